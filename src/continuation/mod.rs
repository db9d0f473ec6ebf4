//! Mid-stream continuation (`continue_streams = true`), the pure core: no I/O, no clock, no tasks.
//! A streamed generation cut after bytes reached the app is finished by another attempt, and that
//! attempt's events are spliced into the app's stream.
//!
//! - [`seam`]: where the continuation's text meets the partial text the app has.

// The pipeline wiring comes next: until then only the tests use this module.
#![cfg_attr(not(test), allow(dead_code, unused_imports))]

pub(crate) mod seam;
