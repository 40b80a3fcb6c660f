//! The native Redis module (crate `leasefence-redis-module`) against a real
//! server that loaded it, named by `LEASEFENCE_TEST_REDIS_MODULE_URL`
//! (`.ci/run` builds the module and starts such a server). The same
//! conformance suite, pause kit and scenarios as the Functions library, plus
//! what only the module has: its own usage errors, interplay with the library
//! on one fence key, WATCH, propagation to a replica without the module, and
//! key routing in a Redis Cluster.

#[macro_use]
mod common;
#[macro_use]
mod redis_common;

use std::sync::Arc;

use common::{REDIS_URL, fence, service_url, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, fence_key};
use leasefence_arbiter::targets::RedisTarget;
use leasefence_arbiter::{ArbiterError, FenceMode};
use redis::aio::MultiplexedConnection;
use redis_common::{expect_stale, forget, get, last, raw, wait_for_replica};

const MODULE_URL: &str = "LEASEFENCE_TEST_REDIS_MODULE_URL";
const REPLICA_URL: &str = "LEASEFENCE_TEST_REDIS_MODULE_REPLICA_URL";
const CLUSTER_URLS: &str = "LEASEFENCE_TEST_REDIS_MODULE_CLUSTER_URLS";

async fn conn() -> Option<MultiplexedConnection> {
    let url = service_url(MODULE_URL)?;
    let mut c = lf::connect(&url).await.expect("connect");
    lf::module_loaded(&mut c).await.expect("the module is loaded");
    Some(c)
}

async fn target() -> Option<(Arc<RedisTarget>, ())> {
    let url = service_url(MODULE_URL)?;
    let t = RedisTarget::connect_via(&url, Via::Module).await.expect("target");
    Some((Arc::new(t), ()))
}

mod suite {
    use super::*;
    conformance_tests!(target());
    pause_kit_test!(pause_kit, target(), 25);
}

mod scenarios {
    use super::*;
    redis_scenarios!(conn(), Via::Module);
}

#[tokio::test]
async fn version_and_usage_errors() {
    let Some(mut c) = conn().await else { return };
    assert_eq!(lf::module_loaded(&mut c).await.expect("version"), lf::MODULE_VERSION);
    let r = unique_resource("module usage");
    let (fk, key) = (fence_key(&r), format!("test:{{{r}}}:usage"));
    let calls: [(&str, &[&str]); 7] = [
        ("set", &[&fk, &key, "1", "strict"]),
        ("set", &[&fk, &key, "1", "strict", "v", "EX", "5", "KEEPTTL"]),
        ("del", &[&fk, "1", "strict"]),
        ("hset", &[&fk, &key, "1", "strict", "field"]),
        ("hset", &[&fk, &key, "1", "strict"]),
        ("xadd", &[&fk, &key, "1", "strict", "*", "field"]),
        ("xadd", &[&fk, &key, "1", "strict", "*"]),
    ];
    for (op, args) in calls {
        let e = raw(Via::Module, op, &[], args)
            .query_async::<redis::Value>(&mut c)
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Some("LFINVALID"), "{op} {args:?}: {e}");
        assert!(e.to_string().contains("usage"), "{e}");
    }
    let untouched: (Option<String>, Option<String>) =
        (get(&mut c, &["GET", &fk]).await, get(&mut c, &["GET", &key]).await);
    assert_eq!(untouched, (None, None), "a refused call writes nothing");
}

/// The module and the Functions library read and write the same fence keys
/// under the same rule, so a stale writer is caught whichever it uses.
#[tokio::test]
async fn module_and_library_share_fences() {
    let Some(mut c) = conn().await else { return };
    lf::install(&mut c).await.expect("the library loads beside the module");
    let r = unique_resource("shared fence");
    let key = format!("test:{{{r}}}:shared");
    Via::Module
        .set(&mut c, &fence(&r, 5), FenceMode::Strict, &key, "module 5")
        .await
        .expect("module 5");
    expect_stale(
        Via::Functions
            .set(&mut c, &fence(&r, 5), FenceMode::Strict, &key, "library 5")
            .await,
        &r,
        5,
        5,
    );
    Via::Functions
        .set(&mut c, &fence(&r, u64::MAX), FenceMode::Strict, &key, "library max")
        .await
        .expect("library max");
    expect_stale(
        Via::Module
            .set(&mut c, &fence(&r, 6), FenceMode::Strict, &key, "module 6")
            .await,
        &r,
        6,
        u64::MAX,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "library max");
    assert_eq!(last(&mut c, &r).await, Some(u64::MAX));
    forget(&mut c, &r, &[&key]).await;
}

