//! `leasefence serve` stops promptly on SIGTERM even while acquires are queued
//! and watch streams are open, and a restart keeps the held lease's token.

mod common;

use std::process::Command;
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
    let pid = coordinator.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
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
