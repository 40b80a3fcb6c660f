//! The `leasefence.v1` gRPC API: generated types, and the explicit mapping
//! between core outcomes and gRPC statuses (shared by server and client, so
//! both sides agree on what a refusal means); and [`frame`], the lean binary
//! protocol beside it, with the same refusals.

pub mod frame;

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("leasefence.v1");
}

use std::time::Duration;

use leasefence_core::{BusyReason, Holder, Invalid, LeaseError, ResourceId, Token};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// Metadata key naming the kind of refusal.
pub const META_ERROR: &str = "leasefence-error";
/// For busy: the holder, when its name is ASCII a header can carry as text.
pub const META_HOLDER: &str = "leasefence-holder";
/// For busy: the holder's name as UTF-8 bytes, when it is not such ASCII (a
/// `-bin` key: gRPC sends it base64-encoded).
pub const META_HOLDER_BIN: &str = "leasefence-holder-bin";
pub const META_TOKEN: &str = "leasefence-token";
pub const META_EXPIRES_IN_MS: &str = "leasefence-expires-in-ms";
/// Why busy: `held` or `lock_delay` ([`BusyReason::as_str`]).
pub const META_BUSY_REASON: &str = "leasefence-busy-reason";
/// For busy: how long until an acquire may succeed ([`LeaseError::retry_in`]).
pub const META_RETRY_IN_MS: &str = "leasefence-retry-in-ms";

/// What a TLS port answers a plaintext client (HTTP/1 `400` body, HTTP/2
/// GOAWAY debug data); clients recognise it to say what went wrong.
pub const TLS_REQUIRED: &str = "this leasefence port speaks TLS: use https:// (plaintext refused)";

/// What a mutual-TLS port answers each request of a client that presented
/// no certificate (HTTP `401`, gRPC `UNAUTHENTICATED`).
pub const CLIENT_CERTIFICATE_REQUIRED: &str = "this leasefence port requires a client certificate (mutual TLS): \
     present one issued by its client CA";

