//! Validation of wire input into core types, shared by the gRPC, HTTP and
//! frame edges so that all accept and refuse exactly the same requests.
//! Public so that fuzz targets can drive exactly the code the edges run.

use std::time::Duration;

use leasefence_core::{Grant, Holder, Invalid, LeaseId, MonoTime, ResourceId};
use serde::Deserialize;

use crate::engine::Acquire;

/// The holder name used when a request names none.
pub const ANONYMOUS: &str = "anonymous";

pub fn resource(s: &str) -> Result<ResourceId, Invalid> {
    ResourceId::new(s)
}

pub fn lease_id(s: &str) -> Result<LeaseId, Invalid> {
    LeaseId::parse_hex(s)
}

/// An acquire's fields as both edges receive them (the engine checks the
/// TTL and lock-delay bounds).
pub struct AcquireFields<'a> {
    pub resource: &'a str,
    pub ttl_ms: u64,
    pub holder: Option<&'a str>,
    pub wait_ms: u64,
    pub lock_delay_ms: u64,
}

pub fn acquire(f: AcquireFields<'_>) -> Result<Acquire, Invalid> {
    let holder = match f.holder {
        None | Some("") => Holder::new(ANONYMOUS)?,
        Some(h) => Holder::new(h)?,
    };
    Ok(Acquire {
        resource: ResourceId::new(f.resource)?,
        holder,
        ttl: Duration::from_millis(f.ttl_ms),
        wait: Duration::from_millis(f.wait_ms),
        lock_delay: Duration::from_millis(f.lock_delay_ms),
    })
}

/// Where a watch resumes. Revisions count per coordinator process, so a
/// resume after revision N > 0 must name the coordinator that numbered it
/// (the `coordinator_id` of the last event seen): without it, the revision N
/// of a coordinator that restarted, or of a new leader, would be taken for
/// the old one's, and events lost or repeated. After 0 (everything this
/// coordinator still has) resumes nothing and needs none.
pub fn resume(after_revision: Option<u64>, coordinator_id: &str) -> Result<Option<u64>, Invalid> {
    match after_revision {
        Some(n) if n > 0 && coordinator_id.is_empty() => Err(Invalid::new(
            "coordinator_id",
            format!(
                "required to resume after revision {n}: give the coordinator_id of the last event seen \
                 (revisions count per coordinator process)"
            ),
        )),
        _ => Ok(after_revision),
    }
}

/// The parameters of a `GET` route's query string, read by [`query`].
pub struct Query(Vec<(&'static str, String)>);

impl Query {
    /// The value of `name`, if the query gave it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The value of `name`, which the query must give.
    pub fn required(&self, name: &'static str) -> Result<&str, Invalid> {
        self.get(name)
            .ok_or_else(|| Invalid::new(name, format!("the query parameter is missing: give ?{name}=NAME")))
    }
}

/// A query string's parameters (`a=1&b=x+y`, as forms encode them), each at
/// most once and each one of `allowed`.
pub fn query(raw: Option<&str>, allowed: &[&'static str]) -> Result<Query, Invalid> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, value) = (decode(key)?, decode(value)?);
        let Some(&name) = allowed.iter().find(|a| **a == key) else {
            let message = format!("unknown parameter {key:?}; allowed: {}", allowed.join(", "));
            return Err(Invalid::new("query", message));
        };
        if out.iter().any(|(k, _)| *k == name) {
            return Err(Invalid::new(name, "given more than once"));
        }
        out.push((name, value));
    }
    Ok(Query(out))
}

/// One part of a query as forms encode it: `+` a space, `%XX` a byte. By
/// hand over `percent-encoding` because axum's `Query` (serde_urlencoded)
/// puts U+FFFD where the bytes are not UTF-8, and would look up a name the
/// caller never gave instead of refusing it.
fn decode(part: &str) -> Result<String, Invalid> {
    let spaced = part.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Invalid::new("query", format!("{part:?} is not UTF-8 once percent-decoded")))
}

pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Time left on a grant at `now`.
pub fn expires_in_ms(grant: &Grant, now: MonoTime) -> u64 {
    millis(grant.expires_at.saturating_since(now))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    resource: String,
    ttl_ms: u64,
    #[serde(default)]
    holder: Option<String>,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    resource: String,
    lease_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceBody {
    resource: String,
}

const ACQUIRE_SHAPE: &str =
    r#"{"resource": string, "ttl_ms": integer, "holder"?: string, "wait_ms"?: integer, "lock_delay_ms"?: integer}"#;
const LEASE_SHAPE: &str = r#"{"resource": string, "lease_id": string}"#;
const RESOURCE_SHAPE: &str = r#"{"resource": string}"#;

fn json<'a, T: Deserialize<'a>>(body: &'a [u8], shape: &str) -> Result<T, Invalid> {
    serde_json::from_slice(body).map_err(|e| Invalid::new("body", format!("{e}; expected JSON {shape}")))
}

/// Decodes and validates an HTTP acquire body (TTL bounds are the engine's).
pub fn acquire_json(body: &[u8]) -> Result<Acquire, Invalid> {
    let b: AcquireBody = json(body, ACQUIRE_SHAPE)?;
    acquire(AcquireFields {
        resource: &b.resource,
        ttl_ms: b.ttl_ms,
        holder: b.holder.as_deref(),
        wait_ms: b.wait_ms,
        lock_delay_ms: b.lock_delay_ms,
    })
}

/// Decodes and validates an HTTP renew or release body.
pub fn lease_json(body: &[u8]) -> Result<(ResourceId, LeaseId), Invalid> {
    let b: LeaseBody = json(body, LEASE_SHAPE)?;
    Ok((resource(&b.resource)?, lease_id(&b.lease_id)?))
}

/// Decodes and validates an HTTP force-release body.
pub fn resource_json(body: &[u8]) -> Result<ResourceId, Invalid> {
    let b: ResourceBody = json(body, RESOURCE_SHAPE)?;
    resource(&b.resource)
}

/// Validates a decoded gRPC acquire.
pub fn acquire_proto(r: &leasefence_proto::v1::AcquireRequest) -> Result<Acquire, Invalid> {
    acquire(AcquireFields {
        resource: &r.resource,
        ttl_ms: r.ttl_ms,
        holder: Some(&r.holder),
        wait_ms: r.wait_ms,
        lock_delay_ms: r.lock_delay_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_decodes_as_forms_encode_and_refuses_what_it_cannot_read() {
        let q = query(Some("prefix=a+b%2Fc&&limit=5"), &["prefix", "limit", "after"]).expect("valid");
        assert_eq!(
            (q.get("prefix"), q.get("limit"), q.get("after")),
            (Some("a b/c"), Some("5"), None)
        );
        assert_eq!(query(None, &["prefix"]).expect("none").get("prefix"), None);
        for (raw, field) in [
            ("limit=1&limit=2", "limit"),
            ("bogus", "query"),
            ("prefix=%C3%28", "query"),
        ] {
            let e = query(Some(raw), &["prefix", "limit"]).err().expect(raw);
            assert_eq!(e.field(), field, "{raw}: {e}");
        }
    }
}
