//! Test helpers shared by unit tests.

use proptest::test_runner::{Config, RngSeed};

/// A proptest configuration with `cases` cases, a fixed seed (a failure reproduces on every
/// run) and no persistence files.
pub(crate) fn proptest_config(cases: u32) -> Config {
    let mut config = Config::with_cases(cases);
    config.rng_seed = RngSeed::Fixed(0x5EED_F00D);
    config.failure_persistence = None;
    config
}
