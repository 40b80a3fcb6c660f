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
mod redis_common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{fence, splitmix, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, fence_key};
use leasefence_arbiter::{ArbiterError, FenceMode};
use redis_common::server::{Server, redis_server_available};

/// Crash-safe persistence: every fenced write is fsynced before it is answered.
const DURABLE: [&str; 6] = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"];

fn start_durable(dir: &Path, module: Option<&Path>) -> Server {
    Server::start(dir, module, &DURABLE)
}

/// Server kills per flavour.
const KILLS: u64 = 100;
const MODULE_SO: &str = "LEASEFENCE_TEST_REDIS_MODULE_SO";

async fn crash_rounds(via: Via, module: Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = unique_resource("redis crash");
    let key = format!("test:{{{r}}}:value");
    let mut seed = getrandom::u64().expect("os randomness");
    eprintln!("{via:?}: seed {seed}");
    let mut acked_max = 0u64;
    let mut token = 0u64;
    let mut server = start_durable(dir.path(), module.as_deref());
    if via == Via::Functions {
        lf::install_url(&server.url()).await.expect("install the library");
    }
    for round in 0..KILLS {
        // A writer sends fenced SETs until the server dies under it.
        let url = server.url();
        let (start, key2) = (token, key.clone());
        let r2 = r.clone();
        let writer = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut t = start;
            // The kill may come before the writer is connected (a loaded
            // machine): then nothing was sent.
            let Ok(mut conn) = lf::connect(&url).await else {
                return (acked, t);
            };
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

        server = start_durable(dir.path(), module.as_deref());
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
