//! A `redis-server` of the test's own on a free port, which the test can stop and restart.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a fresh server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        let port = free_port();
        let mut r = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Every record that holds a request fingerprint (`fp`): its key and the fingerprint.
    pub async fn fingerprints(&self) -> Vec<(String, String)> {
        let client = ::redis::Client::open(self.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
        let mut out = Vec::new();
        for k in keys {
            let fp: Option<String> = ::redis::cmd("HGET")
                .arg(&k)
                .arg("fp")
                .query_async(&mut c)
                .await
                .unwrap_or(None);
            out.extend(fp.map(|fp| (k, fp)));
        }
        out
    }

    /// Rewrites every record that holds a fingerprint of version 2 (`fp`) as a build before it
    /// wrote it: the version-1 fingerprint of a JSON `POST /fake/v1/chat/completions` of `body`.
    /// How many were rewritten.
    pub async fn rewrite_fingerprints_as_v1(&self, body: &str) -> usize {
        use rebound::hooks::idempotency::fingerprint::{fingerprint_v1, V2};
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", http::HeaderValue::from_static("application/json"));
        let path = "/fake/v1/chat/completions";
        let v1 = fingerprint_v1(&http::Method::POST, path, None, &headers, body.as_bytes());
        let client = ::redis::Client::open(self.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut rewritten = 0;
        for (k, _) in self
            .fingerprints()
            .await
            .into_iter()
            .filter(|(_, fp)| fp.starts_with(V2))
        {
            let () = ::redis::cmd("HSET")
                .arg(&k)
                .arg("fp")
                .arg(v1.as_str())
                .query_async(&mut c)
                .await
                .unwrap();
            rewritten += 1;
        }
        rewritten
    }

    /// A port with nothing listening (for "Redis down from the start").
    pub fn unused_url() -> String {
        format!("redis://127.0.0.1:{}/0", free_port())
    }

    /// Freezes the server (SIGSTOP): connections stay open, commands sit in its socket buffers
    /// and run when it is thawed, as with a Redis stalled by a long command, swap or a VM pause.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status().expect("kill").success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Stops the server (its data is gone: nothing is persisted).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)starts the server on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A free port `p` whose cluster bus port `p + 10000` is free too.
pub fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let p = free_port();
        if p <= 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
        // Ephemeral ports are often above 55000: try the low range directly.
        let p = 20_000 + (p % 20_000);
        if TcpListener::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// Starts `redis-server` with `args` (after `--port`/`--bind`/persistence off, in `dir`).
pub fn spawn_server(port: u16, dir: &std::path::Path, args: &[&str]) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)")
}

/// Waits until something listens on `port` (10 s at most).
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on port {port}");
}

/// One command on a fresh synchronous connection to `127.0.0.1:port` (fixtures).
pub fn query<T: ::redis::FromRedisValue>(port: u16, cmd: &mut ::redis::Cmd) -> ::redis::RedisResult<T> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    cmd.query(&mut c)
}

/// The role (`master`, `slave`, `sentinel`) of the server on `port`, if it answers.
pub fn role(port: u16) -> Option<String> {
    let v: ::redis::Value = query(port, &mut ::redis::cmd("ROLE")).ok()?;
    match v {
        ::redis::Value::Array(items) => match items.first() {
            Some(::redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

/// Sends `sig` (e.g. `-KILL`) to `child`.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {sig}");
}

/// A TLS-only redis-server (`tls-port`, a test CA) whose default user is off: only the ACL user
/// `rebound` (password `s3cret`, limited to the `rebound:` keys) gets in.
pub struct RedisTls {
    pub port: u16,
    /// The CA that signed the server's certificate, in a PEM file.
    pub ca_file: std::path::PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

/// The ACL of the test user: what rebound needs, on its own keys and channels.
pub const REBOUND_ACL: &str =
    "user rebound on >s3cret ~rebound:* &rebound:* +@all -@dangerous +info +role +wait +cluster|slots";

impl RedisTls {
    pub fn start() -> RedisTls {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = super::certs::test_pki();
        let write = |name: &str, pem: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, pem).expect("write pem");
            p
        };
        let ca_file = write("ca.pem", &pki.ca_pem);
        let cert = write("redis.pem", &pki.leaf_pem);
        let key = write("redis.key", &pki.leaf_key_pem);
        let port = free_port();
        let conf = dir.path().join("redis.conf");
        std::fs::write(
            &conf,
            format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\nuser default off\n{REBOUND_ACL}\n",
                dir.path().display(),
                cert.display(),
                key.display(),
                ca_file.display()
            ),
        )
        .expect("redis.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        wait_listening(port);
        RedisTls {
            port,
            ca_file,
            child,
            _dir: dir,
        }
    }
}

impl Drop for RedisTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
