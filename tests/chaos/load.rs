//! The clients: mixed unary and streamed requests, half of them keyed (each keyed request sent
//! twice at once to two replicas, then again once both ended), a fault scripted on ~30% of them,
//! retried on connection errors as an SDK would. Everything they see is recorded for the checks.
//! The chaos test's flows are all [`Kind::Fake`]; the soak's ([`Spec::draw_every`]) use every
//! feature's route.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::fake_provider::{anthropic_message, chat_completion};
use crate::support::{FakeProvider, Step};

/// A client gives up on an attempt (head and body) after this: the retry policy's deadline, the
/// shutdown grace and a wide margin for a loaded machine. Reaching it is a hang.
pub const ATTEMPT_BOUND: Duration = Duration::from_secs(35);

/// The fault scripted on a request's first provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    None,
    Status503,
    RetryAfter429,
    RetryAfterMs429,
    HttpDate429,
    OpenAiReset429,
    AnthropicReset429,
    ResetBeforeHead,
    ResetAfterHead,
    StallHead,
    StallFirstByte,
    SseCut,
    SlowFirstByte,
    /// The soak's: an overloaded error event after two events.
    MidStreamOverloaded,
    /// The soak's: Bedrock's event stream with a broken checksum after two events (elsewhere an
    /// aborted body).
    BadChecksum,
    /// The soak's: Bedrock's `modelStreamErrorException` after two events.
    StreamException,
    /// The soak's: Anthropic's 529.
    Overloaded529,
}

impl Fault {
    pub const ALL: [Fault; 12] = [
        Fault::Status503,
        Fault::RetryAfter429,
        Fault::RetryAfterMs429,
        Fault::HttpDate429,
        Fault::OpenAiReset429,
        Fault::AnthropicReset429,
        Fault::ResetBeforeHead,
        Fault::ResetAfterHead,
        Fault::StallHead,
        Fault::StallFirstByte,
        Fault::SseCut,
        Fault::SlowFirstByte,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Status503 => "503",
            Fault::RetryAfter429 => "429 retry-after",
            Fault::RetryAfterMs429 => "429 retry-after-ms",
            Fault::HttpDate429 => "429 retry-after date",
            Fault::OpenAiReset429 => "429 x-ratelimit-reset",
            Fault::AnthropicReset429 => "429 anthropic reset",
            Fault::ResetBeforeHead => "reset before head",
            Fault::ResetAfterHead => "reset after head",
            Fault::StallHead => "stall > per_try",
            Fault::StallFirstByte => "stall 1st byte",
            Fault::SseCut => "SSE cut",
            Fault::SlowFirstByte => "slow 1st byte",
            Fault::MidStreamOverloaded => "overloaded mid-stream",
            Fault::BadChecksum => "event stream checksum",
            Fault::StreamException => "event stream exception",
            Fault::Overloaded529 => "529",
        }
    }

    fn steps(self, stream: bool) -> Vec<Step> {
        let now = SystemTime::now();
        let in_secs = |s: u64| now + Duration::from_secs(s);
        match self {
            Fault::None => vec![],
            Fault::Status503 => vec![Step::status(503)],
            Fault::RetryAfter429 => vec![Step::status_with(429, &[("retry-after", "1")])],
            Fault::RetryAfterMs429 => vec![Step::status_with(429, &[("retry-after-ms", "300")])],
            Fault::HttpDate429 => vec![Step::status_with(
                429,
                &[("retry-after", &httpdate::fmt_http_date(in_secs(1)))],
            )],
            Fault::OpenAiReset429 => vec![Step::status_with(429, &[("x-ratelimit-reset-requests", "300ms")])],
            Fault::AnthropicReset429 => vec![Step::status_with(
                429,
                &[("anthropic-ratelimit-requests-reset", &rfc3339(in_secs(1)))],
            )],
            Fault::ResetBeforeHead => vec![Step::Reset],
            Fault::ResetAfterHead => vec![Step::ResetAfterHead],
            // per_try_timeout is 1.5 s.
            Fault::StallHead => vec![Step::Delay { ms: 3_000 }],
            // first_byte_timeout is 1.5 s.
            Fault::StallFirstByte => vec![Step::Stall],
            Fault::SseCut => vec![Step::CutAfterFirstChunk],
            Fault::SlowFirstByte if stream => vec![Step::ThinkThenStream {
                ms: 400,
                ping_every_ms: 0,
            }],
            Fault::SlowFirstByte => vec![Step::Delay { ms: 400 }],
            Fault::MidStreamOverloaded => vec![Step::MidStreamError {
                after: 2,
                error_type: "overloaded_error".into(),
            }],
            Fault::BadChecksum => vec![Step::BadChecksum { after: 2 }],
            Fault::StreamException => vec![Step::EventStreamException {
                after: 2,
                exception_type: "modelStreamErrorException".into(),
                message: "scripted exception".into(),
            }],
            Fault::Overloaded529 => vec![Step::status(529)],
        }
    }
}

