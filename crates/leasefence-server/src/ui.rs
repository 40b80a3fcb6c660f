//! The status page and the API description, embedded in the binary: no build
//! step, no CDN. The page (`/`, `/ui`) is plain HTML, CSS and JavaScript that
//! reads `GET /v1/resources` and streams `GET /v1/watch`, sending the bearer
//! token the user typed in; it never shows lease ids (the API it reads has
//! none). `GET /openapi.json` is the OpenAPI 3 document of the HTTP API.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::Node;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");
/// The OpenAPI 3 document, kept under `docs/` and checked against the server by tests.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

/// Only our own files, and requests to our own origin: resource and holder
/// names are shown as text, and nothing else may run or be fetched.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(crate) fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/", get(index))
        .route("/ui", get(index))
        .route("/ui/app.js", get(|| file("text/javascript; charset=utf-8", APP_JS)))
        .route("/ui/style.css", get(|| file("text/css; charset=utf-8", STYLE_CSS)))
        .route("/openapi.json", get(|| file("application/json", OPENAPI_JSON)))
}

async fn index() -> impl IntoResponse {
    file("text/html; charset=utf-8", INDEX_HTML).await
}

async fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
