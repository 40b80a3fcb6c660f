//! Leadership: several coordinators over one shared store, one leading at a time.
//!
//! The store ([`StoreNode`]) is the real `leasefence_store::MemoryShared`,
//! the in-memory reference of the `SharedStore` port, on the simulated clock
//! (`MemoryShared::with_clock`): it judges when a leadership lapses and
//! fences every write by its epoch. The coordinators ([`PeerNode`]) campaign
//! while the leadership is free; the winner loads the records and rebuilds the
//! real core machine with `Coordinator::recover` (takeover = restart), group
//! commits through `writer(epoch).apply`, renews its leadership and fences
//! itself: it answers nothing once `leader_deadline(leader_ttl)` has passed
//! since the send time of its last successful renewal. Standbys answer every
//! request with a leader hint.
//!
//! A paused leader wakes believing it still leads: it carries on with what it
//! was doing, writes what its machine produces (expiries that fell due while it
//! slept, requests that queued up) and sends a renewal. With epoch fencing its
//! writes fail with `Deposed` and it steps down; in the control
//! (`Leadership::epoch_fencing` off) the store applies them whatever the epoch.

mod peer;
mod store;

pub use peer::{PeerEvent, PeerNode, PeerStats};
pub use store::{StoreCall, StoreNode, StoreReply, StoreStats};
