//! The soak with every feature (issue 61): 3 rebound binaries on a Redis Sentinel topology (a
//! master, a replica, three sentinels), the fake provider, two credential services, and clients
//! on every feature's route at once:
//! - `/chat/`: OpenAI chat, retries, idempotency (half keyed, each key sent twice at once and once
//!   more), continuation of cut streams; faults on 40%: 503, 429s, resets, a cut after the first
//!   event, an overloaded error mid-stream, a stall, a slow first byte;
//! - `/claude/`: Anthropic Messages over three hosts (`balance = "weighted"`): Anthropic's own,
//!   Bedrock (its binary event stream, SigV4 with AWS credentials from the container endpoint,
//!   rotating every 10 s) and Vertex AI (Google tokens from the metadata server, rotating every
//!   10 s); continuation; faults: a Bedrock stream with a broken checksum, a Bedrock exception
//!   mid-stream, a cut, an overloaded error, 529, 503, a reset;
//! - client retries: a request failing for good, sent three times to its replica;
//! - `/limited/`: `requests_per_minute = 60` for the route, queued, offered about three times that;
//! - `/cached/`: three tenants asking four prompts (the fake echoes each request, so an answer
//!   says whose it was).
//!
//! Meanwhile: the credential services slow (3 s per answer), then down for 15 s; the Redis
//! master frozen for 5 s (the sentinels fail over meanwhile) and later SIGKILLed (failed over,
//! and back as a replica); replicas SIGKILLed with streams in flight and restarted. Then the
//! invariants of `checks` ((a) to (d)) and `soak_checks` ((i) to (m)), as tables
//! (`cargo test --test chaos soak -- --nocapture`). `REBOUND_CHAOS_MINUTES=N` repeats the
//! injections for N minutes (`REBOUND_CHAOS_RATE`, `REBOUND_CHAOS_SEED` as for the chaos test).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::load::{Clients, Spec};
use crate::support::cloud::{bearer_answer, StandIn};
use crate::support::fake_hosts::{AWS_ACCESS_KEY, AWS_SECRET};
use crate::support::redis_sentinel::{RedisSentinel, MASTER_NAME};
use crate::support::FakeProvider;
use crate::{free_port, replica_killed, say, Injections, Load, Replica, Window, ADMIN_TOKEN, ONE_AT_A_TIME};

/// The limit of `/limited/`, per minute.
pub const LIMIT: usize = 60;
/// How long a credential the services hand out is valid (rebound refreshes it at half).
const TOKEN_LIFE: Duration = Duration::from_secs(20);
/// The idempotency lease of the soak's routes.
const LEASE: Duration = Duration::from_secs(3);
/// The pod's token for the container credentials endpoint.
const POD_TOKEN: &str = "soak-pod-token";

fn config(port: u16, admin_port: u16, provider: &str, sentinels: &[String]) -> String {
    let sentinels = sentinels
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
shutdown_grace = "15s"

[admin]
listen = "127.0.0.1:{admin_port}"
token = "{ADMIN_TOKEN}"

[log]
level = "info"

[redis]
sentinels = [{sentinels}]
master_name = "{MASTER_NAME}"
command_timeout = "200ms"
sync_interval = "250ms"

[upstreams.openai]
url = "{provider}"
connect_timeout = "1s"

[upstreams.anthropic]
url = "{provider}"
api = "anthropic"
connect_timeout = "1s"

[upstreams.bedrock]
url = "{provider}"
api = "bedrock"
auth = "aws"
aws_region = "us-east-1"
connect_timeout = "1s"

[upstreams.vertex]
url = "{provider}"
api = "vertex-anthropic"
auth = "gcp"
gcp_project = "soak"
gcp_location = "us-east5"
connect_timeout = "1s"

[upstreams.echo]
url = "{provider}"
connect_timeout = "1s"

[[routes]]
name = "chat"
path_prefix = "/chat/"
upstream = "openai"
strip_prefix = true
retry = "soak"
idempotency = "soak"
continue_streams = true
dead_letters = true

[[routes]]
name = "claude"
path_prefix = "/claude/"
strip_prefix = true
retry = "soak"
idempotency = "soak"
continue_streams = true
dead_letters = true
balance = "weighted"
targets = [
  {{ upstream = "anthropic" }},
  {{ upstream = "bedrock", models = {{ "claude-sonnet-4-5" = "anthropic.claude-sonnet-4-5-20250929-v1:0" }} }},
  {{ upstream = "vertex" }},
]

[[routes]]
name = "limited"
path_prefix = "/limited/"
upstream = "openai"
strip_prefix = true
limits = ["per-minute"]

[[routes]]
name = "cached"
path_prefix = "/cached/"
upstream = "echo"
strip_prefix = true
cache = "soak"

[retry.soak]
max_attempts = 4
base_delay = "50ms"
max_delay = "400ms"
per_try_timeout = "1500ms"
first_byte_timeout = "1500ms"
stream_idle_timeout = "5s"
deadline = "10s"
retry_on = ["connect-failure", "refused-stream", "reset", "timeout", "429", "502", "503", "504", "529"]
max_retry_after = "3s"
budget_ratio = 1.0
budget_min_per_second = 1000

[idempotency.soak]
lease = "{lease}s"
on_concurrent = "follow"
wait_timeout = "10s"
on_store_error = "fail_closed"

[cache.soak]
ttl = "1h"

[limits.per-minute]
key = "route"
requests_per_minute = {LIMIT}
on_limit = "queue"
max_wait = "1s"
redis_down = "local"
"#,
        lease = LEASE.as_secs(),
    )
}

