//! `leasefence serve` stops promptly on SIGTERM even while acquires are queued
//! and watch streams are open, and a restart keeps the held lease's token;
//! `serve` and `gateway` stop gracefully on a SIGTERM sent as soon as they
//! print their listening line.

mod common;

use std::time::{Duration, Instant};

use common::{Coordinator, ms};
use leasefence_client::Client;
use leasefence_core::ResourceId;
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_waiters_and_watchers_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut coordinator = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&coordinator.url).await.expect("connect");
    let r = ResourceId::new("s/1").expect("valid");
    let held = client
        .acquire(&r, Duration::from_secs(60), None, Duration::ZERO)
        .await
        .expect("acquire");
    let waiter = {
        let (client, r) = (client.clone(), r.clone());
        tokio::spawn(async move {
            client
                .acquire(&r, Duration::from_secs(60), None, Duration::from_secs(120))
                .await
        })
    };
    let req = pb::WatchRequest {
        resource: "s/".into(),
        prefix: true,
        after_revision: None,
        coordinator_id: String::new(),
    };
    let mut watch = LeasesClient::connect(coordinator.url.clone())
        .await
        .expect("grpc")
        .watch(req)
        .await
        .expect("watch")
        .into_inner();
    tokio::time::sleep(ms(200)).await;

    let t0 = Instant::now();
    common::sigterm(&coordinator.child);
    let status = tokio::task::spawn_blocking(move || coordinator.child.wait().map(|s| (s, coordinator)))
        .await
        .expect("join")
        .expect("wait");
    assert!(status.0.success(), "serve exits 0 on SIGTERM: {:?}", status.0);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(
        waiter.await.expect("join").is_err(),
        "the queued acquire is answered, not left hanging"
    );
    assert!(
        watch.message().await.is_err() || watch.message().await.ok().flatten().is_none(),
        "watch stream ends"
    );

    // The lease held before the restart still holds, with its token.
    let coordinator = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&coordinator.url).await.expect("connect");
    let renewed = client.renew(&r, &held.lease_id).await.expect("held across a restart");
    assert_eq!(renewed.token, held.token);
}

/// Concurrent HTTP clients acquire and release on a few shared resources
/// (queueing behind each other) until SIGTERM stops the coordinator mid-load.
/// It exits 0; after a restart on the same data dir every grant a client was
/// answered is durable: its resource's last token is at least that token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_keeps_every_answered_grant() {
    const CLIENTS: usize = 12;
    const RESOURCES: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut coordinator = Coordinator::start(dir.path(), &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let (http, url, answered) = (http.clone(), coordinator.url.clone(), answered.clone());
        clients.push(tokio::spawn(async move {
            let resource = format!("load/{}", i % RESOURCES);
            loop {
                let body = serde_json::json!({ "resource": resource, "ttl_ms": 60_000, "wait_ms": 10_000 });
                let Ok(resp) = http
                    .post(format!("{url}/v1/acquire"))
                    .body(body.to_string())
                    .send()
                    .await
                else {
                    return;
                };
                if resp.status() != 200 {
                    return;
                }
                let Ok(lease) = resp.json::<serde_json::Value>().await else {
                    return;
                };
                let token = lease["token"].as_u64().expect("a token");
                answered.lock().expect("lock").push((resource.clone(), token));
                let body = serde_json::json!({ "resource": resource, "lease_id": lease["lease_id"] });
                match http
                    .post(format!("{url}/v1/release"))
                    .body(body.to_string())
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {}
                    _ => return,
                }
            }
        }));
    }
    // Load for a while, then SIGTERM while requests are in flight.
    tokio::time::sleep(ms(600)).await;
    let before = answered.lock().expect("lock").len();
    assert!(before >= 20, "load was running: {before} grants answered");
    let t0 = Instant::now();
    common::sigterm(&coordinator.child);
    let (status, coordinator_dir) = tokio::task::spawn_blocking(move || {
        let s = coordinator.child.wait().expect("wait");
        (s, coordinator)
    })
    .await
    .expect("join");
    drop(coordinator_dir);
    assert!(status.success(), "serve exits 0 on SIGTERM under load: {status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t0.elapsed()
    );
    for c in clients {
        tokio::time::timeout(Duration::from_secs(15), c)
            .await
            .expect("every client is answered or cut off, none hangs")
            .expect("join");
    }
    let answered = answered.lock().expect("lock").clone();

    let distinct: std::collections::HashSet<_> = answered.iter().collect();
    assert_eq!(distinct.len(), answered.len(), "no token answered twice for a resource");

    let restarted = Coordinator::start(dir.path(), &[]);
    let mut highest = std::collections::HashMap::<&str, u64>::new();
    for (r, t) in &answered {
        let h = highest.entry(r.as_str()).or_default();
        *h = (*h).max(*t);
    }
    for (r, t) in &highest {
        let s: serde_json::Value = http
            .get(format!("{}/v1/status?resource={r}", restarted.url))
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        let last = s["last_token"].as_u64().unwrap_or(0);
        assert!(
            last >= *t,
            "{r}: answered token {t}, but after the restart the last token is {last}"
        );
    }
    println!(
        "{} grants answered ({} before SIGTERM), all durable across the restart; stop took {:?}",
        answered.len(),
        before,
        t0.elapsed()
    );
}

/// Supervisors stop what they started at any moment, a fresh process too:
/// once `leasefence COMMAND` printed its listening line, SIGTERM must take
/// the graceful path (exit 0), not the signal's default action (killed,
/// nothing drained). Repeated, since the moment it lands in is a race.
fn sigterm_right_after_the_listening_line_is_graceful(command: &str, prefix: &str) {
    for attempt in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut child, _, _) = common::spawn_listening(command, dir.path(), &[], prefix);
        common::sigterm(&child);
        let status = child.wait().expect("wait");
        assert!(status.success(), "attempt {attempt}: {command} ended with {status:?}");
    }
}

#[test]
fn sigterm_right_after_the_listening_line_stops_serve_gracefully() {
    sigterm_right_after_the_listening_line_is_graceful("serve", "leasefence listening on ");
}

#[test]
fn sigterm_right_after_the_listening_line_stops_the_gateway_gracefully() {
    sigterm_right_after_the_listening_line_is_graceful("gateway", "leasefence gateway listening on ");
}
