use super::*;
use crate::journal::EventKind;

fn entry(status: u16, class: &str, message: Option<&str>, t: u64) -> DeadLetter {
    DeadLetter {
        id: String::new(),
        time_ms: t,
        route: "chat".into(),
        upstream: "openai".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        query: None,
        idempotency_key: Some(format!("k{t}")),
        reason: "retries_exhausted".into(),
        error_class: class.into(),
        final_status: status,
        error_message: message.map(keepable_message),
        attempts: vec![],
        headers: vec![],
        body_base64: Some("e30=".into()),
        body_kept: true,
        body_missing: None,
        body_sealed: None,
        idempotency: None,
        replays: vec![],
        job_id: None,
    }
}

#[test]
fn ids_numbers_and_quoted_values_are_masked() {
    let m = "Rate limit reached for gpt-4o in organization org-abc123 on tokens per min (TPM): \
             Limit 30000, Used 29000, Requested 1500. Please try again in 1.5s.";
    assert_eq!(
        mask(m),
        "Rate limit reached for <id> in organization <id> on tokens per min (TPM): \
         Limit #, Used #, Requested #. Please try again in #."
    );
    assert_eq!(
        mask("The model `gpt-5` does not exist or you don't have access to it"),
        "The model `…` does not exist or you don't have access to it"
    );
    assert_eq!(mask("request req_8f3aa1 failed"), "request <id> failed");
    assert_eq!(mask(r#"field "max_tokens" is 'too large'"#), r#"field "…" is '…'"#);
    // Two occurrences of one cause are one group.
    assert_eq!(
        mask("Overloaded, request id 7f9a0c1e-22b4"),
        mask("Overloaded, request id 0b0b2d11-aa10")
    );
    // An unclosed quote is a character.
    assert_eq!(mask("it's \"open"), "it's \"open");
}

#[test]
fn a_message_keeps_no_credential_and_stays_short() {
    let m = keepable_message("Incorrect API key provided: sk-proj-abc1234*************wxyz. You can find it.");
    assert!(!m.contains("sk-proj"), "{m}");
    assert!(m.contains("[redacted]"), "{m}");
    let m = keepable_message("token AKIAIOSFODNN7EXAMPLE and 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee rejected");
    assert!(!m.contains("AKIA") && !m.contains("9f8e7d6c"), "{m}");
    let long = "x ".repeat(1000);
    assert!(keepable_message(&long).chars().count() <= MESSAGE_MAX + 1);
    assert_eq!(keepable_message("bad\u{0}\nline"), "bad  line");
}

#[test]
fn hostile_messages_never_panic() {
    // Split at every byte of a message with multi-byte characters, quotes and digits.
    let m = "é'1\"`ü2` ’x\u{1F600}9'\u{0}\"";
    for i in 0..=m.len() {
        if let (Some(a), Some(b)) = (m.get(..i), m.get(i..)) {
            let _ = (mask(a), mask(b), keepable_message(a), keepable_message(b));
        }
    }
    let nested = "\"".repeat(10_000) + &"'".repeat(10_000);
    assert!(mask(&nested).len() <= nested.len() * 3);
    let huge = "9".repeat(1 << 20);
    assert_eq!(mask(&huge), "#");
}

#[test]
fn groups_split_by_masked_message_and_count_in_their_window() {
    let w = Window::new(0, 48_000, 48);
    let entries = vec![
        entry(503, "status_5xx", Some("Overloaded, request id 7f9a0c1e"), 1_000),
        entry(503, "status_5xx", Some("Overloaded, request id 0b0b2d11"), 2_500),
        entry(503, "status_5xx", Some("Service down for maintenance"), 47_999),
        entry(400, "status_4xx", Some("'max_tokens' is too large: 99999"), 10_000),
    ];
    let groups = group(&entries, w);
    assert_eq!(groups.len(), 3);
    let g = &groups[0];
    assert_eq!((g.count, g.replayable, g.with_key), (2, 2, 2));
    assert_eq!(g.message.as_deref(), Some("Overloaded, request id <id>"));
    assert_eq!(g.timeline.len(), 48);
    assert_eq!((g.timeline[1], g.timeline[2]), (1, 1));
    assert_eq!(groups.iter().map(|g| g.timeline.iter().sum::<u32>()).sum::<u32>(), 4);
    // The key is what a filter names.
    assert_eq!(g.key, group_key(&entries[0]));
    assert_ne!(group_key(&entries[0]), group_key(&entries[2]));
}

fn event(kind: EventKind, at_ms: u64) -> Event {
    Event {
        at_ms,
        upstream: "openai".into(),
        kind,
        detail: String::new(),
        count: 1,
    }
}

#[test]
fn the_analysis_says_what_happened_then_and_whether_to_replay() {
    let now_ms = 10 * 60_000;
    let entries: Vec<DeadLetter> = (0..5)
        .map(|i| entry(503, "status_5xx", Some("Overloaded"), 60_000 + i))
        .collect();
    let g = &group(&entries, Window::new(0, now_ms, 48))[0];
    let events = vec![
        event(EventKind::CircuitOpened, 61_000),
        event(EventKind::CircuitClosed, 90_000),
        event(EventKind::CircuitOpened, 500_000), // long after: not "then"
    ];
    let closed = UpstreamNow {
        circuit: Some("closed".into()),
        holds: vec![],
    };
    let a = analyse(g, &events, &closed, now_ms);
    assert_eq!(a.verdict, Verdict::Replay, "{}", a.line);
    assert_eq!(a.events.len(), 2, "{:?}", a.events);
    assert!(
        a.line.contains("the circuit opened") && a.line.contains("the circuit closed"),
        "{}",
        a.line
    );
    assert!(a.line.contains("5 × openai answered 503 (Overloaded)"), "{}", a.line);

    // Still open: wait.
    let open = UpstreamNow {
        circuit: Some("open".into()),
        holds: vec![],
    };
    assert_eq!(analyse(g, &events, &open, now_ms).verdict, Verdict::Wait);
    // Cooling down: wait.
    let cooling = UpstreamNow {
        circuit: Some("closed".into()),
        holds: vec!["cooling down".into()],
    };
    assert!(analyse(g, &events, &cooling, now_ms)
        .line
        .contains("openai is cooling down"));
    // The last one a moment ago: not cleared yet, whatever the state.
    assert_eq!(analyse(g, &events, &closed, 60_010).verdict, Verdict::Wait);

    // Without keys: with care.
    let mut keyless = entries.clone();
    keyless[0].idempotency_key = None;
    let g2 = &group(&keyless, Window::new(0, now_ms, 48))[0];
    let a = analyse(g2, &[], &closed, now_ms);
    assert_eq!(a.verdict, Verdict::ReplayWithCare);
    assert!(a.line.contains("1 of 5 have no Idempotency-Key"), "{}", a.line);

    // A 400: the app's to fix.
    let bad: Vec<DeadLetter> = (0..2)
        .map(|i| entry(400, "status_4xx", Some("bad"), 60_000 + i))
        .collect();
    let g3 = &group(&bad, Window::new(0, now_ms, 48))[0];
    assert_eq!(analyse(g3, &[], &closed, now_ms).verdict, Verdict::FixApp);

    // No bodies: nothing to replay.
    let mut bodiless = entries;
    for e in &mut bodiless {
        e.body_kept = false;
    }
    let g4 = &group(&bodiless, Window::new(0, now_ms, 48))[0];
    assert_eq!(analyse(g4, &[], &closed, now_ms).verdict, Verdict::NotReplayable);
}
