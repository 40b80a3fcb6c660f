//! `leasefence arbiter install` and `check` on Redis read the server's
//! settings: a throwaway `redis-server --maxmemory-policy allkeys-lru` (on a
//! free port, killed at the end) is refused with exit 5 and a message that
//! says why and what to set; the shared `LEASEFENCE_TEST_REDIS_URL`, which
//! runs without persistence, installs with a warning on stderr and exit 0.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cli;

/// A `redis-server` with `settings`, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(dir: &std::path::Path, settings: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--dir"])
            .arg(dir)
            .args(["--logfile", "redis.log"])
            .args(settings)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it on PATH?)");
        let server = Server {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while redis::Client::open(server.url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_server_available() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true needs redis-server");
        eprintln!("skipped: redis-server is not on PATH");
    }
    ok
}

#[test]
fn install_and_check_refuse_a_server_that_can_evict_fence_keys() {
    if !redis_server_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = ["--maxmemory-policy", "allkeys-lru", "--save", "", "--appendonly", "no"];
    let server = Server::start(dir.path(), &settings);
    let module_url = server.url.replacen("redis://", "redis+module://", 1);
    for args in [
        &["arbiter", "install", &server.url][..],
        &["arbiter", "check", &server.url, "--trials", "1"],
        &["arbiter", "install", &module_url],
    ] {
        let (code, out, err) = cli(args);
        assert_eq!(code, 5, "{args:?} must be refused: {out} {err}");
        assert!(
            err.contains("maxmemory-policy is allkeys-lru") && err.contains("noeviction") && err.contains("volatile-"),
            "{args:?}: says why and what to set: {err}"
        );
        assert!(!out.contains("installed"), "{out}");
    }
}

#[test]
fn install_and_check_warn_about_a_server_without_persistence() {
    let Ok(url) = std::env::var("LEASEFENCE_TEST_REDIS_URL") else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs LEASEFENCE_TEST_REDIS_URL"
        );
        eprintln!("skipped: LEASEFENCE_TEST_REDIS_URL not set");
        return;
    };
    for args in [
        &["arbiter", "install", &url][..],
        &["arbiter", "check", &url, "--trials", "2"],
    ] {
        let (code, out, err) = cli(args);
        assert_eq!(code, 0, "{args:?}: a warning is not a failure: {out} {err}");
        assert!(
            err.contains("warning: the server has no persistence") && err.contains("appendonly yes"),
            "{args:?}: {err}"
        );
    }
}
