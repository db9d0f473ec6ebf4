//! Human units in the configuration: durations (`"250ms"`, `"2s"`, `"5m"`, `"24h"`) and sizes
//! (`"8MiB"`, `"512KiB"`, `"100B"`). Pure parsing; the caller names the key in its error.

use std::time::Duration;

/// Parses a duration: a non-negative decimal number followed by `ms`, `s`, `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let factor_ms: f64 = match unit.trim() {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "" => return Err("a unit (ms, s, m or h), as in \"250ms\" or \"2s\"".into()),
        _ => return Err("a duration such as \"250ms\", \"2s\", \"5m\" or \"24h\"".into()),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| "a duration such as \"250ms\", \"2s\", \"5m\" or \"24h\"".to_string())?;
    let ms = value * factor_ms;
    if !ms.is_finite() || ms > 365.0 * 24.0 * 3_600_000.0 {
        return Err("a duration of at most a year".into());
    }
    Ok(Duration::from_micros((ms * 1000.0).round() as u64))
}

/// Parses a size: an integer followed by `B`, `KiB`, `MiB`, `GiB` (powers of 1024) or `KB`, `MB`,
/// `GB` (powers of 1000).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let expected = || "a size such as \"8MiB\", \"512KiB\" or \"100B\"".to_string();
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| expected())?;
    let factor: u64 = match unit.trim() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(expected()),
    };
    n.checked_mul(factor).ok_or_else(|| "a size below 16 EiB".to_string())
}

/// Formats a duration the way the config writes it (for `rebound check`).
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Formats a size in the largest binary unit that divides it.
pub(crate) fn format_size(n: u64) -> String {
    for (unit, f) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= f && n % f == 0 {
            return format!("{}{unit}", n / f);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for bad in ["", "5", "s", "-1s", "1.2.3s", "5 minutes", "1e3s", "9999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
        for bad in ["", "8", "8mb", "-1B", "1.5MiB", "99999999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["250ms", "2s", "5m", "24h", "0s"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
        for s in ["8MiB", "512KiB", "100B", "1GiB"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::testing::proptest_config(512))]

            #[test]
            fn parsers_never_panic(s in any::<String>()) {
                let _ = parse_duration(&s);
                let _ = parse_size(&s);
            }

            #[test]
            fn what_is_formatted_parses_back(ms in 0u64..365 * 24 * 3_600_000, n in any::<u64>()) {
                let d = Duration::from_millis(ms);
                prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
                prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
            }
        }
    }
}
