//! Fleet-wide limits and budgets (`[limits.NAME]`, ../shared/DESIGN.md section 9): the pure core.
//! No I/O, no clock reads (time is a parameter: unix milliseconds for windows, an `Instant` for
//! queue deadlines), no global randomness.
//! - [`key`]: a limit's `key` and the [`key::BucketKey`] a request falls in (hashed: no key value
//!   is ever kept or shown);
//! - [`window`]: the fixed windows a limit counts in (minute, UTC day, UTC calendar month).
//!
//! It does not own: the configuration (`config` parses `[limits.NAME]` with [`key::KeySpec::parse`]),
//! how much a request reserves (its `max_tokens` and prompt, read by the pipeline), the Redis
//! scripts that keep the fleet's counts, the lease renewals' tasks, `redis_down`, the metrics or
//! the 429 `limit_exceeded` answer: the pipeline composes those from what is decided here.

// Nothing outside this module uses it yet: this allow goes once the pipeline does.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod key;
pub(crate) mod window;
