//! Read-only HTTP views for dashboards and the status page: a bounded listing
//! of resources by prefix, and the watch stream as NDJSON (gRPC has its own).
//!
//! | route | success |
//! |---|---|
//! | `GET /v1/resources?prefix=P&after=R&limit=N` | `{"resources":[status…],"next_after":R\|null}` |
//! | `GET /v1/watch?prefix=P` or `?resource=R`, `&after_revision=N&coordinator_id=C` | `application/x-ndjson`, one event per line |
//!
//! Neither shows lease ids. A watch stream's last line may be an error object
//! (`shutting_down`, or `lagged` with the revision to resume after). With
//! access control on, both need `read` on the whole prefix (or the resource),
//! and a watch takes a watcher slot like a gRPC one.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leasefence_core::{Invalid, LIST_LIMIT_MAX, ResourceStatus};
use serde_json::{Value, json};

use crate::auth::{Access, Caller};
use crate::http::Failure;
use crate::watch::{self, Ended, Event, EventKind, Filter, WatchError};
use crate::{Node, wire};
use leasefence_core::access::Verb;

/// Resources per listing page when the request names no `limit`.
pub const LIST_LIMIT_DEFAULT: usize = 100;

pub(crate) fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/v1/resources", get(list))
        .route("/v1/watch", get(watch))
}

/// A resource as `GET /v1/status` and the listing show it.
pub(crate) fn status_json(s: &ResourceStatus) -> Value {
    let held = s.held.as_ref();
    json!({
        "resource": s.resource.as_str(),
        "last_token": s.last_token.map(|t| t.get()),
        "holder": held.map(|h| h.holder.as_str()),
        "token": held.map(|h| h.token.get()),
        "expires_in_ms": held.map(|h| wire::millis(h.expires_in)),
        "waiters": s.waiters,
    })
}

/// A prefix is empty (everything) or as valid as a resource name.
fn prefix(p: Option<&str>) -> Result<String, Invalid> {
    match p {
        None | Some("") => Ok(String::new()),
        Some(p) => wire::resource(p)
            .map(|_| p.to_string())
            .map_err(|e| Invalid::new("prefix", e.message())),
    }
}

fn number(params: &wire::Query, name: &'static str) -> Result<Option<u64>, Invalid> {
    params
        .get(name)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Invalid::new(name, format!("must be a non-negative integer, got {v:?}")))
        })
        .transpose()
}

async fn list(
    State(node): State<Arc<Node>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<axum::Json<Value>, Failure> {
    let params = wire::query(query.as_deref(), &["prefix", "after", "limit"])?;
    let prefix = prefix(params.get("prefix"))?;
    caller.check_prefix(Verb::Read, &prefix)?;
    let after = params.get("after").map(wire::resource).transpose()?;
    let limit = match number(&params, "limit")? {
        None => LIST_LIMIT_DEFAULT,
        Some(n @ 1..) if n <= LIST_LIMIT_MAX as u64 => n as usize,
        Some(n) => return Err(Invalid::new("limit", format!("must be 1..={LIST_LIMIT_MAX}, got {n}")).into()),
    };
    let page = node
        .engine()?
        .list(&prefix, after.as_ref().map(|r| r.as_str()), limit)
        .await?;
    let next_after = if page.more {
        page.resources.last().map(|s| s.resource.as_str())
    } else {
        None
    };
    Ok(axum::Json(json!({
        "resources": page.resources.iter().map(status_json).collect::<Vec<_>>(),
        "next_after": next_after,
    })))
}

fn event_json(coordinator_id: &str, e: &Event) -> Value {
    let kind = match e.kind {
        EventKind::Granted => "granted",
        EventKind::Released => "released",
        EventKind::Expired => "expired",
    };
    json!({
        "revision": e.revision,
        "coordinator_id": coordinator_id,
        "resource": e.resource.as_str(),
        "kind": kind,
        "token": e.token.get(),
        "holder": e.holder.as_ref().map(|h| h.as_str()),
    })
}

fn line(v: &Value) -> Bytes {
    let mut text = v.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// Which resources a watch request names: `prefix` (empty: all) or one `resource`.
fn watch_filter(params: &wire::Query) -> Result<Filter, Invalid> {
    match (params.get("prefix"), params.get("resource")) {
        (Some(_), Some(_)) => Err(Invalid::new("query", "give prefix or resource, not both")),
        (None, Some(r)) => Ok(Filter {
            resource: wire::resource(r)?.as_str().to_string(),
            prefix: false,
        }),
        (p, None) => Ok(Filter {
            resource: prefix(p)?,
            prefix: true,
        }),
    }
}

async fn watch(
    State(node): State<Arc<Node>>,
    Extension(access): Extension<Arc<Access>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    let params = wire::query(
        query.as_deref(),
        &["prefix", "resource", "after_revision", "coordinator_id"],
    )?;
    let filter = watch_filter(&params)?;
    if filter.prefix {
        caller.check_prefix(Verb::Read, &filter.resource)?;
    } else {
        caller.check(Verb::Read, &wire::resource(&filter.resource)?)?;
    }
    let coordinator_id = params.get("coordinator_id").unwrap_or_default();
    let after = wire::resume(number(&params, "after_revision")?, coordinator_id)?;
    let slot = access.watching(&caller)?;
    let engine = node.engine()?;
    engine.health()?;
    let sub = engine.watch(&filter, after, coordinator_id).map_err(|e| {
        let (code, kind) = match &e {
            WatchError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            WatchError::Compacted { .. } => (StatusCode::GONE, "compacted"),
            WatchError::Restarted => (StatusCode::GONE, "restarted"),
            WatchError::Future { .. } => (StatusCode::BAD_REQUEST, "invalid"),
        };
        Failure(code, json!({ "error": kind, "message": e.to_string() }))
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let item = |id: &str, e: &Event| Ok(line(&event_json(id, e)));
    tokio::spawn(watch::forward(sub, filter, engine.stopping(), tx, item, end_line, slot));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response())
}

/// The last line of a stream that ended early.
fn end_line(ended: Ended) -> Result<Bytes, std::io::Error> {
    let end = match ended {
        Ended::ShuttingDown => json!({ "error": "shutting_down", "message": "coordinator is shutting down" }),
        Ended::Lagged { after_revision } => json!({
            "error": "lagged",
            "message": format!("watcher fell behind; resume with after_revision={after_revision}"),
            "after_revision": after_revision,
        }),
    };
    Ok(line(&end))
}
