//! The journal: what happened to each upstream lately, read off the metrics' own series once a
//! second ([`PERIOD`]): a circuit opening, probing and closing, a cooldown holding requests back,
//! a quota used up and back, a credential refresh failing, a limit refusing, the adaptive limit
//! lowered, a failover, a retry budget spent. The dead letters' analysis reads it ("what else
//! happened then"), the console shows it. The same data `/metrics` has, so nothing on the request
//! path records anything for it.
//!
//! Each replica keeps its own (bounded: [`CAP`] events). Circuits and holds are the fleet's on
//! every replica with Redis (each mirrors them), so their events are the fleet's; the counts of
//! requests held back, refused or failed over are this replica's.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::metrics::{Metrics, Sample};

/// How often the series are read.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);
/// Events kept at most (the oldest go first).
const CAP: usize = 5_000;
/// Snapshots kept for the console's per-minute counts: one every [`SNAPSHOT_EVERY_MS`] over a
/// little more than a minute.
const SNAPSHOTS: usize = 14;
const SNAPSHOT_EVERY_MS: u64 = 5_000;

/// The families read: the counters events come from, and the gauges of the state now.
pub(crate) const FAMILIES: [&str; 17] = [
    "circuit_transitions_total",
    "cooldown_rejections_total",
    "credential_refreshes_total",
    "limit_decisions_total",
    "concurrency_adjustments_total",
    "failovers_total",
    "retry_budget_exhausted_total",
    "continuations_total",
    "target_state",
    "circuit_state",
    "concurrency_limit",
    "concurrency_in_flight",
    "jobs_queue_depth",
    "inflight_requests",
    "dead_letters_depth",
    "redis_up",
    "credential_expiry_seconds",
];

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventKind {
    CircuitOpened,
    CircuitHalfOpen,
    CircuitClosed,
    Cooldown,
    QuotaUsedUp,
    QuotaBack,
    CredentialRefreshFailed,
    LimitRejected,
    ConcurrencyLowered,
    Failover,
    BudgetExhausted,
}

/// One thing that happened, in the second before `at_ms`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Event {
    pub(crate) at_ms: u64,
    /// The upstream it happened to ("" for a route's or a limit's).
    pub(crate) upstream: String,
    pub(crate) kind: EventKind,
    /// The model, the limit, the signal or the failover's target, as the kind needs.
    pub(crate) detail: String,
    /// How many times in that second (requests held back, refused, failed over).
    pub(crate) count: u64,
}

impl Event {
    /// `12:01:05 the circuit opened`: the event as the analysis line says it (UTC).
    pub(crate) fn sentence(&self) -> String {
        let time = crate::time::utc(self.at_ms);
        let time = time.get(11..).unwrap_or(&time);
        let n = self.count;
        let d = &self.detail;
        let what = match self.kind {
            EventKind::CircuitOpened => "the circuit opened".to_string(),
            EventKind::CircuitHalfOpen => "the circuit half-opened to probe".to_string(),
            EventKind::CircuitClosed => "the circuit closed".to_string(),
            EventKind::Cooldown => format!("a cooldown held back {n} request(s){}", of_model(d)),
            EventKind::QuotaUsedUp => format!("its quota was used up (route {d})"),
            EventKind::QuotaBack => format!("its quota came back (route {d})"),
            EventKind::CredentialRefreshFailed => format!("a credential refresh failed ({n}×)"),
            EventKind::LimitRejected => format!("limit {d} refused {n} request(s)"),
            EventKind::ConcurrencyLowered => format!("the adaptive limit was lowered ({d})"),
            EventKind::Failover => format!("{n} request(s) failed over to {d}"),
            EventKind::BudgetExhausted => format!("the retry budget of route {d} ran out ({n}×)"),
        };
        format!("{time} {what}")
    }
}

fn of_model(model: &str) -> String {
    if model.is_empty() || model == "other" {
        String::new()
    } else {
        format!(" for {model}")
    }
}

/// An upstream's state now, as the analysis needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct UpstreamNow {
    /// `closed`, `half_open` or `open` (`None`: no circuit series).
    pub(crate) circuit: Option<String>,
    /// What holds its targets now, in words (`cooling down`, `out of quota`).
    pub(crate) holds: Vec<String>,
}

