//! Typed outcomes of the lease machine. Expected outcomes (busy, lost, invalid)
//! are values a caller matches on, not strings.

use std::fmt;
use std::time::Duration;

use crate::{Holder, ResourceId, Token};

/// Input that breaks a documented rule: which field, and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    field: &'static str,
    message: String,
}

impl Invalid {
    pub fn new(field: &'static str, message: impl Into<String>) -> Invalid {
        Invalid {
            field,
            message: message.into(),
        }
    }

    pub fn field(&self) -> &'static str {
        self.field
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.message)
    }
}

impl std::error::Error for Invalid {}

/// Why an acquire, renew or release did not succeed. None of these changes any state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Another holder has the resource.
    #[error("resource {resource} is held by {holder} (token {token}) for another {} ms", expires_in.as_millis())]
    Busy {
        resource: ResourceId,
        holder: Holder,
        token: Token,
        expires_in: Duration,
    },
    /// The lease id does not name the current, unexpired lease of this resource:
    /// it expired, was released, or never existed. Re-acquire for a higher token.
    #[error("lease lost: the lease id does not hold {resource} (expired, released or unknown)")]
    LeaseLost { resource: ResourceId },
    /// The resource already has `max` waiters queued.
    #[error("resource {resource} already has {max} waiters queued (the limit)")]
    TooManyWaiters { resource: ResourceId, max: usize },
    /// Every token up to `u64::MAX` has been handed out for this resource.
    #[error(
        "resource {resource} has used every token up to {}; it cannot be granted again",
        u64::MAX
    )]
    TokensExhausted { resource: ResourceId },
    #[error(transparent)]
    Invalid(#[from] Invalid),
}
