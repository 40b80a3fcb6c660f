//! Over HTTP: a status read waits until what it shows is durable, and a failed
//! commit is fatal — calls get a storage error, `/healthz` turns 503 and the
//! server stops with an error, so that its supervisor restarts it from disk.

mod common;

use std::time::Duration;

use common::{GatedStore, Http};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_waits_until_the_grant_it_shows_is_durable() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let s = std::sync::Arc::new(Http::start(store, None).await);
    gate.shut();
    let s2 = s.clone();
    let granting = tokio::spawn(async move { s2.acquire("s/1").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let s3 = s.clone();
    let mut status = tokio::spawn(async move { s3.get("/v1/status?resource=s/1").await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut status).await;
    assert!(
        early.is_err(),
        "status showed a grant that is not durable yet: {early:?}"
    );
    gate.open();
    assert_eq!(granting.await.expect("task").0, 200);
    let (code, body) = status.await.expect("task");
    assert_eq!(code, 200, "{body}");
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!((body["holder"].as_str(), body["token"].as_u64()), (Some("a"), Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_is_fatal() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let s = Http::start(store, None).await;
    assert_eq!(s.acquire("f/1").await.0, 200);
    assert_eq!(s.get("/healthz").await.0, 200);
    gate.fail();
    let (code, body) = s.acquire("f/2").await;
    assert_eq!((code, body["error"].as_str()), (500, Some("storage")), "{body}");
    // Nothing but errors from now on, even for calls that write nothing.
    let (code, body) = s.get("/v1/status?resource=f/1").await;
    assert_eq!(code, 500, "a failed coordinator still answered status: {body}");
    let (code, body) = s.get("/healthz").await;
    assert_eq!(code, 503, "healthz after a failed commit: {body}");
    let ended = tokio::time::timeout(Duration::from_secs(5), s.served)
        .await
        .expect("the server stops after a failed commit")
        .expect("task");
    assert!(ended.is_err(), "a failed commit must stop the server with an error");
}
