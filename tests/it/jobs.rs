//! Async jobs: `Prefer: respond-async` → 202 + `Location`, polled to the upstream's response as it
//! came; one job per Idempotency-Key; workers across replicas run each job once; a killed worker's
//! job is reclaimed; failures are dead letters; bounded queue; callbacks; sealed credentials.

use std::path::Path;
use std::time::Duration;

use rebound::hooks::config::raw::{RawIdempotency, RawJobs, RawRetry};

use crate::support::config_builder::{list, some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_stream_bytes};
use crate::support::redis::RedisServer;
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

const TOKEN: &str = "admin-token-jobs";
const SECRET: &str = "jobs-secret-0123456789";

/// An async route `/fake/` with fast retries, idempotency and dead letters; `[jobs]` with a short
/// visibility timeout, then `jobs`; Redis when given.
fn config(provider: &str, redis: Option<&str>, jobs: impl FnOnce(&mut RawJobs)) -> TestConfig {
    let mut table = RawJobs {
        visibility_timeout: some("1s"),
        secret: some(SECRET),
        ..RawJobs::default()
    };
    jobs(&mut table);
    let c = TestConfig::new(provider)
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(3),
                base_delay: some("10ms"),
                max_delay: some("20ms"),
                ..RawRetry::default()
            },
        )
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some("2s"),
                ..RawIdempotency::default()
            },
        )
        .jobs(table)
        .route(|r| {
            r.async_jobs = Some(true);
            r.retry = some("fast");
            r.idempotency = some("idem");
            r.dead_letters = Some(true);
        })
        .admin_token(TOKEN);
    match redis {
        Some(url) => c.redis(url),
        None => c,
    }
}

async fn submit(base: &str, fake_key: &str, idem: Option<&str>, body: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![
        ("prefer", "respond-async"),
        ("x-fake-key", fake_key),
        ("content-type", "application/json"),
    ];
    if let Some(k) = idem {
        headers.push(("idempotency-key", k));
    }
    headers.extend_from_slice(extra);
    send(
        "POST",
        &format!("{base}/fake/v1/chat/completions"),
        &headers,
        body.to_string(),
    )
    .await
}

fn job_id(a: &Answer) -> String {
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["job_id"].as_str().unwrap().to_string()
}

