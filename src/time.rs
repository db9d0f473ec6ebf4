//! The one clock. Monotonic time is `tokio::time::Instant` everywhere (so paused-time tests cover
//! it); wall-clock time is read only here, for the protocol fields that need it (HTTP-dates in
//! Retry-After, RFC 3339 reset times).

use std::time::SystemTime;

pub use tokio::time::Instant;

/// Monotonic now.
pub fn now() -> Instant {
    Instant::now()
}

/// Wall-clock now, for parsing absolute times in headers.
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}
