//! The HTTP vocabulary every layer shares, and nothing else: header names and header hygiene
//! ([`headers`]), the body types and the per-request log that rides on a response body ([`body`]),
//! the reading of errors that providers report inside a successful body ([`sse`]), what each API
//! knows, one file per family of models: what a request names and its envelope for each host
//! ([`api`]), the JSON scan it is read with ([`json`]), and Bedrock's binary event stream re-framed as Anthropic's server-sent events
//! ([`eventstream`]).
//!
//! It imports only [`crate::metrics`] (the request log counts the response when its body ends),
//! [`crate::time`] (when the request started) and [`crate::config`] (the API a host speaks). The pipeline, jobs, dead letters, idempotency
//! and the retry policy all use it; it never uses them.

pub(crate) mod api;
pub mod body;
pub(crate) mod eventstream;
pub mod headers;
pub(crate) mod json;
pub mod sse;
pub mod usage;