/// A stale call changes no key (a client WATCHing the value still commits),
/// and an admitted one counts as a write of the key, as a plain SET does.
#[tokio::test]
async fn stale_calls_leave_watched_keys_untouched() {
    let Some(mut c) = conn().await else { return };
    let url = std::env::var(MODULE_URL).expect("set when conn() returned");
    let r = unique_resource("watch");
    let key = format!("test:{{{r}}}:watched");
    Via::Module
        .set(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "two")
        .await
        .expect("set 2");
    // A WATCHing client's transaction fails if the key changed after WATCH.
    let mut watcher = lf::connect(&url).await.expect("watcher");
    let () = get(&mut watcher, &["WATCH", &key]).await;
    expect_stale(
        Via::Module
            .set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "one")
            .await,
        &r,
        1,
        2,
    );
    let () = get(&mut watcher, &["MULTI"]).await;
    let _: String = get(&mut watcher, &["GET", &key]).await;
    let untouched: Option<Vec<String>> = get(&mut watcher, &["EXEC"]).await;
    assert_eq!(
        untouched,
        Some(vec!["two".to_string()]),
        "a stale call touched the watched key"
    );
    let () = get(&mut watcher, &["WATCH", &key]).await;
    Via::Module
        .set(&mut c, &fence(&r, 3), FenceMode::Strict, &key, "three")
        .await
        .expect("set 3");
    let () = get(&mut watcher, &["MULTI"]).await;
    let _: String = get(&mut watcher, &["GET", &key]).await;
    let aborted: Option<Vec<String>> = get(&mut watcher, &["EXEC"]).await;
    assert_eq!(aborted, None, "an admitted SET must invalidate WATCH, as SET does");
    forget(&mut c, &r, &[&key]).await;
}

/// What the module propagates is plain `SET`s in one MULTI/EXEC: a replica
/// without the module (`LEASEFENCE_TEST_REDIS_MODULE_REPLICA_URL`, a replica
/// of the module's server) gets the value, the token and the expiry, and
/// DEL, HSET and XADD (with the ID the primary chose) arrive as well.
#[tokio::test]
async fn replicas_without_the_module_get_every_write() {
    let Some(mut c) = conn().await else { return };
    let Some(replica_url) = service_url(REPLICA_URL) else {
        return;
    };
    let mut replica = lf::connect(&replica_url).await.expect("replica");
    let r = unique_resource("replicated");
    let (key, hash, stream) = (
        format!("test:{{{r}}}:value"),
        format!("test:{{{r}}}:hash"),
        format!("test:{{{r}}}:stream"),
    );
    let ttl = std::time::Duration::from_secs(100);
    Via::Module
        .set_with_ttl(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "v1", ttl)
        .await
        .expect("set");
    Via::Module
        .hset(&mut c, &fence(&r, 2), FenceMode::Strict, &hash, &[("f", "v")])
        .await
        .expect("hset");
    let id = Via::Module
        .xadd(&mut c, &fence(&r, 3), FenceMode::Strict, &stream, "*", &[("f", "v")])
        .await
        .expect("xadd");
    Via::Module
        .del(&mut c, &fence(&r, 4), FenceMode::Strict, &[&hash])
        .await
        .expect("del");
    let plain = format!("test:{{{r}}}:plain");
    Via::Module
        .set(&mut c, &fence(&r, 5), FenceMode::Strict, &plain, "v5")
        .await
        .expect("set without expiry");
    wait_for_replica(&mut c).await;
    assert_eq!(
        get::<Option<String>>(&mut replica, &["GET", &plain]).await.as_deref(),
        Some("v5")
    );
    assert_eq!(
        get::<Option<String>>(&mut replica, &["GET", &key]).await.as_deref(),
        Some("v1")
    );
    let pttl: i64 = get(&mut replica, &["PTTL", &key]).await;
    assert!((90_000..=100_000).contains(&pttl), "replica PTTL {pttl}");
    assert_eq!(last(&mut replica, &r).await, Some(5));
    assert_eq!(get::<i64>(&mut replica, &["EXISTS", &hash]).await, 0);
    let entries: Vec<(String, Vec<String>)> = get(&mut replica, &["XRANGE", &stream, "-", "+"]).await;
    assert_eq!(entries, vec![(id, vec!["f".to_string(), "v".to_string()])]);
    forget(&mut c, &r, &[&key, &stream, &plain]).await;
}

