//! Deterministic simulation of the leasefence protocol, and its model check.
//!
//! [`run`] drives the real `leasefence_core::Coordinator` (with a simulated
//! group-committing store that a crash can cut short) and the real
//! `leasefence_core::admit` rule, with 3–5 clients, over a simulated network and
//! clock, from one seed. The history checker then judges what the coordinator
//! answered and what the arbiter admitted. [`model`] is a stateright model of
//! the same protocol, small enough to explore exhaustively.
//!
//! This simulates the protocol, not the network stack: no gRPC, no sockets, no
//! threads, no wall clock.

mod arbiter_node;
mod client;
pub mod config;
mod coordinator_node;
mod event;
pub mod history;
pub mod model;
mod net;
mod rng;
mod sim;

pub use config::{Fencing, Options};
pub use history::{History, Violation};
pub use sim::{RunReport, Trace, run, run_with};
