//! Redis arbiter against the real server in `LEASEFENCE_TEST_REDIS_URL`.

#[macro_use]
mod common;
#[macro_use]
mod redis_common;

use std::sync::Arc;

use common::{REDIS_URL, fence, service_url, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, WaitFor, fence_key};
use leasefence_arbiter::targets::RedisTarget;
use leasefence_arbiter::{ArbiterError, FenceMode};
use redis::aio::MultiplexedConnection;
use redis_common::{forget, get};

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

mod scenarios {
    use super::*;
    redis_scenarios!(conn(), Via::Functions);
}

#[tokio::test]
async fn raw_fcall_usage_and_fence_key_errors() {
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

/// The shared server has no replicas: a write that waits for one is applied
/// and comes back as `NotAcknowledged` with 0 replicas; a wait longer than the
/// connection's response timeout (500 ms) becomes `WaitFailed` saying so (and
/// the server keeps that connection in WAIT until its own timeout).
#[tokio::test]
async fn waiting_for_a_replica_that_is_not_there() {
    let Some(mut c) = conn().await else { return };
    let r = unique_resource("no replica");
    let key = format!("test:{{{r}}}:v");
    let ms = std::time::Duration::from_millis;
    let wait = WaitFor::replicas(1, ms(50)).expect("valid");
    match Via::Functions
        .wait_for(wait)
        .set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "v")
        .await
    {
        Err(ArbiterError::NotAcknowledged { replicas: 0, .. }) => {}
        other => panic!("no replica to acknowledge: {other:?}"),
    }
    assert_eq!(
        get::<String>(&mut c, &["GET", &key]).await,
        "v",
        "applied on the primary"
    );
    let long = WaitFor::replicas(1, ms(1500)).expect("valid");
    match Via::Functions
        .wait_for(long)
        .set(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "w")
        .await
    {
        Err(e @ ArbiterError::WaitFailed { .. }) => assert!(e.to_string().contains("response timeout"), "{e}"),
        other => panic!("the client gives up before WAIT does: {other:?}"),
    }
    // The server still holds that connection in WAIT: read on another.
    let Some(mut other) = conn().await else { return };
    assert_eq!(redis_common::last(&mut other, &r).await, Some(2));
    forget(&mut other, &r, &[&key]).await;
}
