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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}
