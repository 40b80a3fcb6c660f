//! The HTTP/JSON edge: the same operations as gRPC, for curl and for languages
//! without a gRPC stack. Bodies are parsed by hand from bytes so that a bad
//! body gets the same `400 {"error":"invalid","message":…}` as a bad field.
//!
//! | route | body | success |
//! |---|---|---|
//! | `POST /v1/acquire` | `{"resource","ttl_ms","holder"?,"wait_ms"?,"lock_delay_ms"?}` | lease |
//! | `POST /v1/renew` | `{"resource","lease_id"}` | lease |
//! | `POST /v1/release` | `{"resource","lease_id"}` | `{"resource","token","released":true}` |
//! | `GET /v1/status?resource=R` | — | status |
//! | `GET /v1/resources`, `GET /v1/watch` | — | see [`crate::browse`] |
//! | `GET /`, `/ui`, `/openapi.json` | — | the status page and the API document ([`crate::ui`]) |
//! | `POST /v1/force-release` | `{"resource"}` | `{"resource","token","released"}` (`token` null when nothing was held) |
//! | `GET /healthz` | — | `ok` (503 after a storage failure) |
//! | `GET /metrics` | — | Prometheus text (when enabled) |
//!
//! With access control on, every route but `/healthz` needs a credential
//! (`authorization: Bearer <token>` or a client certificate): 401
//! `unauthenticated` without a known one, 403 `permission_denied` without the
//! verb on the resource or for another principal's lease, 429
//! `limit_exceeded` at a limit (see [`crate::auth`]).
//!
//! Refusals: busy 409, lease_lost 410, too_many_waiters 429, tokens_exhausted
//! 409, invalid 400, storage failure 500, shutting down 503. A busy body names
//! its `reason`: `held`, or `lock_delay` (the lease of `holder` and `token`
//! expired, `expires_in_ms` is 0), and `retry_in_ms`.
//!
//! The edges answer in JSON too: an unknown path is `404 not_found` (unless
//! the request is gRPC, which gets gRPC's UNIMPLEMENTED: both share the
//! port), a wrong method on a known path `405 method_not_allowed`, a body over
//! [`BODY_BYTES_MAX`] `413 payload_too_large`, a body that does not arrive
//! whole in time `408 request_timeout`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasefence_core::{Grant, Invalid, LeaseError};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use crate::auth::{Access, Caller};
use crate::edge::activity::BodyTimedOut;
use crate::{ApiError, Engine, Node, wire};
use leasefence_core::access::Verb;

#[path = "http_auth.rs"]
mod auth;

/// The largest request body accepted, in bytes. A request is a few hundred
/// bytes of JSON; anything near this is a mistake or an attack.
pub const BODY_BYTES_MAX: usize = 64 * 1024;

pub fn router(node: Arc<Node>, metrics: Option<PrometheusHandle>, access: Arc<Access>) -> Router {
    // Metrics name no resource: any known principal may read them.
    let metrics_route = get(move |State(node): State<Arc<Node>>, _: Caller| {
        let handle = metrics.clone();
        async move {
            let Some(handle) = handle else {
                return (
                    StatusCode::NOT_FOUND,
                    "metrics are not enabled in this process\n".to_string(),
                );
            };
            if let Ok(engine) = node.engine() {
                engine.record_sizes().await;
            }
            (StatusCode::OK, handle.render())
        }
    });
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", metrics_route)
        .route("/v1/acquire", post(acquire))
        .route("/v1/renew", post(renew))
        .route("/v1/release", post(release))
        .route("/v1/status", get(status))
        .merge(crate::browse::routes())
        .merge(crate::ui::routes())
        .route("/v1/force-release", post(force_release))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(unknown_path)
        .layer(axum::middleware::map_response(payload_too_large))
        .layer(axum::middleware::from_fn(refuse_oversize))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::Extension(access))
        .with_state(node)
}

/// `ok` (with the role on a shared store), or 503 once the coordinator can
/// only answer errors (a failed commit, an unreachable engine).
async fn healthz(State(node): State<Arc<Node>>) -> (StatusCode, String) {
    match node.health() {
        Ok(role) => (StatusCode::OK, role),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {e}\n")),
    }
}

