//! Dead letters read for the person on call (the console and `rebound dead-letters summary`):
//! grouped by cause (route, upstream, reason, error class, status, and the provider's error
//! message with its ids, numbers and quoted values masked), each group with its timeline and one
//! line of analysis: what else happened to its upstream then (from the [`crate::journal`]), and
//! whether a replay is sensible (a transient cause that has cleared, every entry with its body
//! and an `Idempotency-Key`) or pointless (a 4xx the app must fix).
//!
//! Pure: the entries, the journal's events and each upstream's state now are parameters.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{DeadLetter, Group};
use crate::journal::{Event, UpstreamNow};

/// Characters of a provider's message an entry keeps.
pub(crate) const MESSAGE_MAX: usize = 300;

/// How long before a group's first entry and after its last the journal's events count as "then".
const AROUND_MS: u64 = 60_000;

/// A group's last entry this recent means its cause may not have cleared, whatever the state.
const SETTLE_MS: u64 = 30_000;

/// What a replay of a group would do, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Transient, cleared, every entry has its body and an idempotency key: replay.
    Replay,
    /// Transient and cleared, but some entries have no idempotency key: a replay of one whose
    /// original reached the provider may generate (and bill) twice.
    ReplayWithCare,
    /// Transient, not cleared yet (the circuit is open, a hold is on): a replay now fails again.
    Wait,
    /// A request the provider refused for what it is: the app must change it; a replay is
    /// pointless.
    FixApp,
    /// No entry kept its body: nothing can be re-sent.
    NotReplayable,
}

/// A group's analysis line, and the events it read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub verdict: Verdict,
    pub line: String,
    /// What else happened to the upstream around the group, oldest first.
    #[serde(default)]
    pub events: Vec<String>,
}

/// A provider's error message as an entry keeps it: control characters out, credential-like
/// tokens (`sk-...`, `AKIA...`, long mixed letters and digits) replaced by `[redacted]`, at most
/// [`MESSAGE_MAX`] characters.
pub(crate) fn keepable_message(raw: &str) -> String {
    let mut out = String::new();
    for piece in pieces(raw) {
        match piece {
            Piece::Token(t) if looks_secret(t) => out.push_str("[redacted]"),
            Piece::Token(t) | Piece::Other(t) => out.extend(t.chars().map(|c| if c.is_control() { ' ' } else { c })),
        }
    }
    truncate(out.trim(), MESSAGE_MAX)
}

/// The message with what differs between two occurrences of one cause masked: quoted values
/// (`'...'`, `"..."`, `` `...` ``) as `'…'`, numbers (`30000`, `1.5s`, `2.5`) as `#`, any other
/// word with a digit in it (an id: `req_8f3a`, `org-abc123`, a date) as `<id>`.
pub(crate) fn mask(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(c) = rest.chars().next() {
        let prev_word = out.chars().last().is_some_and(char::is_alphanumeric);
        if matches!(c, '\'' | '"' | '`') && !prev_word {
            if let Some(end) = rest[1..].find(c) {
                out.push(c);
                out.push('…');
                out.push(c);
                rest = &rest[end + 2..];
                continue;
            }
        }
        let len = rest.find(|ch: char| !is_token_char(ch)).unwrap_or(rest.len());
        if len == 0 {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        // A sentence's full stop or colon is not part of the word.
        let word = rest[..len].trim_end_matches(['.', ':', ',', '-', '/']);
        let word = if word.is_empty() { &rest[..len] } else { word };
        out.push_str(&mask_word(word));
        rest = &rest[word.len()..];
    }
    out
}

fn mask_word(word: &str) -> String {
    if !word.chars().any(|c| c.is_ascii_digit()) {
        return word.to_string();
    }
    // A number, with at most a two-letter unit (`1.5s`, `20ms`, `8k`).
    let number = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = word.len() - number.len();
    if unit <= 2
        && number
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | ',' | '_' | '+' | '-'))
    {
        return "#".to_string();
    }
    "<id>".to_string()
}

fn is_token_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '+' | '=' | '*')
}

