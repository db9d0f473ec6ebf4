//! The soak's invariants beyond (a) to (d) of `checks`, each a row of the check table:
//! (i) the limit's ledger per window, (j) the streams continued, (k) the cache, (l) the cloud
//! credentials the hosts received, (m) the clients' own retries.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::checks::overlaps;
use crate::load::{Flow, Kind, Outcome, CLIENT_SENDS};
use crate::soak::{Anchor, Issued, LIMIT};
use crate::support::FakeProvider;
use crate::Window;

/// A row of the check table: what, passed, what was measured.
pub type Check = (&'static str, bool, String);

/// Examples kept per check.
const EXAMPLES: usize = 5;

fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 60
}

/// (i) Per UTC minute, the requests of `/limited/` the provider received are at most the limit;
/// in a minute that a Redis fault touched, at most the limit plus each replica's share (the
/// documented bound of `redis_down = "local"`: a replica cut off from Redis admits its share on
/// its own). The provider sees a request a moment after its admission, so a call in the first
/// 200 ms of a minute may count for the minute before (where the bound has room for it).
pub fn limits(provider: &FakeProvider, anchor: Anchor, windows: &[Window]) -> Check {
    const SLACK: Duration = Duration::from_millis(200);
    let share = LIMIT.div_ceil(3);
    let (mut sure, mut early): (BTreeMap<u64, usize>, BTreeMap<u64, usize>) = Default::default();
    for at in provider.requests("limited").iter().filter_map(|c| c.at) {
        let wall = anchor.wall(at);
        let since = wall.duration_since(UNIX_EPOCH).unwrap_or_default();
        let into = Duration::from_millis(u64::try_from(since.as_millis() % 60_000).unwrap_or(0));
        let m = minute_of(wall);
        match into < SLACK {
            true => *early.entry(m).or_default() += 1,
            false => *sure.entry(m).or_default() += 1,
        }
    }
    let faulted = |m: u64| {
        windows.iter().filter(|w| w.kind.starts_with("redis")).any(|w| {
            let (s, e) = (minute_of(anchor.wall(w.start)), minute_of(anchor.wall(w.end)));
            s <= m && m <= e
        })
    };
    let first = sure.keys().chain(early.keys()).min().copied();
    let last = sure.keys().chain(early.keys()).max().copied();
    let (mut ok, mut rows, mut clean) = (true, Vec::new(), 0);
    if let (Some(first), Some(last)) = (first, last) {
        let mut kept = early.clone();
        for m in first..=last {
            let bound = if faulted(m) { LIMIT + 3 * share } else { LIMIT };
            let mut count = sure.get(&m).copied().unwrap_or(0) + kept.get(&m).copied().unwrap_or(0);
            let next = kept.get(&(m + 1)).copied().unwrap_or(0);
            let moved = next.min(bound.saturating_sub(count));
            kept.insert(m + 1, next - moved);
            count += moved;
            ok &= count <= bound;
            clean += usize::from(!faulted(m));
            rows.push(format!(
                "minute {}: {count} (bound {bound}{})",
                m % 60,
                if faulted(m) { ", Redis fault" } else { "" }
            ));
        }
    }
    let total = provider.count("limited");
    (
        "(i) a limit's window admits at most its bound",
        ok,
        format!("{total} calls, {clean} minutes without a fault; {}", rows.join("; ")),
    )
}

/// What the soak's checks read.
pub struct Seen<'a> {
    pub flows: &'a [Flow],
    pub provider: &'a FakeProvider,
    pub windows: &'a [Window],
}

