//! Crash tests for Redis: the server is what crashes. A throwaway
//! `redis-server` with `appendonly yes` and `appendfsync always` is SIGKILLed
//! while a client sends fenced SETs (value = token), then restarted on the
//! same directory, many times, through the Functions library and through the
//! module. After every restart the value and the fence agree (both written or
//! neither: each fenced write is one entry in the AOF) and no acknowledged
//! write is lost.
//!
//! Needs `redis-server` on PATH and, for the module, the built module in
//! `LEASEFENCE_TEST_REDIS_MODULE_SO` (`.ci/run` sets it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fence, splitmix, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, fence_key};
use leasefence_arbiter::{ArbiterError, FenceMode};

/// Server kills per flavour.
const KILLS: u64 = 100;
const MODULE_SO: &str = "LEASEFENCE_TEST_REDIS_MODULE_SO";

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts `redis-server` on `dir` (reloading its AOF) and waits for PING.
    fn start(dir: &Path, module: Option<&Path>) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir)
            .args(["--logfile", "redis.log"]);
        if let Some(so) = module {
            cmd.arg("--loadmodule").arg(so);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it on PATH?)");
        let server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if up.is_ok() {
                return server;
            }
            assert!(Instant::now() < deadline, "redis-server on {dir:?} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn kill(mut self) {
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
fn redis_server_available() -> bool {
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

async fn crash_rounds(via: Via, module: Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = unique_resource("redis crash");
    let key = format!("test:{{{r}}}:value");
    let mut seed = getrandom::u64().expect("os randomness");
    eprintln!("{via:?}: seed {seed}");
    let mut acked_max = 0u64;
    let mut token = 0u64;
    let mut server = Server::start(dir.path(), module.as_deref());
    if via == Via::Functions {
        lf::install_url(&server.url()).await.expect("install the library");
    }
    for round in 0..KILLS {
        // A writer sends fenced SETs until the server dies under it.
        let url = server.url();
        let (start, key2) = (token, key.clone());
        let r2 = r.clone();
        let writer = tokio::spawn(async move {
            let mut conn = lf::connect(&url).await.expect("connect");
            let mut acked = Vec::new();
            let mut t = start;
            loop {
                t += 1;
                match via
                    .set(&mut conn, &fence(&r2, t), FenceMode::Strict, &key2, t.to_string())
                    .await
                {
                    Ok(()) => acked.push(t),
                    Err(ArbiterError::Redis(_)) => return (acked, t),
                    Err(e) => panic!("round {round}: token {t}: {e}"),
                }
            }
        });
        tokio::time::sleep(Duration::from_micros(2_000 + splitmix(&mut seed) % 30_000)).await;
        server.kill();
        let (acked, attempted) = writer.await.expect("writer task");
        acked_max = acked.last().copied().unwrap_or(acked_max).max(acked_max);
        token = attempted;

        server = Server::start(dir.path(), module.as_deref());
        let mut conn = lf::connect(&server.url()).await.expect("reconnect");
        let recorded = lf::last_token(&mut conn, &r).await.expect("fence").map(|t| t.get());
        let value: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await.expect("GET");
        assert_eq!(
            recorded.map(|t| t.to_string()),
            value,
            "round {round}: fence and value disagree after the crash"
        );
        let recorded = recorded.unwrap_or(0);
        assert!(
            recorded >= acked_max,
            "round {round}: acknowledged token {acked_max} lost, the fence holds {recorded}"
        );
        assert!(
            recorded <= attempted,
            "round {round}: fence {recorded} above any token sent"
        );
        if recorded > 0 {
            let stale = via
                .set(&mut conn, &fence(&r, recorded), FenceMode::Strict, &key, "stale")
                .await;
            assert!(
                matches!(stale, Err(ArbiterError::Stale(_))),
                "round {round}: after the restart, token {recorded} again must be stale: {stale:?}"
            );
        }
    }
    eprintln!("{via:?}: {KILLS} server kills, last acknowledged token {acked_max}");
    let mut conn = lf::connect(&server.url()).await.expect("connect");
    let _: u64 = redis::cmd("DEL")
        .arg(&key)
        .arg(fence_key(&r))
        .query_async(&mut conn)
        .await
        .expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_fence_and_value_survive_server_kills_together() {
    if !redis_server_available() {
        return;
    }
    crash_rounds(Via::Functions, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_fence_and_value_survive_server_kills_together() {
    if !redis_server_available() {
        return;
    }
    let Some(so) = common::service_url(MODULE_SO) else {
        return;
    };
    crash_rounds(Via::Module, Some(PathBuf::from(so))).await;
}
