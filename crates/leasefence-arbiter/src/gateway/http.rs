//! The gateway's HTTP routes (axum): parse and check everything a request
//! carries, then hand the effect to [`super::store`] on a blocking thread.
//!
//! Order of checks on a write: key, fence headers (428 / 400), mode and
//! conditional headers (400), `Content-Length` against the limit (413, before
//! any byte is read), the fence against the recorded token (409, before any
//! byte is read), the streamed body (413 as soon as it crosses the limit),
//! then the commit, which checks the fence again: stale (409) before
//! preconditions (412).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, ETAG};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leasefence_core::{Fence, FenceMode, HEADER_RESOURCE, HEADER_TOKEN, Invalid, ResourceId};
use serde_json::json;

use super::blob::{self, BodyError};
use super::precondition::Preconditions;
use super::reply::Refusal;
use super::store::{Record, Store, WriteError};
use super::{HEADER_MODE, KEY_LEN_MAX, LIST_LIMIT_MAX, SERVICE};
use crate::propagate::fence_from_headers;

type Shared = State<Arc<Store>>;
type Reply = Result<Response, Refusal>;

pub(crate) fn router(store: Arc<Store>) -> Router {
    Router::new()
        .route("/", get(info))
        .route("/objects", get(list))
        .route(
            "/objects/{*key}",
            get(get_object).head(head_object).put(put_object).delete(delete_object),
        )
        .route("/fences/{*resource}", get(fence))
        .fallback(|| async { Refusal::NoRoute })
        .with_state(store)
}

async fn info() -> Json<serde_json::Value> {
    Json(json!({"service": SERVICE, "version": env!("CARGO_PKG_VERSION")}))
}

/// Runs a store call on a blocking thread; it completes even if the client goes away.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Refusal::Internal(format!("store task failed: {e}")))
}

/// The object key of the path: 1..=1024 bytes of UTF-8 without control characters.
fn object_key(path: Result<Path<String>, PathRejection>) -> Result<String, Refusal> {
    let Path(key) = path.map_err(|e| Invalid::new("key", format!("the object key in the path: {e}")))?;
    if key.is_empty() || key.len() > KEY_LEN_MAX {
        return Err(Invalid::new(
            "key",
            format!("must be 1..={KEY_LEN_MAX} bytes of UTF-8, got {} bytes", key.len()),
        )
        .into());
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        let msg = format!("must not contain control characters, found U+{:04X}", c as u32);
        return Err(Invalid::new("key", msg).into());
    }
    Ok(key)
}

/// The fence of a write (required) and its mode (strict unless `leasefence-mode: monotonic`).
fn write_fence(headers: &HeaderMap) -> Result<(Fence, FenceMode), Refusal> {
    let fence = fence_from_headers(headers)
        .map_err(Refusal::BadFence)?
        .ok_or(Refusal::FenceRequired)?;
    let mut modes = headers.get_all(HEADER_MODE).iter();
    let mode = match (modes.next(), modes.next()) {
        (None, _) => FenceMode::Strict,
        (Some(_), Some(_)) => {
            return Err(Invalid::new("header", format!("{HEADER_MODE} appears more than once")).into());
        }
        (Some(v), None) => {
            let s = v.to_str().unwrap_or("(not visible ASCII)");
            FenceMode::parse(s).map_err(|e| Invalid::new("header", format!("{HEADER_MODE}: {}", e.message())))?
        }
    };
    Ok((fence, mode))
}

fn object_headers(r: &Record) -> [(axum::http::HeaderName, HeaderValue); 4] {
    let resource = HeaderValue::from_bytes(r.resource.as_str().as_bytes()).unwrap_or(HeaderValue::from_static(""));
    [
        (ETAG, header_value(&r.etag.to_string())),
        (CONTENT_LENGTH, HeaderValue::from(r.size)),
        (
            axum::http::HeaderName::from_static(HEADER_TOKEN),
            HeaderValue::from(r.token.get()),
        ),
        (axum::http::HeaderName::from_static(HEADER_RESOURCE), resource),
    ]
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""))
}

fn describe(key: &str, r: &Record) -> serde_json::Value {
    json!({"key": key, "size": r.size, "etag": r.etag.to_string(), "token": r.token.get(),
           "resource": r.resource.as_str()})
}

fn not_found(key: String) -> Refusal {
    Refusal::NotFound {
        what: "object",
        name: key,
    }
}

async fn lookup(store: &Arc<Store>, key: &str) -> Result<Record, Refusal> {
    let (s, k) = (Arc::clone(store), key.to_string());
    blocking(move || s.lookup(&k))
        .await??
        .ok_or_else(|| not_found(key.to_string()))
}

async fn head_object(State(store): Shared, path: Result<Path<String>, PathRejection>) -> Reply {
    let key = object_key(path)?;
    let r = lookup(&store, &key).await?;
    let mut resp = StatusCode::OK.into_response();
    resp.headers_mut().extend(object_headers(&r));
    Ok(resp)
}

