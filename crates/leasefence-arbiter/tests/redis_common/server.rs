//! Throwaway `redis-server` processes for tests that need a server with
//! settings of their own (persistence, eviction policy, a renamed command):
//! a free loopback port, a directory the caller owns, killed on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts `redis-server` on `dir` (reloading what it persisted there)
    /// with `settings` (`--name value` pairs), loading `module` if given,
    /// and waits until it answers PING (it has loaded its data). A free port can be taken by another
    /// process before the server binds it: the server that answers must be
    /// this one (its `process_id`), or it is started again on another port.
    pub fn start(dir: &Path, module: Option<&Path>, settings: &[&str]) -> Server {
        for _ in 0..5 {
            if let Some(server) = Server::try_start(dir, module, settings) {
                return server;
            }
        }
        panic!("redis-server on {dir:?} did not come up on any of 5 ports (see redis.log there)");
    }

    fn try_start(dir: &Path, module: Option<&Path>, settings: &[&str]) -> Option<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--dir"])
            .arg(dir)
            .args(["--logfile", "redis.log"])
            .args(settings);
        if let Some(so) = module {
            cmd.arg("--loadmodule").arg(so);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it on PATH?)");
        let mut server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if server.child.try_wait().ok().flatten().is_some() {
                return None;
            }
            let info = redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
            if let Ok(info) = info {
                let pid = format!("process_id:{}", server.child.id());
                if !info.lines().any(|l| l.trim() == pid) {
                    return None;
                }
                // INFO answers while the AOF is still loading; PING does not.
                let ready = redis::Client::open(server.url())
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
                if ready.is_ok() {
                    return Some(server);
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL redis-server");
        self.child.wait().expect("reap redis-server");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server` must be runnable; without it the test is skipped, or fails
/// under `CI=true`.
pub fn redis_server_available() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs redis-server on PATH"
        );
        eprintln!("skipped: redis-server is not on PATH");
    }
    ok
}
