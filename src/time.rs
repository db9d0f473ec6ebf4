//! The one clock. Monotonic time is `tokio::time::Instant` everywhere (so paused-time tests cover
//! it); wall-clock time is read only here, for the protocol fields that need it (HTTP-dates in
//! Retry-After, RFC 3339 reset times).

use std::time::SystemTime;

pub use tokio::time::Instant;

/// Monotonic now: the one place the clock is read (clippy's `disallowed_methods` elsewhere).
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Wall-clock now, for parsing absolute times in headers.
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Unix milliseconds of a wall-clock time (0 before 1970): the one conversion, used by every
/// timestamp rebound records (dead letters, jobs) and by the Redis clock offset.
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Wall-clock now in unix milliseconds.
pub(crate) fn now_unix_ms() -> u64 {
    unix_ms(wall_now())
}

/// A UTC date and time of day from unix milliseconds: `(year, month, day, hour, minute, second,
/// millisecond)` (Howard Hinnant's `civil_from_days`).
pub(crate) fn civil_from_unix_ms(ms: u64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
        (ms % 1000) as u32,
    )
}

/// Unix milliseconds as RFC 3339 UTC (`2025-01-31T12:00:00.123Z`).
pub fn rfc3339(ms: u64) -> String {
    let (y, mo, d, h, mi, s, milli) = civil_from_unix_ms(ms);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// Unix milliseconds as `2026-11-29 10:04:05` (UTC), for tables.
pub(crate) fn utc(ms: u64) -> String {
    let (y, mo, d, h, mi, s, _) = civil_from_unix_ms(ms);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
}