/// `2025-01-01T00:00:00Z` (what Anthropic's reset headers carry).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (H. Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Which feature a flow exercises: the route it is sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// The chaos test's route (`/fake/`): retries, idempotency, circuit, cooldowns.
    Fake,
    /// The soak's OpenAI chat route (`/chat/`): retries, idempotency, continuation.
    Chat,
    /// The soak's Anthropic route (`/claude/`) over three hosts (Anthropic, Bedrock signed with
    /// rotating AWS credentials, Vertex AI with rotating Google tokens), continuation.
    Claude,
    /// A request that fails for good (`/chat/`, 503 on every call), sent three times to one
    /// replica as a client's own retries.
    ClientRetry,
    /// The soak's rate-limited route (`/limited/`, one attempt, a limit of requests per minute).
    Limited,
    /// The soak's cached route (`/cached/echo`): a few prompts from a few tenants.
    Cached,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fake => "fake",
            Kind::Chat => "chat",
            Kind::Claude => "claude",
            Kind::ClientRetry => "client retry",
            Kind::Limited => "limited",
            Kind::Cached => "cached",
        }
    }
}

/// What one flow is.
#[derive(Clone, Debug)]
pub struct Spec {
    pub id: u64,
    pub kind: Kind,
    pub fake_key: String,
    pub keyed: bool,
    pub stream: bool,
    pub anthropic: bool,
    pub fault: Fault,
    pub chunks: usize,
    /// The fake's gap between stream events.
    pub gap_ms: u64,
    /// The credential's owner (the cached route's tenants).
    pub tenant: usize,
    /// The cached route's prompt.
    pub prompt: u64,
}

/// The soak's faults per route (each on the flow's first provider call).
const CHAT_FAULTS: [Fault; 9] = [
    Fault::Status503,
    Fault::RetryAfterMs429,
    Fault::OpenAiReset429,
    Fault::ResetBeforeHead,
    Fault::ResetAfterHead,
    Fault::SseCut,
    Fault::MidStreamOverloaded,
    Fault::StallFirstByte,
    Fault::SlowFirstByte,
];
const CLAUDE_FAULTS: [Fault; 7] = [
    Fault::BadChecksum,
    Fault::StreamException,
    Fault::SseCut,
    Fault::MidStreamOverloaded,
    Fault::Overloaded529,
    Fault::Status503,
    Fault::ResetBeforeHead,
];

/// The soak's cached route: this many tenants, each asking this many prompts.
pub const TENANTS: usize = 3;
pub const PROMPTS: u64 = 4;
/// The soak's client-retry flows: the sends of one request.
pub const CLIENT_SENDS: usize = 3;

impl Spec {
    /// The next flow from the seeded generator: ~30% with a fault.
    pub fn draw(rng: &mut StdRng, id: u64) -> Spec {
        let stream = rng.random_bool(0.5);
        let mut fault = if rng.random_bool(0.3) {
            Fault::ALL[rng.random_range(0..Fault::ALL.len())]
        } else {
            Fault::None
        };
        if fault == Fault::SseCut && !stream {
            fault = Fault::ResetAfterHead;
        }
        Spec {
            id,
            kind: Kind::Fake,
            fake_key: format!("chaos-{id}"),
            keyed: rng.random_bool(0.5),
            stream,
            anthropic: rng.random_bool(0.25),
            fault,
            chunks: rng.random_range(3..10),
            gap_ms: 60,
            tenant: 0,
            prompt: 0,
        }
    }

