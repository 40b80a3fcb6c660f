//! Over HTTP: a status read waits until what it shows is durable, and a failed
//! commit is fatal — calls get a storage error, `/healthz` turns 503 and the
//! server stops with an error, so that its supervisor restarts it from disk.

mod common;

use std::time::Duration;

use common::GatedStore;
use leasefence_server::{Server, ServerConfig};
use serde_json::{Value, json};

struct Running {
    base: String,
    http: reqwest::Client,
    served: tokio::task::JoinHandle<Result<(), leasefence_server::ServerError>>,
}

async fn start(store: GatedStore) -> Running {
    let dir = std::env::temp_dir();
    let config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir);
    let server = Server::bind_with_store(config, store).await.expect("bind");
    let base = format!("http://{}", server.local_addr().expect("addr"));
    let served = tokio::spawn(server.run(std::future::pending()));
    Running {
        base,
        http: reqwest::Client::new(),
        served,
    }
}

impl Running {
    async fn acquire(&self, resource: &str) -> (u16, Value) {
        let body = json!({ "resource": resource, "ttl_ms": 60_000, "holder": "a" });
        let r = self
            .http
            .post(format!("{}/v1/acquire", self.base))
            .json(&body)
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_waits_until_the_grant_it_shows_is_durable() {
    let store = GatedStore::new();
    let gate = store.gate.clone();
    let s = std::sync::Arc::new(start(store).await);
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
    let s = start(store).await;
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
