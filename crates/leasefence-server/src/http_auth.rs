//! The HTTP side of access control: the [`Caller`] extractor (the
//! `authorization` header, or the client certificate the TLS listener put in
//! the request's extensions) and the JSON shape of auth refusals.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::Failure;
use crate::auth::{Access, AuthError, Caller};
use crate::peer::PeerCertificate;
use crate::{ApiError, Node};

impl FromRequestParts<Arc<Node>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &Arc<Node>) -> Result<Caller, Response> {
        let refused = |e: AuthError| Failure::from(e).into_response();
        let Some(access) = parts.extensions.get::<Arc<Access>>() else {
            return Access::default().identify(None, None).map_err(refused);
        };
        let authorization = parts.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
        let peer = parts.extensions.get::<PeerCertificate>();
        access.identify(authorization, peer).map_err(refused)
    }
}

impl From<AuthError> for Failure {
    fn from(e: AuthError) -> Failure {
        ApiError::Auth(e).into()
    }
}

/// 401 `unauthenticated`, 403 `permission_denied`, or 429 `limit_exceeded`
/// naming the limit's config key and value.
pub(super) fn failure(e: &AuthError, message: String) -> Failure {
    let kind = e.kind();
    match e {
        AuthError::Unauthenticated(_) => {
            Failure(StatusCode::UNAUTHORIZED, json!({ "error": kind, "message": message }))
        }
        AuthError::PermissionDenied(_) => Failure(StatusCode::FORBIDDEN, json!({ "error": kind, "message": message })),
        AuthError::NotOwner { .. } => Failure(
            StatusCode::FORBIDDEN,
            json!({ "error": kind, "reason": "not_owner", "message": message }),
        ),
        AuthError::Limit { key, value, .. } => Failure(
            StatusCode::TOO_MANY_REQUESTS,
            json!({ "error": kind, "limit": key, "value": value, "message": message }),
        ),
    }
}
