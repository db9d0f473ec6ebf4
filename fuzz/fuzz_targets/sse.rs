//! SSE framing and in-band error classification: the first event's end found frame by frame, the
//! mid-stream scanner, the classifiers; whatever the bytes and however they are split.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebound::hooks::wire::sse::{classify_event, classify_json, ErrorScan, EventEnd};

fuzz_target!(|data: &[u8]| {
    let _ = classify_json(data);
    let _ = classify_event(data);
    let (mut end, mut scan) = (EventEnd::default(), ErrorScan::default());
    let split = data.first().map_or(1, |b| usize::from(*b % 16) + 1);
    for chunk in data.chunks(split) {
        let _ = end.feed(chunk);
        let _ = scan.feed(chunk);
    }
});