/// Who was handed which credential, and until when (`token-N` by the AWS container endpoint,
/// `gcp-token-N` by the metadata server).
pub type Issued = Arc<Mutex<HashMap<String, SystemTime>>>;

/// The two credential services, which can be made slow or taken down.
pub struct Clouds {
    aws: StandIn,
    gcp: StandIn,
    down: Arc<AtomicBool>,
    pub issued: Issued,
}

impl Clouds {
    async fn start() -> Clouds {
        let down = Arc::new(AtomicBool::new(false));
        let issued: Issued = Arc::default();
        let (d, i) = (down.clone(), issued.clone());
        let aws = StandIn::start(move |seen, n| {
            if d.load(Ordering::SeqCst) {
                return (503, vec![], "{}".into());
            }
            if seen.headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(POD_TOKEN) {
                return (401, vec![], "{}".into());
            }
            let token = format!("token-{}", n + 1);
            // Expiration is given in whole seconds: the credential expires at the second's start.
            let expires = floor_secs(SystemTime::now() + TOKEN_LIFE);
            i.lock().unwrap().insert(token.clone(), expires);
            let body = serde_json::json!({
                "AccessKeyId": AWS_ACCESS_KEY,
                "SecretAccessKey": AWS_SECRET,
                "Token": token,
                "Expiration": rfc3339(expires),
            });
            (200, vec![], body.to_string())
        })
        .await;
        let (d, i) = (down.clone(), issued.clone());
        let gcp = StandIn::start(move |seen, n| {
            let flavor = seen.headers.get("metadata-flavor").and_then(|v| v.to_str().ok());
            let path = "/computeMetadata/v1/instance/service-accounts/default/token";
            if d.load(Ordering::SeqCst) || seen.path != path || flavor != Some("Google") {
                return (503, vec![], String::new());
            }
            let token = format!("gcp-token-{}", n + 1);
            i.lock().unwrap().insert(token.clone(), SystemTime::now() + TOKEN_LIFE);
            (200, vec![], bearer_answer(&token, TOKEN_LIFE))
        })
        .await;
        Clouds { aws, gcp, down, issued }
    }

    /// The replicas' environment: the container endpoint and the metadata server, and nothing
    /// else of either cloud's chain.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                format!("{}/v1/credentials", self.aws.url()),
            ),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", POD_TOKEN.into()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials".into()),
            ("AWS_CONFIG_FILE", "/nonexistent/config".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("GCE_METADATA_HOST", self.gcp.addr.to_string()),
            ("CLOUDSDK_CONFIG", "/nonexistent/gcloud".into()),
        ]
    }

    fn slow(&self, wait: Duration) {
        self.aws.delay(wait);
        self.gcp.delay(wait);
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Requests each service received.
    fn asked(&self) -> (usize, usize) {
        (self.aws.count(), self.gcp.count())
    }
}

fn floor_secs(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs())
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// When the run began, on both clocks (the provider's ledger has instants; windows and
/// credentials are on the wall clock).
#[derive(Clone, Copy)]
pub struct Anchor {
    pub instant: Instant,
    pub wall: SystemTime,
}

