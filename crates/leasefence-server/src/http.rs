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
//! | `GET /healthz` | — | `ok` |
//! | `GET /metrics` | — | Prometheus text (when enabled) |
//!
//! Refusals: busy 409, lease_lost 410, too_many_waiters 429, tokens_exhausted
//! 409, invalid 400, storage failure 500, shutting down 503. A busy body names
//! its `reason`: `held`, or `lock_delay` (the lease of `holder` and `token`
//! expired, `expires_in_ms` is 0), and `retry_in_ms`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasefence_core::{Grant, Invalid, LeaseError};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, Engine, wire};

pub fn router(engine: Arc<Engine>, metrics: Option<PrometheusHandle>) -> Router {
    let metrics_route = get(move || {
        let rendered = metrics.as_ref().map(|h| h.render());
        async move {
            match rendered {
                Some(text) => (StatusCode::OK, text),
                None => (
                    StatusCode::NOT_FOUND,
                    "metrics are not enabled in this process\n".to_string(),
                ),
            }
        }
    });
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", metrics_route)
        .route("/v1/acquire", post(acquire))
        .route("/v1/renew", post(renew))
        .route("/v1/release", post(release))
        .route("/v1/status", get(status))
        .with_state(engine)
}

#[derive(Deserialize)]
struct StatusQuery {
    resource: Option<String>,
}

struct Failure(StatusCode, Value);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
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
        }
    }
}

fn lease_json(engine: &Engine, g: &Grant) -> Value {
    json!({
        "resource": g.resource.as_str(),
        "token": g.token.get(),
        "lease_id": g.lease_id.to_hex(),
        "ttl_ms": wire::millis(g.ttl),
        "expires_in_ms": wire::expires_in_ms(g, engine.now()),
        "holder": g.holder.as_str(),
    })
}

async fn acquire(State(engine): State<Arc<Engine>>, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let req = wire::acquire_json(&body)?;
    let grant = engine.acquire(req).await?;
    Ok(axum::Json(lease_json(&engine, &grant)))
}

async fn renew(State(engine): State<Arc<Engine>>, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let (resource, lease_id) = wire::lease_json(&body)?;
    let grant = engine.renew(&resource, &lease_id)?;
    Ok(axum::Json(lease_json(&engine, &grant)))
}

async fn release(State(engine): State<Arc<Engine>>, body: Bytes) -> Result<axum::Json<Value>, Failure> {
    let (resource, lease_id) = wire::lease_json(&body)?;
    let token = engine.release(&resource, &lease_id).await?;
    Ok(axum::Json(
        json!({ "resource": resource.as_str(), "token": token.get(), "released": true }),
    ))
}

async fn status(
    State(engine): State<Arc<Engine>>,
    query: Result<Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>, Failure> {
    let resource = query.ok().and_then(|Query(q)| q.resource).unwrap_or_default();
    let s = engine.status(&wire::resource(&resource)?);
    let held = s.held.as_ref();
    Ok(axum::Json(json!({
        "resource": s.resource.as_str(),
        "last_token": s.last_token.map(|t| t.get()),
        "holder": held.map(|h| h.holder.as_str()),
        "token": held.map(|h| h.token.get()),
        "expires_in_ms": held.map(|h| wire::millis(h.expires_in)),
        "waiters": s.waiters,
    })))
}
