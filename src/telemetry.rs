//! Logging: one `tracing` subscriber, JSON or text, to stdout. `[log] level` applies to rebound's
//! own events; every dependency logs at `warn` so that no library (h2, hyper, rustls) ever prints
//! a request header. rebound itself never logs a header value or a query string.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber (once, from `main`).
pub fn init(log: &LogConfig) {
    let filter = EnvFilter::new(format!("warn,rebound={}", log.level));
    // Colours only on a terminal: a file or a pipe gets plain text.
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .with_writer(std::io::stdout);
    let _ = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Text => builder.compact().try_init(),
    };
}
