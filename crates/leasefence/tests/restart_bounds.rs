//! A restart with tighter bounds: leases and lock-delays granted under the old
//! `--ttl-max` and `--lock-delay-max` are recovered as they were granted (a
//! holder paces its renewals by the TTL it was given, so cutting it short
//! could take the lease from a live holder), and `serve` warns how many there
//! are and how long they may last, without naming them.

mod common;

use std::time::Duration;

use common::{Coordinator, ms, spawn_listening_logged};
use leasefence_client::{Client, ClientError, LeaseConfig};
use leasefence_core::{LeaseError, ResourceId};

#[tokio::test]
async fn terms_over_lowered_bounds_survive_a_restart_and_are_warned_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let long = ResourceId::new("bounds/long-ttl").expect("name");
    let delayed = ResourceId::new("bounds/long-delay").expect("name");
    let granted = client
        .acquire(&long, Duration::from_secs(60), None, Duration::ZERO)
        .await
        .expect("granted under the default bounds");
    let with_delay = LeaseConfig::new(Duration::from_secs(5)).with_lock_delay(Duration::from_secs(30));
    client
        .acquire_with(&delayed, &with_delay)
        .await
        .expect("granted under the default bounds");
    drop(client);
    c.kill();

    let (child, addr) = spawn_listening_logged(
        "serve",
        dir.path(),
        &["--ttl-max", "10s", "--lock-delay-max", "2s"],
        "leasefence listening on ",
    );
    let client = Client::connect(&format!("http://{addr}")).await.expect("connect");

    // The lease keeps its 60 s, on a renewal too, and a new one is held to 10 s.
    let renewed = client.renew(&long, &granted.lease_id).await.expect("renewed");
    assert_eq!(renewed.ttl, Duration::from_secs(60), "{renewed:?}");
    let refused = client
        .acquire(
            &ResourceId::new("bounds/new").expect("name"),
            Duration::from_secs(60),
            None,
            ms(0),
        )
        .await;
    assert!(
        matches!(refused, Err(ClientError::Lease(LeaseError::Invalid(ref i))) if i.field() == "ttl_ms"),
        "a new 60 s lease is over --ttl-max: {refused:?}"
    );

    let logs = child.logs();
    assert!(
        logs.contains("TTL is outside this coordinator's bounds (100..=10000 ms)")
            && logs.contains("leases=1")
            && logs.contains("longest_ttl_ms=60000"),
        "one warning for the lease over --ttl-max, with its TTL: {logs}"
    );
    assert!(
        logs.contains("lock-delays over this coordinator's maximum (2000 ms)")
            && logs.contains("held=1")
            && logs.contains("closed=0")
            && logs.contains("longest_lock_delay_ms=30000"),
        "one warning for the lease whose lock-delay is over --lock-delay-max: {logs}"
    );
    assert!(!logs.contains("bounds/"), "the warnings name no resource: {logs}");
}
