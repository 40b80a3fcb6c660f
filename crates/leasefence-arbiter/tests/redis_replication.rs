//! Waiting for replicas after a fenced write (`Via::wait_for`), against the
//! module's server (`LEASEFENCE_TEST_REDIS_MODULE_URL`) and its real replica
//! (`LEASEFENCE_TEST_REDIS_MODULE_REPLICA_URL`), both flavours.

mod common;
mod redis_common;

use common::{fence, service_url, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via, WaitFor};
use leasefence_arbiter::{ArbiterError, FenceMode};
use redis::aio::MultiplexedConnection;
use redis_common::{expect_stale, forget, get, last, wait_for_replica};

const MODULE_URL: &str = "LEASEFENCE_TEST_REDIS_MODULE_URL";
const REPLICA_URL: &str = "LEASEFENCE_TEST_REDIS_MODULE_REPLICA_URL";

async fn conn() -> Option<MultiplexedConnection> {
    let url = service_url(MODULE_URL)?;
    let mut c = lf::connect(&url).await.expect("connect");
    lf::module_loaded(&mut c).await.expect("the module is loaded");
    Some(c)
}

/// `Via::wait_for(WaitFor::replicas(..))` against the module's server and its
/// real replica: with one replica asked for, the write is answered once the
/// replica has it (read there at once, no sleep); with two, it comes back as
/// `NotAcknowledged` naming what was seen, although the primary applied it.
/// A stale call is refused as usual and waits for nothing.
#[tokio::test]
async fn fenced_writes_wait_for_the_replica() {
    let Some(mut c) = conn().await else { return };
    let Some(replica_url) = service_url(REPLICA_URL) else {
        return;
    };
    let mut replica = lf::connect(&replica_url).await.expect("replica");
    lf::install(&mut c).await.expect("the library, for Via::Functions");
    wait_for_replica(&mut c).await;
    let ms = std::time::Duration::from_millis;
    for via in [Via::Module, Via::Functions] {
        let r = unique_resource("wait for replicas");
        let (key, hash) = (format!("test:{{{r}}}:v"), format!("test:{{{r}}}:h"));
        let one = via.wait_for(WaitFor::replicas(1, ms(400)).expect("valid"));
        one.set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "v1")
            .await
            .expect("the replica acknowledges");
        assert_eq!(
            get::<Option<String>>(&mut replica, &["GET", &key]).await.as_deref(),
            Some("v1"),
            "{via:?}: answered before the replica had the write"
        );
        assert_eq!(last(&mut replica, &r).await, Some(1), "{via:?}");

        let two = WaitFor::replicas(2, ms(100)).expect("valid");
        match via
            .wait_for(two)
            .hset(&mut c, &fence(&r, 2), FenceMode::Strict, &hash, &[("f", "v")])
            .await
        {
            Err(
                e @ ArbiterError::NotAcknowledged {
                    replicas, local_aof, ..
                },
            ) => {
                assert_eq!((replicas, local_aof), (1, false), "{via:?}");
                assert!(
                    matches!(&e, ArbiterError::NotAcknowledged { resource, wait, .. } if *resource == r && *wait == two)
                );
                let text = e.to_string();
                assert!(
                    text.contains("applied on the primary") && text.contains("WAIT 2 100"),
                    "{text}"
                );
            }
            other => panic!("{via:?}: two replicas asked, one there: {other:?}"),
        }
        assert_eq!(last(&mut c, &r).await, Some(2), "{via:?}: the primary applied it");
        assert_eq!(get::<String>(&mut c, &["HGET", &hash, "f"]).await, "v");
        expect_stale(
            one.set(&mut c, &fence(&r, 2), FenceMode::Strict, &key, "stale").await,
            &r,
            2,
            2,
        );
        forget(&mut c, &r, &[&key, &hash]).await;
    }
}

/// `WAITAOF` came with Redis 7.2. Before that, `probe` refuses the wait up
/// front, and a write with it comes back as `WaitFailed` saying so (the
/// primary applied the write).
#[tokio::test]
async fn waitaof_on_a_server_without_it_is_a_clear_error() {
    let Some(mut c) = conn().await else { return };
    let info: String = get(&mut c, &["INFO", "server"]).await;
    let version: Vec<u32> = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("INFO server names the version")
        .trim()
        .split('.')
        .map(|p| p.parse().expect("numeric version"))
        .collect();
    let wait = WaitFor::aof(false, 1, std::time::Duration::from_millis(100)).expect("valid");
    if version[..] >= [7, 2][..] {
        wait.probe(&mut c).await.expect("WAITAOF exists from 7.2 on");
        return;
    }
    match wait.probe(&mut c).await {
        Err(ArbiterError::Invalid(i)) => assert!(i.to_string().contains("Redis 7.2"), "{i}"),
        other => panic!("probe of WAITAOF on {version:?}: {other:?}"),
    }
    let r = unique_resource("waitaof");
    let key = format!("test:{{{r}}}:v");
    match Via::Module
        .wait_for(wait)
        .set(&mut c, &fence(&r, 1), FenceMode::Strict, &key, "v")
        .await
    {
        Err(e @ ArbiterError::WaitFailed { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("applied on the primary")
                    && text.contains("Redis 7.2")
                    && text.contains("WaitFor::replicas"),
                "{text}"
            );
        }
        other => panic!("WAITAOF on {version:?}: {other:?}"),
    }
    assert_eq!(last(&mut c, &r).await, Some(1), "the primary applied the write");
    forget(&mut c, &r, &[&key]).await;
}
