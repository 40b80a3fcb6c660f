//! Redis arbiter against the real server in `LEASEFENCE_TEST_REDIS_URL`.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{REDIS_URL, fence, service_url, unique_resource};
use leasefence_arbiter::redis::{self as lf, fence_key};
use leasefence_arbiter::targets::RedisTarget;
use leasefence_arbiter::{ArbiterError, FenceMode, ResourceId};
use redis::aio::MultiplexedConnection;

async fn conn() -> Option<MultiplexedConnection> {
    let url = service_url(REDIS_URL)?;
    let mut c = lf::connect(&url).await.expect("connect");
    lf::install(&mut c).await.expect("install");
    Some(c)
}

async fn target() -> Option<(Arc<RedisTarget>, ())> {
    let url = service_url(REDIS_URL)?;
    lf::install_url(&url).await.expect("install");
    Some((Arc::new(RedisTarget::connect(&url).await.expect("target")), ()))
}

mod suite {
    use super::*;
    conformance_tests!(target());
    pause_kit_test!(pause_kit, target(), 25);
}

async fn get<T: redis::FromRedisValue>(c: &mut MultiplexedConnection, args: &[&str]) -> T {
    redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(c)
        .await
        .expect("command")
}

/// The recorded `last_token` of `r`, as a number.
async fn last(c: &mut MultiplexedConnection, r: &ResourceId) -> Option<u64> {
    lf::last_token(c, r).await.expect("last").map(|t| t.get())
}

async fn forget(c: &mut MultiplexedConnection, r: &ResourceId, keys: &[&str]) {
    let mut all = vec![fence_key(r)];
    all.extend(keys.iter().map(|k| k.to_string()));
    for k in all {
        let _: u64 = redis::cmd("DEL").arg(k).query_async(c).await.expect("del");
    }
}

fn expect_stale(res: Result<impl std::fmt::Debug, ArbiterError>, r: &ResourceId, presented: u64, current: u64) {
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

#[tokio::test]
async fn fenced_set_and_del() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("set-del");
    let key = format!("test:{{{r}}}:value");
    lf::set(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "two")
        .await
        .expect("set 2");
    expect_stale(
        lf::set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "one").await,
        &r,
        1,
        2,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    expect_stale(
        lf::del(&mut c, &fence(&r, 2), FenceMode::Strict, &[&key]).await,
        &r,
        2,
        2,
    );
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    assert_eq!(
        lf::del(&mut c, &fence(&r, 2), FenceMode::Monotonic, &[&key])
            .await
            .expect("del"),
        1
    );
    assert_eq!(get::<Option<String>>(&mut c, &["GET", &key]).await, None);
    assert_eq!(last(&mut c, &r).await, Some(2));
    forget(&mut c, &r, &[&key]).await;
}

/// A fenced SET may carry an expiry; a stale one changes neither the value
/// nor its TTL, and options that would make SET conditional are refused.
#[tokio::test]
async fn fenced_set_with_expiry() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("set-ttl");
    let key = format!("test:{{{r}}}:cached");
    let ttl = std::time::Duration::from_secs(60);
    lf::set_with_ttl(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "one", ttl)
        .await
        .expect("set 1 with a TTL");
    let pttl: i64 = get(&mut c, &["PTTL", &key]).await;
    assert!((59_000..=60_000).contains(&pttl), "PTTL {pttl}");
    expect_stale(
        lf::set_with_ttl(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "stale", ttl / 60).await,
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
    let ok: String = get(
        &mut c,
        &[
            "FCALL",
            "leasefence_set",
            "2",
            &fk,
            &key,
            "2",
            "strict",
            "two",
            "keepttl",
        ],
    )
    .await;
    assert_eq!(ok, "OK");
    assert!(get::<i64>(&mut c, &["PTTL", &key]).await > 50_000, "KEEPTTL keeps it");
    for opts in [&["NX"][..], &["GET"], &["EX"], &["KEEPTTL", "5"], &["EX", "5", "NX"]] {
        let mut args = vec!["leasefence_set", "2", &fk, &key, "3", "strict", "three"];
        args.extend_from_slice(opts);
        let e = redis::cmd("FCALL")
            .arg(&args)
            .query_async::<redis::Value>(&mut c)
            .await
            .expect_err("refused option");
        assert_eq!(e.code(), Some("LFINVALID"), "{opts:?}: {e}");
    }
    // SET's own refusal of a bad expiry aborts the call before the fence.
    let bad = redis::cmd("FCALL")
        .arg(&["leasefence_set", "2", &fk, &key, "3", "strict", "three", "PX", "0"])
        .query_async::<redis::Value>(&mut c)
        .await;
    assert!(bad.is_err(), "{bad:?}");
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "two");
    assert_eq!(last(&mut c, &r).await, Some(2));
    let zero = lf::set_with_ttl(
        &mut c,
        &fence(&r, 3),
        FenceMode::Strict,
        &key,
        "x",
        std::time::Duration::ZERO,
    )
    .await;
    assert!(matches!(zero, Err(ArbiterError::Invalid(_))), "{zero:?}");
    forget(&mut c, &r, &[&key]).await;
}

