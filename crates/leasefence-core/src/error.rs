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

/// Why a resource is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyReason {
    /// A lease holds it.
    Held,
    /// A lease expired with a lock-delay: nothing is granted for another `retry_in`.
    LockDelay { retry_in: Duration },
}

impl BusyReason {
    /// The stable name used on the wire: `held` or `lock_delay`.
    pub fn as_str(self) -> &'static str {
        match self {
            BusyReason::Held => "held",
            BusyReason::LockDelay { .. } => "lock_delay",
        }
    }
}

fn busy_message(
    resource: &ResourceId,
    holder: &Holder,
    token: Token,
    expires_in: Duration,
    reason: BusyReason,
) -> String {
    match reason {
        BusyReason::Held => format!(
            "resource {} is held by {} (token {token}) for another {} ms",
            resource.shown(),
            holder.shown(),
            expires_in.as_millis()
        ),
        BusyReason::LockDelay { retry_in } => format!(
            "resource {} is in its lock-delay after the lease of {} (token {token}) expired; \
             it can be granted again in {} ms",
            resource.shown(),
            holder.shown(),
            retry_in.as_millis()
        ),
    }
}

impl LeaseError {
    /// For a busy refusal, how long until an acquire may succeed: the rest of
    /// the lock-delay, or the rest of the holder's lease (unless it is released
    /// earlier, or renewed).
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            LeaseError::Busy {
                reason: BusyReason::LockDelay { retry_in },
                ..
            } => Some(*retry_in),
            LeaseError::Busy { expires_in, .. } => Some(*expires_in),
            _ => None,
        }
    }
}

/// Why an acquire, renew or release did not succeed. None of these changes any state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The resource cannot be granted now: another holder has it
    /// ([`BusyReason::Held`]: `holder`'s lease of `token` runs for another
    /// `expires_in`), or `holder`'s lease of `token` expired and its
    /// lock-delay has not passed ([`BusyReason::LockDelay`], `expires_in` zero).
    #[error("{}", busy_message(resource, holder, *token, *expires_in, *reason))]
    Busy {
        resource: ResourceId,
        holder: Holder,
        token: Token,
        expires_in: Duration,
        reason: BusyReason,
    },
    /// The lease id does not name the current, unexpired lease of this resource:
    /// it expired, was released, or never existed. Re-acquire for a higher token.
    #[error("lease lost: the lease id does not hold {} (expired, released or unknown)", resource.shown())]
    LeaseLost { resource: ResourceId },
    /// The resource already has `max` waiters queued.
    #[error("resource {} already has {max} waiters queued (the limit)", resource.shown())]
    TooManyWaiters { resource: ResourceId, max: usize },
    /// Every token up to `u64::MAX` has been handed out for this resource.
    #[error(
        "resource {} has used every token up to {}; it cannot be granted again",
        resource.shown(),
        u64::MAX
    )]
    TokensExhausted { resource: ResourceId },
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_show_names_without_what_would_hide_or_reorder_text() {
        let resource = ResourceId::new("jobs/\u{202E}fdp.exe").expect("a valid name");
        let busy = LeaseError::Busy {
            resource: resource.clone(),
            holder: Holder::new("w\u{200B}orker").expect("a valid holder"),
            token: Token::new(7).expect("a token"),
            expires_in: Duration::from_millis(1500),
            reason: BusyReason::Held,
        };
        assert_eq!(
            busy.to_string(),
            "resource jobs/\\u{202e}fdp.exe is held by w\\u{200b}orker (token 7) for another 1500 ms"
        );
        let lost = LeaseError::LeaseLost { resource };
        assert!(lost.to_string().contains("hold jobs/\\u{202e}fdp.exe ("), "{lost}");
    }
}