impl Anchor {
    pub fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.instant) {
            Some(after) => self.wall + after,
            None => self.wall - (self.instant - at),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let minutes: Option<f64> = std::env::var("REBOUND_CHAOS_MINUTES").ok().and_then(|v| v.parse().ok());
    let seed: u64 = std::env::var("REBOUND_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::SEED);
    let rate: f64 = std::env::var("REBOUND_CHAOS_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if minutes.is_some() { 100.0 } else { 25.0 });
    let anchor = Anchor {
        instant: Instant::now(),
        wall: SystemTime::now(),
    };
    let started = anchor.instant;
    eprintln!(
        "soak: seed {seed}, {rate} flows/s, {}",
        minutes.map_or("bounded run".to_string(), |m| format!("{m} min"))
    );

    let provider = Arc::new(FakeProvider::start().await);
    let mut redis = tokio::task::block_in_place(RedisSentinel::start);
    let clouds = Clouds::start().await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (port, admin_port) = (free_port(), free_port());
        replicas.push(Replica {
            toml: config(port, admin_port, &provider.url(), &redis.sentinel_urls()),
            env: clouds.env(),
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            process: None,
        });
    }
    for r in &mut replicas {
        r.start().await;
    }
    let clients = Arc::new(Clients {
        urls: replicas.iter().map(|r| r.url.clone()).collect(),
    });
    let load = Load::start(clients, provider.clone(), seed, rate, Spec::draw_every);

    let mut inj = Injections::default();
    let end = minutes.map(|m| started + Duration::from_secs_f64(m * 60.0));
    loop {
        tokio::time::sleep(Duration::from_secs(6)).await;
        clouds.slow(Duration::from_secs(3));
        say(&mut inj, started, "credential services slow: 3 s per answer".into());
        tokio::time::sleep(Duration::from_secs(4)).await;
        redis_frozen(&redis, &mut inj);
        tokio::time::sleep(Duration::from_secs(4)).await;
        clouds.slow(Duration::ZERO);
        replica_killed(&mut replicas[1], 1, &mut inj).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        clouds.set_down(true);
        say(&mut inj, started, "credential services down (503) for 15 s".into());
        tokio::time::sleep(Duration::from_secs(4)).await;
        redis_failed_over(&mut redis, &mut inj);
        tokio::time::sleep(Duration::from_secs(8)).await;
        clouds.set_down(false);
        say(&mut inj, started, "credential services back".into());
        replica_killed(&mut replicas[2], 2, &mut inj).await;
        tokio::time::sleep(Duration::from_secs(8)).await;
        match end {
            Some(end) if Instant::now() + Duration::from_secs(185) < end => {
                // A quiet while, so that whole minutes without a fault check the limit's own
                // bound (the minutes the faults touch check the looser one).
                say(&mut inj, started, "no fault for 125 s".into());
                tokio::time::sleep(Duration::from_secs(125)).await;
                continue;
            }
            Some(end) => tokio::time::sleep(end.saturating_duration_since(Instant::now())).await,
            None => {}
        }
        break;
    }
    let load_for = started.elapsed();
    let (flows, skipped) = load.finish().await;
    let (aws, gcp) = clouds.asked();
    say(
        &mut inj,
        started,
        format!("credential services asked: AWS container endpoint {aws}, metadata server {gcp}"),
    );
    let mut pages = Vec::new();
    for r in &replicas {
        pages.push(r.metrics().await);
    }

    let report = crate::checks::check(&flows, &provider, &mut inj);
    let limits = crate::soak_checks::limits(&provider, anchor, &inj.windows);
    let seen = crate::soak_checks::Seen {
        flows: &flows,
        provider: &provider,
        windows: &inj.windows,
    };
    let extra = [
        limits,
        seen.cloud_credentials(anchor, &clouds.issued, &pages),
        seen.cache(),
        seen.client_retries(),
        seen.continued(&pages),
    ];
    inj.checks.extend(extra);
    eprintln!("\n{}", inj.log.join("\n"));
    eprintln!("\n{}", report.table(load_for, skipped));
    eprintln!("| check | passed | measured |\n|---|---|---|");
    for (name, ok, detail) in &inj.checks {
        eprintln!("| {name} | {ok} | {detail} |");
    }
    eprintln!("soak: seed {seed}, whole run {:.1} s", started.elapsed().as_secs_f64());
    if std::env::var_os("REBOUND_CHAOS_VERBOSE").is_some() {
        for (i, r) in replicas.iter().enumerate() {
            let path = std::env::temp_dir().join(format!("rebound-soak-replica-{i}.log"));
            std::fs::write(&path, r.process().logs()).unwrap();
            eprintln!("soak: replica {i}'s log (since its last start): {}", path.display());
        }
    }
    let failures = report.failures(&inj);
    assert!(failures.is_empty(), "soak invariants broken:\n{}", failures.join("\n"));
}

/// The Redis master SIGSTOPped for 5 s: the sentinels promote its replica meanwhile, and the old
/// master, resumed, becomes the new one's replica (what it took while frozen is lost).
fn redis_frozen(redis: &RedisSentinel, inj: &mut Injections) {
    let start = Instant::now();
    let promoted = tokio::task::block_in_place(|| redis.freeze_master(Duration::from_secs(5)));
    say(
        inj,
        start,
        format!("redis master frozen (SIGSTOP) for 5 s: the other node promoted meanwhile: {promoted}"),
    );
    inj.windows.push(Window {
        kind: "redis master frozen, failed over",
        start,
        end: Instant::now() + LEASE + Duration::from_secs(1),
    });
}

/// The Redis master SIGKILLed: the sentinels promote its replica; it comes back, empty, as the
/// new master's replica.
fn redis_failed_over(redis: &mut RedisSentinel, inj: &mut Injections) {
    let start = Instant::now();
    let promoted = tokio::task::block_in_place(|| redis.fail_over(Duration::from_secs(20)));
    say(
        inj,
        start,
        format!(
            "redis master SIGKILLed: replica promoted after {promoted:?}; the killed node back as a replica after {:?}",
            start.elapsed()
        ),
    );
    inj.windows.push(Window {
        kind: "redis master killed, failed over",
        start,
        end: Instant::now() + LEASE + Duration::from_secs(1),
    });
}
