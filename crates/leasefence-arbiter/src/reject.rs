//! What every backend does with a rejection: count it, log it, type it.
//!
//! Tokens are not secrets, so the log line carries resource, presented and
//! current in full.

use std::sync::atomic::{AtomicUsize, Ordering};

use leasefence_core::Stale;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use leasefence_core::{Invalid, Token};
#[cfg(any(feature = "postgres", feature = "redis", feature = "embedded"))]
use leasefence_core::{ResourceId, signing::SignatureError};

use crate::ArbiterError;

/// Counter incremented once per rejected effect, labelled `backend` (and
/// `prefix` once [`set_rejection_prefix_segments`] configured it).
pub const REJECTIONS_METRIC: &str = "leasefence_arbiter_rejections_total";

/// Counter incremented once per fence refused for its signature, labelled
/// `backend` and `reason` (`missing`, `malformed`, `unknown_key`, `mismatch`).
pub const SIGNATURE_REFUSALS_METRIC: &str = "leasefence_arbiter_signature_refusals_total";

static PREFIX_SEGMENTS: AtomicUsize = AtomicUsize::new(0);

/// Labels rejections with the first `segments` `/`-separated parts of the
/// resource (`tenant/7/orders/42` with 2 → `tenant/7`). 0, the default, adds no
/// label. Pick a depth with few distinct values (tenants, tables), never one
/// per row: every value is a time series. Process-wide, like the recorder.
pub fn set_rejection_prefix_segments(segments: usize) {
    PREFIX_SEGMENTS.store(segments, Ordering::Relaxed);
}

/// The first `segments` parts of `resource` (all of it if it has fewer).
fn prefix(resource: &str, segments: usize) -> &str {
    match resource.match_indices('/').nth(segments.saturating_sub(1)) {
        Some((i, _)) => &resource[..i],
        None => resource,
    }
}

/// Counts and logs `stale`, and returns it as the typed error.
pub(crate) fn rejected(backend: &'static str, stale: Stale) -> ArbiterError {
    match PREFIX_SEGMENTS.load(Ordering::Relaxed) {
        0 => metrics::counter!(REJECTIONS_METRIC, "backend" => backend).increment(1),
        n => {
            let prefix = prefix(stale.resource.as_str(), n).to_string();
            metrics::counter!(REJECTIONS_METRIC, "backend" => backend, "prefix" => prefix).increment(1);
        }
    }
    tracing::info!(
        backend,
        resource = %stale.resource.shown(),
        presented = stale.presented.get(),
        current = stale.current.get(),
        "fenced effect rejected: stale token"
    );
    ArbiterError::Stale(stale)
}

/// Counts and logs a fence refused for its signature, and returns it as the
/// typed error. The signature itself is not logged.
#[cfg(any(feature = "postgres", feature = "redis", feature = "embedded"))]
pub(crate) fn refused(backend: &'static str, resource: ResourceId, reason: SignatureError) -> ArbiterError {
    metrics::counter!(SIGNATURE_REFUSALS_METRIC, "backend" => backend, "reason" => reason.reason()).increment(1);
    tracing::warn!(
        backend,
        resource = %resource.shown(),
        reason = reason.reason(),
        "fenced effect refused: bad fence signature"
    );
    ArbiterError::BadSignature { resource, reason }
}

/// Counts and logs the error if it is a rejection or a refusal; passes it through.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn observe(backend: &'static str, e: ArbiterError) -> ArbiterError {
    match e {
        ArbiterError::Stale(s) => rejected(backend, s),
        ArbiterError::BadSignature { resource, reason } => refused(backend, resource, reason),
        other => other,
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// The token as a signed 64-bit integer (PostgreSQL `bigint`, SQLite `INTEGER`).
/// Tokens above `i64::MAX` are refused, never wrapped.
pub(crate) fn token_to_i64(backend: &'static str, token: Token) -> Result<i64, ArbiterError> {
    i64::try_from(token.get()).map_err(|_| {
        ArbiterError::Invalid(Invalid::new(
            "token",
            format!(
                "{token} is above {}, the largest token the {backend} arbiter can store (a signed 64-bit integer)",
                i64::MAX
            ),
        ))
    })
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// A stored token read back; anything below 1 means the record is corrupt.
pub(crate) fn token_from_i64(backend: &'static str, v: i64) -> Result<Token, ArbiterError> {
    u64::try_from(v)
        .ok()
        .and_then(Token::new)
        .ok_or_else(|| ArbiterError::Protocol {
            backend,
            message: format!("stored last_token {v} is not a valid token (must be 1..={})", i64::MAX),
        })
}

#[cfg(test)]
mod tests {
    use super::prefix;

    #[test]
    fn prefix_takes_whole_segments() {
        assert_eq!(prefix("tenant/7/orders/42", 1), "tenant");
        assert_eq!(prefix("tenant/7/orders/42", 2), "tenant/7");
        assert_eq!(prefix("tenant/7", 5), "tenant/7");
        assert_eq!(prefix("plain", 1), "plain");
    }
}
