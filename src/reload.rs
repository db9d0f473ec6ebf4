//! Hot reload: SIGHUP, or a change of the configuration file's contents (a mounted ConfigMap
//! changes by symlink swap; the file is re-read and compared, so any kind of update is seen),
//! builds a new [`Proxy`] and swaps it in. Requests in flight finish on the configuration they
//! started with. An invalid file is refused with its precise errors, counted in
//! `rebound_config_reloads_total{result="failure"}`, and the running configuration stays.
//!
//! What a reload cannot change without a restart: the listen addresses, the worker threads,
//! `[redis]`, `[log]` and `[jobs]` (a reload that changes them applies everything else and says
//! so in a warning).

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LoadError};
use crate::idempotency::fingerprint::digest;
use crate::proxy::{BuildError, Proxy, Shared};

/// How often the configuration file is looked at.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Invalid(#[from] LoadError),
    #[error("{0}")]
    Build(#[from] BuildError),
}

/// Reloads one configuration file into the running proxy.
pub(crate) struct Reloader {
    path: PathBuf,
    proxy: Arc<ArcSwap<Proxy>>,
    shared: Shared,
    /// What needs a restart to change, as first loaded.
    fixed: Fixed,
    /// The digest of the contents last applied or refused (so one bad edit is reported once).
    seen: Mutex<Option<String>>,
}

#[derive(PartialEq, Eq)]
struct Fixed {
    listen: SocketAddr,
    admin: SocketAddr,
    /// `worker_threads` and `runtime`: the threads are made once, at the start.
    threads: (u32, crate::config::Runtime),
    /// A digest of `[redis]` (its password included).
    redis: Option<String>,
    log: (String, String),
    /// A digest of `[jobs]` (its secret included).
    jobs: String,
}

impl Fixed {
    fn of(c: &Config) -> Fixed {
        Fixed {
            listen: c.server.listen,
            admin: c.admin.listen,
            threads: (c.server.worker_threads, c.server.runtime),
            redis: c.redis.as_ref().map(|r| {
                digest(&[
                    format!("{r:?}").as_bytes(),
                    r.topology.describe_secret().as_bytes(),
                    r.password.as_deref().unwrap_or_default().as_bytes(),
                ])
            }),
            log: (format!("{:?}", c.log.format), c.log.level.clone()),
            jobs: digest(&[
                format!("{:?}", c.jobs).as_bytes(),
                c.jobs.secret.as_deref().unwrap_or_default().as_bytes(),
            ]),
        }
    }
}

impl Reloader {
    pub(crate) fn new(config: &Config, proxy: Arc<ArcSwap<Proxy>>, shared: Shared) -> Reloader {
        let seen = std::fs::read(&config.source).ok().map(|b| digest(&[&b]));
        Reloader {
            path: config.source.clone(),
            proxy,
            shared,
            fixed: Fixed::of(config),
            seen: Mutex::new(seen),
        }
    }

    /// Loads, validates and swaps in the file's current contents.
    pub(crate) fn reload(&self, trigger: &str) -> Result<(), ReloadError> {
        if let Ok(bytes) = std::fs::read(&self.path) {
            *self.seen.lock() = Some(digest(&[&bytes]));
        }
        let result = self.try_reload();
        let label = if result.is_ok() { "success" } else { "failure" };
        self.shared
            .metrics
            .config_reloads_total
            .with_label_values(&[label])
            .inc();
        match &result {
            Ok(()) => tracing::info!(config = %self.path.display(), trigger, "configuration reloaded"),
            Err(e) => tracing::error!(
                config = %self.path.display(),
                trigger,
                error = %e,
                "configuration reload refused; the running configuration stays in force"
            ),
        }
        result
    }

    fn try_reload(&self) -> Result<(), ReloadError> {
        let config = Config::load(&self.path)?;
        if Fixed::of(&config) != self.fixed {
            tracing::warn!(
                "listen addresses, worker_threads, runtime, [redis], [log] and [jobs] changes take effect only after a restart; the rest of the new configuration is applied"
            );
        }
        let proxy = Proxy::new(&config, &self.shared)?;
        self.proxy.store(Arc::new(proxy));
        Ok(())
    }

    /// Reloads whenever the file's contents change, until `stop`.
    pub(crate) async fn watch(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            }
            let Ok(bytes) = tokio::fs::read(&self.path).await else {
                continue;
            };
            let current = digest(&[&bytes]);
            let changed = self.seen.lock().as_deref() != Some(current.as_str());
            if changed {
                let _ = self.reload("file change");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload that changes any `[redis]` key warns that it takes a restart: the store, its
    /// liveness and the fingerprint it writes are set up once per process.
    #[test]
    fn a_change_to_any_redis_key_is_one_a_reload_cannot_make() {
        let config = |redis: &str| {
            let src = format!(
                "[upstreams.u]\nurl = \"https://x\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n[redis]\nurl = \"redis://127.0.0.1:1\"\n{redis}"
            );
            Fixed::of(&Config::parse(&src, std::path::Path::new("t.toml"), &|_| None).expect("config"))
        };
        let base = config("");
        assert!(config("") == base);
        for changed in [
            "fingerprint = 1\n",
            "liveness = \"3s\"\n",
            "key_prefix = \"other:\"\n",
            "sync_interval = \"1s\"\n",
            "wait_replicas = 1\n",
            "password = \"p\"\n",
        ] {
            assert!(config(changed) != base, "{changed}");
        }
    }
}