impl UpstreamNow {
    /// `upstream`'s state in `samples`.
    pub(crate) fn of(samples: &[Sample], upstream: &str) -> UpstreamNow {
        let mut now = UpstreamNow::default();
        for s in samples.iter().filter(|s| s.label("upstream") == upstream) {
            match s.name.as_str() {
                "circuit_state" => now.circuit = Some(circuit_word(s.value).to_string()),
                "target_state" if s.value >= 1.0 => {
                    let hold = match s.label("state") {
                        "cooling" => "cooling down",
                        "exhausted" => "out of quota",
                        _ => continue,
                    };
                    if !now.holds.iter().any(|h| h == hold) {
                        now.holds.push(hold.to_string());
                    }
                }
                _ => {}
            }
        }
        now
    }
}

/// `rebound_circuit_state`'s value in words.
pub(crate) fn circuit_word(value: f64) -> &'static str {
    match value as i64 {
        0 => "closed",
        1 => "half_open",
        _ => "open",
    }
}

/// A series' identity: its name and labels.
fn series_key(s: &Sample) -> String {
    let mut k = s.name.clone();
    for (name, value) in &s.labels {
        let _ = write!(k, "\u{1}{name}={value}");
    }
    k
}

/// The events between the values of `before` (by [`series_key`]) and `samples`, at `at_ms`.
fn events_between(before: &HashMap<String, f64>, samples: &[Sample], at_ms: u64) -> Vec<Event> {
    let mut out = Vec::new();
    for s in samples {
        let prev = before.get(&series_key(s)).copied().unwrap_or(0.0);
        let delta = s.value - prev;
        let (upstream, kind, detail) = match (s.name.as_str(), delta > 0.0) {
            ("circuit_transitions_total", true) => {
                let kind = match s.label("to") {
                    "open" => EventKind::CircuitOpened,
                    "half_open" => EventKind::CircuitHalfOpen,
                    _ => EventKind::CircuitClosed,
                };
                (s.label("upstream"), kind, "")
            }
            ("cooldown_rejections_total", true) => (s.label("upstream"), EventKind::Cooldown, s.label("model")),
            ("credential_refreshes_total", true) if s.label("result") == "error" => {
                (s.label("upstream"), EventKind::CredentialRefreshFailed, "")
            }
            ("limit_decisions_total", true) if s.label("result") == "rejected" => {
                ("", EventKind::LimitRejected, s.label("limit"))
            }
            ("concurrency_adjustments_total", true) if s.label("direction") == "down" => {
                (s.label("upstream"), EventKind::ConcurrencyLowered, s.label("signal"))
            }
            ("failovers_total", true) => (s.label("from"), EventKind::Failover, s.label("to")),
            ("retry_budget_exhausted_total", true) => ("", EventKind::BudgetExhausted, s.label("route")),
            ("target_state", _) if s.label("state") == "exhausted" && delta != 0.0 => {
                let kind = if delta > 0.0 {
                    EventKind::QuotaUsedUp
                } else {
                    EventKind::QuotaBack
                };
                (s.label("upstream"), kind, s.label("route"))
            }
            _ => continue,
        };
        out.push(Event {
            at_ms,
            upstream: upstream.to_string(),
            kind,
            detail: detail.to_string(),
            count: if s.name == "target_state" {
                1
            } else {
                delta.round() as u64
            },
        });
    }
    out
}

#[derive(Default)]
struct State {
    /// The values read last, by series; `None` before the first read.
    last: Option<HashMap<String, f64>>,
    events: VecDeque<Event>,
    /// (time, values) every [`SNAPSHOT_EVERY_MS`], oldest first.
    snapshots: VecDeque<(u64, HashMap<String, f64>)>,
    /// The samples read last, for the console.
    samples: Vec<Sample>,
}

/// The journal of one replica (see the module's text).
#[derive(Default)]
pub(crate) struct Journal {
    state: parking_lot::Mutex<State>,
}

impl Journal {
    /// Takes a read of the series at `at_ms`: the events since the last read are added (the
    /// first read is the baseline).
    pub(crate) fn record(&self, samples: Vec<Sample>, at_ms: u64) {
        let values: HashMap<String, f64> = samples.iter().map(|s| (series_key(s), s.value)).collect();
        let mut st = self.state.lock();
        if let Some(last) = &st.last {
            let new = events_between(last, &samples, at_ms);
            st.events.extend(new);
            while st.events.len() > CAP {
                st.events.pop_front();
            }
        }
        if st.snapshots.back().is_none_or(|(t, _)| at_ms >= t + SNAPSHOT_EVERY_MS) {
            st.snapshots.push_back((at_ms, values.clone()));
            while st.snapshots.len() > SNAPSHOTS {
                st.snapshots.pop_front();
            }
        }
        st.last = Some(values);
        st.samples = samples;
    }

