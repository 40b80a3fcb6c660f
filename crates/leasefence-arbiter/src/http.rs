//! HTTP services that fence their effects (feature `http`): axum extractors
//! that take the [`Fence`] from the request's headers, responses for a stale
//! rejection and for any [`ArbiterError`], and, in [`client`], a reqwest
//! helper that attaches a fence and decodes a stale answer back into [`Stale`].
//!
//! The headers are those of [`crate::propagate`]: `leasefence-resource` and
//! `leasefence-token` (decimal, `1..=18446744073709551615`), both or neither,
//! each at most once.
//!
//! | request | [`RequiredFence`] | [`OptionalFence`] |
//! |---|---|---|
//! | both headers, once each, valid | the fence | `Some(fence)` |
//! | neither header | 428 `fence_required` | `None` |
//! | one alone, a repeat, a bad token or resource | 400 `bad_fence` | 400 `bad_fence` |
//!
//! Refusals are JSON `{"error": …, "message": …}`; the message names the
//! headers and what they may hold. A stale effect answers 409
//! `{"error":"stale","resource":…,"presented":…,"current":…,"message":…}`
//! ([`StaleResponse`]), upon which the caller re-reads state.
//!
//! A handler takes the fence and applies its effect through an arbiter; `?`
//! turns an [`ArbiterError`] into its answer ([`ArbiterResponse`]):
//!
//! ```no_run
//! # #[cfg(feature = "embedded")]
//! # mod example {
//! use std::sync::Arc;
//!
//! use axum::extract::{Path, State};
//! use leasefence_arbiter::embedded::EmbeddedArbiter;
//! use leasefence_arbiter::http::{ArbiterResponse, RequiredFence};
//! use leasefence_arbiter::{ArbiterError, FenceMode};
//!
//! /// `PUT /orders/{id}`: 204 once the fenced write committed, 409 when the
//! /// caller's token is stale, 428/400 without a (valid) fence.
//! async fn put_order(
//!     State(arbiter): State<Arc<EmbeddedArbiter>>,
//!     Path(id): Path<String>,
//!     RequiredFence(fence): RequiredFence,
//!     body: String,
//! ) -> Result<axum::http::StatusCode, ArbiterResponse> {
//!     // redb blocks: keep it off the async workers.
//!     tokio::task::spawn_blocking(move || arbiter.put(&fence, FenceMode::Strict, &id, body.as_bytes()))
//!         .await
//!         .map_err(|e| ArbiterError::Task(e.to_string()))??;
//!     Ok(axum::http::StatusCode::NO_CONTENT)
//! }
//!
//! pub fn app(arbiter: Arc<EmbeddedArbiter>) -> axum::Router {
//!     axum::Router::new()
//!         .route("/orders/{id}", axum::routing::put(put_order))
//!         .with_state(arbiter)
//! }
//! # }
//! ```

use axum::Json;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use leasefence_core::{Fence, HEADER_RESOURCE, HEADER_TOKEN, Invalid, Stale};
use serde_json::json;

use crate::ArbiterError;
use crate::propagate::fence_from_headers;

pub mod client;

/// The `error` of a 428: the route requires a fence and the request had none.
pub const ERROR_FENCE_REQUIRED: &str = "fence_required";
/// The `error` of a 400 for fence headers that are malformed, repeated or half there.
pub const ERROR_BAD_FENCE: &str = "bad_fence";
/// The `error` of a 409 stale rejection.
pub const ERROR_STALE: &str = "stale";

/// Extracts the request's fence; a request without one is refused with 428
/// Precondition Required, a malformed one with 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequiredFence(pub Fence);

/// Extracts the request's fence if it has one (`None` when neither header is
/// present); a malformed one is refused with 400, never taken for "no fence".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionalFence(pub Option<Fence>);

/// Why the fence headers were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceRejection {
    /// Neither header is present on a route that requires a fence (428).
    Missing,
    /// Present but unusable: one alone, repeated, or a bad value (400).
    Malformed(Invalid),
}