    /// The soak's next flow: every feature's route, its faults on ~40% of the flows that have
    /// them; one stream in five is long (2-3 s), so that a replica killed finds some mid-stream.
    pub fn draw_every(rng: &mut StdRng, id: u64) -> Spec {
        let pick = rng.random_range(0..100);
        let kind = match pick {
            0..35 => Kind::Chat,
            35..60 => Kind::Claude,
            60..68 => Kind::ClientRetry,
            68..84 => Kind::Limited,
            _ => Kind::Cached,
        };
        let faults: &[Fault] = match kind {
            Kind::Chat => &CHAT_FAULTS,
            Kind::Claude => &CLAUDE_FAULTS,
            _ => &[],
        };
        let fault = match faults.is_empty() || !rng.random_bool(0.4) {
            true => Fault::None,
            false => faults[rng.random_range(0..faults.len())],
        };
        let streams = matches!(kind, Kind::Chat | Kind::Claude);
        let stream = streams && (fault.cuts() || rng.random_bool(0.7));
        let (tenant, prompt) = (rng.random_range(0..TENANTS), rng.random_range(0..PROMPTS));
        let fake_key = match kind {
            Kind::Limited => "limited".to_string(),
            Kind::Cached => format!("cached-{tenant}-{prompt}"),
            _ => format!("soak-{id}"),
        };
        Spec {
            id,
            kind,
            fake_key,
            keyed: streams && rng.random_bool(0.5),
            stream,
            anthropic: kind == Kind::Claude,
            fault,
            chunks: rng.random_range(4..10),
            gap_ms: if rng.random_bool(0.2) { 300 } else { 60 },
            tenant,
            prompt,
        }
    }

    fn path(&self) -> &'static str {
        match (self.kind, self.anthropic) {
            (Kind::Fake, true) => "/fake/v1/messages",
            (Kind::Fake, false) => "/fake/v1/chat/completions",
            (Kind::Chat | Kind::ClientRetry, _) => "/chat/v1/chat/completions",
            (Kind::Claude, _) => "/claude/v1/messages",
            (Kind::Limited, _) => "/limited/v1/chat/completions",
            (Kind::Cached, _) => "/cached/echo",
        }
    }

    fn body(&self) -> String {
        let model = if self.kind == Kind::Claude {
            "claude-sonnet-4-5"
        } else {
            "m"
        };
        let (what, n) = match self.kind {
            Kind::Cached => ("prompt", self.prompt),
            _ => ("flow", self.id),
        };
        format!(
            r#"{{"model":"{model}","stream":{},"max_tokens":64,"messages":[{{"role":"user","content":"{what} {n}"}}]}}"#,
            self.stream
        )
    }

    /// The credential the flow's client sends.
    pub fn credential(&self) -> String {
        match self.kind {
            Kind::Cached => format!("Bearer tenant-{}", self.tenant),
            Kind::Limited => "Bearer limited".into(),
            _ => format!("Bearer chaos-cred-{}", self.id),
        }
    }

    /// Whether a 2xx body that ended cleanly is the whole answer: on the soak's routes, a stream
    /// must also be one valid stream whose text is the one the fake generated (a continued stream
    /// repeats nothing at its seam and misses nothing), and a cached answer must be the tenant's
    /// own.
    pub fn complete(&self, body: &[u8]) -> bool {
        if self.kind == Kind::Cached {
            return self.own_echo(body);
        }
        let whole = || -> String { (0..self.chunks).map(|i| format!("token{i} ")).collect() };
        match (self.stream, self.anthropic, self.kind) {
            (false, false, _) => body == chat_completion().as_bytes(),
            (false, true, Kind::Fake) => body == anthropic_message().as_bytes(),
            (false, true, _) => same_json(body, &anthropic_message()),
            (true, false, Kind::Fake) => body.ends_with(b"data: [DONE]\n\n"),
            (true, true, Kind::Fake) => body.ends_with(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
            (true, false, _) => {
                body.ends_with(b"data: [DONE]\n\n") && crate::streams::chat_text(body).is_some_and(|t| t == whole())
            }
            (true, true, _) => crate::streams::anthropic_text(body).is_some_and(|t| t == whole()),
        }
    }

    /// A stream of a `continue_streams` route that could not be finished ends with an error
    /// event in its dialect: a visible cut, as a reset is.
    pub fn cut_visibly(&self, body: &[u8]) -> bool {
        matches!(self.kind, Kind::Chat | Kind::Claude) && self.stream && crate::streams::ends_with_error(body)
    }

    /// The cached route's answer (the fake's echo of the request it was made for) is this
    /// tenant's, for this prompt.
    fn own_echo(&self, body: &[u8]) -> bool {
        let Ok(echo) = serde_json::from_slice::<serde_json::Value>(body) else {
            return false;
        };
        let header = |name: &str| -> Option<String> {
            echo["headers"]
                .as_array()?
                .iter()
                .find_map(|pair| (pair[0].as_str()? == name).then(|| pair[1].as_str().map(str::to_string))?)
        };
        header("authorization") == Some(self.credential()) && header("x-fake-key").as_deref() == Some(&*self.fake_key)
    }
}

