//! The invariants, from the provider's ledger and the clients' results.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::load::{Attempt, Fault, Flow, Kind, Outcome};
use crate::support::FakeProvider;
use crate::{Injections, Window};

/// Per fault kind: what the clients got.
#[derive(Default, Clone)]
struct Row {
    flows: usize,
    sends: usize,
    ok: usize,
    replayed: usize,
    provider_errors: usize,
    rebound_errors: usize,
    aborted: usize,
    gave_up: usize,
    violations: usize,
    allowed: usize,
}

pub struct Report {
    rows: BTreeMap<(Kind, Fault), Row>,
    rebound_codes: BTreeMap<String, usize>,
    /// Per invariant: (checked, violations, allowed by a documented window, examples).
    inv: BTreeMap<&'static str, (usize, usize, usize, Vec<String>)>,
    allowed_by: BTreeMap<&'static str, usize>,
    provider_calls: usize,
    sigterm_inflight: usize,
}

impl Report {
    fn checked(&mut self, inv: &'static str) {
        self.inv.entry(inv).or_default().0 += 1;
    }
    fn violation(&mut self, inv: &'static str, example: String) {
        let e = self.inv.entry(inv).or_default();
        e.1 += 1;
        if e.3.len() < 5 {
            e.3.push(example);
        }
    }
    fn allowed(&mut self, inv: &'static str, window: &'static str) {
        self.inv.entry(inv).or_default().2 += 1;
        *self.allowed_by.entry(window).or_default() += 1;
    }

    pub fn table(&self, load_for: Duration, skipped: u64) -> String {
        let mut t = String::new();
        let total: usize = self.rows.values().map(|r| r.flows).sum();
        let _ = writeln!(
            t,
            "chaos: {total} flows ({} sends) over {:.0} s, {} provider calls, {skipped} flows not started (400 in flight)",
            self.rows.values().map(|r| r.sends).sum::<usize>(),
            load_for.as_secs_f64(),
            self.provider_calls
        );
        let _ = writeln!(
            t,
            "| route | fault | flows | sends | 2xx complete | of which replayed/followed | provider error passed | rebound error | aborted (visible) | no head after 6 tries | violations | allowed by window |"
        );
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for ((k, f), r) in &self.rows {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                k.name(),
                f.name(),
                r.flows,
                r.sends,
                r.ok,
                r.replayed,
                r.provider_errors,
                r.rebound_errors,
                r.aborted,
                r.gave_up,
                r.violations,
                r.allowed
            );
        }
        let _ = writeln!(t, "\nrebound's own errors: {:?}", self.rebound_codes);
        let _ = writeln!(
            t,
            "\n| invariant | checked | violations | allowed by a documented window |"
        );
        let _ = writeln!(t, "|---|---|---|---|");
        for (name, (checked, v, a, _)) in &self.inv {
            let _ = writeln!(t, "| {name} | {checked} | {v} | {a} |");
        }
        let _ = writeln!(t, "\nallowed windows used: {:?}", self.allowed_by);
        let _ = writeln!(
            t,
            "requests in flight on a SIGTERMed replica: {}",
            self.sigterm_inflight
        );
        t
    }

    pub fn failures(&self, inj: &Injections) -> Vec<String> {
        let mut out = Vec::new();
        for (name, (_, v, _, examples)) in &self.inv {
            if *v > 0 {
                out.push(format!("{name}: {v} violations, e.g.:"));
                out.extend(examples.iter().map(|e| format!("    {e}")));
            }
        }
        for (name, ok, detail) in &inj.checks {
            if !ok {
                out.push(format!("{name}: {detail}"));
            }
        }
        out
    }
}

/// The first documented window that overlaps `start..end`, by its kind.
pub fn overlaps(windows: &[Window], start: Instant, end: Instant) -> Option<&'static str> {
    windows
        .iter()
        .find(|w| w.start <= end && start <= w.end)
        .map(|w| w.kind)
}

fn ms(later: Instant, earlier: Instant) -> i128 {
    if later >= earlier {
        (later - earlier).as_millis() as i128
    } else {
        -((earlier - later).as_millis() as i128)
    }
}

