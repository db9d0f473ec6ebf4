//! rebound: an egress sidecar that forwards an app's calls to LLM and API providers and makes them
//! survive what providers do.
//!
//! # Layout
//! - [`config`]: the TOML file, typed and validated before anything binds;
//! - [`server`]: listeners, accept loops, graceful shutdown ([`server::start`] is what tests call);
//! - [`shutdown`]: the drain and stop signal client connections watch;
//! - [`proxy`]: the request pipeline, top-down in one function, with header and body handling;
//! - [`routing`]: the route table (longest prefix);
//! - [`upstream`]: connection pools over rustls (HTTP/1.1 and HTTP/2), and how an attempt failed;
//! - [`retry`]: pure retry policy (backoff with jitter, Retry-After, budgets);
//! - [`circuit`]: circuit breakers and rate-limit cooldowns per upstream, shared across the fleet;
//! - [`jobs`]: async jobs (`Prefer: respond-async`): the queue, its workers, `/jobs/{id}`;
//! - [`redis`]: the Redis connection, its health and command wrapper;
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`;
//! - [`metrics`]: every metric, defined once on an owned registry;
//! - [`error`]: rebound's own errors and their one mapping to responses;
//! - [`telemetry`]: the log subscriber;
//! - [`wire`]: the HTTP vocabulary every layer shares (header names and hygiene, body types).

pub mod admin;
pub mod circuit;
pub mod cli;
pub mod config;
pub mod dead_letters;
pub mod error;
pub mod idempotency;
pub mod jobs;
pub mod metrics;
pub mod proxy;
pub mod redis;
pub mod reload;
pub mod retry;
pub mod routing;
pub mod server;
pub mod shutdown;
pub mod telemetry;
pub mod time;
pub mod traces;
pub mod upstream;
pub mod wire;

/// Entry points for the cargo-fuzz targets under `fuzz/` (decoders that are private otherwise).
#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod testing;

pub use config::Config;
pub use server::{start, Exit, Server};
