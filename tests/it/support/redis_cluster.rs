//! A Redis Cluster of the test's own: `masters` masters with `replicas` replicas each, on free
//! ports, joined with `redis-cli --cluster create`; nodes can be SIGKILLed (a replica takes over
//! after `cluster-node-timeout`). Every process is killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::{free_cluster_port, query, role, signal, spawn_server, wait_listening};

/// Held by the tests that start a whole topology (a cluster, a Sentinel set): one at a time, so
/// that they do not starve the rest of the suite on a small machine.
pub static TOPOLOGY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct RedisCluster {
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
    _dir: tempfile::TempDir,
}

/// How long a node may be silent before the others fail it over.
pub const NODE_TIMEOUT_MS: u64 = 1000;

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = masters * (1 + replicas);
        let mut ports: Vec<u16> = Vec::with_capacity(n);
        while ports.len() < n {
            let p = free_cluster_port();
            if !ports.iter().any(|&q| q == p || q + 10_000 == p || p + 10_000 == q) {
                ports.push(p);
            }
        }
        let timeout = NODE_TIMEOUT_MS.to_string();
        let children = ports
            .iter()
            .map(|&port| {
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir_all(&node_dir).expect("node dir");
                Some(spawn_server(
                    port,
                    &node_dir,
                    &["--cluster-enabled", "yes", "--cluster-node-timeout", &timeout],
                ))
            })
            .collect();
        for &p in &ports {
            wait_listening(p);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for p in &ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster {
            ports,
            children,
            _dir: dir,
        };
        cluster.wait_ok();
        cluster.wait_replicas(replicas);
        cluster
    }

    /// Waits until every slot range lists `n` replicas, each in sync with its master.
    fn wait_replicas(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while n > 0 && Instant::now() < deadline {
            let table = self.slot_table();
            let synced = table.iter().all(|(_, _, _, replicas)| {
                replicas.len() >= n
                    && replicas.iter().all(|&r| {
                        query::<String>(r, ::redis::cmd("INFO").arg("replication"))
                            .is_ok_and(|i| i.contains("master_link_status:up"))
                    })
            });
            if synced {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(n == 0, "the cluster's replicas did not sync");
    }

    /// Seed URLs (every node).
    pub fn seeds(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// Waits until every running node reports `cluster_state:ok` and sees every slot served.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ok = self.running().all(|p| {
                query::<String>(p, ::redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|i| i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384"))
            });
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not reach cluster_state:ok");
    }

    fn running(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
    }

    /// Every slot range: (first, last, master port, replica ports), as a running node sees it.
    pub fn slot_table(&self) -> Vec<(u16, u16, u16, Vec<u16>)> {
        let int = |v: &::redis::Value| match v {
            ::redis::Value::Int(n) => *n,
            _ => -1,
        };
        let port_of = |v: &::redis::Value| match v {
            ::redis::Value::Array(n) => n.get(1).map(int).unwrap_or(-1) as u16,
            _ => 0,
        };
        for p in self.running() {
            let Ok(::redis::Value::Array(ranges)) = query::<::redis::Value>(p, ::redis::cmd("CLUSTER").arg("SLOTS"))
            else {
                continue;
            };
            return ranges
                .iter()
                .filter_map(|r| match r {
                    ::redis::Value::Array(parts) if parts.len() >= 3 => Some((
                        int(&parts[0]) as u16,
                        int(&parts[1]) as u16,
                        port_of(&parts[2]),
                        parts[3..].iter().map(port_of).collect(),
                    )),
                    _ => None,
                })
                .collect();
        }
        panic!("no node answers CLUSTER SLOTS");
    }

    /// The port of the master serving `slot`, and of its replicas.
    pub fn slot_owner(&self, slot: u16) -> (u16, Vec<u16>) {
        self.slot_table()
            .into_iter()
            .find(|(a, b, _, _)| (*a..=*b).contains(&slot))
            .map(|(_, _, m, r)| (m, r))
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node of this cluster");
        if let Some(mut c) = self.children[i].take() {
            signal(&c, "-KILL");
            let _ = c.wait();
        }
    }

    /// Waits (at most `within`) until the node on `port` is a master; when it became one.
    pub fn wait_master(&self, port: u16, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if role(port).as_deref() == Some("master") {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