impl Fault {
    /// A fault that cuts a stream after its first bytes (only streams are drawn with it).
    pub fn cuts(self) -> bool {
        matches!(
            self,
            Fault::SseCut | Fault::MidStreamOverloaded | Fault::BadChecksum | Fault::StreamException
        )
    }
}

/// Two JSON documents are the same value.
fn same_json(body: &[u8], want: &str) -> bool {
    let parsed = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
    parsed(body).is_some_and(|v| Some(v) == parsed(want.as_bytes()))
}

/// How one attempt (one HTTP exchange with one replica) ended.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// No response head: connection refused, reset, closed before the head.
    NoHead(String),
    /// A response; `body_error` when the body ended with an error (a visible abort).
    Response {
        status: u16,
        replayed: bool,
        rebound_error: Option<String>,
        /// `x-rebound-attempts` and `x-rebound-cache`.
        attempts: Option<u32>,
        cache: Option<String>,
        body: Bytes,
        body_error: Option<String>,
    },
    /// Nothing within [`ATTEMPT_BOUND`].
    Hang,
}

#[derive(Clone, Debug)]
pub struct Attempt {
    pub replica: usize,
    pub token: String,
    pub start: Instant,
    pub head_at: Option<Instant>,
    pub end: Instant,
    pub outcome: Outcome,
}

/// One request as the app sees it (its SDK's retries on connection errors included).
#[derive(Clone, Debug)]
pub struct Sent {
    pub attempts: Vec<Attempt>,
}

impl Sent {
    pub fn last(&self) -> &Attempt {
        &self.attempts[self.attempts.len() - 1]
    }
    pub fn start(&self) -> Instant {
        self.attempts[0].start
    }
    pub fn end(&self) -> Instant {
        self.last().end
    }
}

#[derive(Clone, Debug)]
pub struct Flow {
    pub spec: Spec,
    pub sends: Vec<Sent>,
}

/// The replicas' proxy URLs (fixed ports: a restarted replica comes back on the same one).
pub struct Clients {
    pub urls: Vec<String>,
}

