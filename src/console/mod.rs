//! The operator's console: `GET /console` on the admin port, one page served from the binary
//! (`assets/`: HTML, one script, one stylesheet; no framework, no external request: the content
//! security policy allows none). What it shows comes from the admin API, behind the token:
//!
//! - the dead letters' groups with their analysis (`GET /admin/dead-letters/summary`: the
//!   store's groups, [`crate::dead_letters::analysis`], with the [`crate::journal`]'s events);
//! - one group's entries, 100 a page, one entry with its attempts; replay (after a plan:
//!   `POST /admin/dead-letters/replay?dry_run=true` says what would be sent) and purge;
//! - the fleet now (`GET /admin/fleet`): each upstream's circuit, its targets' holds, adaptive
//!   limits, the limits' decisions, jobs, continuations, the journal's last events: the same
//!   series `/metrics` has.
//!
//! The token: the page itself holds no data and is served whenever a token is configured (no
//! token, no console). The person types the token into the page; it is kept in the page's
//! memory and sent as `Authorization: Bearer` on each API call. Never in a URL, a cookie or
//! storage: a navigation cannot carry a header, a cookie would be sent by any page that posts to
//! the admin port, and HTTP Basic credentials too.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;
use serde_json::{json, Value};

use crate::dead_letters::analysis::{self};
use crate::dead_letters::{DeadLetterError, DeadLetters, Filter, Summary};
use crate::journal::{circuit_word, Journal, UpstreamNow};
use crate::metrics::Sample;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");
const ICON: &str = include_str!("assets/icon.svg");

/// Nothing but this origin; no inline script or style; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's own files at `path`, if `path` is one (`None`: not the console's).
pub(crate) fn asset(path: &str, enabled: bool) -> Option<Response<Full<Bytes>>> {
    let (body, kind) = match path {
        "/console" | "/console/" => (INDEX, "text/html; charset=utf-8"),
        "/console/console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/console/console.css" => (STYLE, "text/css; charset=utf-8"),
        "/console/icon.svg" => (ICON, "image/svg+xml"),
        _ => return None,
    };
    if !enabled {
        let mut resp = Response::new(Full::new(Bytes::from_static(
            b"the console is off: set [admin] token (the console's API calls need it)\n",
        )));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return Some(resp);
    }
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(resp)
}

/// The summary of `filter` with each group's analysis, as of now.
pub(crate) async fn summary(
    dead_letters: &DeadLetters,
    journal: &Journal,
    filter: &Filter,
) -> Result<Summary, DeadLetterError> {
    let now_ms = crate::time::now_unix_ms();
    let mut summary = dead_letters.summary(filter, now_ms).await?;
    let since = summary.window.map_or(0, |w| w.from_ms).saturating_sub(60_000);
    let events = journal.events(since);
    let (samples, _, _) = journal.now();
    for g in &mut summary.groups {
        let now = UpstreamNow::of(&samples, &g.upstream);
        g.analysis = Some(analysis::analyse(g, &events, &now, now_ms));
    }
    Ok(summary)
}

/// What `POST /admin/dead-letters/replay` with `filter` would send, without sending it.
pub(crate) async fn replay_plan(dead_letters: &DeadLetters, filter: &Filter) -> Result<Value, DeadLetterError> {
    let mut requests: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let (mut count, mut replayable, mut with_key) = (0u64, 0u64, 0u64);
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    for e in dead_letters.matching(filter).await? {
        count += 1;
        if !e.replayable() {
            let why = e.body_missing.unwrap_or_else(|| "the request body was not kept".into());
            *skipped.entry(why).or_default() += 1;
            continue;
        }
        replayable += 1;
        with_key += u64::from(e.idempotency_key.is_some());
        *requests.entry((e.route, e.method, e.path)).or_default() += 1;
    }
    let requests: Vec<Value> = requests
        .into_iter()
        .map(|((route, method, path), n)| json!({ "route": route, "method": method, "path": path, "count": n }))
        .collect();
    Ok(json!({
        "count": count,
        "replayable": replayable,
        "with_key": with_key,
        "without_key": replayable - with_key,
        "skipped": skipped,
        "requests": requests,
        "note": "Each is sent once through its route (retries, circuit, limits), with its original \
                 headers and body, credentials set by the route; one with an Idempotency-Key whose \
                 original has completed meanwhile is answered from the store, not sent again",
    }))
}

/// One upstream as the fleet view shows it.
#[derive(Debug, Default, Serialize)]
struct Upstream {
    name: String,
    circuit: Option<&'static str>,
    /// Each route's target on it: `available`, `cooling`, `paced`, `exhausted`, `open`.
    targets: Vec<Value>,
    /// Adaptive (or fixed) concurrency per model: the limit and what runs.
    concurrency: Vec<Value>,
    /// Seconds left on a cloud credential.
    credential_expires_in_s: Option<f64>,
    /// Over the last minute: requests a cooldown held back, in all and per model (the models of
    /// `[metrics] models`, the rest as `other`).
    held_back: u64,
    held_back_by_model: BTreeMap<String, u64>,
    failed_over: u64,
    limit_lowered: u64,
}

