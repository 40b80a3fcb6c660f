//! The simulated network: who talks to whom, the messages, and the faults a
//! message can meet on the way (partition, loss, duplication, delay, reordering).
//!
//! Coordinators of a leadership run reach their shared store over links of
//! their own: delayed (sometimes far longer than usual), cut by partitions in
//! either direction, but never lost or duplicated otherwise (a database
//! connection either answers or times out; it does not run a transaction twice).
//!
//! The network only decides *when* (and whether, and how often) a message
//! arrives; the event loop delivers it. Reordering needs no special case: every
//! copy draws its own delay, so later sends can arrive first.

use leasefence_core::{LeaseId, ResourceId, Token};

use crate::config::{Links, RunConfig, StoreLinks};
use crate::ha::{StoreCall, StoreReply};
use crate::rng::Rng;

/// An actor of the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// The one coordinator of a run without leadership.
    Coordinator,
    Arbiter,
    Client(usize),
    /// Coordinator `i` of a leadership run.
    Peer(usize),
    /// The store the peers share.
    Store,
}

/// Everything that travels. `req` correlates a reply with its request.
#[derive(Clone, Debug)]
pub enum Message {
    /// `wait_ms`: how long the coordinator may queue it behind a holder (0: fail busy).
    /// `sent_ms`: the true time the client sent it, for the checker's client-side
    /// view of the lease only (no coordinator logic reads it).
    Acquire {
        req: u64,
        resource: ResourceId,
        lease_id: LeaseId,
        wait_ms: u64,
        sent_ms: u64,
    },
    Renew {
        req: u64,
        resource: ResourceId,
        lease_id: LeaseId,
        sent_ms: u64,
    },
    Release {
        req: u64,
        resource: ResourceId,
        lease_id: LeaseId,
    },
    Granted {
        req: u64,
        token: Token,
    },
    Renewed {
        req: u64,
    },
    Released {
        req: u64,
    },
    /// Busy, lost, rejected: the request did not get what it asked for.
    Refused {
        req: u64,
    },
    Effect {
        req: u64,
        resource: ResourceId,
        token: Token,
        payload: u64,
    },
    Admitted {
        req: u64,
    },
    Stale {
        req: u64,
    },
    /// A standby's answer to any request: who leads, if it knows.
    NotLeader {
        req: u64,
        leader: Option<usize>,
    },
    /// A peer's call to the shared store, and the store's reply (`req`: the call id).
    StoreCall {
        req: u64,
        call: StoreCall,
    },
    StoreReply {
        req: u64,
        reply: StoreReply,
    },
}

impl Message {
    pub fn req(&self) -> u64 {
        match self {
            Message::Acquire { req, .. }
            | Message::Renew { req, .. }
            | Message::Release { req, .. }
            | Message::Granted { req, .. }
            | Message::Renewed { req }
            | Message::Released { req }
            | Message::Refused { req }
            | Message::Effect { req, .. }
            | Message::Admitted { req }
            | Message::Stale { req }
            | Message::NotLeader { req, .. }
            | Message::StoreCall { req, .. }
            | Message::StoreReply { req, .. } => *req,
        }
    }
}

/// Counters for the trace summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub lost: u64,
    pub cut: u64,
    pub duplicated: u64,
    pub slow: u64,
    /// Peer ↔ store messages dropped by a partition.
    pub store_cut: u64,
}

/// Link faults in force and the per-message fault rates.
#[derive(Debug)]
pub struct Network {
    /// Per client: the links cut and until when (`0`: none).
    cuts: Vec<(Links, u64)>,
    /// Per peer: its links to the store cut, and until when.
    store_cuts: Vec<(StoreLinks, u64)>,
    store_slow_per_mille: u32,
    loss_per_mille: u32,
    dup_per_mille: u32,
    slow_per_mille: u32,
    ttl_ms: u64,
    healed: bool,
    pub stats: NetStats,
}

const NO_LINKS: Links = Links {
    to_coordinator: false,
    from_coordinator: false,
    to_arbiter: false,
    from_arbiter: false,
};

