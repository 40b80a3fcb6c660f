//! What every backend does with a rejection: count it, log it, type it.
//!
//! Tokens are not secrets, so the log line carries resource, presented and
//! current in full.

use leasefence_core::{Invalid, Stale, Token};

use crate::ArbiterError;

/// Counter incremented once per rejected effect, labelled `backend`.
pub const REJECTIONS_METRIC: &str = "leasefence_arbiter_rejections_total";

/// Counts and logs `stale`, and returns it as the typed error.
pub(crate) fn rejected(backend: &'static str, stale: Stale) -> ArbiterError {
    metrics::counter!(REJECTIONS_METRIC, "backend" => backend).increment(1);
    tracing::info!(
        backend,
        resource = %stale.resource,
        presented = stale.presented.get(),
        current = stale.current.get(),
        "fenced effect rejected: stale token"
    );
    ArbiterError::Stale(stale)
}

/// Counts and logs the error if it is a rejection; passes it through.
pub(crate) fn observe(backend: &'static str, e: ArbiterError) -> ArbiterError {
    match e {
        ArbiterError::Stale(s) => rejected(backend, s),
        other => other,
    }
}

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
