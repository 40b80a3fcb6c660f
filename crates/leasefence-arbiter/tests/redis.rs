//! Redis arbiter against the real server in `LEASEFENCE_TEST_REDIS_URL`.

#[macro_use]
mod common;
#[macro_use]
mod redis_common;

use std::sync::Arc;

use common::{REDIS_URL, service_url, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, fence_key};
use leasefence_arbiter::targets::RedisTarget;
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
