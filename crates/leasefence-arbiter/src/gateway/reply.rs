//! Every refusal of the gateway as a status code and a JSON body with an
//! `error` name a client can match on and a `message` a human can act on.
//! Internal failures are logged in full and answered without detail.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasefence_core::signing::SignatureError;
use leasefence_core::{HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, Invalid, ResourceId, Stale};
use serde_json::json;

use super::precondition::PreconditionFailed;
use crate::ArbiterError;

/// Why a request was not served.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// 400: a header, the key or the query breaks a rule.
    Invalid(Invalid),
    /// 400: the fence headers are malformed (repeated, one alone, not a token, ...).
    BadFence(Invalid),
    /// 428: a write without a fence.
    FenceRequired,
    /// 409: the fence is stale.
    Stale(Stale),
    /// 403: the gateway holds fence keys and the fence is not signed with
    /// one of them (a forged or replayed fence). Not 409: no newer token
    /// helps, only the coordinator's signature does.
    BadSignature {
        resource: ResourceId,
        reason: SignatureError,
    },
    /// 412: `If-Match` / `If-None-Match` does not hold.
    Precondition(PreconditionFailed),
    /// 413: the body is (or says it is) larger than the limit.
    TooLarge { limit: u64 },
    /// 404: no object under the key, or no fence for the resource.
    NotFound { what: &'static str, name: String },
    /// 404: a path the gateway does not serve.
    NoRoute,
    /// 400: the request body ended before it was complete.
    BodyFailed(String),
    /// 429: the connection is beyond `connections_max`; it is closed after this.
    TooManyConnections { max: usize },
    /// 507: the disk is full; the body was discarded.
    InsufficientStorage(String),
    /// 500: logged, not shown.
    Internal(String),
}

impl From<ArbiterError> for Refusal {
    fn from(e: ArbiterError) -> Refusal {
        match e {
            ArbiterError::Stale(s) => Refusal::Stale(s),
            ArbiterError::BadSignature { resource, reason } => Refusal::BadSignature { resource, reason },
            ArbiterError::Invalid(i) => Refusal::Invalid(i),
            other => Refusal::Internal(other.to_string()),
        }
    }
}

impl From<Invalid> for Refusal {
    fn from(i: Invalid) -> Refusal {
        Refusal::Invalid(i)
    }
}

/// The header an invalid fence is about, for the `header` field of a 400.
fn fence_header(i: &Invalid) -> &'static str {
    match i.field() {
        "token" => HEADER_TOKEN,
        "resource" => HEADER_RESOURCE,
        "signature" => HEADER_SIGNATURE,
        _ if i.message().starts_with(HEADER_TOKEN) => HEADER_TOKEN,
        _ if i.message().starts_with(HEADER_RESOURCE) && !i.message().contains(" is set but ") => HEADER_RESOURCE,
        _ => "leasefence-resource, leasefence-token",
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            Refusal::Invalid(i) => (
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid", "field": i.field(), "message": i.to_string()}),
            ),
            Refusal::BadFence(i) => (
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_fence", "header": fence_header(&i), "message": i.to_string()}),
            ),
            Refusal::FenceRequired => (
                StatusCode::PRECONDITION_REQUIRED,
                json!({"error": "fence_required", "message": format!(
                    "a write needs a fence: send the headers {HEADER_RESOURCE} (the fence key) and \
                     {HEADER_TOKEN} (a decimal token in 1..={}) of your lease", u64::MAX)}),
            ),
            Refusal::Stale(s) => (
                StatusCode::CONFLICT,
                json!({"error": "stale", "resource": s.resource.as_str(), "presented": s.presented.get(),
                       "current": s.current.get(), "message": s.to_string()}),
            ),
            Refusal::BadSignature { resource, reason } => {
                let key = match &reason {
                    SignatureError::UnknownKey(id) => Some(id.clone()),
                    _ => None,
                };
                (
                    StatusCode::FORBIDDEN,
                    json!({"error": "bad_signature", "resource": resource.as_str(), "reason": reason.reason(),
                           "key": key, "message": format!("fence for {resource} refused: {reason}; send the \
                           {HEADER_SIGNATURE} header the coordinator issued with this fence")}),
                )
            }
            Refusal::Precondition(p) => (
                StatusCode::PRECONDITION_FAILED,
                json!({"error": "precondition_failed", "header": p.header,
                       "current_etag": p.current.map(|e| e.to_string()), "message": p.to_string()}),
            ),
            Refusal::TooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "too_large", "limit": limit,
                       "message": format!("objects may be at most {limit} bytes (--object-size-max)")}),
            ),
            Refusal::NotFound { what, name } => (
                StatusCode::NOT_FOUND,
                json!({"error": "not_found", "message": format!("no {what} {name:?}")}),
            ),
            Refusal::NoRoute => (
                StatusCode::NOT_FOUND,
                json!({"error": "not_found", "message": "no such route: the gateway serves GET /, \
                       PUT/GET/HEAD/DELETE /objects/{key}, GET /objects?prefix=P and GET /fences/{resource}"}),
            ),
            Refusal::BodyFailed(why) => (
                StatusCode::BAD_REQUEST,
                json!({"error": "body_incomplete", "message": format!("the request body did not arrive whole, nothing was written: {why}")}),
            ),
            Refusal::TooManyConnections { max } => (
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": "limit_exceeded", "limit": "connections-max", "max": max, "message": format!(
                    "{max} connections are open (--connections-max); retry later on a new connection")}),
            ),
            Refusal::InsufficientStorage(why) => {
                tracing::warn!(error = %why, "an object did not fit on the disk");
                (
                    StatusCode::INSUFFICIENT_STORAGE,
                    json!({"error": "insufficient_storage", "message": "the gateway's disk is full: nothing was \
                           written; delete objects or give --data-dir more space, then retry with the same token"}),
                )
            }
            Refusal::Internal(why) => {
                tracing::error!(error = %why, "gateway request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": "internal", "message": "the gateway failed; see its log"}),
                )
            }
        };
        (status, Json(body)).into_response()
    }
}
