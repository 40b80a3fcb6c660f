//! The discrete-event loop: one seed, one run, one verdict.
//!
//! Events sit in a queue ordered by (simulated time, insertion number), so ties
//! break the same way every time; nothing reads a wall clock, spawns a thread or
//! opens a socket. The seed draws the run's shape and faults ([`RunConfig`]) and
//! then drives every random choice of the run from the same stream.

use std::collections::BTreeMap;

use leasefence_core::ResourceId;

use crate::arbiter_node::ArbiterNode;
use crate::client::{ClientNode, ClientSetup, ClientStats, Clock};
use crate::config::{Fault, Fencing, Options, RunConfig};
use crate::coordinator_node::{CoordinatorNode, CoordinatorStats};
use crate::event::{Ctx, Event, Out};
use crate::ha::{PeerNode, PeerStats, StoreNode, StoreStats};
use crate::history::{self, History, Violation};
use crate::net::{NetStats, Network, Node};
use crate::rng::Rng;

/// A run that has not ended after this many events is a simulator bug.
pub const EVENTS_MAX: u64 = 5_000_000;

/// What happened in a run, for the one-line verdict and for a replay's summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub events: u64,
    pub clients: usize,
    pub resources: usize,
    pub ttl_ms: u64,
    pub heal_at_ms: u64,
    pub end_ms: u64,
    pub faults: usize,
    pub net: NetStats,
    pub coordinator: CoordinatorStats,
    pub arbiter_rejected: u64,
    /// Effects in the arbiter's own table (must equal the admitted history).
    pub arbiter_applied: usize,
    pub client_stats: Vec<ClientStats>,
    /// Leadership runs: the peers' and the shared store's counters.
    pub peers: Vec<PeerStats>,
    pub store: Option<StoreStats>,
    pub leader_ttl_ms: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub fencing: Fencing,
    pub options: Options,
    pub history: History,
    pub violations: Vec<Violation>,
    pub digest: u64,
    pub trace: Trace,
}

struct World {
    rng: Rng,
    now: u64,
    faulty: bool,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    net: Network,
    coordinator: CoordinatorNode,
    peers: Vec<PeerNode>,
    store: Option<StoreNode>,
    arbiter: ArbiterNode,
    clients: Vec<ClientNode>,
    history: History,
}

/// Runs one seed to the end and checks its history.
pub fn run(seed: u64, fencing: Fencing) -> RunReport {
    run_with(seed, Options::new(fencing))
}

pub fn run_with(seed: u64, options: Options) -> RunReport {
    let fencing = options.fencing;
    let mut rng = Rng::new(seed);
    let config = RunConfig::draw(&mut rng, &options);
    let mut world = World::new(rng, &config, &options);
    let mut events = 0u64;
    while let Some(((at, _), event)) = world.queue.pop_first() {
        if at > config.end_ms {
            break;
        }
        events += 1;
        assert!(events <= EVENTS_MAX, "seed {seed}: more than {EVENTS_MAX} events");
        world.now = at;
        world.dispatch(event);
    }
    let violations = history::check(&world.history, config.clients, config.heal_at_ms);
    let trace = Trace {
        events,
        clients: config.clients,
        resources: config.resources,
        ttl_ms: config.ttl_ms,
        heal_at_ms: config.heal_at_ms,
        end_ms: config.end_ms,
        faults: config.faults.len(),
        net: world.net.stats.clone(),
        coordinator: world.coordinator.stats.clone(),
        arbiter_rejected: world.arbiter.rejected,
        arbiter_applied: world.arbiter.applied(),
        client_stats: world.clients.iter().map(|c| c.stats.clone()).collect(),
        peers: world.peers.iter().map(|p| p.stats.clone()).collect(),
        store: world.store.as_ref().map(|s| s.stats.clone()),
        leader_ttl_ms: config.leadership.as_ref().map(|l| l.leader_ttl_ms),
    };
    RunReport {
        seed,
        fencing,
        options,
        digest: history::digest(&world.history),
        history: world.history,
        violations,
        trace,
    }
}

