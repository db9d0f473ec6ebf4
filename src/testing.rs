//! Test helpers shared by unit tests: the property tests' configuration and the JSON documents
//! they generate.
//!
//! Every parser that a fuzz target under `fuzz/` drives is also a property test here, on stable,
//! in `cargo test`: a bounded number of cases by default, more on demand
//! (`REBOUND_FUZZ_SCALE=100 cargo test --lib`), and a new search with `REBOUND_FUZZ_SEED=<n>`
//! (fuzz/README.md lists each target's tests).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// The seed of every property test unless `REBOUND_FUZZ_SEED` names another.
const SEED: u64 = 0x5EED_F00D;

/// A proptest configuration with `cases` cases times `REBOUND_FUZZ_SCALE` (1 when unset), the
/// fixed seed [`SEED`] or `REBOUND_FUZZ_SEED` (a failure reproduces on every run with the same
/// seed) and no persistence files.
pub(crate) fn proptest_config(cases: u32) -> Config {
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    let scale = number("REBOUND_FUZZ_SCALE").unwrap_or(1).clamp(1, 1_000_000);
    let mut config = Config::with_cases(cases.saturating_mul(u32::try_from(scale).unwrap_or(u32::MAX)));
    config.rng_seed = RngSeed::Fixed(number("REBOUND_FUZZ_SEED").unwrap_or(SEED));
    config.failure_persistence = None;
    config
}

/// Any JSON value up to four levels deep, its object keys drawn from `keys` or short strings
/// with quotes, backslashes and non-ASCII; strings with control characters, quotes and emoji.
pub(crate) fn json_value(keys: &'static [&'static str]) -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let key = prop_oneof![
        proptest::sample::select(keys).prop_map(str::to_string),
        "[a-z\"\\\\\u{e9}]{0,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~\u{e9}\u{1F600}\n\"\\\\]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
