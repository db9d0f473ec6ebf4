//! Entry points for the cargo-fuzz targets under `fuzz/` (see fuzz/README.md): the decoders of
//! what rebound reads from Redis, which are private to their modules. Each takes arbitrary input
//! and must return, never panic.

use redis::Value;

/// Decodes an `idem_begin` script reply.
pub fn idempotency_begin_reply(reply: Vec<Value>) {
    let _ = crate::idempotency::redis_store::fuzz_parse_begin(reply);
}

/// Decodes a job hash as `HMGET` returns it.
pub fn job_hash(reply: &[Value]) {
    crate::jobs::redis_queue::fuzz_decode(reply);
}

/// Turns bytes into Redis values (a simple, stable encoding for the fuzzer to explore): each
/// value is a tag byte, then for strings a length byte and that many bytes.
pub fn values(mut data: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    while let [tag, rest @ ..] = data {
        data = rest;
        match tag % 4 {
            0 => out.push(Value::Nil),
            1 => {
                let (n, rest) = take(data, 8);
                data = rest;
                let mut b = [0u8; 8];
                b[..n.len()].copy_from_slice(n);
                out.push(Value::Int(i64::from_le_bytes(b)));
            }
            _ => {
                let Some((len, rest)) = data.split_first() else { break };
                let (s, rest) = take(rest, usize::from(*len));
                data = rest;
                out.push(Value::BulkString(s.to_vec()));
            }
        }
    }
    out
}

fn take(data: &[u8], n: usize) -> (&[u8], &[u8]) {
    data.split_at(n.min(data.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A reply value: nil, an integer, or a bulk string of any bytes or of words a reply holds.
    fn value() -> impl Strategy<Value = Value> {
        let word = proptest::sample::select(&["completed", "in_progress", "queued", "0", "1", "-1", "", "{}"][..]);
        prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            proptest::collection::vec(any::<u8>(), 0..48).prop_map(Value::BulkString),
            word.prop_map(|w| Value::BulkString(w.as_bytes().to_vec())),
        ]
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(1024))]

        /// The `redis_replies` fuzz target on stable: any bytes, and any reply of Redis values,
        /// are decoded or refused, never a panic.
        #[test]
        fn any_reply_is_decoded_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256), reply in proptest::collection::vec(value(), 0..24)) {
            let from_bytes = values(&bytes);
            prop_assert!(from_bytes.len() <= bytes.len());
            for reply in [from_bytes, reply] {
                job_hash(&reply);
                idempotency_begin_reply(reply);
            }
        }
    }
}
