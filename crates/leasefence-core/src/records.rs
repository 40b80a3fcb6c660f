//! What the lease machine hands a store to make durable ([`Mutation`]) and
//! what a store hands back after a restart ([`StoredResource`]).
//!
//! Durations only, never wall-clock times: after a restart the machine counts
//! every recorded lease, and every recorded lock-delay, in full from the restart.

use std::time::Duration;

use crate::{Holder, LeaseId, ResourceId, Token};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseCause {
    Released,
    Expired,
}

/// A change the store must make durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    Grant {
        resource: ResourceId,
        token: Token,
        lease_id: LeaseId,
        holder: Holder,
        ttl: Duration,
        /// How long the resource stays closed if this lease expires (zero: not at all).
        lock_delay: Duration,
    },
    Release {
        resource: ResourceId,
        token: Token,
        cause: ReleaseCause,
        /// The lock-delay this end starts: the lease's own on an expiry, zero on
        /// a release (a holder that let go cleanly needs no grace period).
        lock_delay: Duration,
    },
}

impl Mutation {
    pub fn resource(&self) -> &ResourceId {
        match self {
            Mutation::Grant { resource, .. } | Mutation::Release { resource, .. } => resource,
        }
    }
}

/// A resource's state as recorded by a store, for recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResource {
    pub resource: ResourceId,
    pub last_token: Token,
    /// The lease recorded as held (its token is `last_token`).
    pub lease: Option<StoredLease>,
    /// Set when the lease of `last_token` expired with a lock-delay and nothing
    /// was granted since: the resource stays closed for the whole delay after
    /// a restart (the store cannot know how much of it had passed).
    pub lock_delay: Option<StoredLockDelay>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLease {
    pub lease_id: LeaseId,
    pub holder: Holder,
    pub ttl: Duration,
    /// Zero: none.
    pub lock_delay: Duration,
}

/// A lock-delay started by the expiry of `holder`'s lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLockDelay {
    pub holder: Holder,
    pub delay: Duration,
}