    /// The events at or after `since_ms`, oldest first.
    pub(crate) fn events(&self, since_ms: u64) -> Vec<Event> {
        let st = self.state.lock();
        st.events.iter().filter(|e| e.at_ms >= since_ms).cloned().collect()
    }

    /// The samples read last, and each counter's growth since the oldest snapshot (about a
    /// minute), by series as [`Sample`]s of the same name and labels.
    pub(crate) fn now(&self) -> (Vec<Sample>, Vec<Sample>, u64) {
        let st = self.state.lock();
        let (since, old) = match st.snapshots.front() {
            Some((t, v)) => (*t, Some(v)),
            None => (0, None),
        };
        let growth = st
            .samples
            .iter()
            .filter(|s| s.name.ends_with("_total"))
            .map(|s| Sample {
                value: s.value - old.and_then(|o| o.get(&series_key(s))).copied().unwrap_or(0.0),
                ..s.clone()
            })
            .collect();
        (st.samples.clone(), growth, since)
    }
}

/// Reads the series every [`PERIOD`] into `journal` until `stop`; `refresh` first brings the
/// scrape-time gauges up to date (the targets' states).
pub(crate) async fn run(
    journal: Arc<Journal>,
    metrics: Arc<Metrics>,
    refresh: impl Fn() + Send,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                refresh();
                journal.record(metrics.samples(&FAMILIES), crate::time::now_unix_ms());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value,
        }
    }

    #[test]
    fn counters_that_grew_are_events_the_first_read_is_the_baseline() {
        let j = Journal::default();
        let open = |v| {
            sample(
                "circuit_transitions_total",
                &[("upstream", "openai"), ("to", "open")],
                v,
            )
        };
        let cool = |v| {
            sample(
                "cooldown_rejections_total",
                &[("upstream", "openai"), ("model", "gpt-4o")],
                v,
            )
        };
        let quota = |v| {
            sample(
                "target_state",
                &[("route", "chat"), ("upstream", "openai"), ("state", "exhausted")],
                v,
            )
        };
        j.record(vec![open(3.0), cool(0.0), quota(0.0)], 1_000);
        assert!(j.events(0).is_empty(), "the baseline is not news");
        j.record(vec![open(4.0), cool(5.0), quota(1.0)], 2_000);
        j.record(vec![open(4.0), cool(5.0), quota(0.0)], 3_000);
        let kinds: Vec<(EventKind, u64)> = j.events(0).iter().map(|e| (e.kind, e.count)).collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::CircuitOpened, 1),
                (EventKind::Cooldown, 5),
                (EventKind::QuotaUsedUp, 1),
                (EventKind::QuotaBack, 1)
            ]
        );
        assert_eq!(j.events(2_500).len(), 1);
        let e = &j.events(0)[1];
        assert!(
            e.sentence().ends_with("a cooldown held back 5 request(s) for gpt-4o"),
            "{}",
            e.sentence()
        );
    }

    #[test]
    fn the_journal_is_bounded() {
        let j = Journal::default();
        for i in 0..(CAP as u64 + 100) {
            let s = sample("failovers_total", &[("from", "a"), ("to", "b")], i as f64);
            j.record(vec![s], i);
        }
        assert_eq!(j.events(0).len(), CAP);
        assert!(j.state.lock().snapshots.len() <= SNAPSHOTS);
    }

    #[test]
    fn an_upstreams_state_now() {
        let samples = vec![
            sample("circuit_state", &[("upstream", "openai")], 2.0),
            sample(
                "target_state",
                &[("route", "chat"), ("upstream", "openai"), ("state", "cooling")],
                1.0,
            ),
            sample(
                "target_state",
                &[("route", "chat"), ("upstream", "openai"), ("state", "exhausted")],
                0.0,
            ),
            sample("circuit_state", &[("upstream", "other")], 0.0),
        ];
        let now = UpstreamNow::of(&samples, "openai");
        assert_eq!(now.circuit.as_deref(), Some("open"));
        assert_eq!(now.holds, vec!["cooling down".to_string()]);
        assert_eq!(UpstreamNow::of(&samples, "other").circuit.as_deref(), Some("closed"));
    }
}