/// Stable names of the refusals, as used in gRPC metadata and HTTP bodies.
pub fn error_kind(e: &LeaseError) -> &'static str {
    match e {
        LeaseError::Busy { .. } => "busy",
        LeaseError::LeaseLost { .. } => "lease_lost",
        LeaseError::TooManyWaiters { .. } => "too_many_waiters",
        LeaseError::TokensExhausted { .. } => "tokens_exhausted",
        LeaseError::Invalid(_) => "invalid",
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Maps a core refusal to its gRPC status (see the `.proto` for the table).
pub fn error_to_status(e: &LeaseError) -> Status {
    let code = match e {
        LeaseError::Busy { .. } => Code::FailedPrecondition,
        LeaseError::LeaseLost { .. } => Code::NotFound,
        LeaseError::TooManyWaiters { .. } => Code::ResourceExhausted,
        LeaseError::TokensExhausted { .. } => Code::OutOfRange,
        LeaseError::Invalid(_) => Code::InvalidArgument,
    };
    let mut status = Status::new(code, e.to_string());
    let md = status.metadata_mut();
    md.insert(META_ERROR, MetadataValue::from_static(error_kind(e)));
    if let LeaseError::Busy {
        holder,
        token,
        expires_in,
        reason,
        ..
    } = e
    {
        // Holder names have no control characters, but may be non-ASCII, which
        // a text header cannot carry: those go as bytes under a `-bin` key.
        // (A text header would take bytes above 0x7F, but a reader can't read
        // them back as text.)
        match holder.as_str().parse() {
            Ok(v) if holder.as_str().is_ascii() => {
                md.insert(META_HOLDER, v);
            }
            _ => {
                md.insert_bin(META_HOLDER_BIN, MetadataValue::from_bytes(holder.as_str().as_bytes()));
            }
        }
        md.insert(META_TOKEN, MetadataValue::from(token.get()));
        md.insert(META_EXPIRES_IN_MS, MetadataValue::from(millis(*expires_in)));
        md.insert(META_BUSY_REASON, MetadataValue::from_static(reason.as_str()));
        let retry_in = e.retry_in().unwrap_or(*expires_in);
        md.insert(META_RETRY_IN_MS, MetadataValue::from(millis(retry_in)));
    }
    status
}

/// Recovers the core refusal from a status produced by [`error_to_status`];
/// `None` for anything else (transport and internal errors).
pub fn status_to_error(resource: &ResourceId, s: &Status) -> Option<LeaseError> {
    let md = s.metadata();
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let resource = resource.clone();
    let millis = |k: &str| get(k).and_then(|t| t.parse().ok()).map(Duration::from_millis);
    match get(META_ERROR)? {
        "busy" => Some(LeaseError::Busy {
            resource,
            holder: get(META_HOLDER)
                .and_then(|h| Holder::new(h).ok())
                .or_else(|| {
                    let bytes = md.get_bin(META_HOLDER_BIN)?.to_bytes().ok()?;
                    Holder::new(std::str::from_utf8(&bytes).ok()?).ok()
                })
                .or_else(|| Holder::new("unknown").ok())?,
            token: get(META_TOKEN).and_then(|t| t.parse().ok()).and_then(Token::new)?,
            expires_in: millis(META_EXPIRES_IN_MS)?,
            // A coordinator from before lock-delays sends no reason: held.
            reason: match get(META_BUSY_REASON) {
                Some("lock_delay") => BusyReason::LockDelay {
                    retry_in: millis(META_RETRY_IN_MS)?,
                },
                _ => BusyReason::Held,
            },
        }),
        "lease_lost" => Some(LeaseError::LeaseLost { resource }),
        "too_many_waiters" => Some(LeaseError::TooManyWaiters { resource, max: 0 }),
        "tokens_exhausted" => Some(LeaseError::TokensExhausted { resource }),
        "invalid" => Some(LeaseError::Invalid(invalid_from_message(s.message()))),
        _ => None,
    }
}

/// Rebuilds an [`Invalid`] from its display form `invalid FIELD: what is allowed`.
pub(crate) fn invalid_from_message(msg: &str) -> Invalid {
    const FIELDS: [&str; 10] = [
        "resource",
        "holder",
        "ttl_ms",
        "wait_ms",
        "lock_delay_ms",
        "lease_id",
        "body",
        "token",
        "mode",
        "frame",
    ];
    let parsed = msg.strip_prefix("invalid ").and_then(|rest| rest.split_once(": "));
    match parsed.and_then(|(field, what)| FIELDS.iter().find(|f| **f == field).map(|f| (*f, what))) {
        Some((field, what)) => Invalid::new(field, what),
        None => Invalid::new("request", msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_round_trips_through_a_status() {
        let r = ResourceId::new("orders/1").expect("valid");
        let e = LeaseError::Busy {
            resource: r.clone(),
            holder: Holder::new("worker-a").expect("valid"),
            token: Token::new(41).expect("non-zero"),
            expires_in: Duration::from_millis(900),
            reason: BusyReason::Held,
        };
        let s = error_to_status(&e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.metadata().get(META_BUSY_REASON).map(|v| v.to_str().ok()),
            Some(Some("held"))
        );
        assert_eq!(
            s.metadata().get(META_RETRY_IN_MS).map(|v| v.to_str().ok()),
            Some(Some("900"))
        );
        assert_eq!(status_to_error(&r, &s), Some(e));
        let lost = LeaseError::LeaseLost { resource: r.clone() };
        assert_eq!(error_to_status(&lost).code(), Code::NotFound);
        assert_eq!(status_to_error(&r, &error_to_status(&lost)), Some(lost));
        assert_eq!(status_to_error(&r, &Status::unavailable("down")), None);
        let bad = LeaseError::Invalid(Invalid::new("ttl_ms", "must be in 100..=200 ms, got 5 ms"));
        assert_eq!(status_to_error(&r, &error_to_status(&bad)), Some(bad));
    }

    #[test]
    fn a_busy_holder_that_is_not_visible_ascii_round_trips() {
        let r = ResourceId::new("orders/1").expect("valid");
        for name in ["wörker-ü", "team a", "w\u{200B}orker"] {
            let e = LeaseError::Busy {
                resource: r.clone(),
                holder: Holder::new(name).expect("valid"),
                token: Token::new(2).expect("non-zero"),
                expires_in: Duration::from_millis(900),
                reason: BusyReason::Held,
            };
            assert_eq!(status_to_error(&r, &error_to_status(&e)), Some(e), "{name:?}");
        }
    }

    #[test]
    fn lock_delay_busy_round_trips_and_an_old_busy_reads_as_held() {
        let r = ResourceId::new("orders/1").expect("valid");
        let e = LeaseError::Busy {
            resource: r.clone(),
            holder: Holder::new("worker-a").expect("valid"),
            token: Token::new(41).expect("non-zero"),
            expires_in: Duration::ZERO,
            reason: BusyReason::LockDelay {
                retry_in: Duration::from_millis(4500),
            },
        };
        let s = error_to_status(&e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        let md = s.metadata();
        assert_eq!(
            md.get(META_BUSY_REASON).map(|v| v.to_str().ok()),
            Some(Some("lock_delay"))
        );
        assert_eq!(md.get(META_RETRY_IN_MS).map(|v| v.to_str().ok()), Some(Some("4500")));
        assert_eq!(status_to_error(&r, &s), Some(e));

        let mut old = Status::failed_precondition("busy");
        for (k, v) in [
            (META_ERROR, "busy"),
            (META_HOLDER, "w"),
            (META_TOKEN, "3"),
            (META_EXPIRES_IN_MS, "70"),
        ] {
            old.metadata_mut().insert(k, v.parse().expect("ascii"));
        }
        assert!(matches!(
            status_to_error(&r, &old),
            Some(LeaseError::Busy {
                reason: BusyReason::Held,
                ..
            })
        ));
        let bad = LeaseError::Invalid(Invalid::new("lock_delay_ms", "must be at most 60000 ms"));
        assert_eq!(status_to_error(&r, &error_to_status(&bad)), Some(bad));
    }
}
