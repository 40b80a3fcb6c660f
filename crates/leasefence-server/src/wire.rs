//! Validation of wire input into core types, shared by the gRPC and HTTP edges
//! so both accept and refuse exactly the same requests.

use std::time::Duration;

use leasefence_core::{Grant, Holder, Invalid, LeaseId, MonoTime, ResourceId};

use crate::engine::Acquire;

/// The holder name used when a request names none.
pub const ANONYMOUS: &str = "anonymous";

pub fn resource(s: &str) -> Result<ResourceId, Invalid> {
    ResourceId::new(s)
}

pub fn lease_id(s: &str) -> Result<LeaseId, Invalid> {
    LeaseId::parse_hex(s)
}

pub fn acquire(resource: &str, ttl_ms: u64, holder: Option<&str>, wait_ms: u64) -> Result<Acquire, Invalid> {
    let holder = match holder {
        None | Some("") => Holder::new(ANONYMOUS)?,
        Some(h) => Holder::new(h)?,
    };
    Ok(Acquire {
        resource: ResourceId::new(resource)?,
        holder,
        ttl: Duration::from_millis(ttl_ms),
        wait: Duration::from_millis(wait_ms),
    })
}

pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Time left on a grant at `now`.
pub fn expires_in_ms(grant: &Grant, now: MonoTime) -> u64 {
    millis(grant.expires_at.saturating_since(now))
}