#[tokio::test]
async fn fenced_hset_and_xadd() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("hset-xadd");
    let (hash, stream) = (format!("test:{{{r}}}:hash"), format!("test:{{{r}}}:stream"));
    let added = lf::hset(
        &mut c,
        &fence(&r, 10),
        FenceMode::Strict,
        &hash,
        &[("a", "1"), ("b", "2")],
    )
    .await;
    assert_eq!(added.expect("hset"), 2);
    expect_stale(
        lf::hset(&mut c, &fence(&r, 10), FenceMode::Strict, &hash, &[("a", "late")]).await,
        &r,
        10,
        10,
    );
    assert_eq!(get::<String>(&mut c, &["HGET", &hash, "a"]).await, "1");
    let id = lf::xadd(&mut c, &fence(&r, 11), FenceMode::Strict, &stream, "*", &[("e", "x")])
        .await
        .expect("xadd");
    assert!(id.contains('-'), "{id}");
    expect_stale(
        lf::xadd(&mut c, &fence(&r, 9), FenceMode::Monotonic, &stream, "*", &[("e", "y")]).await,
        &r,
        9,
        11,
    );
    assert_eq!(get::<u64>(&mut c, &["XLEN", &stream]).await, 1);
    forget(&mut c, &r, &[&hash, &stream]).await;
}

#[tokio::test]
async fn failing_command_leaves_the_fence_unchanged() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("wrongtype");
    let key = format!("test:{{{r}}}:k");
    lf::set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "a string")
        .await
        .expect("set");
    let res = lf::hset(&mut c, &fence(&r, 2), FenceMode::Strict, &key, &[("f", "v")]).await;
    assert!(
        matches!(res, Err(ArbiterError::Redis(_))),
        "HSET on a string must fail: {res:?}"
    );
    assert_eq!(last(&mut c, &r).await, Some(1));
    forget(&mut c, &r, &[&key]).await;
}

#[tokio::test]
async fn raw_fcall_reply_format_and_invalid_arguments() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("raw fcall");
    let (fk, key) = (fence_key(&r), format!("test:{{{r}}}:raw"));
    let ok: String = get(
        &mut c,
        &[
            "FCALL",
            "leasefence_set",
            "2",
            &fk,
            &key,
            "18446744073709551615",
            "strict",
            "v",
        ],
    )
    .await;
    assert_eq!(ok, "OK");
    let err = redis::cmd("FCALL")
        .arg(&[
            "leasefence_set",
            "2",
            &fk,
            &key,
            "18446744073709551614",
            "monotonic",
            "w",
        ])
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
        ("5", "loose"),
    ] {
        let e = redis::cmd("FCALL")
            .arg(&["leasefence_set", "2", &fk, &key, token, mode, "w"])
            .query_async::<String>(&mut c)
            .await
            .expect_err("invalid");
        assert_eq!(e.code(), Some("LFINVALID"), "{token} {mode}: {e}");
    }
    let mut bad_fence = redis::cmd("FCALL");
    bad_fence.arg(&["leasefence_set", "2", "not-a-fence", &key, "1", "strict", "w"]);
    let e = bad_fence
        .query_async::<String>(&mut c)
        .await
        .expect_err("bad fence key");
    assert_eq!(e.code(), Some("LFINVALID"));
    assert_eq!(get::<String>(&mut c, &["GET", &key]).await, "v");
    forget(&mut c, &r, &[&key]).await;
}

/// Wrong key or argument counts, malformed fence keys and a corrupted fence
/// value are refused by every fenced function, and none of them writes.
#[tokio::test]
async fn raw_fcall_usage_fence_key_and_corrupt_fence_errors() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("raw usage");
    let (fk, key) = (fence_key(&r), format!("test:{{{r}}}:usage"));
    let calls: [&[&str]; 8] = [
        &["leasefence_set", "3", &fk, &key, &key, "1", "strict", "v"],
        &["leasefence_set", "2", &fk, &key, "1", "strict"],
        &["leasefence_set", "2", "leasefence:fence:{}", &key, "1", "strict", "v"],
        &["leasefence_set", "2", &key, &fk, "1", "strict", "v"],
        &["leasefence_del", "2", &fk, &key, "1"],
        &["leasefence_hset", "2", &fk, &key, "1", "strict", "field"],
        &["leasefence_xadd", "2", &fk, &key, "1", "strict", "*", "field"],
        &["leasefence_xadd", "3", &fk, &key, &key, "1", "strict", "*", "f", "v"],
    ];
    for args in calls {
        let e = redis::cmd("FCALL")
            .arg(args)
            .query_async::<redis::Value>(&mut c)
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Some("LFINVALID"), "{args:?}: {e}");
    }
    let untouched: (Option<String>, Option<String>) =
        (get(&mut c, &["GET", &fk]).await, get(&mut c, &["GET", &key]).await);
    assert_eq!(untouched, (None, None), "a refused call writes nothing");

    for corrupt in ["abc", "007", "18446744073709551616", ""] {
        let () = get(&mut c, &["SET", &fk, corrupt]).await;
        let e = lf::set(&mut c, &fence(&r, 5), FenceMode::Strict, &key, "v")
            .await
            .expect_err("corrupt fence");
        assert!(e.to_string().contains("LFCORRUPT"), "{corrupt:?}: {e}");
        assert_eq!(get::<String>(&mut c, &["GET", &fk]).await, corrupt);
    }
    assert_eq!(get::<Option<String>>(&mut c, &["GET", &key]).await, None);
    forget(&mut c, &r, &[&key]).await;
}

#[tokio::test]
async fn install_is_idempotent_and_reports_the_version() {
    let Some(mut c) = conn().await else { return };
    lf::install(&mut c).await.expect("second install");
    assert_eq!(
        lf::installed_version(&mut c).await.expect("version").as_deref(),
        Some(lf::LIBRARY_VERSION)
    );
}

#[tokio::test]
async fn check_dispatches_on_redis_scheme() {
    let Some(url) = service_url(REDIS_URL) else { return };
    leasefence_arbiter::install(&url).await.expect("install");
    let report = leasefence_arbiter::check(&url, 5).await.expect("check");
    assert!(report.passed(), "{report:?}");
    assert_eq!((report.backend, report.stale_rejected), ("redis", 5));
}
