//! The config loader, durations and sizes: a config or errors, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebound::hooks::config::units::{parse_duration, parse_size};
use rebound::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_duration(s);
        let _ = parse_size(s);
        let _ = Config::parse(s, std::path::Path::new("fuzz.toml"), &|_| None);
    }
});
