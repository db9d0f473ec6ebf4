//! What rebound reads back from Redis: an idempotency record's begin reply and a job hash.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebound::fuzzing::{idempotency_begin_reply, job_hash, values};

fuzz_target!(|data: &[u8]| {
    let reply = values(data);
    job_hash(&reply);
    idempotency_begin_reply(reply);
});
