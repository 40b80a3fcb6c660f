//! Lock-delays on the real binary: after a lease *expires* the resource is
//! granted to nobody for its delay (busy says why and for how long), a queued
//! acquire waits it out and is granted at its end, a release starts none, the
//! delay is bounded by `serve --lock-delay-max`, and a restart honours it.

mod common;

use std::time::{Duration, Instant};

use common::{Coordinator, cli, ms};
use leasefence_client::{Client, ClientError};
use leasefence_core::{BusyReason, LeaseError, ResourceId};
use serde_json::{Value, json};

async fn post(url: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/acquire"))
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

/// Polls a no-wait acquire of `resource` until it is refused for a lock-delay
/// (the expiry has happened); returns that refusal.
async fn until_in_lock_delay(url: &str, resource: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = post(url, json!({"resource": resource, "ttl_ms": 1000})).await;
        assert_eq!(
            code, 409,
            "nobody may get {resource} while its lease or lock-delay runs: {body}"
        );
        if body["reason"] == "lock_delay" {
            return body;
        }
        assert_eq!(body["reason"], "held", "{body}");
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(ms(20)).await;
    }
}

#[tokio::test]
async fn an_expired_lease_closes_the_resource_until_its_lock_delay_ends_and_the_waiter_gets_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &["--lock-delay-max", "5s"]);
    let (code, refused) = post(
        &c.url,
        json!({"resource": "ld/a", "ttl_ms": 300, "lock_delay_ms": 5001}),
    )
    .await;
    assert_eq!((code, refused["error"].as_str()), (400, Some("invalid")), "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lock_delay_ms") && message.contains("at most 5000 ms"),
        "the refusal names the field and the limit: {message}"
    );

    let started = Instant::now();
    let (code, lease) = post(
        &c.url,
        json!({"resource": "ld/a", "ttl_ms": 300, "holder": "gone", "lock_delay_ms": 3000}),
    )
    .await;
    assert_eq!((code, lease["token"].as_u64()), (200, Some(1)), "{lease}");
    let url = c.url.clone();
    let waiter = tokio::spawn(async move {
        post(
            &url,
            json!({"resource": "ld/a", "ttl_ms": 1000, "holder": "next", "wait_ms": 20_000}),
        )
        .await
    });

    let busy = until_in_lock_delay(&c.url, "ld/a").await;
    assert_eq!(
        (busy["error"].as_str(), busy["holder"].as_str(), busy["token"].as_u64()),
        (Some("busy"), Some("gone"), Some(1)),
        "{busy}"
    );
    assert_eq!(busy["expires_in_ms"], 0, "{busy}");
    let retry = busy["retry_in_ms"].as_u64().expect("retry_in_ms");
    assert!(retry > 0 && retry <= 3000, "{busy}");
    let (code, timed_out) = post(&c.url, json!({"resource": "ld/a", "ttl_ms": 1000, "wait_ms": 200})).await;
    assert_eq!(
        (code, timed_out["reason"].as_str(), timed_out["holder"].as_str()),
        (409, Some("lock_delay"), Some("gone")),
        "a wait that ends inside the lock-delay is answered with it: {timed_out}"
    );

    let (code, granted) = waiter.await.expect("waiter");
    assert_eq!(
        (code, granted["token"].as_u64(), granted["holder"].as_str()),
        (200, Some(2), Some("next")),
        "the queued acquire waits out the lock-delay and gets the resource: {granted}"
    );
    assert!(
        started.elapsed() >= ms(300 + 3000),
        "granted {:?} after the first grant, inside TTL + lock-delay",
        started.elapsed()
    );

    // A release is a clean hand-over: no lock-delay.
    let (_, held) = post(
        &c.url,
        json!({"resource": "ld/b", "ttl_ms": 10_000, "lock_delay_ms": 5000}),
    )
    .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/release", c.url))
        .body(json!({"resource": "ld/b", "lease_id": held["lease_id"]}).to_string())
        .send()
        .await
        .expect("release");
    assert_eq!(resp.status().as_u16(), 200);
    let (code, next) = post(&c.url, json!({"resource": "ld/b", "ttl_ms": 1000})).await;
    assert_eq!((code, next["token"].as_u64()), (200, Some(2)), "{next}");
}

#[tokio::test]
async fn a_restart_keeps_the_resource_closed_for_the_whole_lock_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let (code, out, err) = cli(&[
        "acquire",
        "ld/r",
        "--ttl",
        "300ms",
        "--lock-delay",
        "4s",
        "--json",
        "--server",
        &c.url,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    until_in_lock_delay(&c.url, "ld/r").await;
    // Let the expiry's record reach the disk, and a good part of the delay pass.
    tokio::time::sleep(ms(1500)).await;
    c.kill();

    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let r = ResourceId::new("ld/r").expect("valid");
    match client.acquire(&r, ms(1000), None, Duration::ZERO).await {
        Err(ClientError::Lease(LeaseError::Busy {
            reason: BusyReason::LockDelay { retry_in },
            token,
            ..
        })) => {
            assert_eq!(token.get(), 1);
            // At most 2.5 s of it were left at the kill: the count started again.
            assert!(retry_in > ms(2500), "{retry_in:?} left after the restart");
        }
        other => panic!("expected a lock-delay busy after the restart, got {other:?}"),
    }
    let lease = client
        .acquire(&r, ms(1000), None, Duration::from_secs(20))
        .await
        .expect("granted once the delay ends");
    assert_eq!(lease.token.get(), 2);
}