/// Requests no route matches. gRPC shares the port, so a gRPC call (by its
/// content type, as gRPC clients send it) of a method this server lacks
/// gets gRPC's own answer; anything else gets the JSON 404.
async fn unknown_path(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let grpc = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let status = tonic::Status::unimplemented(format!("no gRPC method {}", uri.path()));
        return status.into_http::<axum::body::Body>().into_response();
    }
    let message = format!(
        "no such path: {method} {}; the API is POST /v1/acquire, /v1/renew, /v1/release, \
         GET /v1/status?resource=R, POST /v1/force-release, GET /v1/resources, /v1/watch, \
         /healthz, /metrics and /openapi.json (the status page is at /)",
        uri.path()
    );
    Failure(
        StatusCode::NOT_FOUND,
        json!({ "error": "not_found", "message": message }),
    )
    .into_response()
}

/// A known path with another method; axum adds the `Allow` header.
async fn method_not_allowed(method: Method, uri: Uri) -> Failure {
    let message = format!(
        "{method} is not allowed on {} (the Allow header lists what is)",
        uri.path()
    );
    Failure(
        StatusCode::METHOD_NOT_ALLOWED,
        json!({ "error": "method_not_allowed", "message": message }),
    )
}

/// The most bytes of a refused body read (and dropped) so that its client
/// gets the 413, and for how long.
const DRAIN_BYTES_MAX: usize = 16 << 20;
const DRAIN_TIME_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// A body over [`BODY_BYTES_MAX`] is refused before a handler runs, and read
/// to its end (up to [`DRAIN_BYTES_MAX`] within [`DRAIN_TIME_MAX`]) before
/// the answer: a server that closes with a body still unread resets the
/// connection, and the client, still writing, loses the 413 that says why.
/// A declared `Content-Length` is judged at once; every other body is read
/// here up to the limit and handed on whole, so that one that does not
/// arrive in time (the edge's body deadline, see `edge::activity`) is
/// answered `408 request_timeout` in JSON. gRPC calls (streams among them)
/// are left to their own limits.
async fn refuse_oversize(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use axum::body::HttpBody;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if declared.is_some_and(|n| n > BODY_BYTES_MAX as u64) {
        return drain_and_refuse(req.into_body().into_data_stream()).await;
    }
    if grpc || req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let mut body = body.into_data_stream();
    let mut whole: Vec<u8> = Vec::new();
    {
        use tokio_stream::StreamExt;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => return unreadable(e),
            };
            if whole.len() + chunk.len() > BODY_BYTES_MAX {
                return drain_and_refuse(body).await;
            }
            whole.extend_from_slice(&chunk);
        }
    }
    let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(whole));
    next.run(req).await
}

/// The answer to a body that failed while it was read: late (408), or
/// broken off (400). The connection closes after it: the rest of the body
/// could not be told from the next request.
fn unreadable(e: axum::Error) -> Response {
    let e = e.into_inner();
    let mut response = match e.downcast_ref::<BodyTimedOut>() {
        Some(late) => Failure(
            StatusCode::REQUEST_TIMEOUT,
            json!({ "error": "request_timeout", "message": late.to_string() }),
        ),
        None => Failure(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid", "message": "the request body could not be read to its end" }),
        ),
    }
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    response
}

/// Reads what is left of a refused body (bounded), then answers 413 and
/// closes the connection.
async fn drain_and_refuse(mut body: axum::body::BodyDataStream) -> Response {
    let _ = tokio::time::timeout(DRAIN_TIME_MAX, async {
        use tokio_stream::StreamExt;
        let mut read = 0usize;
        while let Some(Ok(chunk)) = body.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES_MAX {
                break;
            }
        }
    })
    .await;
    let mut response = payload_too_large(StatusCode::PAYLOAD_TOO_LARGE.into_response()).await;
    response
        .headers_mut()
        .insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    response
}

/// The body extractor's own 413 is plain text (no handler of ours answers
/// 413): say it in JSON like every other refusal.
async fn payload_too_large(response: Response) -> Response {
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    let message = format!("the request body is too large: limit {BODY_BYTES_MAX} bytes");
    Failure(
        StatusCode::PAYLOAD_TOO_LARGE,
        json!({ "error": "payload_too_large", "message": message }),
    )
    .into_response()
}

pub(crate) struct Failure(pub(crate) StatusCode, pub(crate) Value);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        if self.0 == StatusCode::UNAUTHORIZED {
            return (self.0, [(header::WWW_AUTHENTICATE, "Bearer")], axum::Json(self.1)).into_response();
        }
        (self.0, axum::Json(self.1)).into_response()
    }
}

