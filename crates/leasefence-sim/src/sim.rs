//! The discrete-event loop: one seed, one run, one verdict.
//!
//! Events sit in a queue ordered by (simulated time, insertion number), so ties
//! break the same way every time; nothing reads a wall clock, spawns a thread or
//! opens a socket. The seed draws the run's shape and faults ([`RunConfig`]) and
//! then drives every random choice of the run from the same stream.

use std::collections::BTreeMap;

use leasefence_core::ResourceId;

use crate::arbiter_node::ArbiterNode;
use crate::client::{ClientNode, ClientStats, Clock};
use crate::config::{Fault, Fencing, Options, RunConfig};
use crate::coordinator_node::{CoordinatorNode, CoordinatorStats};
use crate::event::{Ctx, Event, Out};
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
}

#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub fencing: Fencing,
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
    let config = RunConfig::draw(&mut rng, fencing);
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
    };
    RunReport {
        seed,
        fencing,
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
        let clients = (0..config.clients)
            .map(|i| {
                let rate_per_mille = config.clock_rate_per_mille.get(i).copied().unwrap_or(1_000);
                let clock = Clock {
                    rate_per_mille,
                    offset_ms: 0,
                };
                ClientNode::new(i, config.ttl_ms, resources.clone(), config.pause_per_mille, clock)
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
            arbiter: ArbiterNode::new(config.fencing),
            clients,
            history: History::default(),
        };
        for (at, fault) in &config.faults {
            world.schedule(*at, Event::Fault(fault.clone()));
        }
        world.schedule(config.heal_at_ms, Event::Heal);
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
        match event {
            Event::Deliver { from, to, msg } => self.with_ctx(|ctx, w| match (from, to) {
                (Node::Client(c), Node::Coordinator) => w.coordinator.on_message(ctx, c, msg),
                (Node::Client(c), Node::Arbiter) => w.arbiter.on_message(ctx, c, msg),
                (_, Node::Client(c)) => w.clients[c].on_message(ctx, msg),
                _ => {}
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
            Event::Fault(Fault::CoordinatorCrash { down_ms, mid_fsync }) => {
                self.with_ctx(|ctx, w| w.coordinator.crash(ctx, down_ms, mid_fsync))
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
            }
        }
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
    arbiter: &'a mut ArbiterNode,
    clients: &'a mut Vec<ClientNode>,
}