impl World {
    fn new(rng: Rng, config: &RunConfig, options: &Options) -> World {
        let resources: Vec<ResourceId> = (0..config.resources)
            .map(|i| ResourceId::new(&format!("res-{i}")).expect("generated resource names are valid"))
            .collect();
        let leadership = config.leadership.as_ref();
        let peers: Vec<PeerNode> = leadership.map_or_else(Vec::new, |l| {
            (0..l.peers)
                .map(|i| PeerNode::new(i, config.clients, config.ttl_ms, l))
                .collect()
        });
        let setup = ClientSetup {
            ttl_ms: config.ttl_ms,
            resources: resources.clone(),
            pause_per_mille: config.pause_per_mille,
            coordinators: match leadership {
                Some(l) => (0..l.peers).map(Node::Peer).collect(),
                None => vec![Node::Coordinator],
            },
            // Leases held over several renewals live across takeovers.
            hold_renewals_max: if leadership.is_some() { 12 } else { 0 },
        };
        let clients = (0..config.clients)
            .map(|i| {
                let rate_per_mille = config.clock_rate_per_mille.get(i).copied().unwrap_or(1_000);
                let clock = Clock {
                    rate_per_mille,
                    offset_ms: 0,
                };
                ClientNode::new(i, setup.clone(), clock)
            })
            .collect();
        let mut world = World {
            rng,
            now: 0,
            faulty: true,
            seq: 0,
            queue: BTreeMap::new(),
            net: Network::new(config),
            coordinator: CoordinatorNode::new(config.clients, config.ttl_ms, options),
            peers,
            store: leadership.map(|l| StoreNode::new(l.leader_ttl_ms, l.epoch_fencing)),
            arbiter: ArbiterNode::new(config.fencing),
            clients,
            history: History::default(),
        };
        for (at, fault) in &config.faults {
            world.schedule(*at, Event::Fault(fault.clone()));
        }
        world.schedule(config.heal_at_ms, Event::Heal);
        for i in 0..world.peers.len() {
            world.with_ctx(|ctx, w| w.peers[i].start(ctx));
        }
        for i in 0..config.clients {
            world.with_ctx(|ctx, w| w.clients[i].start(ctx));
        }
        world
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at_ms, self.seq), event);
    }

    fn dispatch(&mut self, event: Event) {
        // A paused peer handles nothing until it wakes: its events wait, in order.
        if let Some(until) = self.paused_peer(&event) {
            self.schedule(until, event);
            return;
        }
        match event {
            Event::Deliver { from, to, msg } => self.with_ctx(|ctx, w| match (from, to) {
                (Node::Client(c), Node::Coordinator) => w.coordinator.on_message(ctx, c, msg),
                (Node::Client(c), Node::Arbiter) => w.arbiter.on_message(ctx, c, msg),
                (_, Node::Client(c)) => w.clients[c].on_message(ctx, msg),
                (from, Node::Peer(p)) => {
                    if let Some(peer) = w.peers.get_mut(p) {
                        peer.on_message(ctx, from, msg);
                    }
                }
                (Node::Peer(p), Node::Store) => {
                    if let Some(store) = w.store.as_mut() {
                        store.on_message(ctx, p, msg);
                    }
                }
                _ => {}
            }),
            Event::Peer { peer, life, event } => self.with_ctx(|ctx, w| {
                if let Some(p) = w.peers.get_mut(peer) {
                    p.on_event(ctx, life, event);
                }
            }),
            Event::ClientWake { client, generation } => {
                self.with_ctx(|ctx, w| w.clients[client].on_wake(ctx, generation))
            }
            Event::CoordinatorTick { incarnation } => self.with_ctx(|ctx, w| w.coordinator.on_tick(ctx, incarnation)),
            Event::FsyncDone { incarnation, upto } => {
                self.with_ctx(|ctx, w| w.coordinator.on_fsync_done(ctx, incarnation, upto))
            }
            Event::WaitExpired {
                incarnation,
                resource,
                waiter,
            } => self.with_ctx(|ctx, w| w.coordinator.on_wait_expired(ctx, incarnation, &resource, waiter)),
            Event::CoordinatorRestart => self.with_ctx(|ctx, w| w.coordinator.restart(ctx)),
            Event::Fault(Fault::CoordinatorCrash { down_ms, mid_fsync }) if !self.peers.is_empty() => {
                if let Some(p) = self.leader(true) {
                    self.with_ctx(|ctx, w| w.peers[p].crash(ctx, down_ms, mid_fsync));
                }
            }
            Event::Fault(Fault::CoordinatorCrash { down_ms, mid_fsync }) => {
                self.with_ctx(|ctx, w| w.coordinator.crash(ctx, down_ms, mid_fsync))
            }
            Event::Fault(Fault::LeaderPause { for_ms, mid_commit }) => {
                if let Some(p) = self.leader(false) {
                    self.with_ctx(|ctx, w| w.peers[p].pause(ctx, for_ms, mid_commit));
                }
            }
            Event::Fault(Fault::StorePartition { peer, links, for_ms }) => {
                if let Some(p) = peer.or_else(|| self.leader(true)) {
                    self.net.partition_store(p, links, self.now + for_ms);
                }
            }
            Event::Fault(Fault::Partition { client, links, for_ms }) => {
                self.net.partition(client, links, self.now + for_ms)
            }
            Event::Fault(Fault::ClockStep { client, delta_ms }) => {
                if let Some(c) = self.clients.get_mut(client) {
                    c.step_clock(delta_ms);
                }
            }
            Event::Heal => {
                self.faulty = false;
                self.net.heal();
                self.coordinator.disarm();
                self.peers.iter_mut().for_each(PeerNode::disarm);
            }
        }
    }

    /// The peer that leads (of those that believe so, the highest epoch);
    /// `paused`: a paused one counts.
    fn leader(&self, paused: bool) -> Option<usize> {
        (0..self.peers.len())
            .filter(|&p| paused || self.peers[p].paused_until().is_none())
            .filter_map(|p| self.peers[p].leading().map(|e| (e, p)))
            .max()
            .map(|(_, p)| p)
    }

    /// When the peer an event is for wakes, if it is paused now.
    fn paused_peer(&self, event: &Event) -> Option<u64> {
        let peer = match event {
            Event::Deliver { to: Node::Peer(p), .. } => *p,
            Event::Peer {
                event: crate::ha::PeerEvent::Wake,
                ..
            } => return None,
            Event::Peer { peer, .. } => *peer,
            _ => return None,
        };
        self.peers.get(peer)?.paused_until()
    }

    /// Lends an actor the context, then routes what it sent and the timers it set.
    fn with_ctx(&mut self, f: impl FnOnce(&mut Ctx<'_>, &mut Actors<'_>)) {
        let mut out = Vec::new();
        let mut ctx = Ctx {
            now: self.now,
            faulty: self.faulty,
            rng: &mut self.rng,
            history: &mut self.history,
            out: &mut out,
        };
        let mut actors = Actors {
            coordinator: &mut self.coordinator,
            peers: &mut self.peers,
            store: &mut self.store,
            arbiter: &mut self.arbiter,
            clients: &mut self.clients,
        };
        f(&mut ctx, &mut actors);
        for o in out {
            match o {
                Out::Timer { at_ms, event } => self.schedule(at_ms, event),
                Out::Send { from, to, msg } => {
                    for delay in self.net.route(&mut self.rng, self.now, from, to) {
                        let event = Event::Deliver {
                            from,
                            to,
                            msg: msg.clone(),
                        };
                        self.schedule(self.now + delay, event);
                    }
                }
            }
        }
    }
}

/// The actors, borrowed apart from the context so both can be mutated at once.
struct Actors<'a> {
    coordinator: &'a mut CoordinatorNode,
    peers: &'a mut Vec<PeerNode>,
    store: &'a mut Option<StoreNode>,
    arbiter: &'a mut ArbiterNode,
    clients: &'a mut Vec<ClientNode>,
}
