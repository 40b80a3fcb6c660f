//! The coordinator's API over real HTTP/JSON and gRPC on one port: refusals
//! carry their documented codes and details, renew keeps the token, waiters
//! are served when the holder releases, bad input gets 400 with a message
//! saying what is allowed, and the server keeps serving after each.

mod common;

use std::time::Duration;

use common::ms;
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use serde_json::{Value, json};
use tonic::Code;

struct Running {
    url: String,
    http: reqwest::Client,
    _server: common::InProcess,
}

async fn start() -> Running {
    let server = common::in_process().await;
    Running {
        url: server.url.clone(),
        http: reqwest::Client::new(),
        _server: server,
    }
}

impl Running {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    async fn post_raw(&self, path: &str, body: String) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.url))
            .body(body)
            .send()
            .await
            .expect("http");
        let code = resp.status().as_u16();
        (code, resp.json().await.unwrap_or(Value::Null))
    }

    /// An acquire of `resource` that waits up to 5 s, running in the background.
    fn queue(&self, resource: &str, holder: &str) -> tokio::task::JoinHandle<reqwest::Response> {
        let (http, url) = (self.http.clone(), self.url.clone());
        let body = json!({"resource": resource, "ttl_ms": 10_000, "holder": holder, "wait_ms": 5000});
        tokio::spawn(async move {
            http.post(format!("{url}/v1/acquire"))
                .body(body.to_string())
                .send()
                .await
                .expect("post")
        })
    }

    async fn healthy(&self) {
        let resp = self
            .http
            .get(format!("{}/healthz", self.url))
            .send()
            .await
            .expect("healthz");
        assert_eq!(resp.status().as_u16(), 200, "the server must keep serving");
    }

    async fn grpc(&self) -> LeasesClient<tonic::transport::Channel> {
        LeasesClient::connect(self.url.clone()).await.expect("grpc connect")
    }
}