pub fn check(flows: &[Flow], provider: &FakeProvider, inj: &mut Injections) -> Report {
    let mut r = Report {
        rows: BTreeMap::new(),
        rebound_codes: BTreeMap::new(),
        inv: BTreeMap::new(),
        allowed_by: BTreeMap::new(),
        provider_calls: 0,
        sigterm_inflight: 0,
    };
    let bound = 2 * crate::SYNC_INTERVAL + crate::COMMAND_TIMEOUT;
    let run_start = flows.iter().flat_map(|f| f.sends.iter().map(|s| s.start())).min();
    let mut counted = std::collections::HashSet::new();
    for flow in flows {
        let spec = &flow.spec;
        let ledger = provider.requests(&spec.fake_key);
        if counted.insert(spec.fake_key.as_str()) {
            // Once per key (the soak's limited and cached flows share theirs).
            r.provider_calls += ledger.len();
        }
        let mut row = r.rows.get(&(spec.kind, spec.fault)).cloned().unwrap_or_default();
        row.flows += 1;
        let start = flow.sends.iter().map(|s| s.start()).min().expect("a send");
        let end = flow.sends.iter().map(|s| s.end()).max().expect("a send");
        let window = overlaps(&inj.windows, start, end);
        let mut violated = false;
        let mut allowed = false;
        // Every 2xx complete body, with its end and whether it was replayed or followed.
        let mut successes: Vec<(&Attempt, bool, &[u8])> = Vec::new();
        for sent in &flow.sends {
            row.sends += 1;
            for a in &sent.attempts {
                // (c) every attempt ends: never a hang.
                r.checked("(c) no hang");
                if matches!(a.outcome, Outcome::Hang) {
                    violated = true;
                    r.violation(
                        "(c) no hang",
                        format!("{} attempt {} on replica {} hung", spec.fake_key, a.token, a.replica),
                    );
                }
            }
            match &sent.last().outcome {
                Outcome::NoHead(_) => row.gave_up += 1,
                Outcome::Hang => {}
                Outcome::Response {
                    status,
                    replayed,
                    rebound_error,
                    body,
                    body_error,
                    ..
                } => {
                    let a = sent.last();
                    if (200..300).contains(status) {
                        r.checked("(c) 2xx ends complete or visibly aborted");
                        if body_error.is_some() {
                            row.aborted += 1;
                        } else if spec.complete(body) {
                            row.ok += 1;
                            if *replayed {
                                row.replayed += 1;
                            }
                            successes.push((a, *replayed, body));
                        } else if spec.cut_visibly(body) {
                            row.aborted += 1;
                        } else {
                            violated = true;
                            r.violation(
                                "(c) 2xx ends complete or visibly aborted",
                                format!(
                                    "{} ({} {}, fault {}, window {:?}) on replica {} ended cleanly but is not the whole answer ({} bytes, replayed {replayed}): {:?}",
                                    spec.fake_key,
                                    spec.kind.name(),
                                    if spec.stream { "stream" } else { "unary" },
                                    spec.fault.name(),
                                    window,
                                    a.replica,
                                    body.len(),
                                    match std::env::var_os("REBOUND_CHAOS_VERBOSE") {
                                        Some(_) => String::from_utf8_lossy(body).into_owned(),
                                        None => String::from_utf8_lossy(&body[body.len().saturating_sub(80)..]).into_owned(),
                                    }
                                ),
                            );
                        }
                    } else {
                        // (d) rebound's own errors carry x-rebound-error and a JSON body naming it;
                        // anything else must be the provider's answer passed through.
                        r.checked("(d) rebound errors: x-rebound-error + JSON");
                        let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
                        match rebound_error {
                            Some(code) => {
                                row.rebound_errors += 1;
                                *r.rebound_codes.entry(format!("{status} {code}")).or_default() += 1;
                                let named = json.as_ref().and_then(|j| j["error"]["code"].as_str()) == Some(code);
                                if !named {
                                    violated = true;
                                    r.violation(
                                        "(d) rebound errors: x-rebound-error + JSON",
                                        format!(
                                            "{} {status} {code}: body {:?}",
                                            spec.fake_key,
                                            String::from_utf8_lossy(body)
                                        ),
                                    );
                                }
                            }
                            None => {
                                row.provider_errors += 1;
                                let scripted = json
                                    .as_ref()
                                    .and_then(|j| j["error"]["message"].as_str())
                                    .is_some_and(|m| m.starts_with("scripted"));
                                if !scripted {
                                    violated = true;
                                    r.violation(
                                        "(d) rebound errors: x-rebound-error + JSON",
                                        format!(
                                            "{} {status} without x-rebound-error, not the provider's: {:?}",
                                            spec.fake_key,
                                            String::from_utf8_lossy(body)
                                        ),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        if spec.keyed {
            // Runs beyond the first: provider calls after a client had the key's whole 2xx, more
            // than one 2xx neither replayed nor followed, or a call made for a follower (a
            // follower never calls the provider: it reads the original, or a continuation run
            // for every follower after its owner died).
            let done = successes.iter().map(|(a, _, _)| a.end).min();
            let late: Vec<_> = match done {
                Some(done) => ledger.iter().filter(|c| c.at.is_some_and(|at| at > done)).collect(),
                None => Vec::new(),
            };
            let fresh = successes.iter().filter(|(_, replayed, _)| !replayed).count();
            let followers: Vec<&str> = flow
                .sends
                .iter()
                .flat_map(|s| &s.attempts)
                .filter(|a| matches!(a.outcome, Outcome::Response { replayed: true, .. }))
                .map(|a| a.token.as_str())
                .collect();
            let follower_calls = ledger
                .iter()
                .filter(|c| c.header("x-chaos-attempt").is_some_and(|t| followers.contains(&t)))
                .count();
            let second_run = !late.is_empty() || fresh > 1 || follower_calls > 0;
            // (b) two successful responses for one key are byte-identical.
            r.checked("(b) 2xx for one key identical");
            if let Some((_, _, first)) = successes.first() {
                let differs = successes.iter().find(|(_, _, b)| b != first);
                if let (Some(_), Some(w), true) = (differs, window, second_run) {
                    // A documented fault let the key run twice, each run its own bytes.
                    allowed = true;
                    r.allowed("(b) 2xx for one key identical", w);
                } else if let Some((_, _, other)) = differs {
                    violated = true;
                    let shown = |b: &[u8]| match std::env::var_os("REBOUND_CHAOS_VERBOSE") {
                        Some(_) => format!("{:?}", String::from_utf8_lossy(b)),
                        None => format!("{} bytes", b.len()),
                    };
                    r.violation(
                        "(b) 2xx for one key identical",
                        format!(
                            "{} ({}, fault {}): bodies differ: {} vs {}",
                            spec.fake_key,
                            spec.kind.name(),
                            spec.fault.name(),
                            shown(first),
                            shown(other)
                        ),
                    );
                }
            }
            // (a) no provider call after a client had the key's whole 2xx; at most one 2xx that
            // is neither replayed nor followed.
            r.checked("(a) one run per key");
            if second_run {
                match window {
                    Some(w) => {
                        allowed = true;
                        r.allowed("(a) one run per key", w);
                    }
                    None => {
                        violated = true;
                        let detail = flow
                            .sends
                            .iter()
                            .flat_map(|s| &s.attempts)
                            .map(|a| {
                                let what = match &a.outcome {
                                    Outcome::Response {
                                        status,
                                        replayed,
                                        rebound_error,
                                        body_error,
                                        ..
                                    } => format!(
                                        "{status} replayed={replayed} err={rebound_error:?} abort={body_error:?}"
                                    ),
                                    o => format!("{o:?}"),
                                };
                                format!(
                                    "[{} r{} +{}ms..+{}ms {what}]",
                                    a.token,
                                    a.replica,
                                    ms(a.start, start),
                                    ms(a.end, start)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(" ");
                        let calls = ledger
                            .iter()
                            .map(|c| {
                                format!(
                                    "{}@+{}ms",
                                    c.header("x-chaos-attempt").unwrap_or("?"),
                                    c.at.map_or(0, |at| ms(at, start))
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(" ");
                        r.violation(
                            "(a) one run per key",
                            format!(
                                "{} (+{} ms into the run) fault {}: {} fresh 2xx, {} calls after completion, {} calls for followers; sends {detail}; provider calls {calls}",
                                spec.fake_key,
                                run_start.map_or(0, |r| ms(start, r)),
                                spec.fault.name(),
                                fresh,
                                late.len(),
                                follower_calls
                            ),
                        );
                    }
                }
            }
        }
        // (e) SIGTERM loses none of the requests in flight on the replica.
        for (replica, at, _) in &inj.sigterms {
            for sent in &flow.sends {
                for a in &sent.attempts {
                    if a.replica != *replica || a.start >= *at || a.end <= *at {
                        continue;
                    }
                    let reached = a.head_at.is_some()
                        || ledger
                            .iter()
                            .any(|c| c.header("x-chaos-attempt") == Some(a.token.as_str()));
                    if !reached {
                        continue; // never read by rebound (a connection closed as the drain began): the client retried it
                    }
                    r.sigterm_inflight += 1;
                    r.checked("(e) SIGTERM loses nothing in flight");
                    let lost = match &a.outcome {
                        Outcome::NoHead(e) => Some(format!("no head: {e}")),
                        Outcome::Hang => Some("hang".into()),
                        Outcome::Response {
                            body_error: Some(e), ..
                        } if spec.fault != Fault::SseCut => Some(format!("aborted: {e}")),
                        _ => None,
                    };
                    if let Some(why) = lost {
                        violated = true;
                        r.violation(
                            "(e) SIGTERM loses nothing in flight",
                            format!("{} attempt {} on replica {replica}: {why}", spec.fake_key, a.token),
                        );
                    }
                }
            }
        }
        if violated {
            row.violations += 1;
        } else if allowed {
            row.allowed += 1;
        }
        r.rows.insert((spec.kind, spec.fault), row);
    }
    // SIGTERM exits 0 (drained within the grace).
    for (replica, _, code) in &inj.sigterms {
        r.checked("(e) SIGTERM loses nothing in flight");
        if *code != Some(0) {
            r.violation(
                "(e) SIGTERM loses nothing in flight",
                format!("replica {replica} exited {code:?} after SIGTERM"),
            );
        }
    }
    // (f) shared state works again after Redis returns.
    for (what, feature, t) in inj.recoveries.clone() {
        r.checked("(f) shared state back after Redis returns");
        let line = format!(
            "(f) after {what}: {feature} works again after {} (bound {} ms)",
            t.map_or("never (10 s)".to_string(), |t| format!("{} ms", t.as_millis())),
            bound.as_millis()
        );
        inj.log.push(line.clone());
        // Measured from the instant Redis answers again, by probes that take round trips of
        // their own on a loaded machine (a dead letter lost to the first write after the return
        // costs its probe a 1.5 s poll): the bound plus 1.5 s fails only a real stall.
        if t.is_none_or(|t| t > bound + Duration::from_millis(1500)) {
            r.violation("(f) shared state back after Redis returns", line);
        }
    }
    r
}
