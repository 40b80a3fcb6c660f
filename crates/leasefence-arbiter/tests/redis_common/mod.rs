//! Scenarios that every Redis flavour ([`Via::Functions`] and [`Via::Module`])
//! must pass alike, and the helpers they share. `redis_scenarios!(conn, via)`
//! turns them into one test each.

#![allow(dead_code, unused_macros)]

mod hardening;
pub mod server;

// Used by `redis_scenarios!`, which not every test file expands.
#[allow(unused_imports)]
pub use hardening::{fence_keys_are_off_limits, xadd_nomkstream_on_a_missing_stream_records_no_fence};

use leasefence_arbiter::redis::{self as lf, Via, fence_key};
use leasefence_arbiter::{ArbiterError, FenceMode, ResourceId};
use redis::aio::MultiplexedConnection;

use crate::common::{fence, unique_resource};

pub async fn get<T: redis::FromRedisValue>(c: &mut MultiplexedConnection, args: &[&str]) -> T {
    redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(c)
        .await
        .expect("command")
}

/// The recorded `last_token` of `r`, as a number.
pub async fn last(c: &mut MultiplexedConnection, r: &ResourceId) -> Option<u64> {
    lf::last_token(c, r).await.expect("last").map(|t| t.get())
}

pub async fn forget(c: &mut MultiplexedConnection, r: &ResourceId, keys: &[&str]) {
    let mut all = vec![fence_key(r)];
    all.extend(keys.iter().map(|k| k.to_string()));
    for k in all {
        let _: u64 = redis::cmd("DEL").arg(k).query_async(c).await.expect("del");
    }
}

pub fn expect_stale(res: Result<impl std::fmt::Debug, ArbiterError>, r: &ResourceId, presented: u64, current: u64) {
    match res {
        Err(ArbiterError::Stale(s)) => {
            assert_eq!(
                (&s.resource, s.presented.get(), s.current.get()),
                (r, presented, current)
            )
        }
        other => panic!("expected Stale {presented} over {current}, got {other:?}"),
    }
}

/// A raw fenced call as a client in any language would send it: `op` is
/// `set`, `del`, `hset` or `xadd`; `keys` start with the fence key.
pub fn raw(via: Via, op: &str, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let mut cmd = match via {
        Via::Functions => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("leasefence_{op}")).arg(keys.len());
            cmd
        }
        Via::Module => redis::cmd(&format!("LEASEFENCE.{}", op.to_ascii_uppercase())),
    };
    cmd.arg(keys).arg(args);
    cmd
}

