//! rebound: an egress sidecar that forwards an app's calls to LLM and API providers and makes them
//! survive what providers do.
//!
//! Where each part is, what it may import and why: ARCHITECTURE.md (its code map and layer table
//! are checked against this tree by `tests/it/architecture.rs`).

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod cache;
pub(crate) mod circuit;
pub mod cli;
pub(crate) mod cloud;
pub(crate) mod config;
pub(crate) mod console;
pub(crate) mod continuation;
pub(crate) mod credentials;
pub(crate) mod dead_letters;
pub(crate) mod error;
pub(crate) mod idempotency;
pub(crate) mod jobs;
pub(crate) mod journal;
pub(crate) mod limiter;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod proxy;
pub(crate) mod redis;
pub(crate) mod reload;
pub(crate) mod retry;
pub(crate) mod routing;
pub(crate) mod server;
pub(crate) mod shutdown;
pub(crate) mod targets;
pub(crate) mod tasks;
pub mod telemetry;
pub(crate) mod time;
pub(crate) mod traces;
pub(crate) mod upstream;
pub(crate) mod wire;
pub(crate) mod words;
pub mod workers;

/// Entry points for the cargo-fuzz targets under `fuzz/` (decoders that are private otherwise).
#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod hooks;

#[cfg(test)]
mod testing;

pub use config::{Config, Runtime};
pub use server::{start, start_on, Exit, Server};
pub use workers::Workers;
