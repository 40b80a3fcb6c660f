//! gRPC services that fence their effects (feature `grpc`, tonic 0.14): the
//! fence travels as the metadata `leasefence-resource` / `leasefence-token`,
//! the same names and rules as [`crate::propagate`]'s headers.
//!
//! - Client: [`AttachFence`], an interceptor that adds one fence to every
//!   call, or [`attach_fence`] for one request.
//! - Server: [`fence_from_request`] / [`require_fence`] read it in a handler;
//!   [`RequireFence`], an interceptor, refuses calls without a valid fence
//!   before they reach the service and leaves the parsed [`Fence`] in the
//!   request's extensions (`request.extensions().get::<Fence>()`).
//! - A missing fence is `FAILED_PRECONDITION`, a malformed one (one part
//!   alone, repeated, a bad token or resource) `INVALID_ARGUMENT`.
//! - A stale effect is `FAILED_PRECONDITION` ([`stale_to_status`]) with the
//!   metadata `leasefence-resource`, [`METADATA_PRESENTED`] and
//!   [`METADATA_CURRENT`]; [`stale_from_status`] decodes it on the client so
//!   the caller can re-read state. [`arbiter_status`] maps any
//!   [`ArbiterError`].
//!
//! ```no_run
//! use leasefence_arbiter::grpc::{arbiter_status, require_fence};
//! use leasefence_arbiter::{ArbiterError, Fence};
//!
//! // Inside a tonic service method: take the fence, apply the effect through
//! // an arbiter, answer a stale token with FAILED_PRECONDITION.
//! async fn ship(
//!     request: tonic::Request<String>,
//!     apply: impl AsyncFnOnce(&Fence, String) -> Result<(), ArbiterError>,
//! ) -> Result<tonic::Response<()>, tonic::Status> {
//!     let fence = require_fence(&request)?;
//!     apply(&fence, request.into_inner()).await.map_err(arbiter_status)?;
//!     Ok(tonic::Response::new(()))
//! }
//! ```

use http::header::{HeaderName, HeaderValue};
use leasefence_core::{Fence, HEADER_RESOURCE, HEADER_TOKEN, Invalid, ResourceId, Stale, Token};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Code, Request, Status};

use crate::ArbiterError;
use crate::propagate::{fence_from_headers, fence_to_headers};

/// Metadata of a stale rejection: the token the caller presented.
pub const METADATA_PRESENTED: &str = "leasefence-presented";
/// Metadata of a stale rejection: the token recorded, which refused it.
pub const METADATA_CURRENT: &str = "leasefence-current";

/// Sets the fence metadata on `request` (replacing earlier values).
pub fn attach_fence<T>(request: &mut Request<T>, fence: &Fence) -> Result<(), Status> {
    fence_to_headers(fence, request.metadata_mut().as_mut()).map_err(|e| invalid_argument(&e))
}

/// Client interceptor that attaches one fence to every call made through it.
#[derive(Clone, Debug)]
pub struct AttachFence(pub Fence);

impl Interceptor for AttachFence {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        attach_fence(&mut request, &self.0)?;
        Ok(request)
    }
}

/// The request's fence, `None` when neither part is present;
/// `INVALID_ARGUMENT` when it is malformed.
pub fn fence_from_request<T>(request: &Request<T>) -> Result<Option<Fence>, Status> {
    fence_from_metadata(request.metadata())
}

/// The request's fence; `FAILED_PRECONDITION` when there is none,
/// `INVALID_ARGUMENT` when it is malformed.
pub fn require_fence<T>(request: &Request<T>) -> Result<Fence, Status> {
    fence_from_request(request)?
        .ok_or_else(|| Status::failed_precondition(format!("this method requires a fence: {}", allowed())))
}

fn fence_from_metadata(metadata: &MetadataMap) -> Result<Option<Fence>, Status> {
    fence_from_headers(metadata.as_ref()).map_err(|e| invalid_argument(&e))
}

/// What the two metadata entries may hold, for every refusal's message.
fn allowed() -> String {
    format!(
        "send the metadata {HEADER_RESOURCE} (the resource name) and {HEADER_TOKEN} (a decimal token in 1..={}), each once",
        u64::MAX
    )
}

fn invalid_argument(e: &Invalid) -> Status {
    Status::invalid_argument(format!("bad fence metadata ({}): {}", e.message(), allowed()))
}

/// Server interceptor: refuses a call without a valid fence, and puts the
/// parsed [`Fence`] into the request's extensions for the handler.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequireFence;

impl Interceptor for RequireFence {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let fence = require_fence(&request)?;
        request.extensions_mut().insert(fence);
        Ok(request)
    }
}

/// A stale rejection as `FAILED_PRECONDITION`, with resource, presented and
/// current in the metadata (and in the message).
pub fn stale_to_status(stale: &Stale) -> Status {
    let mut metadata = MetadataMap::new();
    // Raw bytes, as in a fence: a resource may be non-ASCII UTF-8; a
    // ResourceId never holds the control bytes a header value refuses.
    if let Ok(resource) = HeaderValue::from_bytes(stale.resource.as_str().as_bytes()) {
        metadata
            .as_mut()
            .insert(HeaderName::from_static(HEADER_RESOURCE), resource);
    }
    metadata.insert(METADATA_PRESENTED, MetadataValue::from(stale.presented.get()));
    metadata.insert(METADATA_CURRENT, MetadataValue::from(stale.current.get()));
    let message = format!("{stale}: re-read the state and retry under a newer lease");
    Status::with_metadata(Code::FailedPrecondition, message, metadata)
}

/// The [`Stale`] carried by a status from [`stale_to_status`]; `None` for any
/// other status (a missing fence is `FAILED_PRECONDITION` too, but carries
/// no tokens).
pub fn stale_from_status(status: &Status) -> Option<Stale> {
    if status.code() != Code::FailedPrecondition {
        return None;
    }
    let md = status.metadata();
    let text = |name: &str| -> Option<&str> { std::str::from_utf8(md.as_ref().get(name)?.as_bytes()).ok() };
    let token = |name: &str| text(name)?.parse::<u64>().ok().and_then(Token::new);
    Some(Stale {
        resource: ResourceId::new(text(HEADER_RESOURCE)?).ok()?,
        presented: token(METADATA_PRESENTED)?,
        current: token(METADATA_CURRENT)?,
    })
}

/// Any [`ArbiterError`] as a status: stale `FAILED_PRECONDITION` (as
/// [`stale_to_status`]), a refused signature `PERMISSION_DENIED`, invalid
/// `INVALID_ARGUMENT`, a retryable conflict
/// `ABORTED` (retry the call), anything else `INTERNAL` with a generic
/// message; the error itself goes to the log, not to the caller.
pub fn arbiter_status(e: ArbiterError) -> Status {
    match &e {
        ArbiterError::Stale(s) => stale_to_status(s),
        ArbiterError::Invalid(i) => Status::invalid_argument(i.to_string()),
        ArbiterError::BadSignature { .. } => Status::permission_denied(e.to_string()),
        _ if e.is_retryable() => {
            Status::aborted("the fenced effect ran into a concurrent one and was rolled back: retry the call")
        }
        _ => {
            tracing::error!(error = %e, "fenced effect failed");
            Status::internal("the fenced effect failed; the service's log says why")
        }
    }
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