pub async fn set_and_del(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("set-del");
    let key = format!("test:{{{r}}}:value");
    via.set(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "two")
        .await
        .expect("set 2");
    expect_stale(
        via.set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "one").await,
        &r,
        1,
        2,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    expect_stale(
        via.del(&mut c, &fence(&r, 2), FenceMode::Strict, &[&key]).await,
        &r,
        2,
        2,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    let removed = via
        .del(
            &mut c,
            &fence(&r, 2),
            FenceMode::Monotonic,
            &[&key, "test:never-written"],
        )
        .await;
    assert_eq!(removed.expect("del"), 1);
    assert_eq!(get::<Option<String>>(&mut c, &["GET", &key]).await, None);
    assert_eq!(last(&mut c, &r).await, Some(2));
    forget(&mut c, &r, &[&key]).await;
}

/// A fenced SET may carry an expiry; a stale one changes neither the value
/// nor its TTL, and options that would make SET conditional are refused.
pub async fn set_with_expiry(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("set-ttl");
    let key = format!("test:{{{r}}}:cached");
    let ttl = std::time::Duration::from_secs(60);
    via.set_with_ttl(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "one", ttl)
        .await
        .expect("set 1 with a TTL");
    let pttl: i64 = get(&mut c, &["PTTL", &key]).await;
    assert!((59_000..=60_000).contains(&pttl), "PTTL {pttl}");
    expect_stale(
        via.set_with_ttl(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "stale", ttl / 60)
            .await,
        &r,
        1,
        1,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "one");
    assert!(
        get::<i64>(&mut c, &["PTTL", &key]).await > 50_000,
        "a stale SET keeps the TTL"
    );

    let fk = fence_key(&r);
    let ok: String = raw(via, "set", &[&fk, &key], &["2", "strict", "two", "keepttl"])
        .query_async(&mut c)
        .await
        .expect("KEEPTTL");
    assert_eq!(ok, "OK");
    assert!(get::<i64>(&mut c, &["PTTL", &key]).await > 50_000, "KEEPTTL keeps it");
    for opts in [&["NX"][..], &["GET"], &["EX"], &["KEEPTTL", "5"], &["EX", "5", "NX"]] {
        let mut args = vec!["3", "strict", "three"];
        args.extend_from_slice(opts);
        let e = raw(via, "set", &[&fk, &key], &args)
            .query_async::<redis::Value>(&mut c)
            .await
            .expect_err("refused option");
        assert_eq!(e.code(), Some("LFINVALID"), "{opts:?}: {e}");
    }
    // A bad expiry is refused before the fence is written.
    for bad in [
        &["PX", "0"][..],
        &["EX", "-5"],
        &["EX", "x"],
        &["EXAT", "9223372036854775807"],
    ] {
        let mut args = vec!["3", "strict", "three"];
        args.extend_from_slice(bad);
        let res = raw(via, "set", &[&fk, &key], &args)
            .query_async::<redis::Value>(&mut c)
            .await;
        assert!(res.is_err(), "{bad:?}: {res:?}");
    }
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    assert_eq!(last(&mut c, &r).await, Some(2));
    // A plain fenced SET drops the TTL, as SET does.
    via.set(&mut c, &fence(&r, 3), FenceMode::Strict, &key, "three")
        .await
        .expect("set 3");
    assert_eq!(get::<i64>(&mut c, &["PTTL", &key]).await, -1);
    let zero = via
        .set_with_ttl(
            &mut c,
            &fence(&r, 4),
            FenceMode::Strict,
            &key,
            "x",
            std::time::Duration::ZERO,
        )
        .await;
    assert!(matches!(zero, Err(ArbiterError::Invalid(_))), "{zero:?}");
    forget(&mut c, &r, &[&key]).await;
}

pub async fn hset_and_xadd(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("hset-xadd");
    let (hash, stream) = (format!("test:{{{r}}}:hash"), format!("test:{{{r}}}:stream"));
    let added = via
        .hset(
            &mut c,
            &fence(&r, 10),
            FenceMode::Strict,
            &hash,
            &[("a", "1"), ("b", "2")],
        )
        .await;
    assert_eq!(added.expect("hset"), 2);
    expect_stale(
        via.hset(&mut c, &fence(&r, 10), FenceMode::Strict, &hash, &[("a", "late")])
            .await,
        &r,
        10,
        10,
    );
    assert_eq!(get::<String>(&mut c, &["HGET", &hash, "a"]).await, "1");
    let id = via
        .xadd(&mut c, &fence(&r, 11), FenceMode::Strict, &stream, "*", &[("e", "x")])
        .await
        .expect("xadd");
    assert!(id.contains('-'), "{id}");
    expect_stale(
        via.xadd(&mut c, &fence(&r, 9), FenceMode::Monotonic, &stream, "*", &[("e", "y")])
            .await,
        &r,
        9,
        11,
    );
    assert_eq!(get::<u64>(&mut c, &["XLEN", &stream]).await, 1);
    forget(&mut c, &r, &[&hash, &stream]).await;
}

pub async fn failing_command_leaves_the_fence_unchanged(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("wrongtype");
    let key = format!("test:{{{r}}}:k");
    via.set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "a string")
        .await
        .expect("set");
    let res = via
        .hset(&mut c, &fence(&r, 2), FenceMode::Strict, &key, &[("f", "v")])
        .await;
    assert!(
        matches!(res, Err(ArbiterError::Redis(_))),
        "HSET on a string must fail: {res:?}"
    );
    let res = via
        .xadd(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "*", &[("f", "v")])
        .await;
    assert!(
        matches!(res, Err(ArbiterError::Redis(_))),
        "XADD on a string must fail: {res:?}"
    );
    assert_eq!(last(&mut c, &r).await, Some(1));
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "a string");
    forget(&mut c, &r, &[&key]).await;
}

pub async fn reply_format_and_invalid_arguments(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("raw call");
    let (fk, key) = (fence_key(&r), format!("test:{{{r}}}:raw"));
    let ok: String = raw(via, "set", &[&fk, &key], &["18446744073709551615", "strict", "v"])
        .query_async(&mut c)
        .await
        .expect("u64::MAX");
    assert_eq!(ok, "OK");
    let err = raw(via, "set", &[&fk, &key], &["18446744073709551614", "monotonic", "w"])
        .query_async::<String>(&mut c)
        .await
        .expect_err("stale");
    assert_eq!(err.code(), Some("STALE"));
    assert_eq!(
        err.detail(),
        Some(format!("18446744073709551614 18446744073709551615 {r}").as_str())
    );
    for (token, mode) in [
        ("0", "strict"),
        ("18446744073709551616", "strict"),
        ("007", "strict"),
        ("+7", "strict"),
        ("5", "loose"),
    ] {
        let e = raw(via, "set", &[&fk, &key], &[token, mode, "w"])
            .query_async::<String>(&mut c)
            .await
            .expect_err("invalid");
        assert_eq!(e.code(), Some("LFINVALID"), "{token} {mode}: {e}");
    }
    for bad_fence in ["not-a-fence", "leasefence:fence:{}", "leasefence:fence:{x"] {
        let e = raw(via, "set", &[bad_fence, &key], &["1", "strict", "w"])
            .query_async::<String>(&mut c)
            .await
            .expect_err("bad fence key");
        assert_eq!(e.code(), Some("LFINVALID"), "{bad_fence}");
    }
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "v");
    forget(&mut c, &r, &[&key]).await;
}

