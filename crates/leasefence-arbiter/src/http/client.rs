//! The calling side: attach a fence to a reqwest request
//! ([`FenceRequestExt::fence`]) and turn a 409 stale answer back into a
//! [`Stale`] ([`FenceResponseExt::error_for_stale`]), so the caller can
//! re-read state instead of treating the refusal as a transport error.
//!
//! ```no_run
//! use leasefence_arbiter::http::client::{CallError, FenceRequestExt, FenceResponseExt};
//! use leasefence_arbiter::Fence;
//!
//! async fn ship(client: &reqwest::Client, fence: &Fence) -> Result<(), CallError> {
//!     let answer = client
//!         .put("http://orders.internal/orders/42")
//!         .fence(fence)
//!         .body("shipped")
//!         .send()
//!         .await?
//!         .error_for_stale()
//!         .await;
//!     match answer {
//!         Ok(_) => Ok(()),
//!         Err(CallError::Stale(stale)) => {
//!             // A newer holder wrote first: re-read, do not retry with this token.
//!             eprintln!("{stale}");
//!             Ok(())
//!         }
//!         Err(e) => Err(e),
//!     }
//! }
//! ```

use std::future::Future;

use leasefence_core::{Fence, ResourceId, Stale, Token};
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response, StatusCode};

use super::ERROR_STALE;
use crate::propagate::fence_to_headers;

/// Adds the fence headers to a request.
pub trait FenceRequestExt {
    /// Sets `leasefence-resource` and `leasefence-token` (replacing any
    /// earlier values of those two headers).
    fn fence(self, fence: &Fence) -> Self;
}

impl FenceRequestExt for RequestBuilder {
    fn fence(self, fence: &Fence) -> RequestBuilder {
        let mut headers = HeaderMap::new();
        // A ResourceId holds no control bytes, so this cannot fail; if it
        // ever did, the request would go out unfenced and a route that
        // requires a fence would refuse it with 428, never admit it.
        if let Err(e) = fence_to_headers(fence, &mut headers) {
            tracing::warn!(error = %e, "fence headers not attached");
        }
        self.headers(headers)
    }
}

/// Why a fenced call did not succeed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The service refused the effect: a newer token was recorded.
    #[error(transparent)]
    Stale(#[from] Stale),
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
}

/// Decodes stale answers of a fenced service.
pub trait FenceResponseExt: Sized {
    /// [`CallError::Stale`] for a 409 whose body is a leasefence stale
    /// rejection; every other response (a 409 of another kind included)
    /// comes back unchanged, for the caller to inspect as usual.
    fn error_for_stale(self) -> impl Future<Output = Result<Self, CallError>> + Send;
}

impl FenceResponseExt for Response {
    async fn error_for_stale(self) -> Result<Response, CallError> {
        if self.status() != StatusCode::CONFLICT {
            return Ok(self);
        }
        let (status, version, headers) = (self.status(), self.version(), self.headers().clone());
        let body = self.bytes().await?;
        if let Some(stale) = stale_from_json(&body) {
            return Err(CallError::Stale(stale));
        }
        // Another kind of conflict: hand back an equivalent response.
        let mut rebuilt = ::http::Response::new(body);
        *rebuilt.status_mut() = status;
        *rebuilt.version_mut() = version;
        *rebuilt.headers_mut() = headers;
        Ok(Response::from(rebuilt))
    }
}

/// The [`Stale`] in a 409 body `{"error":"stale","resource":…,"presented":…,"current":…}`,
/// `None` when the body is anything else (tokens must be JSON integers
/// `1..=u64::MAX`, the resource a valid name).
pub fn stale_from_json(body: &[u8]) -> Option<Stale> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v.get("error")?.as_str()? != ERROR_STALE {
        return None;
    }
    let token = |name: &str| v.get(name)?.as_u64().and_then(Token::new);
    Some(Stale {
        resource: ResourceId::new(v.get("resource")?.as_str()?).ok()?,
        presented: token("presented")?,
        current: token("current")?,
    })
}
