//! Self-fencing lease sessions (`leasefence_client::Lease`, `with_lease`)
//! against the real coordinator binary: keep-alive across many TTLs, `lost()`
//! within the TTL of the last successful renewal once the coordinator is gone,
//! loss on refusal, and work cancelled on loss.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Coordinator, ms};
use leasefence_client::{Client, ClientError, LeaseConfig, Loss, WithLeaseError};
use leasefence_core::{LeaseError, ResourceId};
use tokio::time::{Instant, sleep};

fn res(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid resource")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_kept_alive_across_six_ttls_with_its_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let other = Client::connect(&c.url).await.expect("connect");
    let (r, ttl) = (res("session/keep"), ms(300));
    let lease = client.lease(&r, ttl).await.expect("acquire");
    assert_eq!(lease.token().get(), 1);
    let start = Instant::now();
    while start.elapsed() < ttl * 6 {
        sleep(ttl / 2).await;
        assert!(!lease.is_lost(), "lost after {:?}", start.elapsed());
        match other.acquire(&r, ttl, None, Duration::ZERO).await {
            Err(ClientError::Lease(LeaseError::Busy { token, .. })) => assert_eq!(token, lease.token()),
            other => panic!("a second holder must be refused while the lease is kept: {other:?}"),
        }
    }
    let since_renewal = client.clock().now().saturating_since(lease.renewed_at());
    assert!(since_renewal < ttl / 2, "renewed {since_renewal:?} ago");
    let held = other.status(&r).await.expect("status").held.expect("held");
    assert_eq!(held.1, lease.token(), "token unchanged after 6 TTLs");
    assert_eq!(lease.release().await.expect("release").get(), 1);
    assert_eq!(other.status(&r).await.expect("status").held, None);
    let next = other.acquire(&r, ttl, None, Duration::ZERO).await.expect("free again");
    assert_eq!(next.token.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_within_the_ttl_of_the_last_renewal_when_the_coordinator_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let ttl = ms(500);
    let lease = client.lease(&res("session/die"), ttl).await.expect("acquire");
    sleep(ttl * 2).await;
    assert!(!lease.is_lost());
    let killed_at = Instant::now();
    c.kill();
    let loss = lease.lost().await;
    let fired_at = Instant::now();
    let (fired_stamp, last) = (client.clock().now(), lease.renewed_at());
    let killed_stamp = fired_stamp.saturating_sub(fired_at - killed_at);
    assert_eq!(loss, Loss::Expired);
    assert!(last <= killed_stamp, "no renewal can succeed after the kill");
    let since_last = fired_stamp.saturating_since(last);
    assert!(since_last <= ttl, "fired {since_last:?} after the last renewal");
    assert!(fired_stamp >= lease.deadline(), "not before its own deadline");
    // The deadline counts the time the coordinator reported left, which it
    // rounds down to whole milliseconds and computes a little after the renewal:
    // it may sit a few ms under the TTL, never more.
    let deadline_after = lease.deadline().saturating_since(last);
    assert!(
        deadline_after + ms(20) >= ttl - lease.margin(),
        "deadline {deadline_after:?} after the last renewal"
    );
    assert!(fired_at - killed_at <= ttl);
    assert!(lease.is_lost());
    eprintln!(
        "lost() fired {} ms after the last successful renewal was sent, {} ms after the kill (ttl {} ms, margin {} ms)",
        since_last.as_millis(),
        (fired_at - killed_at).as_millis(),
        ttl.as_millis(),
        lease.margin().as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_at_once_when_the_coordinator_refuses_a_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let (r, ttl) = (res("session/revoked"), ms(3_000));
    let lease = client.lease(&r, LeaseConfig::new(ttl)).await.expect("acquire");
    let released_at = Instant::now();
    client
        .release(&r, lease.lease_id())
        .await
        .expect("released behind its back");
    assert_eq!(lease.lost().await, Loss::Revoked);
    let after = released_at.elapsed();
    assert!(
        after < ttl / 2,
        "noticed {after:?} after the release, well before the deadline"
    );
}

/// Records when it is dropped: the work future owning it was cancelled.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().expect("lock") = Some(Instant::now());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_cancels_the_work_when_the_lease_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let ttl = ms(400);
    let dropped = Arc::new(Mutex::new(None));
    let killed_at = Arc::new(Mutex::new(None));
    let killer = {
        let killed_at = killed_at.clone();
        tokio::spawn(async move {
            sleep(ttl * 2).await;
            *killed_at.lock().expect("lock") = Some(Instant::now());
            c.kill();
        })
    };
    let clock = DropClock(dropped.clone());
    let out = client
        .with_lease(&res("session/work"), ttl, |fence| async move {
            let _clock = clock;
            assert_eq!(fence.token.get(), 1);
            loop {
                sleep(ms(5)).await;
            }
        })
        .await;
    killer.await.expect("killer");
    let resource = res("session/work");
    assert!(
        matches!(&out, Err(WithLeaseError::Lost { resource: r, loss: Loss::Expired }) if *r == resource),
        "{out:?}"
    );
    let dropped = dropped.lock().expect("lock").expect("the work future was dropped");
    let killed = killed_at.lock().expect("lock").expect("killed");
    assert!(dropped - killed <= ttl, "work ran {:?} past the kill", dropped - killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_returns_the_output_and_releases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let r = res("session/ok");
    let config = LeaseConfig::new(ms(300)).with_margin(ms(100));
    let out = client
        .with_lease(&r, config, |fence| async move {
            sleep(ms(700)).await; // outlives two TTLs: the keep-alive carries it
            fence.token.get() * 10
        })
        .await
        .expect("work done under the lease");
    assert_eq!(out, 10);
    let s = client.status(&r).await.expect("status");
    assert_eq!((s.held, s.last_token.map(|t| t.get())), (None, Some(1)));
    for margin in [ms(300), ms(0)] {
        let bad = client.lease(&r, LeaseConfig::new(ms(300)).with_margin(margin)).await;
        assert!(
            matches!(bad, Err(ClientError::Invalid(ref i)) if i.field() == "margin"),
            "margin {margin:?}: {bad:?}"
        );
    }
    assert_eq!(
        client.status(&r).await.expect("status").last_token.map(|t| t.get()),
        Some(1)
    );
}
