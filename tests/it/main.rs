//! rebound's integration tests: one binary (one link), real sockets throughout.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the clock and lock rules are the product's: harnesses measure real time and keep their own fixtures
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // fixtures (outside #[test] fns) fail loudly by design

mod support;

mod admin;
mod architecture;
mod cache;
mod circuit;
mod circuit_shared;
mod client_retries;
mod cloud_aws;
mod cloud_azure;
mod cloud_gcp;
mod concurrency;
mod config_files;
mod console;
mod continuation;
mod credentials;
mod cut_streams;
mod dead_letters;
mod docs;
mod edges;
mod event_stream;
mod failover;
mod fake_hosts;
mod follow;
mod hosts;
mod idempotency;
mod idempotency_faults;
mod idempotency_store;
mod inband;
mod jobs;
mod limit_scope;
mod limiter_store;
mod limits;
mod limits_fleet;
mod long_generation;
mod named;
mod owner_liveness;
mod passthrough;
mod pool;
mod process;
mod redis_plumbing;
mod redis_round_trips;
mod redis_tls;
mod redis_topologies;
mod reload;
mod retry;
mod shutdown;
mod tidy;
mod tls;
mod tokens;
mod traces;
mod workers;