enum Piece<'a> {
    Token(&'a str),
    Other(&'a str),
}

fn pieces(s: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = s;
    std::iter::from_fn(move || {
        let c = rest.chars().next()?;
        let token = is_token_char(c);
        let len = rest.find(|ch: char| is_token_char(ch) != token).unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(len);
        rest = tail;
        Some(if token {
            Piece::Token(piece)
        } else {
            Piece::Other(piece)
        })
    })
}

/// A token that may be a credential: a known key prefix, or long and of letters and digits mixed.
fn looks_secret(t: &str) -> bool {
    const PREFIXES: [&str; 7] = ["sk-", "sk_", "AKIA", "ASIA", "AIza", "xox", "ghp_"];
    let letters = t.chars().filter(char::is_ascii_alphabetic).count();
    let digits = t.chars().filter(char::is_ascii_digit).count();
    (t.len() >= 12 && PREFIXES.iter().any(|p| t.starts_with(p)))
        || (t.len() >= 24 && letters >= 4 && digits >= 4 && !t.contains('/'))
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A group's stable key: 16 hex digits of what makes it one cause.
pub(crate) fn group_key(e: &DeadLetter) -> String {
    let masked = e.error_message.as_deref().map(mask).unwrap_or_default();
    let mut h = Sha256::new();
    for part in [&e.route, &e.upstream, &e.reason, &e.error_class] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(e.final_status.to_be_bytes());
    h.update(masked.as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// The span a summary's timelines cover, in `buckets` equal parts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub from_ms: u64,
    pub to_ms: u64,
    pub bucket_ms: u64,
}

impl Window {
    /// `buckets` parts from `from_ms` to `to_ms` (at least a second each).
    pub(crate) fn new(from_ms: u64, to_ms: u64, buckets: u64) -> Window {
        let span = to_ms.saturating_sub(from_ms).max(1000);
        let bucket_ms = span.div_ceil(buckets.max(1)).max(1000);
        Window {
            from_ms,
            to_ms: from_ms + span,
            bucket_ms,
        }
    }

    fn buckets(&self) -> usize {
        usize::try_from((self.to_ms - self.from_ms).div_ceil(self.bucket_ms)).unwrap_or(1)
    }

    fn bucket(&self, at_ms: u64) -> usize {
        let i = at_ms.saturating_sub(self.from_ms) / self.bucket_ms;
        usize::try_from(i)
            .unwrap_or(usize::MAX)
            .min(self.buckets().saturating_sub(1))
    }
}

/// The entries' groups, largest first, each with its timeline over `window`.
pub(crate) fn group(entries: &[DeadLetter], window: Window) -> Vec<Group> {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for e in entries {
        let key = group_key(e);
        let g = groups.entry(key.clone()).or_insert_with(|| Group {
            key,
            route: e.route.clone(),
            upstream: e.upstream.clone(),
            reason: e.reason.clone(),
            error_class: e.error_class.clone(),
            final_status: e.final_status,
            message: e.error_message.as_deref().map(mask),
            example: e.error_message.clone(),
            count: 0,
            first_seen_ms: e.time_ms,
            last_seen_ms: e.time_ms,
            replayable: 0,
            with_key: 0,
            replayed: 0,
            timeline: vec![0; window.buckets()],
            analysis: None,
        });
        g.count += 1;
        g.first_seen_ms = g.first_seen_ms.min(e.time_ms);
        g.last_seen_ms = g.last_seen_ms.max(e.time_ms);
        g.replayable += u64::from(e.replayable());
        g.with_key += u64::from(e.idempotency_key.is_some());
        g.replayed += u64::from(!e.replays.is_empty());
        if let Some(n) = g.timeline.get_mut(window.bucket(e.time_ms)) {
            *n += 1;
        }
    }
    let mut groups: Vec<Group> = groups.into_values().collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_seen_ms.cmp(&a.last_seen_ms)));
    groups
}

/// Whether a group's cause is the request itself (a 4xx other than 408 and 429).
fn app_error(g: &Group) -> bool {
    (400..500).contains(&g.final_status) && !matches!(g.final_status, 408 | 429)
}

/// The events of `g`'s upstream around it, as sentences, oldest first.
fn around(g: &Group, events: &[Event]) -> Vec<String> {
    let (from, to) = (g.first_seen_ms.saturating_sub(AROUND_MS), g.last_seen_ms + AROUND_MS);
    events
        .iter()
        .filter(|e| e.upstream == g.upstream && (from..=to).contains(&e.at_ms))
        .map(Event::sentence)
        .collect()
}

/// `g`'s analysis: what happened then, whether its cause cleared (`now`: its upstream's state at
/// `now_ms`), and what a replay would do.
pub(crate) fn analyse(g: &Group, events: &[Event], now: &UpstreamNow, now_ms: u64) -> Analysis {
    let then = around(g, events);
    let cause = cause(g);
    let (verdict, advice) = if g.replayable == 0 {
        (
            Verdict::NotReplayable,
            "No entry kept its body (set dead_letter_bodies = true on the route to make them replayable)".to_string(),
        )
    } else if app_error(g) {
        (
            Verdict::FixApp,
            format!(
                "A {} is the request itself: the app must change it; a replay is pointless",
                g.final_status
            ),
        )
    } else if let Some(why) = still(now, g, now_ms) {
        (
            Verdict::Wait,
            format!("Not cleared yet ({why}): a replay now would fail again"),
        )
    } else if g.with_key < g.replayable {
        (
            Verdict::ReplayWithCare,
            format!(
                "Cleared; {} of {} have no Idempotency-Key: a replay of one the provider had started may generate twice",
                g.replayable - g.with_key,
                g.replayable
            ),
        )
    } else {
        (
            Verdict::Replay,
            "Cleared; each has its Idempotency-Key, so a replay cannot generate twice: replay".to_string(),
        )
    };
    let mut line = cause;
    if !then.is_empty() {
        let shown: Vec<&str> = then.iter().rev().take(4).rev().map(String::as_str).collect();
        let _ = write!(line, ". Then: {}", shown.join("; "));
        if then.len() > shown.len() {
            let _ = write!(line, " (+{} earlier)", then.len() - shown.len());
        }
    }
    let _ = write!(line, ". {advice}.");
    if g.replayable < g.count && verdict != Verdict::NotReplayable {
        let _ = write!(
            line,
            " {} without their body cannot be replayed.",
            g.count - g.replayable
        );
    }
    Analysis {
        verdict,
        line,
        events: then,
    }
}

/// What the group is, in words.
fn cause(g: &Group) -> String {
    let what = match g.error_class.as_str() {
        "circuit_open" => format!("not sent: the circuit of {} was open", g.upstream),
        "cooldown" => format!("not sent: {} was cooling down after a 429", g.upstream),
        "timeout" => format!("{} timed out", g.upstream),
        "connect_failure" => format!("{} could not be reached", g.upstream),
        "reset" => format!("{} cut the connection", g.upstream),
        _ => format!("{} answered {}", g.upstream, g.final_status),
    };
    let message = g.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
    // Not sent at all: the class said why; else why rebound stopped trying.
    let stopped = match g.error_class.as_str() {
        "circuit_open" | "cooldown" => String::new(),
        _ => format!(", {}", g.reason.replace('_', " ")),
    };
    format!("{} × {what}{message}{stopped}", g.count)
}

/// Why `g`'s cause has not cleared at `now_ms`, if it has not.
fn still(now: &UpstreamNow, g: &Group, now_ms: u64) -> Option<String> {
    match now.circuit.as_deref() {
        Some("open") => return Some(format!("the circuit of {} is open", g.upstream)),
        Some("half_open") => return Some(format!("the circuit of {} is half-open, probing", g.upstream)),
        _ => {}
    }
    if let Some(hold) = now.holds.first() {
        return Some(format!("{} is {hold}", g.upstream));
    }
    (now_ms.saturating_sub(g.last_seen_ms) < SETTLE_MS).then(|| "the last one failed less than 30 s ago".to_string())
}

#[cfg(test)]
mod tests;