#[tokio::test]
async fn http_busy_renew_expiry_and_release() {
    let s = start().await;
    let (code, a) = s
        .post(
            "/v1/acquire",
            json!({"resource": "orders/1", "ttl_ms": 300, "holder": "a"}),
        )
        .await;
    assert_eq!(code, 200, "{a}");
    assert_eq!(a["token"], 1);
    let lease_id = a["lease_id"].as_str().expect("lease id").to_string();

    let (code, busy) = s
        .post(
            "/v1/acquire",
            json!({"resource": "orders/1", "ttl_ms": 300, "holder": "b"}),
        )
        .await;
    assert_eq!(code, 409);
    assert_eq!(
        (busy["error"].as_str(), busy["holder"].as_str(), busy["token"].as_u64()),
        (Some("busy"), Some("a"), Some(1))
    );

    let (code, renewed) = s
        .post("/v1/renew", json!({"resource": "orders/1", "lease_id": lease_id}))
        .await;
    assert_eq!(
        (code, renewed["token"].as_u64()),
        (200, Some(1)),
        "renew keeps the token"
    );

    tokio::time::sleep(ms(450)).await;
    let (code, lost) = s
        .post("/v1/renew", json!({"resource": "orders/1", "lease_id": lease_id}))
        .await;
    assert_eq!((code, lost["error"].as_str()), (410, Some("lease_lost")));
    let (code, _) = s
        .post("/v1/release", json!({"resource": "orders/1", "lease_id": lease_id}))
        .await;
    assert_eq!(code, 410, "releasing an expired lease is lease lost");

    let (code, b) = s
        .post("/v1/acquire", json!({"resource": "orders/1", "ttl_ms": 300}))
        .await;
    assert_eq!(
        (code, b["token"].as_u64(), b["holder"].as_str()),
        (200, Some(2), Some("anonymous"))
    );
    let status = s
        .http
        .get(format!("{}/v1/status?resource=orders/1", s.url))
        .send()
        .await
        .expect("status");
    let status: Value = status.json().await.expect("json");
    assert_eq!(
        (status["last_token"].as_u64(), status["token"].as_u64()),
        (Some(2), Some(2))
    );
    let (code, rel) = s
        .post(
            "/v1/release",
            json!({"resource": "orders/1", "lease_id": b["lease_id"]}),
        )
        .await;
    assert_eq!((code, rel["released"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn http_waiters_are_served_in_order_when_the_holder_releases() {
    let s = start().await;
    let (_, a) = s
        .post("/v1/acquire", json!({"resource": "q", "ttl_ms": 10_000, "holder": "a"}))
        .await;
    let first = s.queue("q", "first");
    tokio::time::sleep(ms(100)).await;
    let second = s.queue("q", "second");
    tokio::time::sleep(ms(100)).await;
    let (code, _) = s
        .post("/v1/release", json!({"resource": "q", "lease_id": a["lease_id"]}))
        .await;
    assert_eq!(code, 200);
    let first: Value = first.await.expect("join").json().await.expect("json");
    assert_eq!(
        (first["holder"].as_str(), first["token"].as_u64()),
        (Some("first"), Some(2))
    );
    let (_, rel) = s
        .post("/v1/release", json!({"resource": "q", "lease_id": first["lease_id"]}))
        .await;
    assert_eq!(rel["token"], 2);
    let second: Value = second.await.expect("join").json().await.expect("json");
    assert_eq!(
        (second["holder"].as_str(), second["token"].as_u64()),
        (Some("second"), Some(3))
    );
}

#[tokio::test]
async fn http_wait_times_out_as_busy() {
    let s = start().await;
    s.post("/v1/acquire", json!({"resource": "w", "ttl_ms": 10_000, "holder": "a"}))
        .await;
    let (code, busy) = s
        .post("/v1/acquire", json!({"resource": "w", "ttl_ms": 1000, "wait_ms": 200}))
        .await;
    assert_eq!((code, busy["holder"].as_str()), (409, Some("a")));
    assert_eq!(busy["reason"], "held", "{busy}");
    assert!(busy["retry_in_ms"].as_u64().is_some_and(|ms| ms > 9000), "{busy}");
    let status: Value = s
        .http
        .get(format!("{}/v1/status?resource=w", s.url))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(status["waiters"], 0, "a timed-out waiter leaves the queue");
}

#[tokio::test]
async fn http_bad_input_gets_400_with_what_is_allowed_and_the_server_keeps_serving() {
    let s = start().await;
    let long = "x".repeat(513);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "/v1/acquire",
            json!({"resource": "", "ttl_ms": 1000}).to_string(),
            "1..=512 bytes",
        ),
        (
            "/v1/acquire",
            json!({"resource": long, "ttl_ms": 1000}).to_string(),
            "got 513 bytes",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a\u{7}b", "ttl_ms": 1000}).to_string(),
            "control characters",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl_ms": 5}).to_string(),
            "100..=3600000 ms",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl_ms": 99_999_999}).to_string(),
            "100..=3600000 ms",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl_ms": -1}).to_string(),
            "expected JSON",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a"}).to_string(),
            "missing field `ttl_ms`",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl": 1000}).to_string(),
            "unknown field `ttl`",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl_ms": 1000, "holder": ""}).to_string(),
            "",
        ),
        (
            "/v1/acquire",
            json!({"resource": "a", "ttl_ms": 1000, "wait_ms": 86_400_000u64}).to_string(),
            "at most",
        ),
        ("/v1/acquire", "{not json".to_string(), "expected JSON"),
        (
            "/v1/renew",
            json!({"resource": "a", "lease_id": "xyz"}).to_string(),
            "32 hex digits",
        ),
        (
            "/v1/release",
            json!({"resource": "a"}).to_string(),
            "missing field `lease_id`",
        ),
    ];
    for (path, body, needle) in cases {
        let (code, v) = s.post_raw(path, body.clone()).await;
        if needle.is_empty() {
            // An empty holder means "anonymous": accepted.
            assert_eq!(code, 200, "{body}: {v}");
            continue;
        }
        assert_eq!(code, 400, "{path} {body}: {v}");
        assert_eq!(v["error"], "invalid", "{v}");
        let msg = v["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{body}: message {msg:?} should mention {needle:?}"
        );
        s.healthy().await;
    }
    let resp = s.http.get(format!("{}/v1/status", s.url)).send().await.expect("get");
    assert_eq!(resp.status().as_u16(), 400, "status without a resource");
    s.healthy().await;
}

#[tokio::test]
async fn grpc_busy_renew_lost_waiter_and_invalid() {
    let s = start().await;
    let mut c = s.grpc().await;
    let acquire = |resource: &str, holder: &str, ttl_ms: u64, wait_ms: u64| pb::AcquireRequest {
        resource: resource.into(),
        ttl_ms,
        holder: holder.into(),
        wait_ms,
        lock_delay_ms: 0,
    };
    let a = c
        .acquire(acquire("g", "a", 300, 0))
        .await
        .expect("acquire")
        .into_inner();
    assert_eq!(a.token, 1);

    let busy = c.acquire(acquire("g", "b", 300, 0)).await.expect_err("busy");
    assert_eq!(busy.code(), Code::FailedPrecondition);
    assert_eq!(
        busy.metadata().get("leasefence-holder").and_then(|v| v.to_str().ok()),
        Some("a")
    );
    assert_eq!(
        busy.metadata().get("leasefence-error").and_then(|v| v.to_str().ok()),
        Some("busy")
    );

    let renewed = c
        .renew(pb::RenewRequest {
            resource: "g".into(),
            lease_id: a.lease_id.clone(),
        })
        .await;
    assert_eq!(renewed.expect("renew").into_inner().token, 1);

    tokio::time::sleep(ms(450)).await;
    let lost = c
        .renew(pb::RenewRequest {
            resource: "g".into(),
            lease_id: a.lease_id.clone(),
        })
        .await;
    assert_eq!(lost.expect_err("lost").code(), Code::NotFound);

    let b = c
        .acquire(acquire("g", "b", 5000, 0))
        .await
        .expect("acquire")
        .into_inner();
    assert_eq!(b.token, 2);
    let mut c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.acquire(acquire("g", "w", 5000, 5000)).await });
    tokio::time::sleep(ms(100)).await;
    c.release(pb::ReleaseRequest {
        resource: "g".into(),
        lease_id: b.lease_id,
    })
    .await
    .expect("release");
    let w = waiter.await.expect("join").expect("waiter granted").into_inner();
    assert_eq!((w.token, w.holder.as_str()), (3, "w"));

    for bad in [
        acquire("", "a", 1000, 0),
        acquire("g", "a", 1, 0),
        acquire("g", "a\n", 1000, 0),
    ] {
        let e = c.acquire(bad).await.expect_err("invalid");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("must"), "{}", e.message());
    }
    let e = c
        .release(pb::ReleaseRequest {
            resource: "g".into(),
            lease_id: "nope".into(),
        })
        .await
        .expect_err("bad id");
    assert_eq!(e.code(), Code::InvalidArgument);
    let st = c
        .get(pb::GetRequest { resource: "g".into() })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        (st.last_token, st.held.map(|h| h.token)),
        (3, Some(3)),
        "still serving after bad input"
    );
}

#[tokio::test]
async fn grpc_keepalive_stream_renews_until_lost() {
    let s = start().await;
    let mut c = s.grpc().await;
    let req = pb::AcquireRequest {
        resource: "k".into(),
        ttl_ms: 200,
        holder: "a".into(),
        wait_ms: 0,
        lock_delay_ms: 0,
    };
    let a = c.acquire(req).await.expect("acquire").into_inner();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c
        .keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    // Renew every 100 ms for 5 TTLs: the lease must survive with its token.
    for _ in 0..10 {
        tx.send(pb::RenewRequest {
            resource: "k".into(),
            lease_id: a.lease_id.clone(),
        })
        .await
        .expect("send");
        let r = replies.message().await.expect("reply").expect("renewed");
        assert_eq!(r.token, 1);
        tokio::time::sleep(ms(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    tx.send(pb::RenewRequest {
        resource: "k".into(),
        lease_id: a.lease_id.clone(),
    })
    .await
    .expect("send");
    let end = replies.message().await.expect_err("lost ends the stream");
    assert_eq!(end.code(), Code::NotFound);
}