impl Network {
    pub fn new(c: &RunConfig) -> Network {
        let peers = c.leadership.as_ref().map_or(0, |l| l.peers);
        let no_store_links = StoreLinks {
            to_store: false,
            from_store: false,
        };
        Network {
            cuts: vec![(NO_LINKS, 0); c.clients],
            store_cuts: vec![(no_store_links, 0); peers],
            store_slow_per_mille: c.leadership.as_ref().map_or(0, |l| l.store_slow_per_mille),
            loss_per_mille: c.loss_per_mille,
            dup_per_mille: c.dup_per_mille,
            slow_per_mille: c.slow_per_mille,
            ttl_ms: c.ttl_ms,
            healed: false,
            stats: NetStats::default(),
        }
    }

    pub fn partition(&mut self, client: usize, links: Links, until_ms: u64) {
        if let Some(cut) = self.cuts.get_mut(client) {
            *cut = (links, until_ms);
        }
    }

    pub fn partition_store(&mut self, peer: usize, links: StoreLinks, until_ms: u64) {
        if let Some(cut) = self.store_cuts.get_mut(peer) {
            *cut = (links, until_ms);
        }
    }

    /// Ends every fault: from now on messages are delayed a little, never lost.
    pub fn heal(&mut self) {
        self.healed = true;
        self.cuts.iter_mut().for_each(|c| *c = (NO_LINKS, 0));
        self.store_cuts.iter_mut().for_each(|c| c.1 = 0);
    }

    /// The arrival delays of the copies of a message sent now (empty: dropped).
    pub fn route(&mut self, rng: &mut Rng, now: u64, from: Node, to: Node) -> Vec<u64> {
        if let Some(peer) = store_link(from, to) {
            return self.route_store(rng, now, peer, to == Node::Store);
        }
        self.stats.sent += 1;
        if self.is_cut(now, from, to) {
            self.stats.cut += 1;
            return Vec::new();
        }
        if self.healed {
            return vec![rng.range(1, 10)];
        }
        if rng.chance(self.loss_per_mille) {
            self.stats.lost += 1;
            return Vec::new();
        }
        let copies = if rng.chance(self.dup_per_mille) { 2 } else { 1 };
        self.stats.duplicated += copies - 1;
        (0..copies).map(|_| self.delay(rng)).collect()
    }

    fn route_store(&mut self, rng: &mut Rng, now: u64, peer: usize, to_store: bool) -> Vec<u64> {
        let cut = self
            .store_cuts
            .get(peer)
            .filter(|(_, until)| now < *until)
            .is_some_and(|(l, _)| if to_store { l.to_store } else { l.from_store });
        if cut {
            self.stats.store_cut += 1;
            return Vec::new();
        }
        if !self.healed && rng.chance(self.store_slow_per_mille) {
            // A transaction stuck on the way: it may land after a takeover.
            self.stats.slow += 1;
            return vec![rng.range(50, 3 * self.ttl_ms)];
        }
        vec![rng.range(1, 10)]
    }

    fn delay(&mut self, rng: &mut Rng) -> u64 {
        if rng.chance(self.slow_per_mille) {
            // Held back past a TTL: an effect can land after its lease ended.
            self.stats.slow += 1;
            return rng.range(50, 3 * self.ttl_ms);
        }
        rng.range(1, 20)
    }

    fn is_cut(&self, now: u64, from: Node, to: Node) -> bool {
        let cut = |client: usize| self.cuts.get(client).filter(|(_, until)| now < *until).map(|(l, _)| *l);
        match (from, to) {
            (Node::Client(c), Node::Coordinator | Node::Peer(_)) => cut(c).is_some_and(|l| l.to_coordinator),
            (Node::Coordinator | Node::Peer(_), Node::Client(c)) => cut(c).is_some_and(|l| l.from_coordinator),
            (Node::Client(c), Node::Arbiter) => cut(c).is_some_and(|l| l.to_arbiter),
            (Node::Arbiter, Node::Client(c)) => cut(c).is_some_and(|l| l.from_arbiter),
            _ => false,
        }
    }
}

/// The peer at one end of a peer ↔ store link.
fn store_link(from: Node, to: Node) -> Option<usize> {
    match (from, to) {
        (Node::Peer(p), Node::Store) | (Node::Store, Node::Peer(p)) => Some(p),
        _ => None,
    }
}