/// A key's type and content, comparable between servers.
async fn snapshot(c: &mut MultiplexedConnection, key: &[u8]) -> (String, Vec<Vec<u8>>) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(c).await.expect("TYPE");
    let query = match kind.as_str() {
        "string" => redis::cmd("GET").arg(key).clone(),
        "hash" => redis::cmd("HGETALL").arg(key).clone(),
        "stream" => redis::cmd("XRANGE").arg(key).arg("-").arg("+").clone(),
        _ => return (kind, Vec::new()),
    };
    let value: redis::Value = query.query_async(c).await.expect("read");
    (kind, vec![format!("{value:?}").into_bytes()])
}

/// Without the module, calls fail with a message that says how to load it.
#[tokio::test]
async fn a_server_without_the_module_says_how_to_load_it() {
    let Some(url) = service_url(REDIS_URL) else { return };
    let mut c = lf::connect(&url).await.expect("connect");
    if Via::Module.installed_version(&mut c).await.expect("probe").is_some() {
        panic!("{REDIS_URL} must name a server without the module, for this test");
    }
    let r = unique_resource("no module");
    let res = Via::Module
        .set(&mut c, &fence(&r, 1), FenceMode::Strict, "test:no-module", "v")
        .await;
    match res {
        Err(e @ ArbiterError::ModuleNotLoaded) => assert!(e.to_string().contains("--loadmodule"), "{e}"),
        other => panic!("expected ModuleNotLoaded, got {other:?}"),
    }
    let err = RedisTarget::connect_via(&url, Via::Module).await.err();
    assert!(matches!(err, Some(ArbiterError::ModuleNotLoaded)), "{err:?}");
}

#[tokio::test]
async fn check_dispatches_on_redis_module_scheme() {
    let Some(url) = service_url(MODULE_URL) else { return };
    let module_url = url.replacen("redis://", "redis+module://", 1);
    let installed = leasefence_arbiter::install(&module_url)
        .await
        .expect("install checks the module");
    assert!(
        installed
            .what
            .contains(&format!("module leasefence version {}", lf::MODULE_VERSION)),
        "{installed}"
    );
    let report = leasefence_arbiter::check(&module_url, 5).await.expect("check");
    assert!(report.passed(), "{report:?}");
    assert_eq!((report.backend, report.stale_rejected), ("redis", 5));
}

