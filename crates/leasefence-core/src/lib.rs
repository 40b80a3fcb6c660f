//! Pure logic of leasefence: fencing tokens, names, the per-resource lease state
//! machine and the arbiter rule.
//!
//! Nothing here does I/O, reads a clock or is async. Time comes in as a
//! [`MonoTime`] argument; what must be made durable comes out as [`Effect`]s that
//! the caller (the server, backed by a store) executes in order. That keeps every
//! safety rule testable with exact, repeatable outcomes.
//!
//! The invariant everything serves: for each resource, no effect authorized by
//! token n is accepted after an effect authorized by a higher token.

pub mod access;
mod arbiter;
mod config;
mod coordinator;
mod error;
mod expiry;
mod fence;
mod lease_id;
mod names;
mod records;
pub mod signing;
mod time;
mod token;

pub use arbiter::{FenceMode, Stale, admit};
pub use config::{Config, OutsideBounds};
pub use coordinator::{
    AcquireOutcome, AcquireRequest, Coordinator, Effect, Grant, HeldStatus, LIST_LIMIT_MAX, ResourcePage,
    ResourceStatus, WaiterId,
};
pub use error::{BusyReason, Invalid, LeaseError};
pub use fence::{ENV_RESOURCE, ENV_SIGNATURE, ENV_TOKEN, Fence, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN};
pub use lease_id::LeaseId;
pub use names::{HOLDER_LEN_MAX, Holder, RESOURCE_LEN_MAX, ResourceId, Shown, shown};
pub use records::{Mutation, ReleaseCause, StoredLease, StoredLockDelay, StoredResource};
pub use time::MonoTime;
pub use token::Token;
