//! The `rebound` command: parse arguments, load the config, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rebound::{cli, telemetry, Config, Exit, Runtime};

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
#[allow(clippy::large_enum_variant)] // parsed once per process: its size costs nothing
enum Command {
    /// Validate a configuration and print the effective routes and policies (exit 0 valid, 1 not).
    Check,
    /// Inspect, replay and purge dead letters through the admin API.
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
        /// The admin API (default: the config's `[admin] listen`, else http://127.0.0.1:9901).
        #[arg(long, global = true)]
        admin: Option<String>,
        /// The admin token (default: the config's `[admin] token`).
        #[arg(long, env = "REBOUND_ADMIN_TOKEN", global = true, hide_env_values = true)]
        token: Option<String>,
        /// Print the API's JSON instead of a table.
        #[arg(long, global = true)]
        json: bool,
    },
}

#[derive(clap::Args, Clone)]
struct FilterArgs {
    /// Only this route.
    #[arg(long)]
    route: Option<String>,
    /// Only this reason (retries_exhausted, budget_exhausted, deadline_exceeded, retry_after_too_long,
    /// unsafe_to_replay, circuit_open).
    #[arg(long)]
    reason: Option<String>,
    /// Only this upstream.
    #[arg(long)]
    upstream: Option<String>,
    /// Only entries since this time (unix ms or RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Only this group of the summary (its GROUP column).
    #[arg(long)]
    group: Option<String>,
}

