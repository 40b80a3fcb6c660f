//! `acquire`, `renew`, `release`, `status`: one call each to a coordinator.

use leasefence_client::{ClientError, LeaseConfig, LeaseInfo};
use leasefence_core::{Holder, LeaseError, LeaseId, ResourceId};
use serde_json::json;

use crate::cli::{AcquireArgs, LeaseArgs, StatusArgs};
use crate::out::outln;
use crate::{CmdResult, Failure};

/// Maps a client error to the documented exit codes.
pub fn failure(e: ClientError) -> Failure {
    let code = match &e {
        ClientError::Lease(LeaseError::Busy { .. } | LeaseError::TooManyWaiters { .. }) => Failure::BUSY,
        ClientError::Lease(LeaseError::LeaseLost { .. }) => Failure::LOST,
        ClientError::Lease(LeaseError::Invalid(_)) | ClientError::Invalid(_) => Failure::INVALID,
        ClientError::Lease(LeaseError::TokensExhausted { .. }) => Failure::INTERNAL,
        ClientError::Transport { .. } | ClientError::Server(_) => Failure::INTERNAL,
        ClientError::Refused { .. } => Failure::REFUSED,
    };
    Failure::new(code, e)
}

fn resource(s: &str) -> Result<ResourceId, Failure> {
    ResourceId::new(s).map_err(Failure::invalid)
}

fn lease_id(s: &str) -> Result<LeaseId, Failure> {
    LeaseId::parse_hex(s).map_err(Failure::invalid)
}

pub(crate) fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    format!("{host}:{}", std::process::id())
}

fn print_lease(l: &LeaseInfo, as_json: bool, verb: &str) -> CmdResult {
    if as_json {
        let mut v = json!({
            "resource": l.resource.as_str(),
            "token": l.token.get(),
            "lease_id": l.lease_id.to_hex(),
            "ttl_ms": u64::try_from(l.ttl.as_millis()).unwrap_or(u64::MAX),
            "expires_in_ms": u64::try_from(l.expires_in.as_millis()).unwrap_or(u64::MAX),
            "holder": l.holder.as_str(),
        });
        if let Some(s) = &l.signature {
            v["signature"] = json!(s);
        }
        outln!("{v}")?;
    } else {
        let signature = l
            .signature
            .as_ref()
            .map(|s| format!(" signature={s}"))
            .unwrap_or_default();
        outln!(
            "{verb} {} token={} lease_id={} ttl={} holder={}{signature}",
            l.resource.shown(),
            l.token,
            l.lease_id.to_hex(),
            humantime::format_duration(l.ttl),
            l.holder.shown()
        )?;
    }
    Ok(())
}

pub async fn acquire(a: AcquireArgs) -> CmdResult {
    let res = resource(&a.resource)?;
    let holder = Holder::new(&a.holder.unwrap_or_else(default_holder)).map_err(Failure::invalid)?;
    let client = a.server.connect().await?;
    let config = LeaseConfig::new(a.ttl)
        .with_holder(holder)
        .with_wait(a.wait)
        .with_lock_delay(a.lock_delay);
    let lease = client.acquire_with(&res, &config).await.map_err(failure)?;
    if let Err(f) = print_lease(&lease, a.json, "acquired") {
        // No one can learn this lease's id: give it back rather than leave
        // the resource held for its TTL.
        let then = match client.release(&res, &lease.lease_id).await {
            Ok(_) => "the lease was released".to_string(),
            Err(e) => format!("the lease is held until it expires (releasing it failed: {e})"),
        };
        return Err(Failure::new(f.code, anyhow::anyhow!("{}; {then}", f.error)));
    }
    Ok(())
}

pub async fn renew(a: LeaseArgs) -> CmdResult {
    let (res, id) = (resource(&a.resource)?, lease_id(&a.lease_id)?);
    let client = a.server.connect().await?;
    let lease = client.renew(&res, &id).await.map_err(failure)?;
    print_lease(&lease, a.json, "renewed")
}

pub async fn release(a: LeaseArgs) -> CmdResult {
    let (res, id) = (resource(&a.resource)?, lease_id(&a.lease_id)?);
    let client = a.server.connect().await?;
    let token = client.release(&res, &id).await.map_err(failure)?;
    if a.json {
        outln!(
            "{}",
            json!({ "resource": res.as_str(), "token": token.get(), "released": true })
        )?;
    } else {
        outln!("released {} token={token}", res.shown())?;
    }
    Ok(())
}

pub async fn status(a: StatusArgs) -> CmdResult {
    let res = resource(&a.resource)?;
    let client = a.server.connect().await?;
    let s = client.status(&res).await.map_err(failure)?;
    if a.json {
        let held = s.held.as_ref();
        let v = json!({
            "resource": res.as_str(),
            "last_token": s.last_token.map(|t| t.get()),
            "holder": held.map(|h| h.0.as_str()),
            "token": held.map(|h| h.1.get()),
            "expires_in_ms": held.map(|h| u64::try_from(h.2.as_millis()).unwrap_or(u64::MAX)),
            "waiters": s.waiters,
        });
        outln!("{v}")?;
    } else {
        let last = s.last_token.map_or("none".to_string(), |t| t.to_string());
        match &s.held {
            Some((holder, token, left)) => outln!(
                "{}: held by {} token={token} expires_in={} last_token={last} waiters={}",
                res.shown(),
                holder.shown(),
                humantime::format_duration(*left),
                s.waiters
            )?,
            None => outln!("{}: not held last_token={last}", res.shown())?,
        }
    }
    Ok(())
}
