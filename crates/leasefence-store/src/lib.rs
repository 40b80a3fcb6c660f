//! Durable storage of leases and per-resource token sequences.
//!
//! One trait, [`LeaseStore`], that every backend implements and that one
//! conformance suite ([`conformance`]) checks. The coordinator never writes a
//! store directly: it hands mutations to a [`Committer`], a single writer thread
//! that group-commits them (many grants, one transaction, one fsync) and answers
//! each only once it is durable.
//!
//! Backends: [`EmbeddedStore`] (redb behind a commit log, the default, crash-safe) and
//! [`MemoryStore`] (not durable; a reference for tests and simulation).
//!
//! For high availability, [`SharedStore`] ([`shared`]) is a store several
//! coordinators share, one leading at a time under a strictly increasing epoch
//! that fences every write; [`MemoryShared`] is its in-memory reference, and
//! `PostgresShared` (cargo feature `postgres`, module `postgres`) keeps the
//! shard's leadership and records in PostgreSQL, `EtcdShared` (cargo feature
//! `etcd`) in etcd. [`conformance::shared`] is the suite every shared backend
//! passes.

mod codec;
mod committer;
pub mod conformance;
mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(any(feature = "etcd", feature = "postgres"))]
mod known;
mod memory;
mod memory_shared;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod shared;
#[cfg(all(test, feature = "postgres"))]
#[path = "../tests/common/pg_route.rs"]
mod test_pg_route;
#[cfg(all(test, any(feature = "etcd", feature = "postgres")))]
#[path = "../tests/common/proxy.rs"]
mod test_proxy;
mod wal;

pub use committer::{
    BATCH_MUTATIONS, CHECKPOINT_SECONDS, COMMIT_SECONDS, Committer, CommitterStats, Durable, EXPIRIES_TOTAL,
    GRANTS_TOTAL, IDLE_SPIN, IDLE_SPIN_MAX, RELEASES_TOTAL, Seq,
};
pub use embedded::EmbeddedStore;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdConfigError, EtcdShared, EtcdWriter};
pub use memory::MemoryStore;
pub use memory_shared::{MemoryShared, MemoryWriter};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresConfig, PostgresShared, PostgresWriter};
pub use shared::{Epoch, LeaderInfo, SHARD_DEFAULT, SharedStore};

use leasefence_core::{Mutation, StoredResource};

/// Why a store operation failed. Any of these is fatal for the writer: after a
/// failed commit nothing more is written until the process restarts and reloads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O failed: {0}")]
    Io(String),
    #[error("store record for {resource:?} is corrupt: {reason}")]
    Corrupt { resource: String, reason: String },
    #[error("refusing to lower the token of {resource}: stored {stored}, attempted {attempted}")]
    TokenRegression {
        resource: String,
        stored: u64,
        attempted: u64,
    },
    #[error("store writer stopped after an earlier failure; restart the coordinator")]
    Poisoned,
    /// A shared store's write or renewal under an epoch that is no longer
    /// current: another coordinator leads now. Nothing was written.
    #[error("deposed: epoch {epoch} is no longer current (the shard's epoch is {current})")]
    Deposed { epoch: u64, current: u64 },
    /// A shared store's engine cannot be reached (or answered with an error
    /// that says nothing was written); the coordinator must not grant from memory.
    #[error("store engine unavailable: {0}")]
    Unavailable(String),
    /// A shared store's write that may or may not have taken effect: it was
    /// sent, and the engine was lost (or fell silent) before it answered. The
    /// coordinator must neither report it as done nor as not done; it stops
    /// writing and reloads what the engine holds before it grants again.
    #[error("store write of unknown outcome (it may or may not have taken effect): {0}")]
    Indeterminate(String),
    #[error("store writer is closed")]
    Closed,
}

/// Durable lease storage. Implementations need not be thread-safe: the
/// [`Committer`] owns the store on one thread.
pub trait LeaseStore: Send + 'static {
    /// Every resource ever granted, with the lease recorded as held, if any.
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError>;

    /// Applies `batch` in order as one atomic transaction, durable (fsynced)
    /// before it returns `Ok`. A grant must carry a token above the stored one;
    /// a release of a token that is no longer the held one changes nothing.
    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError>;

    /// The most mutations one [`LeaseStore::apply`] may take (an engine's
    /// limit on operations per transaction, such as etcd's); the committer
    /// never hands it more.
    fn batch_max(&self) -> usize {
        usize::MAX
    }

    /// Work the store does between commits, once the batch before it is
    /// answered (the embedded store folds its log into its tree here). An
    /// error stops the writer as a failed commit does.
    fn maintain(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The record of one resource after applying `m` to `current` (the pure rule
/// every backend shares). A grant replaces the record (ending any lock-delay);
/// an end of the current lease clears it and, if the end starts a lock-delay,
/// records that delay with the holder whose lease expired.
pub(crate) fn next_record(current: Option<StoredResource>, m: &Mutation) -> Result<Option<StoredResource>, StoreError> {
    use leasefence_core::{StoredLease, StoredLockDelay};
    match m {
        Mutation::Grant {
            resource,
            token,
            lease_id,
            holder,
            ttl,
            lock_delay,
        } => {
            if let Some(cur) = &current
                && cur.last_token >= *token
            {
                return Err(StoreError::TokenRegression {
                    resource: resource.to_string(),
                    stored: cur.last_token.get(),
                    attempted: token.get(),
                });
            }
            let lease = StoredLease {
                lease_id: *lease_id,
                holder: holder.clone(),
                ttl: *ttl,
                lock_delay: *lock_delay,
            };
            Ok(Some(StoredResource {
                resource: resource.clone(),
                last_token: *token,
                lease: Some(lease),
                lock_delay: None,
            }))
        }
        Mutation::Release { token, lock_delay, .. } => Ok(current.map(|mut cur| {
            if cur.last_token == *token
                && let Some(lease) = cur.lease.take()
            {
                cur.lock_delay = (!lock_delay.is_zero()).then_some(StoredLockDelay {
                    holder: lease.holder,
                    delay: *lock_delay,
                });
            }
            cur
        })),
    }
}