/// Streams the blob the key points at. A blob replaced (and removed) between
/// the lookup and the open is looked up again: blobs are immutable, so what
/// is served is always one whole object.
async fn get_object(State(store): Shared, path: Result<Path<String>, PathRejection>) -> Reply {
    const ATTEMPTS: usize = 16;
    let key = object_key(path)?;
    for _ in 0..ATTEMPTS {
        let r = lookup(&store, &key).await?;
        match tokio::fs::File::open(blob::blob_path(store.data_dir(), r.blob)).await {
            Ok(file) => {
                let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 64 * 1024));
                let mut resp = (StatusCode::OK, body).into_response();
                resp.headers_mut().extend(object_headers(&r));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                return Ok(resp);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let again = lookup(&store, &key).await;
                if matches!(&again, Ok(now) if now.blob == r.blob) {
                    return Err(Refusal::Internal(format!("object {key:?}: its blob is missing")));
                }
            }
            Err(e) => return Err(Refusal::Internal(format!("object {key:?}: cannot open its blob: {e}"))),
        }
    }
    Err(Refusal::Internal(format!(
        "object {key:?} kept changing while being opened"
    )))
}

async fn put_object(
    State(store): Shared,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Reply {
    let key = object_key(path)?;
    let (fence, mode) = write_fence(&headers)?;
    let pre = Preconditions::from_headers(&headers)?;
    let limit = store.object_size_max();
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Refusal::TooLarge { limit });
    }
    let (s, f) = (Arc::clone(&store), fence.clone());
    blocking(move || s.precheck(&f, mode)).await??;
    let (pending, file) = blob::receive(store.data_dir(), limit, body.into_data_stream())
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { limit } => Refusal::TooLarge { limit },
            BodyError::Body(why) => Refusal::BodyFailed(why),
            BodyError::Io(e) => io_refusal("cannot store the body", e),
        })?;
    let (s, k, f) = (Arc::clone(&store), key.clone(), fence.clone());
    let (record, old) = blocking(move || s.commit_put(&k, &f, mode, &pre, pending, file))
        .await?
        .map_err(write_refusal)?;
    let status = if old.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut resp = (status, Json(describe(&key, &record))).into_response();
    resp.headers_mut().insert(ETAG, header_value(&record.etag.to_string()));
    Ok(resp)
}

async fn delete_object(State(store): Shared, path: Result<Path<String>, PathRejection>, headers: HeaderMap) -> Reply {
    let key = object_key(path)?;
    let (fence, mode) = write_fence(&headers)?;
    let pre = Preconditions::from_headers(&headers)?;
    let (s, k) = (Arc::clone(&store), key.clone());
    match blocking(move || s.commit_delete(&k, &fence, mode, &pre)).await? {
        Ok(old) => Ok(Json(json!({"deleted": describe(&key, &old)})).into_response()),
        Err(WriteError::NotFound) => Err(not_found(key)),
        Err(e) => Err(write_refusal(e)),
    }
}

fn write_refusal(e: WriteError) -> Refusal {
    match e {
        WriteError::Arbiter(a) => a.into(),
        WriteError::Precondition(p) => Refusal::Precondition(p),
        WriteError::NotFound => Refusal::Internal("a put found no object to replace".to_string()),
        WriteError::Io(e) => io_refusal("cannot make the body durable", e),
    }
}

/// A full disk is the client's 507 (retry later); any other I/O error is ours.
fn io_refusal(what: &str, e: std::io::Error) -> Refusal {
    match e.kind() {
        std::io::ErrorKind::StorageFull => Refusal::InsufficientStorage(format!("{what}: {e}")),
        _ => Refusal::Internal(format!("{what}: {e}")),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /objects?prefix=P[&after=K][&limit=N]`: keys in order, with `next`
/// (the `after` of the next page) when more follow.
async fn list(State(store): Shared, q: Result<Query<ListParams>, QueryRejection>) -> Reply {
    let Query(q) = q.map_err(|e| {
        Invalid::new(
            "query",
            format!("{e}; allowed: prefix=P, after=KEY, limit=1..={LIST_LIMIT_MAX}"),
        )
    })?;
    let limit = q.limit.unwrap_or(LIST_LIMIT_MAX);
    if limit == 0 || limit > LIST_LIMIT_MAX {
        return Err(Invalid::new("limit", format!("must be 1..={LIST_LIMIT_MAX}, got {limit}")).into());
    }
    let (entries, more) = blocking(move || store.list(&q.prefix, q.after.as_deref(), limit)).await??;
    let next = if more {
        entries.last().map(|(k, _)| k.clone())
    } else {
        None
    };
    let objects: Vec<_> = entries.iter().map(|(k, r)| describe(k, r)).collect();
    Ok(Json(json!({"objects": objects, "truncated": more, "next": next})).into_response())
}

/// `GET /fences/{resource}`: the fence key's recorded `last_token`.
async fn fence(State(store): Shared, path: Result<Path<String>, PathRejection>) -> Reply {
    let Path(name) = path.map_err(|e| Invalid::new("resource", format!("the resource in the path: {e}")))?;
    let resource = ResourceId::new(&name)?;
    let r = resource.clone();
    match blocking(move || store.last_token(&r)).await?? {
        Some(t) => Ok(Json(json!({"resource": resource.as_str(), "token": t.get()})).into_response()),
        None => Err(Refusal::NotFound {
            what: "fence for",
            name,
        }),
    }
}