/// Thousands of calls with random argument lists (random counts, empty and
/// NUL-laden strings, non-UTF-8 bytes, out-of-range tokens, refused options,
/// the fence key in every position) never take the server down, the fence
/// only ever holds a valid token that never goes backwards, and the replica
/// ends with the same keys. The module
/// runs inside the server: a panic there would abort Redis itself.
#[tokio::test]
async fn random_arguments_never_crash_the_server_or_move_the_fence_back() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("random args");
    let fk = fence_key(&r);
    let prefix = format!("test:{{{r}}}:");
    let mut pool: Vec<Vec<u8>> = [
        "",
        "0",
        "1",
        "2",
        "7",
        "01",
        "+3",
        "-1",
        // Not u64::MAX: once admitted, every later call would be stale.
        "18446744073709551616",
        "strict",
        "monotonic",
        "STRICT",
        "EX",
        "PX",
        "EXAT",
        "PXAT",
        "KEEPTTL",
        "NX",
        "GET",
        "100",
        "0-0",
        "*",
        "5-1",
        "leasefence:fence:{}",
        "leasefence:fence:{",
        "field",
        "value",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    pool.extend([fk.as_bytes().to_vec(), fk.as_bytes().to_vec(), fk.as_bytes().to_vec()]);
    for name in ["a", "b", "h", "s"] {
        pool.push(format!("{prefix}{name}").into_bytes());
    }
    // Odd bytes, only ever as values or inside the test's own key prefix.
    for odd in [&b"\0"[..], b"\xff\xfe", b"1\0", b"1 ", "\u{663}".as_bytes()] {
        let mut key = prefix.clone().into_bytes();
        key.extend_from_slice(odd);
        pool.push(key);
    }
    let mut seed = getrandom::u64().expect("os randomness");
    eprintln!("seed {seed}");
    let mut next = move || common::splitmix(&mut seed);
    let ops = [
        "LEASEFENCE.SET",
        "LEASEFENCE.DEL",
        "LEASEFENCE.HSET",
        "LEASEFENCE.XADD",
        "LEASEFENCE.VERSION",
    ];
    let mut highest = 0u64;
    let mut answered = [0usize; 2];
    for _ in 0..3000 {
        let mut cmd = redis::cmd(ops[(next() % ops.len() as u64) as usize]);
        // Half the calls are shaped like real ones (FENCE KEY TOKEN MODE, then
        // random arguments), so admissions and rejections happen too.
        if next() % 2 == 0 {
            let key = format!("{prefix}{}", ["a", "b", "h", "s"][(next() % 4) as usize]);
            let mode = if next() % 2 == 0 { "strict" } else { "monotonic" };
            cmd.arg(&fk).arg(key).arg(1 + next() % 60).arg(mode);
        }
        for _ in 0..next() % 7 {
            cmd.arg(&pool[(next() % pool.len() as u64) as usize][..]);
        }
        match cmd.query_async::<redis::Value>(&mut c).await {
            Ok(_) => answered[0] += 1,
            // An error reply (-STALE, -LFINVALID, -ERR, -WRONGTYPE, ...).
            Err(e) if e.code().is_some() => answered[1] += 1,
            Err(e) => panic!("the server stopped answering: {e}"),
        }
        if let Some(t) = last(&mut c, &r).await {
            assert!(t >= highest, "the fence went back from {highest} to {t}");
            highest = t;
        }
    }
    let pong: String = get(&mut c, &["PING"]).await;
    assert_eq!(pong, "PONG");
    assert_eq!(
        lf::module_loaded(&mut c).await.expect("still loaded"),
        lf::MODULE_VERSION
    );
    assert!(
        answered[0] > 0 && answered[1] > 0,
        "both admitted and refused calls: {answered:?}"
    );
    assert!(highest > 0, "some fenced call was admitted");
    eprintln!(
        "{} calls answered, {} refused; the fence ended at {highest}",
        answered[0], answered[1]
    );
    let keys: Vec<Vec<u8>> = get(&mut c, &["KEYS", &format!("{prefix}*")]).await;
    if let Ok(replica_url) = std::env::var(REPLICA_URL) {
        let mut replica = lf::connect(&replica_url).await.expect("replica");
        wait_for_replica(&mut c).await;
        eprintln!("{} keys to compare with the replica", keys.len() + 1);
        let mut all = keys.clone();
        all.push(fk.clone().into_bytes());
        for key in all {
            assert_eq!(
                snapshot(&mut c, &key).await,
                snapshot(&mut replica, &key).await,
                "{} on the replica",
                String::from_utf8_lossy(&key)
            );
        }
    }
    if !keys.is_empty() {
        let _: u64 = redis::cmd("DEL").arg(keys).query_async(&mut c).await.expect("cleanup");
    }
    forget(&mut c, &r, &[]).await;
}

