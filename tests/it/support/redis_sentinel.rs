//! Sentinel of the test's own: a master, a replica and three sentinels (quorum 2, a master is
//! down after 1 s of silence), on free ports. The master can be SIGKILLed; the sentinels then
//! promote the replica. Every process is killed on drop.

use std::process::Child;
use std::time::{Duration, Instant};

use super::redis::{free_port, query, role, signal, spawn_server, wait_listening};

pub const MASTER_NAME: &str = "mymaster";

pub struct RedisSentinel {
    pub master: u16,
    pub replica: u16,
    pub sentinels: Vec<u16>,
    master_child: Option<Child>,
    others: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        let dir = tempfile::tempdir().expect("tempdir");
        let (master, replica) = (free_port(), free_port());
        let master_child = spawn_server(master, dir.path(), &[]);
        wait_listening(master);
        let replica_dir = dir.path().join("replica");
        std::fs::create_dir_all(&replica_dir).expect("dir");
        let mut others = vec![spawn_server(
            replica,
            &replica_dir,
            &["--replicaof", "127.0.0.1", &master.to_string()],
        )];
        wait_listening(replica);
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\nsentinel down-after-milliseconds {MASTER_NAME} 1000\nsentinel failover-timeout {MASTER_NAME} 10000\nsentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir.path().display()
                ),
            )
            .expect("sentinel conf");
            let child = std::process::Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            others.push(child);
            sentinels.push(port);
        }
        for &p in &sentinels {
            wait_listening(p);
        }
        let s = RedisSentinel {
            master,
            replica,
            sentinels,
            master_child: Some(master_child),
            others,
            _dir: dir,
        };
        s.wait_ready();
        s
    }

    /// Waits until the replica is in sync and every sentinel knows the replica and the other two
    /// sentinels (a failover needs them).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let synced = query::<String>(self.replica, ::redis::cmd("INFO").arg("replication"))
                .is_ok_and(|i| i.contains("master_link_status:up"));
            let known = self.sentinels.iter().all(|&p| {
                let replicas: Vec<::redis::Value> =
                    query(p, ::redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME)).unwrap_or_default();
                let peers: Vec<::redis::Value> =
                    query(p, ::redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME)).unwrap_or_default();
                !replicas.is_empty() && peers.len() >= 2
            });
            if synced && known {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sentinel fixture not ready");
    }

    /// `sentinels` for a config: each sentinel's `redis://` URL.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// SIGKILLs the master.
    pub fn kill_master(&mut self) {
        if let Some(mut c) = self.master_child.take() {
            signal(&c, "-KILL");
            let _ = c.wait();
        }
    }

    /// Waits (at most `within`) until the replica is a master; when it became one.
    pub fn wait_promoted(&self, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if role(self.replica).as_deref() == Some("master") {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for c in self.master_child.iter_mut().chain(self.others.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
