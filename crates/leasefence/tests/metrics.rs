//! `GET /metrics` on the real binary counts grants, releases and refusals.

mod common;

use std::time::Duration;

use common::Coordinator;
use leasefence_client::Client;
use leasefence_core::ResourceId;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

#[tokio::test]
async fn metrics_count_grants_releases_and_refusals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let r = ResourceId::new("m/1").expect("valid");
    let lease = client
        .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquire");
    assert!(
        client
            .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
            .await
            .is_err(),
        "busy"
    );
    client.release(&r, &lease.lease_id).await.expect("release");

    let text = reqwest::get(format!("{}/metrics", c.url))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert_eq!(value(&text, "leasefence_grants_total"), Some(1.0), "{text}");
    assert_eq!(value(&text, "leasefence_releases_total"), Some(1.0), "{text}");
    assert_eq!(
        value(&text, "leasefence_refusals_total{reason=\"busy\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value(&text, "leasefence_leases_held"), Some(0.0), "{text}");
    assert!(
        !text.contains(&lease.lease_id.to_hex()),
        "lease ids never appear in metrics"
    );
}

#[tokio::test]
async fn expiry_queue_gauge_stays_bounded_by_live_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let r = ResourceId::new("m/queue").expect("valid");
    // More acquire+release cycles than the queue's slack: without compaction
    // every one would leave an entry behind for the lease's hour.
    for _ in 0..150 {
        let lease = client
            .acquire(&r, Duration::from_secs(3600), None, Duration::ZERO)
            .await
            .expect("acquire");
        client.release(&r, &lease.lease_id).await.expect("release");
    }
    let text = reqwest::get(format!("{}/metrics", c.url))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    let entries = value(&text, "leasefence_expiry_queue_entries").expect("the gauge is exported");
    assert!(entries <= 64.0, "{entries} queue entries with nothing held:\n{text}");
}

/// The latency and size histograms, and the watcher gauge.
#[tokio::test]
async fn metrics_have_commit_and_request_histograms_and_count_watchers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let r = ResourceId::new("m/hist").expect("valid");
    let lease = client
        .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquire");
    client.renew(&r, &lease.lease_id).await.expect("renew");
    client.release(&r, &lease.lease_id).await.expect("release");
    let mut grpc = leasefence_proto::v1::leases_client::LeasesClient::connect(c.url.clone())
        .await
        .expect("connect");
    let watch = grpc
        .watch(leasefence_proto::v1::WatchRequest {
            resource: "m/hist".into(),
            ..Default::default()
        })
        .await
        .expect("watch");
    let metrics = || async {
        reqwest::get(format!("{}/metrics", c.url))
            .await
            .expect("get")
            .text()
            .await
            .expect("text")
    };
    let mut text = metrics().await;
    for _ in 0..100 {
        if value(&text, "leasefence_watchers") == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = metrics().await;
    }
    assert_eq!(value(&text, "leasefence_watchers"), Some(1.0), "{text}");
    // Two commits at least (the grant, the release), each one batch.
    assert!(
        value(&text, "leasefence_store_commit_seconds_count").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    assert!(text.contains("leasefence_store_commit_seconds_bucket{le="), "{text}");
    assert!(
        value(&text, "leasefence_store_batch_mutations_count").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    for op in ["acquire", "renew", "release"] {
        let series = format!("leasefence_request_seconds_count{{op=\"{op}\",outcome=\"ok\"}}");
        assert_eq!(value(&text, &series), Some(1.0), "{series}: {text}");
    }
    drop(watch);
    for _ in 0..100 {
        text = metrics().await;
        if value(&text, "leasefence_watchers") == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        value(&text, "leasefence_watchers"),
        Some(0.0),
        "a watcher gone is counted out: {text}"
    );
}
