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

async fn scrape(url: &str) -> common::prom::Exposition {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    common::prom::parse(&text).unwrap_or_else(|e| panic!("/metrics is not valid Prometheus text: {e}\n{text}"))
}

/// `/metrics` parses strictly as Prometheus text, before and after traffic,
/// and the counters and histogram counts move by exactly the traffic sent.
#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_move_with_traffic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let client = Client::connect(&c.url).await.expect("connect");
    let warm = ResourceId::new("m/parse/warm").expect("valid");
    let l = client
        .acquire(&warm, Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquire");
    client.release(&warm, &l.lease_id).await.expect("release");
    let before = scrape(&c.url).await;

    let rounds = 7;
    for i in 0..rounds {
        let r = ResourceId::new(&format!("m/parse/{i}")).expect("valid");
        let lease = client
            .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
            .await
            .expect("acquire");
        client.renew(&r, &lease.lease_id).await.expect("renew");
        assert!(
            client
                .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
                .await
                .is_err(),
            "busy"
        );
        client.release(&r, &lease.lease_id).await.expect("release");
    }
    let after = scrape(&c.url).await;
    let moved = |series: &str| after.get(series).unwrap_or(0.0) - before.get(series).unwrap_or(0.0);
    let n = f64::from(rounds);
    assert_eq!(moved("leasefence_grants_total"), n);
    assert_eq!(moved("leasefence_renewals_total"), n);
    assert_eq!(moved("leasefence_releases_total"), n);
    assert_eq!(moved("leasefence_refusals_total{reason=\"busy\"}"), n);
    assert_eq!(
        moved("leasefence_request_seconds_count{op=\"acquire\",outcome=\"ok\"}"),
        n
    );
    assert_eq!(
        moved("leasefence_request_seconds_count{op=\"acquire\",outcome=\"error\"}"),
        n
    );
    assert_eq!(
        moved("leasefence_request_seconds_count{op=\"renew\",outcome=\"ok\"}"),
        n
    );
    assert_eq!(
        moved("leasefence_request_seconds_count{op=\"release\",outcome=\"ok\"}"),
        n
    );
    // Every grant and release is one mutation: the batches carry 2n more.
    assert_eq!(moved("leasefence_store_batch_mutations_sum"), 2.0 * n);
    assert!(moved("leasefence_store_commit_seconds_count") >= 1.0);
    for (name, kind) in [
        ("leasefence_grants_total", "counter"),
        ("leasefence_leases_held", "gauge"),
        ("leasefence_request_seconds", "histogram"),
        ("leasefence_store_commit_seconds", "histogram"),
        // The store checkpoints as it opens (a fresh log generation).
        ("leasefence_store_checkpoint_seconds", "histogram"),
    ] {
        assert_eq!(after.types.get(name).map(String::as_str), Some(kind), "TYPE of {name}");
    }
}

/// Metric names `metrics.rs` and the store declare (`counter!("…")` and the like).
fn declared_metrics() -> Vec<(String, &'static str)> {
    let server = include_str!("../../leasefence-server/src/metrics.rs");
    let mut out = Vec::new();
    for (mac, kind) in [
        ("counter!(\"", "counter"),
        ("gauge!(\"", "gauge"),
        ("histogram!(\"", "histogram"),
    ] {
        for piece in server.split(mac).skip(1) {
            out.push((piece.split('"').next().unwrap_or_default().to_string(), kind));
        }
    }
    out.push((leasefence_store::COMMIT_SECONDS.to_string(), "histogram"));
    out.push((leasefence_store::BATCH_MUTATIONS.to_string(), "histogram"));
    out.push((leasefence_store::CHECKPOINT_SECONDS.to_string(), "histogram"));
    out
}

/// Every metric `docs/grafana-dashboard.json` queries is one the server
/// exports: seen on a live `/metrics` after traffic, or (failures and
/// leadership, which need a fault or a shared store) declared in the source.
#[tokio::test]
async fn the_grafana_dashboard_queries_only_exported_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/grafana-dashboard.json")).expect("dashboard JSON");
    let mut used = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("leasefence_") {
                    used.insert(word.to_string());
                }
            }
        }
    }
    assert!(used.len() >= 15, "{used:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &["--ttl-min", "10ms"]);
    let client = Client::connect(&c.url).await.expect("connect");
    // An open watch stream (the HTTP one), so the watcher gauge is exported.
    let watch = reqwest::get(format!("{}/v1/watch?prefix=m/", c.url))
        .await
        .expect("watch");
    assert_eq!(watch.status(), 200);
    let r = ResourceId::new("m/dash").expect("valid");
    let lease = client
        .acquire(&r, Duration::from_secs(10), None, Duration::ZERO)
        .await
        .expect("acquire");
    client.renew(&r, &lease.lease_id).await.expect("renew");
    assert!(
        client
            .acquire(&r, Duration::from_secs(1), None, Duration::ZERO)
            .await
            .is_err()
    );
    client.release(&r, &lease.lease_id).await.expect("release");
    client
        .acquire(&r, Duration::from_millis(20), None, Duration::ZERO)
        .await
        .expect("short");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let live = scrape(&c.url).await;
    assert!(
        live.total("leasefence_expiries_total") >= 1.0,
        "the short lease expired"
    );
    assert_eq!(live.get("leasefence_watchers"), Some(1.0), "the HTTP watch is counted");
    drop(watch);

    let declared = declared_metrics();
    let mut missing = Vec::new();
    for name in &used {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|b| declared.iter().any(|(d, k)| d == b && *k == "histogram"))
            .unwrap_or(name);
        let seen = live.types.contains_key(base);
        let fault_or_shared_store = [
            "leasefence_store_failures_total",
            "leasefence_leader",
            "leasefence_leader_epoch",
            "leasefence_leadership_changes_total",
        ];
        let is_declared = declared.iter().any(|(d, _)| d == base);
        if !(seen || (fault_or_shared_store.contains(&base) && is_declared)) {
            missing.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the server does not export: {missing:?}"
    );
}