impl FilterArgs {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        [
            ("route", &self.route),
            ("reason", &self.reason),
            ("upstream", &self.upstream),
            ("since", &self.since),
            ("group", &self.group),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// List entries, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue from a previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Groups by cause (route, upstream, reason, class, status, the provider's message masked),
    /// each with what else happened then and whether a replay is sensible; the last 24 hours
    /// unless --since.
    Summary {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Re-send one entry (--id) or every matching entry through its route.
    Replay {
        #[arg(long)]
        id: Option<String>,
        /// Replay every entry (or every entry matching the filters).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Delete matching entries (--all for every entry).
    Purge {
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::DeadLetters {
        action,
        admin,
        token,
        json,
    }) = cli.command
    {
        return dead_letters(cli.config, action, admin, token, json);
    }
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
        Some(Command::DeadLetters { .. }) => ExitCode::FAILURE,
    }
}

fn dead_letters(
    config: Option<PathBuf>,
    action: DeadLetterAction,
    admin: Option<String>,
    token: Option<String>,
    json: bool,
) -> ExitCode {
    let loaded = config.as_deref().map(Config::load);
    if let Some(Err(errors)) = &loaded {
        eprintln!("{errors}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let loaded = loaded.and_then(Result::ok);
    let admin = admin.unwrap_or_else(|| match &loaded {
        Some(c) if c.admin.listen.ip().is_unspecified() => format!("http://127.0.0.1:{}", c.admin.listen.port()),
        Some(c) => format!("http://{}", c.admin.listen),
        None => "http://127.0.0.1:9901".to_string(),
    });
    let Some(token) = token.or_else(|| loaded.and_then(|c| c.admin.token)) else {
        eprintln!("rebound: no admin token: use --token, REBOUND_ADMIN_TOKEN, or --config with [admin] token");
        return ExitCode::from(EXIT_CONFIG);
    };
    let (action, filter) = match action {
        DeadLetterAction::List { filter, limit, cursor } => (cli::Action::List { limit, cursor }, filter),
        DeadLetterAction::Summary { filter } => (cli::Action::Summary, filter),
        DeadLetterAction::Replay { id, all, filter } => {
            if id.is_none() && !all && filter.pairs().is_empty() {
                eprintln!("rebound: say which entries to replay: --id ID, filters, or --all");
                return ExitCode::from(EXIT_CONFIG);
            }
            (cli::Action::Replay { id }, filter)
        }
        DeadLetterAction::Purge { all, filter } => {
            if !all && filter.pairs().is_empty() {
                eprintln!("rebound: say which entries to purge: filters, or --all");
                return ExitCode::from(EXIT_CONFIG);
            }
            (cli::Action::Purge, filter)
        }
    };
    let cmd = cli::Command {
        admin,
        token,
        action,
        filter: filter.pairs(),
        json,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rebound: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(&cmd)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rebound: {e}");
            ExitCode::FAILURE
        }
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
    raise_fd_limit(config.server.max_connections);
    let threads = match config.server.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n as usize,
    };
    let Some((runtime, workers)) = runtime(config.server.runtime, threads) else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async move {
        let source = config.source.display().to_string();
        // Watched before the listeners open: a signal that comes as they do is handled (a drain,
        // a reload), never the default action, which kills the process.
        let mut stop = StopSignals::watch();
        let mut hup = hangups();
        let server = match rebound::start_on(config, workers).await {
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
            signal = stop.next() => signal,
            () = reload_on_sighup(&server, &mut hup) => "SIGHUP",
        };
        tracing::info!(signal, "shutting down");
        server.shutdown();
        let exit = tokio::select! {
            exit = server.wait() => exit,
            second = stop.next() => {
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

/// The runtime `threads` workers share as `shape` says, and the workers beside its thread; `None`
/// (said on stderr) when a thread or a runtime cannot be made.
///
/// Per core (the default): this thread's single-threaded runtime accepts and runs the background
/// tasks, and each further worker is one more single-threaded runtime serving its own
/// connections with no cross-thread hop (`rebound::workers`). Work stealing: tokio's
/// multi-threaded runtime, every connection on it.
fn runtime(shape: Runtime, threads: usize) -> Option<(tokio::runtime::Runtime, rebound::Workers)> {
    let built = match shape {
        Runtime::WorkStealing if threads > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build(),
    };
    let runtime = built
        .map_err(|e| eprintln!("rebound: cannot start the runtime: {e}"))
        .ok()?;
    let more = match shape {
        Runtime::PerCore => threads.saturating_sub(1),
        Runtime::WorkStealing => 0,
    };
    let workers = rebound::Workers::spawn(more)
        .map_err(|e| eprintln!("rebound: cannot start the worker threads: {e}"))
        .ok()?;
    Some((runtime, workers))
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime and nginx's
/// `worker_rlimit_nofile` do: every client and upstream connection is a descriptor, and the usual
/// soft limit (1024 on a laptop) is far below `max_connections`. Says so when even the hard
/// limit is too low for it.
fn raise_fd_limit(max_connections: u32) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(cur), Some(max)) = (limit.current, limit.maximum) {
        if cur < max {
            limit.current = Some(max);
            if let Err(e) = setrlimit(Resource::Nofile, limit) {
                tracing::warn!(error = %e, soft = cur, hard = max, "cannot raise the open-file limit");
            }
        }
    } else if limit.current.is_some() && limit.maximum.is_none() {
        // The hard limit is unlimited: the kernel caps the soft one at fs.nr_open.
        limit.current = Some(1 << 20);
        let _ = setrlimit(Resource::Nofile, limit);
    }
    let now = getrlimit(Resource::Nofile).current;
    // A proxied request holds a client connection and at most one upstream connection (HTTP/1.1;
    // HTTP/2 shares one): two descriptors per connection is the need. The listeners, Redis and
    // log files fit in the pooled upstream connections' slack.
    let needed = 2 * u64::from(max_connections);
    if let Some(n) = now.filter(|n| *n < needed) {
        tracing::warn!(
            open_files = n,
            needed,
            max_connections,
            "the open-file limit is below 2 x max_connections: connections past it fail to open (raise the hard limit, e.g. ulimit -Hn or the container's nofile)"
        );
    }
}

/// SIGHUP, watched from now on (`None` where it cannot be).
#[cfg(unix)]
fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    signal(SignalKind::hangup()).ok()
}

#[cfg(not(unix))]
fn hangups() -> Option<()> {
    None
}

/// Reloads the configuration on every SIGHUP (never returns, unless SIGHUP cannot be watched).
#[cfg(unix)]
async fn reload_on_sighup(server: &rebound::Server, hup: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(hup) = hup {
        while hup.recv().await.is_some() {
            // The outcome is logged and counted by the reloader.
            let _ = server.reload();
        }
    }
    std::future::pending().await
}

#[cfg(not(unix))]
async fn reload_on_sighup(_: &rebound::Server, _: &mut Option<()>) {
    std::future::pending().await
}

/// SIGTERM and SIGINT, watched from when they are made.
struct StopSignals {
    #[cfg(unix)]
    watched: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl StopSignals {
    fn watch() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let watched = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(term), Ok(int)) => Some((term, int)),
                _ => None,
            };
            StopSignals { watched }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// The next SIGTERM or SIGINT, named.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some((term, int)) = &mut self.watched {
            return tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}
