//! `GET /metrics` shows only what is durable: a grant whose commit has not
//! finished is neither counted in `leasefence_grants_total` nor held in
//! `leasefence_leases_held`, and one whose commit failed never is — the rule
//! every answer, status and watch event already follows.
//!
//! Its own test binary: the Prometheus recorder is process-wide.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{GatedStore, Http};

/// `(leasefence_grants_total, leasefence_leases_held)` as `/metrics` shows them.
async fn scrape(s: &Http) -> (Option<f64>, Option<f64>) {
    let (code, text) = tokio::time::timeout(Duration::from_secs(5), s.get("/metrics"))
        .await
        .expect("a scrape answers even while a commit is stuck");
    assert_eq!(code, 200, "{text}");
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    };
    (value("leasefence_grants_total "), value("leasefence_leases_held "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_grant_only_once_it_is_durable() {
    let handle = leasefence_server::metrics::install_prometheus().expect("the first recorder installs");
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let s = Arc::new(Http::start(store, Some(handle)).await);

    assert_eq!(s.acquire("d/1").await.0, 200);
    assert_eq!(scrape(&s).await, (Some(1.0), Some(1.0)), "one durable grant");

    // A second grant decided but not yet on disk.
    gate.shut();
    let s2 = s.clone();
    let granting = tokio::spawn(async move { s2.acquire("d/2").await.0 });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!granting.is_finished(), "the grant must wait for its commit");
    assert_eq!(
        scrape(&s).await,
        (Some(1.0), Some(1.0)),
        "metrics showed a grant that is not durable yet"
    );
    gate.open();
    assert_eq!(granting.await.expect("task"), 200);
    assert_eq!(scrape(&s).await, (Some(2.0), Some(2.0)), "both grants are durable");

    // A grant whose commit fails is never shown.
    gate.fail();
    assert_eq!(s.acquire("d/3").await.0, 500);
    assert_eq!(
        scrape(&s).await,
        (Some(2.0), Some(2.0)),
        "metrics showed a grant whose commit failed"
    );
}