impl Clients {
    /// Runs one flow to its end.
    pub async fn run(self: Arc<Self>, provider: Arc<FakeProvider>, spec: Spec, seed: u64) -> Flow {
        let mut rng = StdRng::seed_from_u64(seed ^ spec.id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        match spec.kind {
            // Every call fails: each send fails for good.
            Kind::ClientRetry => provider.script(&spec.fake_key, vec![Step::status(503); 40]),
            Kind::Limited | Kind::Cached => {}
            _ => provider.script(&spec.fake_key, spec.fault.steps(spec.stream)),
        }
        let n = self.urls.len();
        let first = rng.random_range(0..n);
        let credential = spec.credential();
        let mut sends = Vec::new();
        if spec.kind == Kind::ClientRetry {
            // An app's own retries: to its own sidecar, moments apart.
            for nth in 0..CLIENT_SENDS {
                sends.push(self.send(&spec, &credential, first, nth).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else if spec.keyed {
            let second = (first + rng.random_range(1..n)) % n;
            let (a, b) = tokio::join!(
                self.send(&spec, &credential, first, 0),
                self.send(&spec, &credential, second, 1)
            );
            sends.push(a);
            sends.push(b);
            let third = rng.random_range(0..n);
            sends.push(self.send(&spec, &credential, third, 2).await);
        } else {
            sends.push(self.send(&spec, &credential, first, 0).await);
        }
        Flow { spec, sends }
    }

    /// One request, retried on another replica after a connection error (no response head) as an
    /// SDK retries an `APIConnectionError`: at most 6 attempts, 100 ms apart and growing.
    async fn send(&self, spec: &Spec, credential: &str, mut replica: usize, nth: usize) -> Sent {
        let mut attempts = Vec::new();
        for i in 0..6u32 {
            let token = format!("{}-{nth}-{i}", spec.id);
            let a = self.attempt(spec, credential, replica, token).await;
            let retry = matches!(a.outcome, Outcome::NoHead(_));
            attempts.push(a);
            if !retry {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100 * u64::from(i + 1))).await;
            replica = (replica + 1) % self.urls.len();
        }
        Sent { attempts }
    }

    async fn attempt(&self, spec: &Spec, credential: &str, replica: usize, token: String) -> Attempt {
        let start = Instant::now();
        let chunks = spec.chunks.to_string();
        let gap = spec.gap_ms.to_string();
        let mut req = Request::builder()
            .method("POST")
            .uri(format!("{}{}", self.urls[replica], spec.path()))
            .header("content-type", "application/json")
            .header("authorization", credential)
            .header("x-fake-key", &spec.fake_key)
            .header("x-chaos-attempt", &token)
            .header("x-fake-chunks", chunks.as_str())
            .header("x-fake-gap-ms", gap.as_str());
        if spec.keyed {
            req = req.header("idempotency-key", format!("idem-{}", spec.id));
        }
        let req = req.body(Full::new(Bytes::from(spec.body()))).expect("request");
        // A fresh connection per attempt, as after a failure an SDK opens a new one anyway; it
        // keeps a connection the replica closes while idle out of the results.
        let client = crate::support::client();
        let mut head_at = None;
        let exchange = async {
            let resp = match client.request(req).await {
                Ok(r) => r,
                Err(e) => return Outcome::NoHead(format!("{e:?}")),
            };
            head_at = Some(Instant::now());
            let status = resp.status().as_u16();
            let h = resp.headers();
            let replayed = h.get("idempotent-replayed").is_some();
            let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let rebound_error = text("x-rebound-error");
            let attempts = text("x-rebound-attempts").and_then(|v| v.parse().ok());
            let cache = text("x-rebound-cache");
            let mut body = resp.into_body();
            let mut bytes = Vec::new();
            let mut body_error = None;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => {
                        if let Some(d) = f.data_ref() {
                            bytes.extend_from_slice(d);
                        }
                    }
                    Err(e) => {
                        body_error = Some(format!("{e}"));
                        break;
                    }
                }
            }
            Outcome::Response {
                status,
                replayed,
                rebound_error,
                attempts,
                cache,
                body: Bytes::from(bytes),
                body_error,
            }
        };
        let outcome = tokio::time::timeout(ATTEMPT_BOUND, exchange)
            .await
            .unwrap_or(Outcome::Hang);
        Attempt {
            replica,
            token,
            start,
            head_at,
            end: Instant::now(),
            outcome,
        }
    }
}
