//! Sentinel of the test's own: a master, a replica and three sentinels (quorum 2, a master is
//! down after 1 s of silence), on free ports. The master can be SIGKILLed; the sentinels then
//! promote the replica. The soak fails it over again and again: whichever node is master is
//! frozen or killed, and a killed node comes back as the new master's replica. Every process is
//! killed on drop.

use std::process::Child;
use std::time::{Duration, Instant};

use super::redis::{free_port, query, role, signal, spawn_server, wait_listening};

pub const MASTER_NAME: &str = "mymaster";

pub struct RedisSentinel {
    /// The first master's port.
    pub master: u16,
    /// The first replica's port.
    pub replica: u16,
    pub sentinels: Vec<u16>,
    /// The two data nodes (the first master, the first replica): port, process, directory.
    nodes: Vec<(u16, Option<Child>, std::path::PathBuf)>,
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
        let replica_child = spawn_server(
            replica,
            &replica_dir,
            &["--replicaof", "127.0.0.1", &master.to_string()],
        );
        wait_listening(replica);
        let mut others = Vec::new();
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
            nodes: vec![
                (master, Some(master_child), dir.path().to_path_buf()),
                (replica, Some(replica_child), replica_dir),
            ],
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

    /// SIGKILLs the first master.
    pub fn kill_master(&mut self) {
        if let Some(mut c) = self.nodes[0].1.take() {
            signal(&c, "-KILL");
            let _ = c.wait();
        }
    }

    /// The node that is master now (by its own `ROLE`), and the other one.
    fn roles(&self) -> (usize, usize) {
        match role(self.nodes[1].0).as_deref() {
            Some("master") if role(self.nodes[0].0).as_deref() != Some("master") => (1, 0),
            _ => (0, 1),
        }
    }

    /// SIGSTOPs the master for `pause` (past the sentinels' 1 s, so they promote the other
    /// node; the frozen one, resumed, is made its replica). Whether the other node was master
    /// when it resumed.
    pub fn freeze_master(&self, pause: Duration) -> bool {
        let (m, other) = self.roles();
        let child = self.nodes[m].1.as_ref().expect("the master runs");
        signal(child, "-STOP");
        std::thread::sleep(pause);
        signal(child, "-CONT");
        role(self.nodes[other].0).as_deref() == Some("master")
    }

    /// SIGKILLs the master, waits (at most `within`) until the sentinels promote the other node,
    /// then starts the killed node again, empty, as the new master's replica, and waits until it
    /// is in sync. How long the promotion took, if it happened.
    pub fn fail_over(&mut self, within: Duration) -> Option<Duration> {
        let (m, other) = self.roles();
        let started = Instant::now();
        if let Some(mut c) = self.nodes[m].1.take() {
            signal(&c, "-KILL");
            let _ = c.wait();
        }
        let new_master = self.nodes[other].0;
        let deadline = started + within;
        let mut promoted = None;
        while Instant::now() < deadline {
            if role(new_master).as_deref() == Some("master") {
                promoted = Some(started.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (port, _, dir) = &self.nodes[m];
        let child = spawn_server(*port, dir, &["--replicaof", "127.0.0.1", &new_master.to_string()]);
        wait_listening(*port);
        self.nodes[m].1 = Some(child);
        self.wait_synced(m, Duration::from_secs(20));
        promoted
    }

    fn wait_synced(&self, node: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let synced = query::<String>(self.nodes[node].0, ::redis::cmd("INFO").arg("replication"))
                .is_ok_and(|i| i.contains("master_link_status:up"));
            if synced {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
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
        let nodes = self.nodes.iter_mut().filter_map(|n| n.1.as_mut());
        for c in nodes.chain(self.others.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
