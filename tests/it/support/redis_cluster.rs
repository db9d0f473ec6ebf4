//! A Redis Cluster of the test's own: `masters` masters with `replicas` replicas each, on free
//! ports, joined with `redis-cli --cluster create`; nodes can be SIGKILLed (a replica takes over
//! after `cluster-node-timeout`). Every process is killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::{free_cluster_port, query, role, signal, spawn_server, wait_listening};

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
        cluster
    }

    /// Seed URLs (every node).
    pub fn seeds(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// `cluster = [...]` for a config.
    pub fn toml_seeds(&self) -> String {
        let seeds: Vec<String> = self.seeds().iter().map(|s| format!("\"{s}\"")).collect();
        format!("[{}]", seeds.join(", "))
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

    /// The port of the master serving `slot`, and of its replicas (as a running node sees it).
    pub fn slot_owner(&self, slot: u16) -> (u16, Vec<u16>) {
        for p in self.running() {
            let Ok(::redis::Value::Array(ranges)) = query::<::redis::Value>(p, ::redis::cmd("CLUSTER").arg("SLOTS"))
            else {
                continue;
            };
            for r in ranges {
                let ::redis::Value::Array(parts) = r else { continue };
                let int = |v: &::redis::Value| match v {
                    ::redis::Value::Int(n) => *n,
                    _ => -1,
                };
                let port_of = |v: &::redis::Value| match v {
                    ::redis::Value::Array(n) => n.get(1).map(int).unwrap_or(-1) as u16,
                    _ => 0,
                };
                if int(&parts[0]) <= i64::from(slot) && i64::from(slot) <= int(&parts[1]) {
                    return (port_of(&parts[2]), parts[3..].iter().map(port_of).collect());
                }
            }
        }
        panic!("no node serves slot {slot}");
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
