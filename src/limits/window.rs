//! Fixed windows aligned to Unix time: the minute, the UTC day and the UTC calendar month a limit
//! counts in. Every replica that reads the same time finds the same window, so the fleet's count
//! of a bucket is keyed by it (`Window::index`) with no coordination.
//!
//! Decides: which window an instant falls in, where it ends, and how long is left (for
//! `retry-after` and the `RateLimit` field's `t`). Does not read the clock: the caller passes unix
//! milliseconds (each replica's own wall clock: the replicas of a fleet agree on the window as far
//! as their clocks agree, so keep them synchronised, docs/limits.md). Fixed windows allow up to twice a limit across
//! the edge of two windows; that is the price of one counter per window, and what the gateways
//! that keep fleet-wide limits accept (docs/limits.md).

use std::fmt;

/// The length of a limit's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Period {
    /// 60 s from each whole minute of Unix time (`requests_per_minute`, `tokens_per_minute`).
    Minute,
    /// A UTC day, from 00:00 (`usd_per_day`).
    Day,
    /// A UTC calendar month, from the 1st at 00:00 (`usd_per_month`).
    Month,
}

const MINUTE_MS: u64 = 60_000;
const DAY_MS: u64 = 86_400_000;
/// The last millisecond the `time` crate can name a month of (9999-12-31T23:59:59.999Z): later
/// instants are read as this one, so every function here is total.
const LAST_MS: u64 = 253_402_300_799_999;

impl Period {
    /// The window `unix_ms` falls in.
    pub(crate) fn window(self, unix_ms: u64) -> Window {
        let index = match self {
            Period::Minute => unix_ms / MINUTE_MS,
            Period::Day => unix_ms / DAY_MS,
            Period::Month => month_index(unix_ms),
        };
        Window { period: self, index }
    }

    /// The window's nominal length in seconds, for `RateLimit-Policy`'s `w` (a month is 30 days:
    /// the field has one number, and `t` on `RateLimit` says when this month really ends).
    pub(crate) fn nominal_secs(self) -> u64 {
        match self {
            Period::Minute => 60,
            Period::Day => 86_400,
            Period::Month => 30 * 86_400,
        }
    }
}

/// One window of a period: the `index`-th minute, day or month since 1970-01-01T00:00:00Z.
/// Windows of one period are ordered in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Window {
    pub(crate) period: Period,
    pub(crate) index: u64,
}

impl Window {
    /// Unix milliseconds of the window's first instant.
    pub(crate) fn start_ms(self) -> u64 {
        match self.period {
            Period::Minute => self.index.saturating_mul(MINUTE_MS),
            Period::Day => self.index.saturating_mul(DAY_MS),
            Period::Month => month_start_ms(self.index),
        }
    }

    /// Unix milliseconds of the next window's first instant (this one's end, exclusive).
    pub(crate) fn end_ms(self) -> u64 {
        match self.period {
            Period::Minute | Period::Day => self.next().start_ms(),
            Period::Month if month_start_ms(self.index.saturating_add(1)) == LAST_MS => u64::MAX,
            Period::Month => month_start_ms(self.index.saturating_add(1)),
        }
    }

    /// The window after this one.
    pub(crate) fn next(self) -> Window {
        Window {
            period: self.period,
            index: self.index.saturating_add(1),
        }
    }

    /// Milliseconds from `unix_ms` to the window's end (0 once it has ended).
    pub(crate) fn ms_left(self, unix_ms: u64) -> u64 {
        self.end_ms().saturating_sub(unix_ms)
    }

    /// Whole seconds from `unix_ms` to the window's end, rounded up (a client told to wait this
    /// long finds the next window), 0 once it has ended.
    pub(crate) fn secs_left(self, unix_ms: u64) -> u64 {
        self.ms_left(unix_ms).div_ceil(1000)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = match self.period {
            Period::Minute => "m",
            Period::Day => "d",
            Period::Month => "mo",
        };
        write!(f, "{period}{}", self.index)
    }
}