impl<S: Send + Sync> FromRequestParts<S> for RequiredFence {
    type Rejection = FenceRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match fence_from_headers(&parts.headers) {
            Ok(Some(fence)) => Ok(RequiredFence(fence)),
            Ok(None) => Err(FenceRejection::Missing),
            Err(e) => Err(FenceRejection::Malformed(e)),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for OptionalFence {
    type Rejection = FenceRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        fence_from_headers(&parts.headers)
            .map(OptionalFence)
            .map_err(FenceRejection::Malformed)
    }
}

/// `Option<RequiredFence>` works as [`OptionalFence`] does.
impl<S: Send + Sync> OptionalFromRequestParts<S> for RequiredFence {
    type Rejection = FenceRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Self::Rejection> {
        fence_from_headers(&parts.headers)
            .map(|f| f.map(RequiredFence))
            .map_err(FenceRejection::Malformed)
    }
}

/// What the two headers may hold, for every refusal's message.
fn allowed() -> String {
    format!(
        "send {HEADER_RESOURCE} (the resource name) and {HEADER_TOKEN} (a decimal token in 1..={}), each once",
        u64::MAX
    )
}

impl IntoResponse for FenceRejection {
    fn into_response(self) -> Response {
        let (status, error, message) = match self {
            FenceRejection::Missing => (
                StatusCode::PRECONDITION_REQUIRED,
                ERROR_FENCE_REQUIRED,
                format!("this route requires a fence: {}", allowed()),
            ),
            FenceRejection::Malformed(e) => (
                StatusCode::BAD_REQUEST,
                ERROR_BAD_FENCE,
                format!("bad fence headers ({}): {}", e.message(), allowed()),
            ),
        };
        (status, Json(json!({ "error": error, "message": message }))).into_response()
    }
}

/// A stale rejection as an answer: 409 with `resource`, `presented` and
/// `current` (tokens as JSON integers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleResponse(pub Stale);

impl From<Stale> for StaleResponse {
    fn from(s: Stale) -> StaleResponse {
        StaleResponse(s)
    }
}

impl IntoResponse for StaleResponse {
    fn into_response(self) -> Response {
        let s = self.0;
        let body = json!({
            "error": ERROR_STALE,
            "resource": s.resource.as_str(),
            "presented": s.presented.get(),
            "current": s.current.get(),
            "message": format!("{s}: re-read the state and retry under a newer lease"),
        });
        (StatusCode::CONFLICT, Json(body)).into_response()
    }
}

/// Any [`ArbiterError`] as an answer: stale 409 (as [`StaleResponse`]),
/// a refused signature 403 `{"error":"bad_signature","resource","reason",
/// "message"}`, invalid 400, a retryable conflict ([`ArbiterError::is_retryable`]) 503,
/// anything else 500 with a generic message; the error itself goes to the
/// log, not to the caller.
#[derive(Debug)]
pub struct ArbiterResponse(pub ArbiterError);

impl From<ArbiterError> for ArbiterResponse {
    fn from(e: ArbiterError) -> ArbiterResponse {
        ArbiterResponse(e)
    }
}

impl From<Stale> for ArbiterResponse {
    fn from(s: Stale) -> ArbiterResponse {
        ArbiterResponse(ArbiterError::Stale(s))
    }
}

impl IntoResponse for ArbiterResponse {
    fn into_response(self) -> Response {
        let e = self.0;
        let (status, error, message) = match &e {
            ArbiterError::Stale(s) => return StaleResponse(s.clone()).into_response(),
            ArbiterError::BadSignature { resource, reason } => {
                let body = json!({"error": "bad_signature", "resource": resource.as_str(),
                                  "reason": reason.reason(), "message": e.to_string()});
                return (StatusCode::FORBIDDEN, Json(body)).into_response();
            }
            ArbiterError::Invalid(i) => (StatusCode::BAD_REQUEST, "invalid", i.to_string()),
            _ if e.is_retryable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "retry",
                "the fenced effect ran into a concurrent one and was rolled back: retry the request".to_string(),
            ),
            _ => {
                tracing::error!(error = %e, "fenced effect failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the fenced effect failed; the service's log says why".to_string(),
                )
            }
        };
        (status, Json(json!({ "error": error, "message": message }))).into_response()
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
