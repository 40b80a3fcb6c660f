//! The HTTP layer over real sockets: an axum app on 127.0.0.1:0 whose handler
//! fences its write through the embedded arbiter, called with reqwest and
//! `.fence()`: the current token writes, a stale one gets 409 and writes
//! nothing, a missing fence 428, every malformed one 400.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use common::{Headers, fence, malformed_fences, unique_resource};
use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_arbiter::http::client::{CallError, FenceRequestExt, FenceResponseExt};
use leasefence_arbiter::http::{ArbiterResponse, OptionalFence, RequiredFence};
use leasefence_arbiter::{ArbiterError, Fence, FenceMode, ResourceId, Token};
use serde_json::Value;

struct App {
    base: String,
    arbiter: Arc<EmbeddedArbiter>,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// `PUT /objects/{key}`: the body becomes the value of `key`, fenced (strict).
async fn put_object(
    State(arbiter): State<Arc<EmbeddedArbiter>>,
    Path(key): Path<String>,
    RequiredFence(fence): RequiredFence,
    body: Bytes,
) -> Result<StatusCode, ArbiterResponse> {
    tokio::task::spawn_blocking(move || arbiter.put(&fence, FenceMode::Strict, &key, &body))
        .await
        .map_err(|e| ArbiterError::Task(e.to_string()))??;
    Ok(StatusCode::OK)
}

/// What the optional extractors saw: `none` or the fence.
async fn optional(OptionalFence(f): OptionalFence) -> String {
    f.map_or_else(|| "none".to_string(), |f| f.to_string())
}

async fn optional_required(f: Option<RequiredFence>) -> String {
    f.map_or_else(|| "none".to_string(), |RequiredFence(f)| f.to_string())
}

/// A 409 of another kind, to show the client leaves it alone.
async fn other_conflict() -> (StatusCode, &'static str) {
    (StatusCode::CONFLICT, r#"{"error":"busy"}"#)
}

async fn start() -> App {
    let dir = tempfile::tempdir().expect("temp dir");
    let arbiter = Arc::new(EmbeddedArbiter::open(&dir.path().join("http.redb")).expect("open"));
    let app = Router::new()
        .route("/objects/{key}", put(put_object))
        .route("/optional", get(optional))
        .route("/optional-required", get(optional_required))
        .route("/conflict", get(other_conflict))
        .with_state(Arc::clone(&arbiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    App {
        base: format!("http://{addr}"),
        arbiter,
        client: reqwest::Client::builder().no_proxy().build().expect("client"),
        _dir: dir,
    }
}

impl App {
    fn put(&self, key: &str) -> reqwest::RequestBuilder {
        self.client.put(format!("{}/objects/{key}", self.base))
    }

    /// `PUT /objects/k` with `body`, fenced by `resource` at `token`.
    async fn put_fenced(&self, resource: &ResourceId, token: u64, body: &'static str) -> reqwest::Response {
        let req = self.put("k").fence(&fence(resource, token)).body(body);
        req.send().await.expect("send")
    }

    fn value(&self, key: &str) -> Option<String> {
        let v = self.arbiter.get(key).expect("get");
        v.map(|b| String::from_utf8(b).expect("utf-8"))
    }

    fn last_token(&self, r: &ResourceId) -> Option<u64> {
        self.arbiter.last_token(r).expect("last_token").map(Token::get)
    }
}

async fn json(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("JSON body")
}

#[tokio::test]
async fn current_token_writes_and_a_stale_one_gets_409_and_writes_nothing() {
    let app = start().await;
    let r = unique_resource("http-stale ß");
    let resp = app.put_fenced(&r, 5, "five").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.value("k").as_deref(), Some("five"));

    for late in [5, 4, 1] {
        let resp = app.put_fenced(&r, late, "late").await;
        assert_eq!(resp.status(), StatusCode::CONFLICT, "token {late}");
        let body = json(resp).await;
        assert_eq!(body["error"], "stale");
        assert_eq!(body["resource"], r.as_str());
        assert_eq!(
            (body["presented"].as_u64(), body["current"].as_u64()),
            (Some(late), Some(5))
        );
    }
    assert_eq!(app.value("k").as_deref(), Some("five"));

    // The client turns the same answer back into a typed Stale.
    let resp = app.put_fenced(&r, 3, "late").await;
    match resp.error_for_stale().await {
        Err(CallError::Stale(s)) => {
            assert_eq!((&s.resource, s.presented.get(), s.current.get()), (&r, 3, 5));
        }
        other => panic!("expected CallError::Stale, got {other:?}"),
    }

    let resp = app.put_fenced(&r, u64::MAX, "max").await;
    assert_eq!(
        resp.error_for_stale().await.expect("not stale").status(),
        StatusCode::OK
    );
    assert_eq!(app.value("k").as_deref(), Some("max"));
    assert_eq!(app.last_token(&r), Some(u64::MAX));
}

#[tokio::test]
async fn a_write_without_a_fence_gets_428_and_writes_nothing() {
    let app = start().await;
    let resp = app.put("k").body("unfenced").send().await.expect("send");
    assert_eq!(resp.status(), StatusCode::PRECONDITION_REQUIRED);
    let body = json(resp).await;
    assert_eq!(body["error"], "fence_required");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("leasefence-resource") && message.contains("leasefence-token"),
        "{message}"
    );
    assert_eq!(app.value("k"), None);
}

fn with_headers(mut req: reqwest::RequestBuilder, headers: &Headers) -> reqwest::RequestBuilder {
    for (name, value) in headers {
        let value = reqwest::header::HeaderValue::from_bytes(value).expect("header value");
        req = req.header(*name, value);
    }
    req
}

#[tokio::test]
async fn every_malformed_fence_gets_400_and_writes_nothing() {
    let app = start().await;
    let r = unique_resource("http-malformed");
    for (why, headers) in malformed_fences(r.as_str()) {
        let resp = with_headers(app.put("k"), &headers)
            .body(why)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{why}");
        let body = json(resp).await;
        assert_eq!(body["error"], "bad_fence", "{why}");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains("leasefence-token"), "{why}: {message}");
        for route in ["optional", "optional-required"] {
            let req = app.client.get(format!("{}/{route}", app.base));
            let resp = with_headers(req, &headers).send().await.expect("send");
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{route}, {why}");
        }
    }
    assert_eq!(app.value("k"), None);
    assert_eq!(app.last_token(&r), None);
}

#[tokio::test]
async fn the_optional_extractors_give_none_or_the_fence() {
    let app = start().await;
    let f = Fence::from_parts("orders/42", "17").expect("fence");
    for route in ["optional", "optional-required"] {
        let url = format!("{}/{route}", app.base);
        let none = app.client.get(&url).send().await.expect("send");
        assert_eq!(none.text().await.expect("text"), "none", "{route}");
        let some = app.client.get(&url).fence(&f).send().await.expect("send");
        assert_eq!(some.text().await.expect("text"), "orders/42@17", "{route}");
    }
}

#[tokio::test]
async fn other_answers_pass_the_client_unchanged() {
    let app = start().await;
    let resp = app
        .client
        .get(format!("{}/conflict", app.base))
        .send()
        .await
        .expect("send");
    let resp = resp.error_for_stale().await.expect("a busy 409 is not stale");
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(resp.text().await.expect("text"), r#"{"error":"busy"}"#);
}