/// The fleet now: the journal's last read of the series `/metrics` has (see the module's text);
/// `redis`: whether the process has Redis configured.
pub(crate) fn fleet(journal: &Journal, redis: bool) -> Value {
    let (samples, growth, since) = journal.now();
    let mut upstreams: BTreeMap<String, Upstream> = BTreeMap::new();
    let mut scalars: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &samples {
        match s.name.as_str() {
            "circuit_state" => at(&mut upstreams, s.label("upstream")).circuit = Some(circuit_word(s.value)),
            "target_state" if s.value >= 1.0 => at(&mut upstreams, s.label("upstream"))
                .targets
                .push(json!({ "route": s.label("route"), "state": s.label("state") })),
            "concurrency_limit" => concurrency(at(&mut upstreams, s.label("upstream")), s, "limit"),
            "concurrency_in_flight" => concurrency(at(&mut upstreams, s.label("upstream")), s, "in_flight"),
            "credential_expiry_seconds" => {
                at(&mut upstreams, s.label("upstream")).credential_expires_in_s = Some(s.value)
            }
            "jobs_queue_depth" | "inflight_requests" | "dead_letters_depth" | "redis_up" => {
                scalars.insert(s.name.as_str(), s.value);
            }
            _ => {}
        }
    }
    let mut limits: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut continuations: BTreeMap<String, u64> = BTreeMap::new();
    for g in &growth {
        let n = g.value.max(0.0).round() as u64;
        match g.name.as_str() {
            "cooldown_rejections_total" if n > 0 => {
                let u = at(&mut upstreams, g.label("upstream"));
                u.held_back += n;
                *u.held_back_by_model.entry(g.label("model").to_string()).or_default() += n;
            }
            "failovers_total" => at(&mut upstreams, g.label("from")).failed_over += n,
            "concurrency_adjustments_total" if g.label("direction") == "down" => {
                at(&mut upstreams, g.label("upstream")).limit_lowered += n
            }
            "limit_decisions_total" => {
                *limits
                    .entry(g.label("limit").to_string())
                    .or_default()
                    .entry(g.label("result").to_string())
                    .or_default() += n;
            }
            "continuations_total" => *continuations.entry(g.label("result").to_string()).or_default() += n,
            _ => {}
        }
    }
    let limits: Vec<Value> = limits
        .into_iter()
        .map(|(name, counts)| json!({ "name": name, "last_minute": counts }))
        .collect();
    let now_ms = crate::time::now_unix_ms();
    let mut events = journal.events(now_ms.saturating_sub(15 * 60_000));
    events.reverse();
    events.truncate(30);
    let events: Vec<Value> = events
        .iter()
        .map(|e| json!({ "at_ms": e.at_ms, "upstream": e.upstream, "kind": e.kind, "text": e.sentence() }))
        .collect();
    let scalar = |name: &str| scalars.get(name).map(|v| v.round() as i64);
    json!({
        "at_ms": now_ms,
        "minute_since_ms": since,
        "redis": match (redis, scalar("redis_up")) {
            (false, _) => "off",
            (true, Some(1)) => "up",
            (true, _) => "down",
        },
        "requests_in_flight": scalar("inflight_requests"),
        "dead_letters": scalar("dead_letters_depth"),
        "jobs_unfinished": scalar("jobs_queue_depth"),
        "upstreams": upstreams.into_values().filter(|u| !u.name.is_empty()).collect::<Vec<_>>(),
        "limits": limits,
        "continuations_last_minute": continuations,
        "events": events,
    })
}

/// `name`'s row of the fleet view, made on first use.
fn at<'a>(upstreams: &'a mut BTreeMap<String, Upstream>, name: &str) -> &'a mut Upstream {
    upstreams.entry(name.to_string()).or_insert_with(|| Upstream {
        name: name.to_string(),
        ..Upstream::default()
    })
}

fn concurrency(u: &mut Upstream, s: &Sample, field: &str) {
    let model = s.label("model");
    let row = match u.concurrency.iter_mut().find(|r| r["model"] == model) {
        Some(row) => row,
        None => {
            u.concurrency.push(json!({ "model": model }));
            let last = u.concurrency.len() - 1;
            &mut u.concurrency[last]
        }
    };
    row[field] = json!(s.value.round() as i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_small_self_contained_and_off_without_a_token() {
        let total = INDEX.len() + SCRIPT.len() + STYLE.len() + ICON.len();
        assert!(total < 200 * 1024, "the console is {total} bytes");
        for text in [INDEX, SCRIPT, STYLE] {
            // Nothing from elsewhere: no absolute URL a browser would fetch.
            assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"));
        }
        // No inline script or style: the policy forbids them.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("style="));
        assert!(!SCRIPT.contains("innerHTML"), "render with textContent only");
        let resp = asset("/console", true).unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("default-src 'none'"));
        assert_eq!(asset("/console", false).unwrap().status(), StatusCode::NOT_FOUND);
        assert!(asset("/consoles", true).is_none());
    }
}
