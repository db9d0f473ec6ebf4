//! The fake provider's cloud hosts (`support/fake_hosts.rs`), checked from outside over real
//! sockets: what each host takes, answers and refuses, before any rebound test leans on them.
//! Requests to Bedrock are signed by AWS's own signer (`aws-sigv4`), not by the verifier the fake
//! checks them with.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;

use crate::support::event_stream::{decode, Message};
use crate::support::fake_hosts::{AWS_ACCESS_KEY, AWS_SECRET, BEDROCK_VERSION, SIGNATURE_MISMATCH, VERTEX_VERSION};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::{send, Answer};

/// A Bedrock model id, as an SDK writes it in the path (`:` percent-encoded).
const MODEL_PATH: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1%3A0";
const BEDROCK_BODY: &str =
    r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;

/// The headers AWS's signer adds to a POST of `body` to `url` (`x-amz-date`, `authorization`),
/// signed for `bedrock` in `region` with the example access key and `secret`.
fn sigv4(url: &str, body: &str, region: &str, secret: &str) -> Vec<(String, String)> {
    let identity: Identity = Credentials::new(AWS_ACCESS_KEY, secret, None, None, "test").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("bedrock")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let headers = [("content-type", "application/json")];
    let signable =
        SignableRequest::new("POST", url, headers.into_iter(), SignableBody::Bytes(body.as_bytes())).unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    instructions
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A POST to Bedrock's `operation` of the model, under `key`, signed with `secret` for `region`
/// (unsigned when `secret` is empty).
async fn bedrock(
    provider: &FakeProvider,
    operation: &str,
    body: &str,
    key: &str,
    region: &str,
    secret: &str,
) -> Answer {
    let url = format!("{}/model/{MODEL_PATH}/{operation}", provider.url());
    let signed = match secret {
        "" => Vec::new(),
        secret => sigv4(&url, body, region, secret),
    };
    let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json"), ("x-fake-key", key)];
    headers.extend(signed.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    send("POST", &url, &headers, body.to_string()).await
}

/// Bedrock's error: its status, `x-amzn-errortype`'s type and the message.
fn bedrock_error(a: &Answer) -> (u16, String, String) {
    let error_type = a
        .header("x-amzn-errortype")
        .unwrap_or("")
        .split(':')
        .next()
        .unwrap()
        .to_string();
    let message = a.json()["message"].as_str().unwrap_or("").to_string();
    (a.status.as_u16(), error_type, message)
}

#[tokio::test]
async fn bedrock_answers_a_request_signed_with_the_example_keys_as_anthropic_would() {
    let provider = FakeProvider::start().await;
    let a = bedrock(&provider, "invoke", BEDROCK_BODY, "ok", "us-east-1", AWS_SECRET).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["type"], "message");
    assert_eq!(a.json()["usage"]["output_tokens"], 96);
    assert_eq!(a.header("x-amzn-bedrock-input-token-count"), Some("12"));
    assert_eq!(a.header("x-amzn-bedrock-output-token-count"), Some("96"));
    let seen = &provider.requests("ok")[0];
    assert_eq!(seen.path, format!("/model/{MODEL_PATH}/invoke"));
    assert!(seen
        .header("authorization")
        .unwrap()
        .starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"));
}

#[tokio::test]
async fn bedrock_refuses_what_aws_refuses_before_the_script_is_consumed() {
    let provider = FakeProvider::start().await;
    provider.script("k", vec![Step::status(429)]);
    let refused = |status: u16, error_type: &str, message: &str| (status, error_type.to_string(), message.to_string());
    // Authentication.
    let a = bedrock(&provider, "invoke", BEDROCK_BODY, "k", "us-east-1", "").await;
    assert_eq!(
        bedrock_error(&a),
        refused(
            403,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token"
        )
    );
    let a = bedrock(&provider, "invoke", BEDROCK_BODY, "k", "us-east-1", "another-secret").await;
    assert_eq!(
        bedrock_error(&a),
        refused(403, "InvalidSignatureException", SIGNATURE_MISMATCH)
    );
    let url = format!("{}/model/{MODEL_PATH}/invoke", provider.url());
    let headers = [("authorization", "Bearer sk-ant-app-key"), ("x-fake-key", "k")];
    let a = send("POST", &url, &headers, BEDROCK_BODY).await;
    assert_eq!(bedrock_error(&a).1, "UnrecognizedClientException");
    provider.aws_region("us-west-2");
    let a = bedrock(&provider, "invoke", BEDROCK_BODY, "k", "us-east-1", AWS_SECRET).await;
    assert_eq!(bedrock_error(&a).1, "InvalidSignatureException");
    assert!(bedrock_error(&a).2.contains("region"), "{}", a.text());
    // The body.
    for (body, says) in [
        (
            r#"{"model":"claude-fake","anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#,
            "extraneous key [model] is not permitted",
        ),
        (
            r#"{"stream":true,"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#,
            "extraneous key [stream] is not permitted",
        ),
        (
            r#"{"max_tokens":8,"messages":[]}"#,
            "required key [anthropic_version] not found",
        ),
        (
            r#"{"anthropic_version":"vertex-2023-10-16","max_tokens":8,"messages":[]}"#,
            "#/anthropic_version",
        ),
        (
            r#"{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":"a,b","max_tokens":8,"messages":[]}"#,
            "#/anthropic_beta",
        ),
        ("not json", "Malformed input request"),
    ] {
        let a = bedrock(&provider, "invoke", body, "k", "us-west-2", AWS_SECRET).await;
        let (status, error_type, message) = bedrock_error(&a);
        assert_eq!((status, error_type.as_str()), (400, "ValidationException"), "{body}");
        assert!(message.contains(says), "{body}: {message}");
    }
    assert!(BEDROCK_BODY.contains(BEDROCK_VERSION));
    let beta = r#"{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["a","b"],"max_tokens":8,"messages":[]}"#;
    // The script's 429 is for the first request Bedrock took: Bedrock's ThrottlingException.
    let a = bedrock(&provider, "invoke", beta, "k", "us-west-2", AWS_SECRET).await;
    assert_eq!(
        bedrock_error(&a),
        refused(
            429,
            "ThrottlingException",
            "Too many requests, please wait before trying again."
        )
    );
    let a = bedrock(&provider, "invoke", beta, "k", "us-west-2", AWS_SECRET).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(provider.count("k"), 12);
    // Each recorded request says whether Bedrock took it, and why not.
    let seen = provider.requests("k");
    assert_eq!(
        seen[0].refused.as_deref(),
        Some(r#"403 MissingAuthenticationTokenException: {"message":"Missing Authentication Token"}"#)
    );
    assert!(seen[..10].iter().all(|r| r.refused.is_some()));
    assert!(seen[10..].iter().all(|r| r.refused.is_none()));
}

/// The event types of a Bedrock stream's chunks, and the stream's messages.
fn chunks(a: &Answer) -> (Vec<String>, Vec<Message>) {
    assert_eq!(a.header("content-type"), Some("application/vnd.amazon.eventstream"));
    let messages = decode(&a.body).unwrap();
    let types = messages
        .iter()
        .map(|m| match m.header(":message-type") {
            Some("event") => m.event().unwrap()["type"].as_str().unwrap().to_string(),
            _ => format!("exception:{}", m.header(":exception-type").unwrap()),
        })
        .collect();
    (types, messages)
}

fn normal_stream(deltas: usize) -> Vec<String> {
    let mut types = vec!["message_start".to_string(), "content_block_start".to_string()];
    types.extend((0..deltas).map(|_| "content_block_delta".to_string()));
    types.extend(["content_block_stop", "message_delta", "message_stop"].map(String::from));
    types
}

#[tokio::test]
async fn bedrock_streams_the_anthropic_events_as_event_stream_chunks() {
    let provider = FakeProvider::start().await;
    let a = bedrock(
        &provider,
        "invoke-with-response-stream",
        BEDROCK_BODY,
        "s",
        "us-east-1",
        AWS_SECRET,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let (types, messages) = chunks(&a);
    assert_eq!(types, normal_stream(5));
    let text: String = messages
        .iter()
        .filter_map(|m| m.event().unwrap()["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "token0 token1 token2 token3 token4 ");
    let stop = messages.last().unwrap().event().unwrap();
    let metrics = &stop["amazon-bedrock-invocationMetrics"];
    assert_eq!(
        (
            metrics["inputTokenCount"].as_u64(),
            metrics["outputTokenCount"].as_u64()
        ),
        (Some(12), Some(5))
    );
    assert!(metrics["invocationLatency"].is_u64() && metrics["firstByteLatency"].is_u64());
    assert_eq!(provider.streams_completed("s"), 1);
}

#[tokio::test]
async fn bedrock_scripts_its_exceptions_and_a_broken_checksum() {
    let provider = FakeProvider::start().await;
    let exception = |after: usize| Step::EventStreamException {
        after,
        exception_type: "throttlingException".into(),
        message: "Too many tokens, please wait before trying again.".into(),
    };
    provider.script(
        "x",
        vec![
            exception(2),
            exception(0),
            Step::in_band("overloaded_error"),
            Step::MidStreamError {
                after: 1,
                error_type: "rate_limit_error".into(),
            },
            Step::BadChecksum { after: 3 },
            Step::status(503),
        ],
    );
    let stream = || {
        bedrock(
            &provider,
            "invoke-with-response-stream",
            BEDROCK_BODY,
            "x",
            "us-east-1",
            AWS_SECRET,
        )
    };
    let (types, messages) = chunks(&stream().await);
    assert_eq!(
        types,
        ["message_start", "content_block_start", "exception:throttlingException"]
    );
    assert_eq!(
        messages[2].payload,
        br#"{"message":"Too many tokens, please wait before trying again."}"#
    );
    assert_eq!(chunks(&stream().await).0, ["exception:throttlingException"]);
    assert_eq!(chunks(&stream().await).0, ["exception:serviceUnavailableException"]);
    // The fake's first SSE frame holds three events: the error comes after them.
    assert_eq!(
        chunks(&stream().await).0,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "exception:throttlingException"
        ]
    );
    let broken = stream().await;
    assert_eq!(decode(&broken.body).unwrap_err(), "message 4: message checksum");
    let whole = broken.body.len();
    assert_eq!(
        decode(&broken.body[..whole - event_stream_len(&broken.body, 3)])
            .unwrap()
            .len(),
        3
    );
    let a = stream().await;
    assert_eq!(bedrock_error(&a).1, "ServiceUnavailableException");
}

/// The length of the messages of `bytes` from the `n`th (from 0) on.
fn event_stream_len(bytes: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        at += u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    bytes.len() - at
}

const VERTEX_BODY: &str =
    r#"{"anthropic_version":"vertex-2023-10-16","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;

async fn vertex(provider: &FakeProvider, method: &str, body: &str, key: &str, bearer: bool) -> Answer {
    let url = format!(
        "{}/v1/projects/llm-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:{method}",
        provider.url()
    );
    let mut headers = vec![("content-type", "application/json"), ("x-fake-key", key)];
    if bearer {
        headers.push(("authorization", "Bearer test-token"));
    }
    send("POST", &url, &headers, body.to_string()).await
}

fn google_error(a: &Answer) -> (u16, String) {
    let e = &a.json()["error"];
    assert_eq!(e["code"].as_u64(), Some(u64::from(a.status.as_u16())), "{}", a.text());
    (a.status.as_u16(), e["status"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn vertex_anthropic_answers_as_anthropic_and_refuses_as_google() {
    let provider = FakeProvider::start().await;
    assert!(VERTEX_BODY.contains(VERTEX_VERSION));
    let a = vertex(&provider, "rawPredict", VERTEX_BODY, "v", true).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["type"], "message");
    let streamed = VERTEX_BODY.replacen('{', r#"{"stream":true,"#, 1);
    let a = vertex(&provider, "streamRawPredict", &streamed, "v", true).await;
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    assert!(
        a.text().starts_with("event: message_start\n")
            && a.text()
                .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );

    assert_eq!(
        google_error(&vertex(&provider, "rawPredict", VERTEX_BODY, "v", false).await),
        (401, "UNAUTHENTICATED".into())
    );
    for body in [
        VERTEX_BODY.replacen('{', r#"{"model":"claude-sonnet-4-5","#, 1),
        VERTEX_BODY.replace("vertex-2023-10-16", "bedrock-2023-05-31"),
        r#"{"max_tokens":8,"messages":[]}"#.to_string(),
        streamed.clone(),
    ] {
        let a = vertex(&provider, "rawPredict", &body, "v", true).await;
        assert_eq!(google_error(&a), (400, "INVALID_ARGUMENT".into()), "{body}");
    }
    assert_eq!(
        google_error(&vertex(&provider, "streamRawPredict", VERTEX_BODY, "v", true).await).0,
        400
    );
    provider.script("v", vec![Step::status(429)]);
    assert_eq!(
        google_error(&vertex(&provider, "rawPredict", VERTEX_BODY, "v", true).await),
        (429, "RESOURCE_EXHAUSTED".into())
    );
    assert_eq!(
        provider.requests("v")[0].path.rsplit('/').next(),
        Some("claude-sonnet-4-5@20250929:rawPredict")
    );
}

#[tokio::test]
async fn azure_wants_an_api_version_on_deployment_paths_and_answers_as_openai() {
    let provider = FakeProvider::start().await;
    let chat = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let call = |path: &str, body: &str, key: Option<&str>| {
        let url = format!("{}{path}", provider.url());
        let body = body.to_string();
        let key = key.map(str::to_string);
        async move {
            let mut headers = vec![("content-type", "application/json"), ("x-fake-key", "z")];
            if let Some(k) = &key {
                headers.push(("api-key", k.as_str()));
            }
            send("POST", &url, &headers, body).await
        }
    };
    let a = call("/openai/deployments/gpt-4o/chat/completions", chat, Some("azure-key")).await;
    assert_eq!(
        (a.status.as_u16(), &a.json()["error"]["code"]),
        (404, &serde_json::json!("DeploymentNotFound"))
    );
    let a = call(
        "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
        chat,
        None,
    )
    .await;
    assert_eq!(a.status, 401);
    let a = call(
        "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
        chat,
        Some("azure-key"),
    )
    .await;
    assert_eq!(a.json()["object"], "chat.completion");
    let a = call(
        "/openai/v1/chat/completions",
        &chat.replacen('{', r#"{"stream":true,"#, 1),
        Some("azure-key"),
    )
    .await;
    assert!(a.text().ends_with("data: [DONE]\n\n"), "{}", a.text());
    let a = call(
        "/openai/deployments/embed/embeddings?api-version=2024-10-21",
        r#"{"input":["a","b"],"encoding_format":"base64"}"#,
        Some("azure-key"),
    )
    .await;
    let data = a.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 2);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data[1]["embedding"].as_str().unwrap())
        .unwrap();
    assert_eq!(f32::from_le_bytes(bytes[4..8].try_into().unwrap()), 9.0 / 64.0);
    let a = call(
        "/openai/responses",
        r#"{"model":"gpt-4o","input":"hi"}"#,
        Some("azure-key"),
    )
    .await;
    assert_eq!(a.status, 404);
    let a = call(
        "/openai/responses?api-version=preview",
        r#"{"model":"gpt-4o","input":"hi"}"#,
        Some("azure-key"),
    )
    .await;
    assert_eq!(a.json()["object"], "response");
    provider.script("z", vec![Step::status(429)]);
    let a = call("/openai/v1/embeddings", r#"{"input":"a"}"#, Some("azure-key")).await;
    assert_eq!(
        (a.status.as_u16(), &a.json()["error"]["code"]),
        (429, &serde_json::json!("429"))
    );
}

#[tokio::test]
async fn gemini_and_vertex_gemini_answer_with_usage_metadata() {
    let provider = FakeProvider::start().await;
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let call = |path: String, body: &str, credential: Option<(&'static str, &'static str)>| {
        let url = format!("{}{path}", provider.url());
        let body = body.to_string();
        async move {
            let mut headers = vec![("content-type", "application/json"), ("x-fake-key", "g")];
            headers.extend(credential);
            send("POST", &url, &headers, body).await
        }
    };
    let key = Some(("x-goog-api-key", "goog-key"));
    let gemini = |method: &str| format!("/v1beta/models/gemini-2.5-flash:{method}");
    let a = call(gemini("generateContent"), body, key).await;
    assert_eq!(a.json()["usageMetadata"]["totalTokenCount"], 108);
    assert_eq!(
        google_error(&call(gemini("generateContent"), body, None).await),
        (403, "PERMISSION_DENIED".into())
    );
    let a = call(gemini("streamGenerateContent?alt=sse"), body, key).await;
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    let text = a.text();
    let events: Vec<&str> = text.split_terminator("\r\n\r\n").collect();
    assert_eq!(events.len(), 5);
    let last: serde_json::Value = serde_json::from_str(events[4].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 5);
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    let a = call(gemini("streamGenerateContent"), body, key).await;
    assert_eq!(a.json().as_array().unwrap().len(), 5);

    let vertex = |method: &str| {
        format!("/v1/projects/llm-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:{method}")
    };
    let bearer = Some(("authorization", "Bearer test-token"));
    assert_eq!(call(vertex("generateContent"), body, bearer).await.status, 200);
    assert_eq!(
        google_error(&call(vertex("generateContent"), body, key).await),
        (401, "UNAUTHENTICATED".into())
    );
    let with_model = r#"{"model":"gemini-2.5-flash","contents":[]}"#;
    assert_eq!(
        google_error(&call(vertex("generateContent"), with_model, bearer).await).1,
        "INVALID_ARGUMENT"
    );
    assert_eq!(
        google_error(&call(vertex("generateContent"), "{}", bearer).await).1,
        "INVALID_ARGUMENT"
    );
}

#[tokio::test]
async fn an_event_stream_exception_elsewhere_is_the_anthropic_error_it_stands_for() {
    let provider = FakeProvider::start().await;
    provider.script(
        "e",
        vec![Step::EventStreamException {
            after: 1,
            exception_type: "throttlingException".into(),
            message: "slow down".into(),
        }],
    );
    let body = r#"{"model":"claude-fake","max_tokens":8,"stream":true,"messages":[]}"#;
    let a = send(
        "POST",
        &format!("{}/v1/messages", provider.url()),
        &[("x-fake-key", "e")],
        body,
    )
    .await;
    assert!(a.text().starts_with("event: message_start"), "{}", a.text());
    assert!(a.text().ends_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"scripted rate_limit_error\"}}\n\n"), "{}", a.text());
}
