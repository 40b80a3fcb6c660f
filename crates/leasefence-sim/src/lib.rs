//! Deterministic simulation of the leasefence protocol, and its model check.
//!
//! [`run`] drives the real `leasefence_core::Coordinator` (with a simulated
//! group-committing store that a crash can cut short) and the real
//! `leasefence_core::admit` rule, with 3–5 clients, over a simulated network and
//! clock, from one seed. The history checker then judges what the coordinator
//! answered and what the arbiter admitted. [`model`] is a stateright model of
//! the same protocol, small enough to explore exhaustively.
//!
//! With [`Options::leadership`], 2–3 coordinators share one store
//! (`leasefence_store::MemoryShared` on the simulated clock), one leading at a
//! time under an epoch that fences its writes; leaders pause past their
//! leader TTL, lose the store and crash, and the checker also judges takeovers.
//!
//! This simulates the protocol, not the network stack: no gRPC, no sockets, no
//! threads, no wall clock.

mod arbiter_node;
mod client;
pub mod config;
mod coordinator_node;
mod event;
mod ha;
pub mod history;
pub mod model;
mod net;
mod rng;
mod sim;

pub use config::{Fencing, Leadership, Options};
pub use ha::{PeerStats, StoreStats};
pub use history::{History, Violation};
pub use sim::{RunReport, Trace, run, run_with};