/// In a Redis Cluster (`LEASEFENCE_TEST_REDIS_MODULE_CLUSTER_URLS`, one URL
/// per master, each with the module), both flavours route by their keys: the
/// fence key and the data keys, never the token or the mode. Exactly one node
/// takes a call whose keys share the `{RESOURCE}` tag, the others answer
/// MOVED, and keys of another slot are refused with CROSSSLOT.
#[tokio::test]
async fn cluster_routes_fenced_calls_by_their_keys() {
    let Some(urls) = service_url(CLUSTER_URLS) else { return };
    let mut nodes = Vec::new();
    for url in urls.split(',') {
        let mut conn = lf::connect(url).await.expect("connect to a cluster node");
        // Functions live per node: load the library on every master.
        lf::install(&mut conn).await.expect("install the library on the node");
        nodes.push(conn);
    }
    assert!(nodes.len() >= 3, "{CLUSTER_URLS} must name the masters: {urls}");
    for via in [Via::Functions, Via::Module] {
        let r = unique_resource("cluster");
        let (key, other) = (format!("test:{{{r}}}:v"), format!("test:{{{r}-elsewhere}}:v"));
        let mut owner = None;
        for (i, conn) in nodes.iter_mut().enumerate() {
            match via.set(conn, &fence(&r, 1), FenceMode::Monotonic, &key, "v").await {
                Ok(()) => {
                    assert!(owner.is_none(), "{via:?}: two nodes took one slot");
                    owner = Some(i);
                }
                Err(ArbiterError::Redis(e)) if e.to_string().to_ascii_uppercase().contains("MOVED") => {}
                Err(e) => panic!("{via:?}: node {i}: expected OK or MOVED, got {e}"),
            }
        }
        let owner = owner.unwrap_or_else(|| panic!("{via:?}: no node took the call"));
        let conn = &mut nodes[owner];
        let cross = via.set(conn, &fence(&r, 2), FenceMode::Strict, &other, "v").await;
        assert!(
            matches!(&cross, Err(ArbiterError::Redis(e)) if e.to_string().to_ascii_uppercase().contains("CROSSSLOT")),
            "{via:?}: a data key of another slot: {cross:?}"
        );
        let second = format!("test:{{{r}}}:w");
        let removed = via.del(conn, &fence(&r, 2), FenceMode::Strict, &[&key, &second]).await;
        assert_eq!(removed.expect("DEL of two keys in the slot"), 1, "{via:?}");
        assert_eq!(last(conn, &r).await, Some(2), "{via:?}");
        forget(conn, &r, &[]).await;
    }
}

/// In a cluster, the fence key of `b` and the fence key of `b}tail` share a
/// slot (the hash tag ends at the first `}`), so the holder of `b}tail` could
/// reach `b`'s fence key without a CROSSSLOT error. Both flavours refuse it
/// as a data key, on the node that owns the slot, and `b`'s fence stays.
#[tokio::test]
async fn cluster_refuses_a_fence_key_in_the_same_slot() {
    let Some(urls) = service_url(CLUSTER_URLS) else { return };
    for via in [Via::Functions, Via::Module] {
        let b = unique_resource("cluster victim");
        let a = leasefence_arbiter::ResourceId::new(&format!("{b}}}tail")).expect("valid resource");
        let (key_b, fence_b) = (format!("test:{{{b}}}:v"), fence_key(&b));
        let mut owner = None;
        for url in urls.split(',') {
            let mut conn = lf::connect(url).await.expect("connect to a cluster node");
            lf::install(&mut conn).await.expect("install the library on the node");
            if via
                .set(&mut conn, &fence(&b, 10), FenceMode::Strict, &key_b, "b10")
                .await
                .is_ok()
            {
                owner = Some(conn);
            }
        }
        let mut conn = owner.unwrap_or_else(|| panic!("{via:?}: no node took b's write"));
        let res = via
            .set(&mut conn, &fence(&a, 1), FenceMode::Strict, &fence_b, "1")
            .await;
        assert!(
            matches!(&res, Err(ArbiterError::Invalid(_))),
            "{via:?}: the holder of {a} wrote the fence key of {b}: {res:?}"
        );
        let res = via.del(&mut conn, &fence(&a, 1), FenceMode::Strict, &[&fence_b]).await;
        assert!(matches!(&res, Err(ArbiterError::Invalid(_))), "{via:?}: {res:?}");
        assert_eq!(last(&mut conn, &b).await, Some(10), "{via:?}");
        assert_eq!(last(&mut conn, &a).await, None, "{via:?}");
        forget(&mut conn, &b, &[&key_b]).await;
    }
}