impl From<Invalid> for Failure {
    fn from(e: Invalid) -> Failure {
        ApiError::Lease(LeaseError::Invalid(e)).into()
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        let e = e.counted();
        let message = e.to_string();
        match e {
            ApiError::Lease(e) => {
                let kind = leasefence_proto::error_kind(&e);
                let mut body = json!({ "error": kind, "message": message });
                let code = match &e {
                    LeaseError::Busy {
                        resource,
                        holder,
                        token,
                        expires_in,
                        reason,
                    } => {
                        body["resource"] = json!(resource.as_str());
                        body["holder"] = json!(holder.as_str());
                        body["token"] = json!(token.get());
                        body["expires_in_ms"] = json!(wire::millis(*expires_in));
                        body["reason"] = json!(reason.as_str());
                        body["retry_in_ms"] = json!(wire::millis(e.retry_in().unwrap_or(*expires_in)));
                        StatusCode::CONFLICT
                    }
                    LeaseError::LeaseLost { .. } => StatusCode::GONE,
                    LeaseError::TooManyWaiters { .. } => StatusCode::TOO_MANY_REQUESTS,
                    LeaseError::TokensExhausted { .. } => StatusCode::CONFLICT,
                    LeaseError::Invalid(_) => StatusCode::BAD_REQUEST,
                };
                Failure(code, body)
            }
            ApiError::Store(_) => Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "error": "storage", "message": message }),
            ),
            ApiError::ShuttingDown => Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "shutting_down", "message": message }),
            ),
            ApiError::NotLeader { leader } => Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "not_leader", "leader": leader, "message": message }),
            ),
            ApiError::Unavailable(_) => Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "unavailable", "message": message }),
            ),
            ApiError::OutcomeUnknown(_) => Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "outcome_unknown", "message": message }),
            ),
            ApiError::Auth(e) => auth::failure(&e, message),
        }
    }
}

fn lease_json(node: &Node, engine: &Engine, g: &Grant) -> Value {
    let mut lease = json!({
        "resource": g.resource.as_str(),
        "token": g.token.get(),
        "lease_id": g.lease_id.to_hex(),
        "ttl_ms": wire::millis(g.ttl),
        "expires_in_ms": wire::expires_in_ms(g, engine.now()),
        "holder": g.holder.as_str(),
    });
    if let Some(signature) = node.signature(g) {
        lease["signature"] = Value::String(signature);
    }
    lease
}

// Each call reads and checks its request before it asks for the engine, as
// the gRPC and frame edges do: a request wrong in itself, or not allowed, is
// refused as such on a standby too rather than sent on to the leader. The
// bounds that a coordinator's configuration sets (TTL, wait, lock delay)
// are the engine's, so only the active coordinator checks those.

async fn acquire(State(node): State<Arc<Node>>, caller: Caller, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let mut req = wire::acquire_json(&body)?;
    caller.check(Verb::Acquire, &req.resource)?;
    req.holder = caller.holder(req.holder)?;
    let engine = node.engine()?;
    let grant = engine.acquire_limited(req, caller.limit()).await?;
    Ok(axum::Json(lease_json(&node, &engine, &grant)))
}

async fn renew(State(node): State<Arc<Node>>, caller: Caller, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let (resource, lease_id) = wire::lease_json(&body)?;
    caller.check(Verb::Acquire, &resource)?;
    let engine = node.engine()?;
    let grant = engine.renew_as(&resource, &lease_id, caller.principal()).await?;
    Ok(axum::Json(lease_json(&node, &engine, &grant)))
}

async fn release(State(node): State<Arc<Node>>, caller: Caller, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let (resource, lease_id) = wire::lease_json(&body)?;
    caller.check(Verb::Acquire, &resource)?;
    let engine = node.engine()?;
    let token = engine.release_as(&resource, &lease_id, caller.principal()).await?;
    Ok(axum::Json(
        json!({ "resource": resource.as_str(), "token": token.get(), "released": true }),
    ))
}

async fn status(
    State(node): State<Arc<Node>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<axum::Json<Value>, Failure> {
    let params = wire::query(query.as_deref(), &["resource"])?;
    let resource = wire::resource(params.required("resource")?)?;
    caller.check(Verb::Read, &resource)?;
    let s = node.engine()?.status(&resource).await?;
    Ok(axum::Json(crate::browse::status_json(&s)))
}

/// An administrator ends whatever lease the resource has; audited.
async fn force_release(
    State(node): State<Arc<Node>>,
    caller: Caller,
    body: Bytes,
) -> Result<axum::Json<Value>, Failure> {
    let resource = wire::resource_json(&body)?;
    caller.check(Verb::Admin, &resource)?;
    let ended = node.engine()?.force_release(&resource).await?;
    caller.audit_force_release(&resource, ended);
    Ok(axum::Json(json!({
        "resource": resource.as_str(),
        "token": ended.map(|t| t.get()),
        "released": ended.is_some(),
    })))
}