/// A fence key holding something other than a token stops every call, and
/// nothing is written.
pub async fn corrupt_fence_is_refused(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("corrupt");
    let (fk, key) = (fence_key(&r), format!("test:{{{r}}}:corrupt"));
    for corrupt in ["abc", "007", "18446744073709551616", ""] {
        let () = get(&mut c, &["SET", &fk, corrupt]).await;
        let e = via
            .set(&mut c, &fence(&r, 5), FenceMode::Strict, &key, "v")
            .await
            .expect_err("corrupt fence");
        assert!(e.to_string().contains("LFCORRUPT"), "{corrupt:?}: {e}");
        assert_eq!(get::<String>(&mut c, &["GET", &fk]).await, corrupt);
    }
    let _: u64 = get(&mut c, &["DEL", &fk]).await;
    let _: u64 = get(&mut c, &["HSET", &fk, "f", "v"]).await;
    let e = via
        .del(&mut c, &fence(&r, 5), FenceMode::Strict, &[&key])
        .await
        .expect_err("a hash as fence");
    assert!(
        e.to_string().contains("LFCORRUPT") || e.to_string().contains("WRONGTYPE"),
        "{e}"
    );
    assert_eq!(get::<Option<String>>(&mut c, &["GET", &key]).await, None);
    forget(&mut c, &r, &[&key]).await;
}

/// Tokens of every decimal length are recorded exactly, whatever was there
/// before (the module overwrites a token in place, so a longer token grows the
/// string), and the fence key is refused as the data key.
pub async fn tokens_of_every_length_round_trip(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("token lengths");
    let key = format!("test:{{{r}}}:lengths");
    let mut tokens: Vec<u64> = (0..20).map(|e| 10u64.pow(e)).flat_map(|t| [t.max(2) - 1, t]).collect();
    tokens.push(u64::MAX);
    tokens.dedup();
    for t in tokens {
        via.set(&mut c, &fence(&r, t), FenceMode::Strict, &key, t.to_string())
            .await
            .expect("admitted");
        assert_eq!(last(&mut c, &r).await, Some(t));
        let raw: String = get(&mut c, &["GET", &fence_key(&r)]).await;
        assert_eq!(raw, t.to_string());
        expect_stale(
            via.set(&mut c, &fence(&r, t), FenceMode::Strict, &key, "again").await,
            &r,
            t,
            t,
        );
    }
    let fk = fence_key(&r);
    let _: u64 = get(&mut c, &["DEL", &fk]).await;
    let self_write = via.set(&mut c, &fence(&r, 1), FenceMode::Strict, &fk, "v").await;
    assert!(matches!(&self_write, Err(ArbiterError::Invalid(_))), "{self_write:?}");
    let self_del = via.del(&mut c, &fence(&r, 1), FenceMode::Strict, &[&key, &fk]).await;
    assert!(matches!(&self_del, Err(ArbiterError::Invalid(_))), "{self_del:?}");
    assert_eq!(
        get::<Option<String>>(&mut c, &["GET", &fk]).await,
        None,
        "nothing written"
    );
    forget(&mut c, &r, &[&key]).await;
}

/// Waits until a replica has acknowledged every write so far.
pub async fn wait_for_replica(c: &mut MultiplexedConnection) {
    // WAIT in short steps (the client's reply timeout is shorter than a
    // replica's first full sync may take).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let acked: i64 = get(c, &["WAIT", "1", "200"]).await;
        if acked >= 1 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica did not acknowledge the writes in 10 s"
        );
    }
}

/// One `#[tokio::test]` per scenario; `$conn` evaluates to a future of
/// `Option<MultiplexedConnection>` (`None`: skipped).
macro_rules! redis_scenarios {
    ($conn:expr, $via:expr) => {
        redis_scenarios!(@each $conn, $via;
            set_and_del,
            set_with_expiry,
            hset_and_xadd,
            failing_command_leaves_the_fence_unchanged,
            reply_format_and_invalid_arguments,
            corrupt_fence_is_refused,
            tokens_of_every_length_round_trip,
            fence_keys_are_off_limits,
            xadd_nomkstream_on_a_missing_stream_records_no_fence
        );
    };
    (@each $conn:expr, $via:expr; $($name:ident),*) => {$(
        #[tokio::test]
        async fn $name() {
            let Some(c) = $conn.await else { return };
            crate::redis_common::$name(c, $via).await;
        }
    )*};
}
