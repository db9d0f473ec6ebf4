//! rebound fixtures: in-process (`rebound::start` on port 0) and the real binary as a child process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use rebound::{Config, Exit, Server};

/// Parses a config from text (no environment).
pub fn parse(toml: &str) -> Config {
    Config::parse(toml, Path::new("test.toml"), &|_| None).unwrap_or_else(|e| panic!("test config invalid:\n{e}"))
}

/// rebound running in this process.
pub struct Rebound {
    pub server: Option<Server>,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// `http://127.0.0.1:PORT` of the admin listener.
    pub admin: String,
}

impl Rebound {
    pub async fn start(toml: &str) -> Rebound {
        Self::start_config(parse(toml)).await
    }

    pub async fn start_config(config: Config) -> Rebound {
        Self::start_on(config, rebound::Workers::none()).await
    }

    /// Serving client connections on `workers` besides the test's runtime.
    pub async fn start_on(config: Config, workers: rebound::Workers) -> Rebound {
        let server = rebound::start_on(config, workers).await.expect("rebound starts");
        let url = format!("http://{}", server.proxy_addr);
        let admin = format!("http://{}", server.admin_addr);
        Rebound {
            server: Some(server),
            url,
            admin,
        }
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> String {
        super::get(&format!("{}/metrics", self.admin)).await.text()
    }

    /// Starts the drain and waits for it.
    pub async fn shutdown(&mut self) -> Exit {
        let server = self.server.take().expect("running");
        server.shutdown();
        server.wait().await
    }
}

impl Drop for Rebound {
    fn drop(&mut self) {
        if let Some(s) = &self.server {
            s.shutdown();
        }
    }
}

/// The real binary, spawned with a config file; stdout (the logs) is collected.
pub struct ReboundProcess {
    pub child: Child,
    pub proxy: String,
    pub admin: String,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl ReboundProcess {
    /// Starts `rebound --config FILE` with `env` added, and waits for its "listening" line.
    pub async fn start(toml: &str, env: &[(&str, &str)]) -> ReboundProcess {
        ReboundProcess::spawn(toml, env, None).await
    }

    /// [`ReboundProcess::start`] with the open-file limits set first (`ulimit -Sn SOFT`, and
    /// `-Hn HARD` when given), through a shell that then `exec`s rebound (its pid is rebound's).
    pub async fn start_with_fd_limits(toml: &str, soft: u64, hard: Option<u64>) -> ReboundProcess {
        ReboundProcess::spawn(toml, &[], Some((soft, hard))).await
    }

    async fn spawn(toml: &str, env: &[(&str, &str)], fd_limits: Option<(u64, Option<u64>)>) -> ReboundProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let path: PathBuf = dir.path().join("rebound.toml");
        std::fs::write(&path, toml).expect("write config");
        let mut cmd = match fd_limits {
            None => Command::new(env!("CARGO_BIN_EXE_rebound")),
            Some((soft, hard)) => {
                // The soft limit first: a hard limit below the soft one is refused.
                let hard = hard.map(|h| format!(" && ulimit -Hn {h}")).unwrap_or_default();
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -Sn {soft}{hard} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_rebound"));
                sh
            }
        };
        cmd.arg("--config")
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn rebound");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, String)>(1);
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(stderr),
        ] {
            let logs = logs.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains("rebound listening") {
                        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                            let p = v["proxy"].as_str().unwrap_or_default().to_string();
                            let a = v["admin"].as_str().unwrap_or_default().to_string();
                            let _ = tx.try_send((p, a));
                        }
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let (proxy, admin) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("rebound did not start; logs: {:?}", logs.lock().unwrap()))
            .expect("listening line");
        ReboundProcess {
            child,
            proxy: format!("http://{proxy}"),
            admin: format!("http://{admin}"),
            logs,
            _dir: dir,
        }
    }

    /// The config file it runs on (tests may rewrite it).
    pub fn config_path(&self) -> PathBuf {
        self._dir.path().join("rebound.toml")
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Sends a signal (`libc`-free: through the `kill` command).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("pid");
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

/// A connected `RedisHandle` on `url` (for store tests), once it answers.
pub async fn redis_handle(url: &str) -> rebound::hooks::redis::RedisHandle {
    redis_handle_for(rebound::hooks::config::RedisConfig {
        command_timeout: Duration::from_millis(500),
        ..rebound::hooks::config::RedisConfig::standalone(url)
    })
    .await
}

/// A connected `RedisHandle` on any topology, once it answers.
pub async fn redis_handle_for(config: rebound::hooks::config::RedisConfig) -> rebound::hooks::redis::RedisHandle {
    let url = config.topology.describe();
    let metrics = std::sync::Arc::new(rebound::hooks::metrics::Metrics::new().unwrap());
    let tasks = tokio_util::task::TaskTracker::new();
    let handle =
        rebound::hooks::redis::RedisHandle::start(config, metrics, &tasks, tokio_util::sync::CancellationToken::new());
    assert!(
        super::eventually(Duration::from_secs(10), || handle.is_up()).await,
        "redis at {url} did not answer"
    );
    handle
}
