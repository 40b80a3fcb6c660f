//! One resource's state inside the lease machine: its last token, the lease
//! holding it or the lock-delay keeping it closed, and its FIFO waiters.

use std::collections::VecDeque;
use std::time::Duration;

use crate::{BusyReason, Holder, LeaseError, LeaseId, MonoTime, ResourceId, Token, WaiterId};

/// What a grant needs beyond the resource: a request's or a waiter's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Terms {
    pub(super) lease_id: LeaseId,
    pub(super) holder: Holder,
    pub(super) ttl: Duration,
    pub(super) lock_delay: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) token: Token,
    pub(super) terms: Terms,
    pub(super) expires_at: MonoTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Waiter {
    pub(super) id: WaiterId,
    pub(super) terms: Terms,
}

/// A lock-delay in progress: `holder`'s lease of the resource's last token expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Delay {
    pub(super) until: MonoTime,
    pub(super) holder: Holder,
}

/// One resource. Never both `held` and `delay`; waiters only while one of them is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) last: Option<Token>,
    pub(super) held: Option<Held>,
    pub(super) delay: Option<Delay>,
    pub(super) waiters: VecDeque<Waiter>,
}

impl Entry {
    /// Whether an expiry-queue entry for `token` still has work to find here:
    /// the lease of `token` runs, or the lock-delay its expiry started does.
    pub(super) fn waits_on(&self, token: Token) -> bool {
        self.held.as_ref().is_some_and(|h| h.token == token) || (self.delay.is_some() && self.last == Some(token))
    }

    /// The refusal an acquire without waiting gets at `now`, if any.
    pub(super) fn busy(&self, now: MonoTime, resource: &ResourceId) -> Option<LeaseError> {
        if let Some(h) = self.held.as_ref().filter(|h| h.expires_at > now) {
            return Some(LeaseError::Busy {
                resource: resource.clone(),
                holder: h.terms.holder.clone(),
                token: h.token,
                expires_in: h.expires_at.saturating_since(now),
                reason: BusyReason::Held,
            });
        }
        let (d, token) = self.delay.as_ref().filter(|d| d.until > now).zip(self.last)?;
        Some(LeaseError::Busy {
            resource: resource.clone(),
            holder: d.holder.clone(),
            token,
            expires_in: Duration::ZERO,
            reason: BusyReason::LockDelay {
                retry_in: d.until.saturating_since(now),
            },
        })
    }
}
