//! The `rebound` command: parse arguments, load the config, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rebound::{telemetry, Config, Exit};

/// Exit code for an invalid configuration at startup (EX_USAGE).
const EXIT_CONFIG: u8 = 64;
/// Exit code when the shutdown grace ran out and connections were closed unfinished.
const EXIT_GRACE_EXPIRED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "rebound",
    version,
    about = "An egress sidecar for LLM and API providers: retries, Retry-After, circuit breaking, idempotency, metrics."
)]
struct Cli {
    /// The configuration file.
    #[arg(long, short, env = "REBOUND_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration and print the effective routes and policies (exit 0 valid, 1 not).
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(path) = cli.config else {
        eprintln!(
            "rebound: no configuration given: use --config PATH (or REBOUND_CONFIG), e.g. --config config/rebound.toml"
        );
        return ExitCode::from(EXIT_CONFIG);
    };
    match cli.command {
        Some(Command::Check) => match Config::load(&path) {
            Ok(config) => {
                print!("{}", config.summary());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::from(1)
            }
        },
        None => serve(path),
    }
}

fn serve(path: PathBuf) -> ExitCode {
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(&config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rebound: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let source = config.source.display().to_string();
        let server = match rebound::start(config).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            proxy = %server.proxy_addr,
            admin = %server.admin_addr,
            config = %source,
            version = env!("CARGO_PKG_VERSION"),
            "rebound listening"
        );
        let signal = tokio::select! {
            signal = shutdown_signal() => signal,
            () = reload_on_sighup(&server) => "SIGHUP",
        };
        tracing::info!(signal, "shutting down");
        server.shutdown();
        let exit = tokio::select! {
            exit = server.wait() => exit,
            second = shutdown_signal() => {
                tracing::warn!(signal = second, "second signal: exiting without waiting");
                Exit::GraceExpired { closed: 0 }
            }
        };
        match exit {
            Exit::Drained => ExitCode::SUCCESS,
            Exit::GraceExpired { .. } => ExitCode::from(EXIT_GRACE_EXPIRED),
        }
    })
}

/// Reloads the configuration on every SIGHUP (never returns, unless SIGHUP cannot be watched).
async fn reload_on_sighup(server: &rebound::Server) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return std::future::pending().await;
        };
        while hup.recv().await.is_some() {
            // The outcome is logged and counted by the reloader.
            let _ = server.reload();
        }
    }
    std::future::pending().await
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}
