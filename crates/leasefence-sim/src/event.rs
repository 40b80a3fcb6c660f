//! The discrete events of the simulation and the context an actor gets when it
//! handles one: the simulated time, the run's PRNG, the history, and an outbox.
//!
//! Actors never touch the queue or the network: they say what to send and which
//! timers to set, and the loop in `sim.rs` routes it. That keeps each actor a
//! plain state machine that is easy to read on its own.

use crate::history::History;
use crate::net::{Message, Node};
use crate::rng::Rng;

/// Something that happens at a simulated time.
#[derive(Clone, Debug)]
pub enum Event {
    Deliver {
        from: Node,
        to: Node,
        msg: Message,
    },
    /// A client's timer; stale if `generation` is no longer the client's current one.
    ClientWake {
        client: usize,
        generation: u64,
    },
    /// The coordinator's expiry deadline, for the incarnation that set it.
    CoordinatorTick {
        incarnation: u64,
    },
    /// A group commit finished: mutations up to `upto` (exclusive) are durable.
    FsyncDone {
        incarnation: u64,
        upto: u64,
    },
    /// A queued acquire's server-side wait bound ran out (the engine's `wait_ms`).
    WaitExpired {
        incarnation: u64,
        resource: leasefence_core::ResourceId,
        waiter: leasefence_core::WaiterId,
    },
    CoordinatorRestart,
    /// A timer of leadership-run peer `peer`, set during its life `life`.
    Peer {
        peer: usize,
        life: u64,
        event: crate::ha::PeerEvent,
    },
    /// Scheduled faults and the end of the fault phase.
    Fault(crate::config::Fault),
    Heal,
}

/// What an actor asks the loop to do.
#[derive(Debug)]
pub enum Out {
    Send { from: Node, to: Node, msg: Message },
    Timer { at_ms: u64, event: Event },
}

/// An actor's view of the world while it handles one event.
pub struct Ctx<'a> {
    pub now: u64,
    /// `false` once the faults have healed: no new pauses are drawn.
    pub faulty: bool,
    pub rng: &'a mut Rng,
    pub history: &'a mut History,
    pub out: &'a mut Vec<Out>,
}

impl Ctx<'_> {
    pub fn send(&mut self, from: Node, to: Node, msg: Message) {
        self.out.push(Out::Send { from, to, msg });
    }

    pub fn timer(&mut self, at_ms: u64, event: Event) {
        self.out.push(Out::Timer { at_ms, event });
    }

    /// A line for a replay's trace (takeovers, step-downs); no check reads it.
    pub fn note(&mut self, line: String) {
        self.history.notes.push((self.now, line));
    }
}