impl Seen<'_> {
    fn of(&self, kind: Kind) -> impl Iterator<Item = &Flow> {
        self.flows.iter().filter(move |f| f.spec.kind == kind)
    }

    /// (l) Every request that reached Bedrock or Vertex AI carried a credential a service
    /// issued, not expired when it arrived (a second of slack: the expiry is the services'
    /// clock, the arrival the provider's), and none was refused for its signature or token.
    pub fn cloud_credentials(&self, anchor: Anchor, issued: &Issued, pages: &[String]) -> Check {
        let issued = issued.lock().unwrap().clone();
        let mut hosts: BTreeMap<&str, usize> = BTreeMap::new();
        let mut bad = Vec::new();
        for flow in self.of(Kind::Claude) {
            for call in self.provider.requests(&flow.spec.fake_key) {
                let (host, token) = if call.path.contains("/model/") {
                    ("bedrock", call.header("x-amz-security-token").map(str::to_string))
                } else if call.path.contains("/publishers/anthropic/") {
                    let bearer = call.header("authorization").and_then(|a| a.strip_prefix("Bearer "));
                    ("vertex", bearer.map(str::to_string))
                } else {
                    ("anthropic", None)
                };
                *hosts.entry(host).or_default() += 1;
                if host == "anthropic" {
                    continue;
                }
                let arrived = call.at.map(|at| anchor.wall(at));
                let why = match (&call.refused, token.as_deref().and_then(|t| issued.get(t)), arrived) {
                    (Some(refused), _, _) => Some(format!("refused: {refused}")),
                    (None, None, _) => Some(format!("a credential no service issued: {token:?}")),
                    (None, Some(&expires), Some(at)) if at > expires + Duration::from_secs(1) => Some(format!(
                        "{token:?} arrived {:?} after it expired",
                        at.duration_since(expires).unwrap_or_default()
                    )),
                    _ => None,
                };
                if let Some(why) = why {
                    bad.push(format!("{} on {host}: {why}", flow.spec.fake_key));
                }
            }
        }
        let n = bad.len();
        bad.truncate(EXAMPLES);
        (
            "(l) cloud hosts got only live credentials",
            n == 0 && hosts.contains_key("bedrock") && hosts.contains_key("vertex"),
            format!(
                "calls per host {hosts:?}, {} credentials issued, {} requests moved to another host for want of one; {n} bad {bad:?}",
                issued.len(),
                sum(pages, "rebound_failovers_total{", "reason=\"credential\"")
            ),
        )
    }

    /// (k) The cache: every answer is the tenant's own for its prompt (checked with (c)); and
    /// once a prompt's answer was stored, a later request is served from the store: a miss more
    /// than a second after an earlier request of the same prompt ended with the whole answer,
    /// outside the documented windows, is a stored answer lost.
    pub fn cache(&self) -> Check {
        let mut by_key: HashMap<&str, Vec<&Flow>> = HashMap::new();
        for flow in self.of(Kind::Cached) {
            by_key.entry(&flow.spec.fake_key).or_default().push(flow);
        }
        let (mut hits, mut misses, mut lost, mut allowed, mut examples) = (0, 0, 0, 0, Vec::new());
        for (key, flows) in &by_key {
            let attempts = || {
                flows
                    .iter()
                    .flat_map(|f| f.sends.iter().flat_map(move |s| s.attempts.iter().map(move |a| (f, a))))
            };
            let stored = attempts()
                .filter(|(f, a)| match &a.outcome {
                    Outcome::Response {
                        status: 200,
                        body,
                        body_error: None,
                        ..
                    } => f.spec.complete(body),
                    _ => false,
                })
                .map(|(_, a)| a.end)
                .min();
            for (_, a) in attempts() {
                let Outcome::Response { cache, .. } = &a.outcome else {
                    continue;
                };
                match cache.as_deref() {
                    Some("hit") => hits += 1,
                    Some("miss") => {
                        misses += 1;
                        if stored.is_some_and(|s| a.start > s + Duration::from_secs(1)) {
                            match overlaps(self.windows, a.start, a.end) {
                                Some(_) => allowed += 1,
                                None => {
                                    lost += 1;
                                    if examples.len() < EXAMPLES {
                                        examples.push(format!(
                                            "{key}: attempt {} on replica {} missed",
                                            a.token, a.replica
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let calls: usize = by_key.keys().map(|k| self.provider.count(k)).sum();
        (
            "(k) the cache serves what it stored",
            lost == 0 && hits > 0,
            format!(
                "{} prompts, {hits} hits, {misses} misses, {calls} provider calls; {lost} misses after a stored answer ({allowed} in a window) {examples:?}",
                by_key.len()
            ),
        )
    }

    /// (m) A client's own retries of a failure for good add one provider call each: a request
    /// sent [`CLIENT_SENDS`] times to its replica (4 attempts the first time) costs at most
    /// 4 + 2 calls, unless a send needed another replica or a window (a replica restarted
    /// forgets the failure) overlaps it.
    pub fn client_retries(&self) -> Check {
        let (mut checked, mut allowed, mut bad, mut calls_total) = (0, 0, Vec::new(), 0);
        for flow in self.of(Kind::ClientRetry) {
            let calls = self.provider.count(&flow.spec.fake_key);
            calls_total += calls;
            let one_replica = flow.sends.iter().all(|s| s.attempts.len() == 1)
                && flow
                    .sends
                    .iter()
                    .all(|s| s.last().replica == flow.sends[0].last().replica);
            let start = flow.sends[0].start();
            let end = flow.sends[flow.sends.len() - 1].end();
            let answered = flow
                .sends
                .iter()
                .all(|s| matches!(s.last().outcome, Outcome::Response { .. }));
            if !one_replica || !answered || overlaps(self.windows, start, end).is_some() {
                allowed += 1;
                continue;
            }
            checked += 1;
            let bound = 4 + (CLIENT_SENDS - 1);
            let repeats_one = flow.sends[1..].iter().all(|s| match &s.last().outcome {
                Outcome::Response { attempts, .. } => *attempts == Some(1),
                _ => false,
            });
            if calls > bound || !repeats_one {
                bad.push(format!(
                    "{}: {calls} calls (bound {bound}), repeats one attempt each {repeats_one}",
                    flow.spec.fake_key
                ));
            }
        }
        let n = bad.len();
        bad.truncate(EXAMPLES);
        (
            "(m) a client's retries add one call each",
            n == 0 && checked > 0,
            format!("{checked} requests checked ({allowed} on a restarted replica or moved), {calls_total} provider calls; {n} over {bad:?}"),
        )
    }

    /// (j) Streams were cut and continued: the continuations counted by the replicas (since
    /// their last start) and the cut flows that ended whole ((c) checks each one's text).
    pub fn continued(&self, pages: &[String]) -> Check {
        let failed = sum(pages, "rebound_continuations_total{", "result=\"failed\"");
        let mut results: BTreeMap<String, f64> = BTreeMap::new();
        for page in pages {
            for line in page.lines().filter(|l| l.starts_with("rebound_continuations_total{")) {
                let result = line.split("result=\"").nth(1).and_then(|r| r.split('"').next());
                let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
                if let (Some(result), Some(value)) = (result, value) {
                    *results.entry(result.to_string()).or_default() += value;
                }
            }
        }
        let whole = self
            .flows
            .iter()
            .filter(|f| matches!(f.spec.kind, Kind::Chat | Kind::Claude) && f.spec.stream && f.spec.fault.cuts())
            .filter(|f| {
                f.sends.iter().any(|s| match &s.last().outcome {
                    Outcome::Response {
                        status: 200,
                        body,
                        body_error: None,
                        replayed: false,
                        ..
                    } => f.spec.complete(body),
                    _ => false,
                })
            })
            .count();
        // Outside the documented windows, every stream its fault cut ends whole: a visible cut
        // there is a continuation that did not happen.
        let mut visible = Vec::new();
        for f in self.flows.iter().filter(|f| f.spec.stream && f.spec.fault.cuts()) {
            let start = f.sends[0].start();
            let end = f.sends.iter().map(|s| s.end()).max().unwrap_or(start);
            if !matches!(f.spec.kind, Kind::Chat | Kind::Claude) || overlaps(self.windows, start, end).is_some() {
                continue;
            }
            for s in &f.sends {
                let whole = match &s.last().outcome {
                    Outcome::Response {
                        status: 200,
                        body,
                        body_error: None,
                        ..
                    } => f.spec.complete(body),
                    Outcome::Response { status: 200, .. } => false,
                    _ => true, // not a stream the app read (a rebound error, no response)
                };
                if !whole {
                    visible.push(format!(
                        "{} ({}) attempt {}",
                        f.spec.fake_key,
                        f.spec.fault.name(),
                        s.last().token
                    ));
                }
            }
        }
        let continued = results.get("continued").copied().unwrap_or(0.0);
        let n = visible.len();
        visible.truncate(EXAMPLES);
        (
            "(j) cut streams were continued into whole ones",
            continued > 0.0 && whole > 0 && n == 0,
            format!(
                "{whole} flows cut by their fault ended whole; continuations by result {results:?} ({failed} failed); {n} cut visibly outside a window {visible:?}"
            ),
        )
    }
}

/// The sum of a counter's series (lines starting with `series`) whose labels contain `label`,
/// over the replicas' metrics pages.
fn sum(pages: &[String], series: &str, label: &str) -> f64 {
    pages
        .iter()
        .flat_map(|p| p.lines())
        .filter(|l| l.starts_with(series) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}