/// Months since January 1970 of `unix_ms` (UTC).
fn month_index(unix_ms: u64) -> u64 {
    let secs = unix_ms.min(LAST_MS) / 1000;
    let Ok(at) = ::time::OffsetDateTime::from_unix_timestamp(secs as i64) else {
        return 0; // unreachable: every second up to LAST_MS is in range
    };
    let years = u64::try_from(at.year() - 1970).unwrap_or(0);
    years * 12 + u64::from(u8::from(at.month()) - 1)
}

/// Unix milliseconds of the first instant of month `index` (LAST_MS past the `time` crate's range).
fn month_start_ms(index: u64) -> u64 {
    let (year, month) = (1970 + index / 12, (index % 12) as u8 + 1);
    let date = i32::try_from(year)
        .ok()
        .zip(::time::Month::try_from(month).ok())
        .and_then(|(y, m)| ::time::Date::from_calendar_date(y, m, 1).ok());
    match date {
        Some(d) => u64::try_from(d.midnight().assume_utc().unix_timestamp()).map_or(0, |s| s * 1000),
        None => LAST_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of a UTC date and time.
    fn ms(y: i32, mo: u8, d: u8, h: u8, mi: u8, s: u8) -> u64 {
        let date = ::time::Date::from_calendar_date(y, ::time::Month::try_from(mo).unwrap(), d).unwrap();
        let t = ::time::Time::from_hms(h, mi, s).unwrap();
        date.with_time(t).assume_utc().unix_timestamp() as u64 * 1000
    }

    #[test]
    fn minutes_and_days_are_aligned_to_unix_time() {
        let at = ms(2026, 12, 5, 21, 49, 45) + 123;
        let m = Period::Minute.window(at);
        assert_eq!(m.start_ms(), ms(2026, 12, 5, 21, 49, 0));
        assert_eq!(m.end_ms(), ms(2026, 12, 5, 21, 50, 0));
        assert_eq!(m.ms_left(at), 14_877);
        assert_eq!(m.secs_left(at), 15);
        assert_eq!(m.secs_left(m.end_ms()), 0);
        assert_eq!(Period::Minute.window(m.end_ms()), m.next());
        assert_eq!(Period::Minute.window(m.end_ms() - 1), m);

        let d = Period::Day.window(at);
        assert_eq!(d.start_ms(), ms(2026, 12, 5, 0, 0, 0));
        assert_eq!(d.end_ms(), ms(2026, 12, 6, 0, 0, 0));
        assert_eq!(d.secs_left(at), 2 * 3600 + 10 * 60 + 15);
    }

    #[test]
    fn months_are_utc_calendar_months() {
        let feb = Period::Month.window(ms(2028, 2, 29, 23, 59, 59));
        assert_eq!(feb.start_ms(), ms(2028, 2, 1, 0, 0, 0));
        assert_eq!(feb.end_ms(), ms(2028, 3, 1, 0, 0, 0));
        assert_eq!(Period::Month.window(ms(2028, 3, 1, 0, 0, 0)), feb.next());
        let dec = Period::Month.window(ms(2026, 12, 31, 12, 0, 0));
        assert_eq!(dec.end_ms(), ms(2027, 1, 1, 0, 0, 0));
        assert_eq!(dec.next().start_ms(), dec.end_ms());
        assert_eq!(Period::Month.window(0).index, 0);
        assert_eq!(Period::Month.window(ms(1971, 1, 1, 0, 0, 0)).index, 12);
    }

    #[test]
    fn every_instant_has_a_window_that_contains_it() {
        for at in [0, 1, 59_999, 60_000, ms(2026, 1, 31, 23, 59, 59), LAST_MS, u64::MAX] {
            for period in [Period::Minute, Period::Day, Period::Month] {
                let w = period.window(at);
                let at = if period == Period::Month { at.min(LAST_MS) } else { at };
                assert!(w.start_ms() <= at, "{period:?} {at}");
                assert!(at < w.end_ms() || w.end_ms() == u64::MAX, "{period:?} {at}");
            }
        }
    }

    #[test]
    fn windows_order_in_time_and_display_without_ambiguity() {
        let a = Period::Minute.window(0);
        assert!(a < a.next());
        assert_eq!(a.next().to_string(), "m1");
        assert_eq!(Period::Month.window(0).to_string(), "mo0");
        assert_eq!(Period::Minute.nominal_secs(), 60);
    }
}