async fn status(base: &str, id: &str) -> serde_json::Value {
    let a = get(&format!("{base}/jobs/{id}")).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

/// Polls `GET /jobs/{id}` until the job is finished.
async fn finished(base: &str, id: &str, within: Duration) -> serde_json::Value {
    until(&format!("job {id} finished"), within, || async {
        let s = status(base, id).await;
        match s["status"] == "succeeded" || s["status"] == "failed" {
            true => Ok(s),
            false => Err(s.to_string()),
        }
    })
    .await
}

async fn submitted_then_polled_to_the_response(redis: Option<&RedisServer>) {
    let provider = FakeProvider::start().await;
    let url = redis.map(RedisServer::url);
    let rebound = config(&provider.url(), url.as_deref(), |_| {}).start().await;
    provider.script("slow", vec![Step::Delay { ms: 600 }]);

    let a = submit(&rebound.url, "slow", None, r#"{"model":"m"}"#, &[("prefer", "wait=5")]).await;
    let id = job_id(&a);
    assert_eq!(a.header("location"), Some(format!("/jobs/{id}").as_str()));
    assert_eq!(a.header("preference-applied"), Some("respond-async"));
    assert_eq!(a.json()["status"], "queued");
    assert_eq!(id.len(), 32);

    // Before it is done: the status says so, the result is a clear 404.
    let early = get(&format!("{}/jobs/{id}/result", rebound.url)).await;
    assert_eq!(early.status, 404);
    assert_eq!(early.header("x-rebound-error"), Some("job_not_finished"));
    assert_eq!(early.header("x-should-retry"), Some("true"));
    assert_eq!(early.json()["error"]["code"], "job_not_finished");
    let s = status(&rebound.url, &id).await;
    assert!(s["status"] == "queued" || s["status"] == "running", "{s}");

    let s = finished(&rebound.url, &id, Duration::from_secs(10)).await;
    assert_eq!(s["status"], "succeeded", "{s}");
    assert_eq!(s["http_status"], 200);
    assert_eq!(s["attempts"], 1);
    assert_eq!(s["runs"], 1);
    assert_eq!(s["route"], "fake");
    // The attempt's token usage, as the fake completion reported it.
    assert_eq!(s["usage"][0]["attempt"], 1, "{s}");
    assert_eq!(s["usage"][0]["input"], 12);
    assert_eq!(s["usage"][0]["output"], 96);
    assert_eq!(s["usage"][0]["outcome"], "delivered");
    assert_eq!(s["result_url"], format!("/jobs/{id}/result"));
    for t in ["created_at", "started_at", "finished_at"] {
        assert!(s[t].as_str().unwrap().ends_with('Z'), "{t}: {s}");
    }
    assert!(s["error"].is_null());

    let r = get(&format!("{}/jobs/{id}/result", rebound.url)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, chat_completion().as_bytes(), "the upstream body, byte for byte");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-request-id"), Some("req_fake_0001"));
    assert_eq!(r.header("x-rebound-job-id"), Some(id.as_str()));
    assert_eq!(provider.count("slow"), 1);
    // The run went upstream as a normal request: the Prefer header lost respond-async only.
    let seen = provider.requests("slow").pop().unwrap();
    assert_eq!(seen.header("prefer"), Some("wait=5"));
    assert_eq!(seen.body, br#"{"model":"m"}"#);

    // A streamed job: the SSE bytes as they came.
    let id = job_id(&submit(&rebound.url, "sse", None, r#"{"stream":true}"#, &[]).await);
    assert_eq!(
        finished(&rebound.url, &id, Duration::from_secs(10)).await["status"],
        "succeeded"
    );
    let r = get(&format!("{}/jobs/{id}/result", rebound.url)).await;
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.text(), sse_stream_bytes(5));

    // Without the preference the route answers synchronously, as ever.
    let sync = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "sync")],
        "{}",
    )
    .await;
    assert_eq!(sync.status, 200);
    assert_eq!(sync.body, chat_completion().as_bytes());
    assert!(sync.header("preference-applied").is_none());

    // Unknown ids, other paths and methods.
    let unknown = get(&format!("{}/jobs/{}", rebound.url, "ab".repeat(16))).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "job_not_found");
    assert_eq!(get(&format!("{}/jobs/not-an-id", rebound.url)).await.status, 404);
    let post = send("POST", &format!("{}/jobs/{id}", rebound.url), &[], "").await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));

    let m = rebound.metrics().await;
    assert_eq!(metric(&m, r#"rebound_jobs_total{route="fake",status="queued"}"#), 2.0);
    assert_eq!(
        metric(&m, r#"rebound_jobs_total{route="fake",status="succeeded"}"#),
        2.0
    );
    assert_eq!(metric(&m, "rebound_jobs_queue_depth"), 0.0);
}

#[tokio::test]
async fn submitted_then_polled_to_the_response_in_memory() {
    submitted_then_polled_to_the_response(None).await;
}

#[tokio::test]
async fn submitted_then_polled_to_the_response_in_redis() {
    let redis = RedisServer::start();
    submitted_then_polled_to_the_response(Some(&redis)).await;
}

async fn one_job_per_idempotency_key(redis: Option<&RedisServer>) {
    let provider = FakeProvider::start().await;
    let url = redis.map(RedisServer::url);
    let rebound = config(&provider.url(), url.as_deref(), |_| {}).start().await;
    provider.script("k", vec![Step::Delay { ms: 400 }]);
    let body = r#"{"model":"m","n":1}"#;
    let tenant = [("authorization", "Bearer sk-tenant-a")];

    let first = submit(&rebound.url, "k", Some("job-key-1"), body, &tenant).await;
    let id = job_id(&first);
    assert!(first.header("idempotent-replayed").is_none());
    // Key order does not matter (JSON is compared canonically).
    let again = submit(&rebound.url, "k", Some("job-key-1"), r#"{"n":1,"model":"m"}"#, &tenant).await;
    assert_eq!(job_id(&again), id, "the same key never enqueues twice");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert!(
        ["queued", "running"].contains(&again.json()["status"].as_str().unwrap()),
        "{}",
        again.text()
    );
    // The same key with another body: 422, as for synchronous requests.
    let reused = submit(&rebound.url, "k", Some("job-key-1"), r#"{"model":"other"}"#, &tenant).await;
    assert_eq!(reused.status, 422);
    assert_eq!(reused.json()["error"]["code"], "idempotency_key_reused");
    // Another tenant's identical key is another job, which it alone can read.
    let other = submit(
        &rebound.url,
        "k2",
        Some("job-key-1"),
        body,
        &[("authorization", "Bearer sk-tenant-b")],
    )
    .await;
    let other_id = job_id(&other);
    assert_ne!(other_id, id);
    let peek = send(
        "GET",
        &format!("{}/jobs/{id}", rebound.url),
        &[("authorization", "Bearer sk-tenant-b")],
        "",
    )
    .await;
    assert_eq!(peek.status, 404, "another credential cannot read the job");

    let poll = |id: String| {
        let base = rebound.url.clone();
        async move {
            until(&format!("job {id} finished"), Duration::from_secs(10), || async {
                let s = send("GET", &format!("{base}/jobs/{id}"), &tenant, "").await.json();
                match s["status"] == "succeeded" || s["status"] == "failed" {
                    true => Ok(s),
                    false => Err(s.to_string()),
                }
            })
            .await
        }
    };
    assert_eq!(poll(id.clone()).await["status"], "succeeded");
    // Once it is done, the key still answers with the same job, finished.
    let late = submit(&rebound.url, "k", Some("job-key-1"), body, &tenant).await;
    assert_eq!(job_id(&late), id);
    assert_eq!(late.json()["status"], "succeeded");
    // No job is left to run (a duplicate enqueued by mistake would be queued or running): then
    // the provider's count is final.
    until_metric(&rebound, "rebound_jobs_queue_depth", |n| n == 0.0).await;
    assert_eq!(provider.count("k"), 1, "one job, one upstream call");
    let m = rebound.metrics().await;
    assert_eq!(
        metric(&m, r#"rebound_jobs_total{route="fake",status="deduplicated"}"#),
        2.0
    );
}

#[tokio::test]
async fn one_job_per_idempotency_key_in_memory() {
    one_job_per_idempotency_key(None).await;
}

#[tokio::test]
async fn one_job_per_idempotency_key_in_redis() {
    let redis = RedisServer::start();
    one_job_per_idempotency_key(Some(&redis)).await;
}

/// A job (and its request's record) written before the fingerprint's version 2 still answers a
/// resubmission of its key with the same job; another body is still 422.
#[tokio::test]
async fn a_job_with_a_version_1_fingerprint_still_answers_its_key() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let body = r#"{"model":"m","input":"line one\nline two"}"#;
    let id = job_id(&submit(&rebound.url, "k", Some("old-job"), body, &[]).await);
    assert_eq!(
        finished(&rebound.url, &id, Duration::from_secs(10)).await["status"],
        "succeeded"
    );

    // Every record that holds the request's fingerprint, rewritten as an older build wrote it:
    // the job and its request's idempotency record.
    assert_eq!(redis.rewrite_fingerprints_as_v1(body).await, 2);

    let again = submit(
        &rebound.url,
        "k",
        Some("old-job"),
        r#"{"input":"line one\u000aline two","model":"m"}"#,
        &[],
    )
    .await;
    assert_eq!(job_id(&again), id, "the same job");
    assert_eq!(again.json()["status"], "succeeded");
    let reused = submit(&rebound.url, "k", Some("old-job"), r#"{"model":"other"}"#, &[]).await;
    assert_eq!(reused.status, 422);
    assert_eq!(provider.count("k"), 1);
}

#[tokio::test]
async fn a_job_whose_request_already_completed_is_answered_from_the_idempotency_store() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let sync = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[
            ("x-fake-key", "done"),
            ("idempotency-key", "already-done"),
            ("content-type", "application/json"),
        ],
        "{}",
    )
    .await;
    assert_eq!(sync.status, 200);
    // What a reclaimed job meets when its first run had completed upstream: the stored response.
    let id = job_id(&submit(&rebound.url, "done", Some("already-done"), "{}", &[]).await);
    let s = finished(&rebound.url, &id, Duration::from_secs(10)).await;
    assert_eq!(s["status"], "succeeded");
    assert_eq!(s["attempts"], 0);
    let r = get(&format!("{}/jobs/{id}/result", rebound.url)).await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(r.body, chat_completion().as_bytes());
    assert_eq!(provider.count("done"), 1, "never a second upstream call");
}

#[tokio::test]
async fn twenty_jobs_across_two_instances_complete_exactly_once() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |j| j.workers = Some(2));
    let a = config.start().await;
    let b = config.start().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let key = format!("job{i}");
        provider.script(&key, vec![Step::Delay { ms: 150 }]);
        let base = if i % 2 == 0 { &a.url } else { &b.url };
        let idem = format!("fleet-{i}");
        ids.push(job_id(
            &submit(base, &key, Some(&idem), &format!("{{\"i\":{i}}}"), &[]).await,
        ));
    }
    for (i, id) in ids.iter().enumerate() {
        // Any replica answers for any job.
        let base = if i % 2 == 0 { &b.url } else { &a.url };
        let s = finished(base, id, Duration::from_secs(30)).await;
        assert_eq!(s["status"], "succeeded", "{s}");
        assert_eq!(s["runs"], 1, "{s}");
    }
    for i in 0..20 {
        assert_eq!(provider.count(&format!("job{i}")), 1, "job{i} ran once");
    }
    let done = |page: &str| metric(page, r#"rebound_jobs_total{route="fake",status="succeeded"}"#);
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    assert_eq!(done(&ma) + done(&mb), 20.0);
    assert!(done(&ma) > 0.0 && done(&mb) > 0.0, "both replicas' workers took jobs");
    assert_eq!(metric(&ma, "rebound_jobs_reclaimed_total"), 0.0);
}

#[tokio::test]
async fn a_killed_worker_s_job_is_reclaimed_and_completed_once() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |j| j.workers = Some(1));
    provider.script("long", vec![Step::Delay { ms: 4000 }]);

    let mut doomed = ReboundProcess::start(&config.toml(), &[]).await;
    let id = job_id(&submit(&doomed.proxy, "long", Some("reclaim-me"), r#"{"model":"m"}"#, &[]).await);
    assert!(
        eventually(Duration::from_secs(10), || provider.count("long") == 1).await,
        "the first worker took the job"
    );
    assert_eq!(status(&doomed.proxy, &id).await["status"], "running");
    doomed.child.start_kill().unwrap();
    let _ = doomed.child.wait().await;

    let survivor = config.start().await;
    let s = finished(&survivor.url, &id, Duration::from_secs(20)).await;
    assert_eq!(s["status"], "succeeded", "{s}");
    assert_eq!(s["runs"], 2, "run once by the dead worker, once by the survivor: {s}");
    let r = get(&format!("{}/jobs/{id}/result", survivor.url)).await;
    assert_eq!(r.body, chat_completion().as_bytes());
    // The dead worker's call never came back to anyone; the survivor's is the one that counts.
    // Both reached the provider before the survivor recorded its result: the count is final.
    assert_eq!(provider.count("long"), 2);
    let m = survivor.metrics().await;
    assert_eq!(metric(&m, "rebound_jobs_reclaimed_total"), 1.0);
    assert_eq!(
        metric(&m, r#"rebound_jobs_total{route="fake",status="succeeded"}"#),
        1.0
    );
    assert_eq!(metric(&m, "rebound_jobs_queue_depth"), 0.0);
}

#[tokio::test]
async fn a_job_whose_workers_keep_dying_is_failed_as_abandoned() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |j| j.workers = Some(1));
    provider.script("poison", vec![Step::Delay { ms: 4000 }]);
    let mut doomed = ReboundProcess::start(&config.toml(), &[]).await;
    let id = job_id(&submit(&doomed.proxy, "poison", None, "{}", &[]).await);
    assert!(eventually(Duration::from_secs(10), || provider.count("poison") == 1).await);
    doomed.child.start_kill().unwrap();
    let _ = doomed.child.wait().await;
    // As if four more workers had died running it.
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg(format!("rebound:{{jobs}}:job:{id}"))
        .arg("runs")
        .arg(5)
        .query_async(&mut c)
        .await
        .unwrap();

    let survivor = config.start().await;
    let s = finished(&survivor.url, &id, Duration::from_secs(10)).await;
    assert_eq!(s["status"], "failed", "{s}");
    assert!(s["error"].as_str().unwrap().starts_with("abandoned"), "{s}");
    let r = get(&format!("{}/jobs/{id}/result", survivor.url)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "job_result_unavailable");
    assert_eq!(provider.count("poison"), 1, "not run again");
    let m = survivor.metrics().await;
    assert_eq!(metric(&m, r#"rebound_jobs_total{route="fake",status="failed"}"#), 1.0);
    assert_eq!(metric(&m, "rebound_jobs_queue_depth"), 0.0);
}

#[tokio::test]
async fn a_permanently_failing_job_fails_and_lands_in_the_dead_letters() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    provider.script("down", vec![Step::status(503); 3]);
    let id = job_id(&submit(&rebound.url, "down", Some("doomed-job"), "{}", &[]).await);
    let s = finished(&rebound.url, &id, Duration::from_secs(10)).await;
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(s["http_status"], 503);
    assert_eq!(s["attempts"], 3);
    assert_eq!(s["error"], "the upstream answered 503");
    let r = get(&format!("{}/jobs/{id}/result", rebound.url)).await;
    assert_eq!(r.status, 503, "the upstream's answer as it came");
    assert!(r.text().contains("scripted 503"), "{}", r.text());

    let entry = until("the job's dead letter", Duration::from_secs(5), || async {
        let page = send(
            "GET",
            &format!("{}/admin/dead-letters", rebound.admin),
            &[("authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await
        .json();
        match page["items"].as_array().and_then(|i| i.first()) {
            Some(e) => Ok(e.clone()),
            None => Err(page.to_string()),
        }
    })
    .await;
    assert_eq!(entry["reason"], "retries_exhausted", "{entry}");
    assert_eq!(entry["job_id"], id.as_str());
    assert_eq!(entry["idempotency_key"], "doomed-job");
    assert_eq!(entry["attempts"].as_array().unwrap().len(), 3);
    let m = rebound.metrics().await;
    assert_eq!(metric(&m, r#"rebound_jobs_total{route="fake",status="failed"}"#), 1.0);
}

async fn a_full_queue_refuses_with_503(redis: Option<&RedisServer>) {
    let provider = FakeProvider::start().await;
    let url = redis.map(RedisServer::url);
    let rebound = config(&provider.url(), url.as_deref(), |j| {
        j.workers = Some(1);
        j.max_queue = Some(2);
    })
    .start()
    .await;
    for k in ["q1", "q2", "q3"] {
        provider.script(k, vec![Step::Delay { ms: 1500 }]);
    }
    let first = job_id(&submit(&rebound.url, "q1", None, "{}", &[]).await);
    assert!(eventually(Duration::from_secs(5), || provider.count("q1") == 1).await);
    job_id(&submit(&rebound.url, "q2", None, "{}", &[]).await);
    // One running, one queued: the cap counts both.
    let full = submit(&rebound.url, "q3", None, "{}", &[]).await;
    assert_eq!(full.status, 503, "{}", full.text());
    assert_eq!(full.header("x-rebound-error"), Some("queue_full"));
    assert!(full.header("retry-after").is_some());
    assert!(full.json()["error"]["message"].as_str().unwrap().contains("max_queue"));
    let m = rebound.metrics().await;
    assert_eq!(metric(&m, r#"rebound_jobs_total{route="fake",status="rejected"}"#), 1.0);
    assert_eq!(metric(&m, "rebound_jobs_queue_depth"), 2.0);
    // Room again once the first finishes.
    finished(&rebound.url, &first, Duration::from_secs(10)).await;
    job_id(&submit(&rebound.url, "q3", None, "{}", &[]).await);
    assert_eq!(provider.count("q3"), 0, "the refused submission never ran");
}

#[tokio::test]
async fn a_full_queue_refuses_with_503_in_memory() {
    a_full_queue_refuses_with_503(None).await;
}

#[tokio::test]
async fn a_full_queue_refuses_with_503_in_redis() {
    let redis = RedisServer::start();
    a_full_queue_refuses_with_503(Some(&redis)).await;
}

#[tokio::test]
async fn callbacks_post_the_result_with_the_job_id_as_idempotency_key() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let receiver = FakeProvider::start().await;
    let allowed = format!("{}/echo/", receiver.url());
    let rebound = config(&provider.url(), Some(&redis.url()), |j| {
        j.callback_allowed_prefixes = Some(vec![allowed.clone()])
    })
    .start()
    .await;

    // Outside the allowed prefixes: refused at submission, nothing queued.
    for bad in ["http://127.0.0.1:1/echo/hook", "not a url"] {
        let refused = submit(&rebound.url, "cb", None, "{}", &[("x-rebound-callback", bad)]).await;
        assert_eq!(refused.status, 400, "{}", refused.text());
        assert_eq!(refused.json()["error"]["code"], "callback_not_allowed");
    }
    assert_eq!(provider.count("cb"), 0);

    // The receiver fails once: the callback is retried.
    receiver.script("default", vec![Step::status(503)]);
    let hook = format!("{allowed}hook");
    let id = job_id(&submit(&rebound.url, "cb", None, "{}", &[("x-rebound-callback", &hook)]).await);
    let s = until("the callback delivered or failed", Duration::from_secs(15), || async {
        let s = status(&rebound.url, &id).await;
        match s["callback"]["state"] == "delivered" || s["callback"]["state"] == "failed" {
            true => Ok(s),
            false => Err(s.to_string()),
        }
    })
    .await;
    assert_eq!(s["callback"]["state"], "delivered", "{s}");
    assert_eq!(s["callback"]["attempts"], 2);
    assert_eq!(s["callback"]["last_status"], 200);
    assert_eq!(s["status"], "succeeded");

    let posts = receiver.requests("default");
    assert_eq!(posts.len(), 2);
    let post = posts.last().unwrap();
    assert_eq!(post.method, "POST");
    assert_eq!(post.path, "/echo/hook");
    assert_eq!(post.header("idempotency-key"), Some(id.as_str()));
    assert_eq!(post.header("content-type"), Some("application/json"));
    let payload: serde_json::Value = serde_json::from_slice(&post.body).unwrap();
    assert_eq!(payload["job_id"], id.as_str());
    assert_eq!(payload["status"], "succeeded");
    assert_eq!(payload["response"]["status"], 200);
    assert_eq!(payload["response"]["headers"]["content-type"], "application/json");
    assert_eq!(payload["response"]["body"], chat_completion());
    // The callback URL is rebound's, never the provider's.
    let seen = provider.requests("cb").pop().unwrap();
    assert!(seen.header("x-rebound-callback").is_none());
}

/// Every key and value in Redis, as text.
async fn dump(redis: &RedisServer) -> String {
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
    let mut out = String::new();
    for k in keys {
        let kind: String = ::redis::cmd("TYPE").arg(&k).query_async(&mut c).await.unwrap();
        let value: ::redis::Value = match kind.as_str() {
            "hash" => ::redis::cmd("HGETALL").arg(&k).query_async(&mut c).await.unwrap(),
            "stream" => ::redis::cmd("XRANGE")
                .arg(&k)
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await
                .unwrap(),
            "string" => ::redis::cmd("GET").arg(&k).query_async(&mut c).await.unwrap(),
            _ => ::redis::Value::Nil,
        };
        let text = format!("{value:?}");
        out.push_str(&format!("{k} ({kind}): {text}\n"));
        if let ::redis::Value::Array(items) = &value {
            for item in items {
                if let ::redis::Value::BulkString(b) = item {
                    out.push_str(&String::from_utf8_lossy(b));
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn credentials_of_queued_jobs_are_sealed_in_redis() {
    const CANARY: &str = "sk-CANARY-7f3a";
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    provider.script("sealed", vec![Step::Delay { ms: 1000 }]);
    let auth = format!("Bearer {CANARY}");
    let creds = [("authorization", auth.as_str()), ("x-api-key", CANARY)];
    let id = job_id(&submit(&rebound.url, "sealed", Some("sealed-key"), "{}", &creds).await);
    assert!(eventually(Duration::from_secs(5), || provider.count("sealed") == 1).await);
    let while_running = dump(&redis).await;
    assert!(while_running.contains(&id), "the job is in Redis:\n{while_running}");
    assert!(while_running.contains("cred"), "{while_running}");
    assert!(
        !while_running.contains("CANARY"),
        "a credential in Redis:\n{while_running}"
    );
    assert!(!while_running.contains("sealed-key"), "a raw idempotency key in Redis");

    // Only the submitting credential reads the job.
    assert_eq!(get(&format!("{}/jobs/{id}", rebound.url)).await.status, 404);
    until("the job succeeded", Duration::from_secs(10), || async {
        let a = send("GET", &format!("{}/jobs/{id}", rebound.url), &creds, "").await;
        assert_eq!(a.status, 200);
        match a.json()["status"] == "succeeded" {
            true => Ok(()),
            false => Err(a.text()),
        }
    })
    .await;
    // The provider got them, unsealed.
    let seen = provider.requests("sealed").pop().unwrap();
    assert_eq!(seen.header("authorization"), Some(auth.as_str()));
    assert_eq!(seen.header("x-api-key"), Some(CANARY));
    let after = dump(&redis).await;
    assert!(!after.contains("CANARY"), "{after}");
    assert!(
        !after.contains("\"cred\""),
        "the sealed credentials are dropped once the job is done"
    );
}

#[tokio::test]
async fn without_an_async_route_nothing_changes() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    let a = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("prefer", "respond-async")],
        "{}",
    )
    .await;
    assert_eq!(a.status, 200, "a route without async = true answers synchronously");
    assert!(a.header("preference-applied").is_none());
    let jobs = get(&format!("{}/jobs/{}", rebound.url, "ab".repeat(16))).await;
    assert_eq!(
        jobs.json()["error"]["code"],
        "no_route",
        "no job API without an async route"
    );
}

fn config_errors(toml: &str) -> String {
    match rebound::Config::parse(toml, Path::new("jobs.toml"), &|_| None) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn jobs_config_is_validated_and_located() {
    let base = "http://127.0.0.1:1";
    let parsed = config(base, None, |_| {}).config();
    assert!(parsed.routes[0].async_jobs);
    assert_eq!(parsed.jobs.visibility_timeout, Duration::from_secs(1));
    assert_eq!(parsed.jobs.workers, 4);
    assert!(
        !format!("{:?}", parsed.jobs).contains(SECRET),
        "the secret is never printed"
    );

    // A misspelt key does not compile in the typed config: it is added to the file as text.
    let misspelt = Edit::new(&config(base, None, |_| {}).toml())
        .set("jobs", "wokers", 2i64)
        .to_string();
    let e = config_errors(&misspelt);
    assert!(e.contains("jobs.wokers") && e.contains("unknown field"), "{e}");
    let e = config_errors(
        &config(base, None, |j| {
            j.workers = Some(0);
            j.max_queue = Some(-1);
        })
        .toml(),
    );
    assert!(
        e.contains("jobs.workers: expected an integer from 1 to 256, found 0"),
        "{e}"
    );
    assert!(e.contains("jobs.max_queue"), "{e}");
    let e = config_errors(&config(base, None, |j| j.visibility_timeout = some("200ms")).toml());
    assert!(e.contains("jobs.visibility_timeout: expected at least 1s"), "{e}");
    let e = config_errors(
        &config(base, None, |j| {
            j.callback_allowed_prefixes = list(&["https://hooks.example.com"])
        })
        .toml(),
    );
    assert!(
        e.contains("jobs.callback_allowed_prefixes[0]: expected an http:// or https:// URL prefix with a path"),
        "{e}"
    );
    // With Redis, an async route needs the secret its credentials are sealed with.
    let no_secret = config(base, Some("redis://127.0.0.1:1/0"), |j| j.secret = None);
    let e = config_errors(&no_secret.toml());
    assert!(e.contains("routes[0].async: expected [jobs] secret"), "{e}");
    assert!(e.contains("jobs.toml:"), "located: {e}");
    let short = config(base, None, |j| j.secret = some("short"));
    let e = config_errors(&short.toml());
    assert!(e.contains("jobs.secret: expected at least 16 characters"), "{e}");
    assert!(!e.contains("short\""), "the value is never echoed: {e}");
    // The job API's paths stay free.
    let shadowed = config(base, None, |_| {}).route(|r| r.path_prefix = some("/jobs/x/"));
    let e = config_errors(&shadowed.toml());
    assert!(
        e.contains("routes[0].path_prefix: expected a prefix outside /jobs/"),
        "{e}"
    );
}
