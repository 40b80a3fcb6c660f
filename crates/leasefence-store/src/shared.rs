//! Stores that several coordinators share, one of which leads at a time:
//! the high-availability backends (PostgreSQL, etcd).
//!
//! The shape is the one Chubby, ZooKeeper and Kafka's controller share: the
//! shard's leadership lives in the replicated engine itself (a PostgreSQL row
//! whose expiry the database's clock judges; an etcd lease), with an *epoch*
//! that strictly increases with every new leadership term. The leader keeps
//! the in-memory machine and group commit; every batch it writes is
//! conditional, in the same engine transaction, on its epoch still being the
//! current one. A coordinator that pauses, is deposed and wakes up cannot
//! write a single record: the arbiter rule, applied to the coordinator itself.
//!
//! The methods block (the backends drive their own clients); call them from a
//! blocking thread, never from an async task. The [`SharedStore::writer`] is a
//! plain [`LeaseStore`], owned by the [`crate::Committer`]'s thread like any other.
//!
//! Keys and rows carry a shard id; only [`SHARD_DEFAULT`] exists for now, so that
//! spreading resources over several active coordinators later is an extension.

use std::time::Duration;

use crate::{LeaseStore, StoreError};

/// A leadership term's number. Strictly increasing per shard, across every
/// coordinator that ever led it; the first term is 1.
pub type Epoch = u64;

/// The shard every resource belongs to while there is only one.
pub const SHARD_DEFAULT: u32 = 0;

/// Who leads a shard, as the engine says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    pub epoch: Epoch,
    /// The URL the leader advertises to clients (`serve --advertise`).
    pub advertise: String,
}

/// A store shared by the coordinators of one shard (see the module doc).
///
/// The one conformance suite for this trait is
/// [`crate::conformance::shared::run_all`]; every backend passes it.
pub trait SharedStore: Send + Sync + 'static {
    /// The epoch-fenced store the leader's committer writes through.
    type Writer: LeaseStore;

    /// One attempt to lead: if the shard has no leader whose leadership is
    /// still live (judged by the engine's own clock, never by comparing
    /// coordinators' clocks), takes it for `ttl` under a new epoch, strictly
    /// above every epoch before, and returns that epoch. `Ok(None)` while
    /// another coordinator's leadership is live.
    fn campaign(&self, advertise: &str, ttl: Duration) -> Result<Option<Epoch>, StoreError>;

    /// Extends the leadership of `epoch` to `ttl` from now (the engine's
    /// clock). [`StoreError::Deposed`] once `epoch` is no longer current.
    /// `ttl` must be the TTL the campaign took: some engines (etcd) cannot
    /// change a lease's TTL and extend it by the campaign's.
    fn renew(&self, epoch: Epoch, ttl: Duration) -> Result<(), StoreError>;

    /// The shard's live leader, if any (for the hints standbys give clients).
    fn leader(&self) -> Result<Option<LeaderInfo>, StoreError>;

    /// Ends the leadership of `epoch` at once (a clean shutdown), so that a
    /// standby need not wait out the TTL. Does nothing if `epoch` is not current.
    fn resign(&self, epoch: Epoch) -> Result<(), StoreError>;

    /// A writer for the leader of `epoch`: `load` reads the shard's records,
    /// and every `apply` is one engine transaction that first checks that
    /// `epoch` is still current and otherwise fails with
    /// [`StoreError::Deposed`], writing nothing.
    fn writer(&self, epoch: Epoch) -> Result<Self::Writer, StoreError>;
}

/// How long a coordinator may keep answering as leader after the send time of
/// its last successful [`SharedStore::renew`]: the leader TTL less a margin for
/// clock-rate differences and the time to react (as the client's self-fencing
/// deadline: `max(ttl/10, 50ms)`, and never more than half the TTL). A standby
/// takes over only once the engine judges the full TTL passed, so the old
/// leader has stopped answering before a new one can grant.
pub fn leader_deadline(ttl: Duration) -> Duration {
    let margin = (ttl / 10).max(Duration::from_millis(50)).min(ttl / 2);
    ttl - margin
}
