//! A simulated client: acquire (maybe waiting) → maybe renew → effect → release.
//!
//! The client judges its lease by its own clock, which may run fast or slow and
//! may jump (an injected clock, never the simulation's). A well-behaved client
//! checks that its lease is still valid before acting; faults make that check
//! wrong: a pause right after it (a GC stall), a slow clock, a backwards step,
//! or an effect held up in the network. The effect is sent anyway, and only
//! fencing at the arbiter keeps it from doing harm.
//!
//! With several coordinators (leadership runs) the client sends to the one it
//! believes leads, follows a standby's leader hint, and tries the next one when
//! a request times out. There it may also hold a lease for a while, renewing
//! it every third of a TTL, so that leases live across takeovers.

use leasefence_core::{LeaseId, ResourceId, Token};

use crate::event::{Ctx, Event};
use crate::history::SentRelease;
use crate::net::{Message, Node};

/// A client's clock: `now * rate / 1000 + offset`, in local milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub rate_per_mille: u64,
    pub offset_ms: i64,
}

impl Clock {
    fn read(&self, now_ms: u64) -> i64 {
        let scaled = u128::from(now_ms) * u128::from(self.rate_per_mille) / 1000;
        i64::try_from(scaled).unwrap_or(i64::MAX).saturating_add(self.offset_ms)
    }

    /// Simulated time a local duration takes on this clock.
    fn sim_ms(&self, local_ms: u64) -> u64 {
        (local_ms * 1000 / self.rate_per_mille.max(1)).max(1)
    }
}

#[derive(Clone, Debug)]
struct Lease {
    resource: ResourceId,
    lease_id: LeaseId,
    token: Token,
    valid_until_local: i64,
}

#[derive(Clone, Debug)]
enum Phase {
    Idle,
    Acquiring {
        resource: ResourceId,
        lease_id: LeaseId,
        sent_local: i64,
    },
    Renewing {
        lease: Lease,
        sent_local: i64,
    },
    Paused {
        lease: Lease,
    },
    /// Holding the lease between renewals (leadership runs only).
    Holding {
        lease: Lease,
    },
    Effecting {
        lease: Lease,
    },
    Releasing,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub grants: u64,
    pub admitted: u64,
    pub stale: u64,
    pub pauses: u64,
    pub timeouts: u64,
}

/// How a client behaves beyond its clock (see [`ClientNode::new`]).
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub ttl_ms: u64,
    pub resources: Vec<ResourceId>,
    pub pause_per_mille: u32,
    /// The coordinators it knows, in the order it tries them.
    pub coordinators: Vec<Node>,
    /// Half the grants are held for up to this many renewals, a third of a
    /// TTL apart (0: never; at most the one renewal right after the grant).
    pub hold_renewals_max: u32,
}

#[derive(Debug)]
pub struct ClientNode {
    id: usize,
    ttl_ms: u64,
    resources: Vec<ResourceId>,
    pause_per_mille: u32,
    coordinators: Vec<Node>,
    /// Index into `coordinators` of the one requests go to.
    target: usize,
    hold_renewals_max: u32,
    renewals_left: u32,
    pub clock: Clock,
    generation: u64,
    req: u64,
    phase: Phase,
    pub stats: ClientStats,
}

impl ClientNode {
    pub fn new(id: usize, setup: ClientSetup, clock: Clock) -> ClientNode {
        ClientNode {
            id,
            ttl_ms: setup.ttl_ms,
            resources: setup.resources,
            pause_per_mille: setup.pause_per_mille,
            coordinators: setup.coordinators,
            target: 0,
            hold_renewals_max: setup.hold_renewals_max,
            renewals_left: 0,
            clock,
            generation: 0,
            req: 0,
            phase: Phase::Idle,
            stats: ClientStats::default(),
        }
    }

    fn coordinator(&self) -> Node {
        self.coordinators.get(self.target).copied().unwrap_or(Node::Coordinator)
    }

    /// No answer: the coordinator may be down or deposed; try the next one.
    fn try_next(&mut self) {
        self.target = (self.target + 1) % self.coordinators.len().max(1);
    }

    pub fn start(&mut self, ctx: &mut Ctx<'_>) {
        self.idle(ctx);
    }

    pub fn on_wake(&mut self, ctx: &mut Ctx<'_>, generation: u64) {
        if generation != self.generation {
            return;
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => self.acquire(ctx),
            Phase::Paused { lease } => self.send_effect(ctx, lease),
            Phase::Holding { lease } => self.renew(ctx, lease),
            // A renewal that timed out leaves the lease as it was: judge it by
            // the clock (with several coordinators: keep renewing elsewhere).
            Phase::Renewing { lease, .. } => {
                self.stats.timeouts += 1;
                self.try_next();
                self.renew_elsewhere_or_act(ctx, lease);
            }
            Phase::Effecting { lease } => {
                self.stats.timeouts += 1;
                self.release(ctx, lease);
            }
            Phase::Acquiring { .. } | Phase::Releasing => {
                self.stats.timeouts += 1;
                self.try_next();
                self.idle(ctx);
            }
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, msg: Message) {
        // Late, duplicated or orphaned replies answer a request we gave up on.
        if msg.req() != self.req {
            return;
        }
        if let Message::NotLeader { leader, .. } = msg {
            self.follow_hint(ctx, leader);
            return;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match (phase, msg) {
            (
                Phase::Acquiring {
                    resource,
                    lease_id,
                    sent_local,
                },
                Message::Granted { token, .. },
            ) => {
                self.stats.grants += 1;
                // Short-circuit: single-coordinator runs draw nothing more here.
                let holds = self.hold_renewals_max > 0 && ctx.rng.chance(500);
                self.renewals_left = if holds { self.hold_renewals_max } else { 0 };
                // The TTL started when the coordinator got the request, after we sent it.
                let valid_until_local = sent_local + self.ttl_i64();
                let lease = Lease {
                    resource,
                    lease_id,
                    token,
                    valid_until_local,
                };
                if holds {
                    self.hold(ctx, lease);
                } else if ctx.rng.chance(300) {
                    self.renew(ctx, lease);
                } else {
                    self.begin_effect(ctx, lease);
                }
            }
            (Phase::Renewing { mut lease, sent_local }, Message::Renewed { .. }) => {
                lease.valid_until_local = sent_local + self.ttl_i64();
                // Short-circuit: single-coordinator runs draw nothing more here.
                if self.renewals_left > 0 && ctx.rng.chance(900) {
                    self.hold(ctx, lease);
                } else {
                    self.begin_effect(ctx, lease);
                }
            }
            (Phase::Effecting { lease }, Message::Admitted { .. }) => {
                self.stats.admitted += 1;
                self.release(ctx, lease);
            }
            (Phase::Effecting { lease }, Message::Stale { .. }) => {
                self.stats.stale += 1;
                self.release(ctx, lease);
            }
            (phase @ (Phase::Paused { .. } | Phase::Effecting { .. } | Phase::Holding { .. }), _) => self.phase = phase,
            // Refused acquire or renewal, or a release answered: start over.
            _ => self.idle(ctx),
        }
    }

    /// A standby answered: go where it says the leader is (or try the next
    /// one), then carry on as after a refusal, except that a lease whose
    /// renewal was turned away is still judged by the clock.
    fn follow_hint(&mut self, ctx: &mut Ctx<'_>, leader: Option<usize>) {
        match leader.and_then(|l| self.coordinators.iter().position(|c| *c == Node::Peer(l))) {
            Some(i) => self.target = i,
            None => self.try_next(),
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Renewing { lease, .. } => self.renew_elsewhere_or_act(ctx, lease),
            phase @ (Phase::Paused { .. } | Phase::Effecting { .. } | Phase::Holding { .. }) => self.phase = phase,
            _ => self.idle(ctx),
        }
    }

    /// Keeps the lease a while longer: the next renewal in a third of a TTL.
    fn hold(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        self.renewals_left = self.renewals_left.saturating_sub(1);
        self.phase = Phase::Holding { lease };
        self.local_timer(ctx, self.ttl_ms / 3);
    }

    /// A keep-alive survives a takeover: while the lease is still valid by
    /// the client's clock, a renewal that got no answer is sent to the next
    /// coordinator. With one coordinator, the client acts on the lease as it is.
    fn renew_elsewhere_or_act(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        let margin = self.ttl_i64() / 10;
        if self.coordinators.len() > 1 && self.clock.read(ctx.now) + margin < lease.valid_until_local {
            self.renew(ctx, lease);
        } else {
            self.begin_effect(ctx, lease);
        }
    }

    pub fn step_clock(&mut self, delta_ms: i64) {
        self.clock.offset_ms = self.clock.offset_ms.saturating_add(delta_ms);
    }

    fn acquire(&mut self, ctx: &mut Ctx<'_>) {
        let resource = self.resources[ctx.rng.index(self.resources.len())].clone();
        let lease_id = lease_id(ctx.rng);
        let wait_ms = if ctx.rng.chance(500) {
            ctx.rng.range(1, 2 * self.ttl_ms)
        } else {
            0
        };
        let req = self.next_req();
        let msg = Message::Acquire {
            req,
            resource: resource.clone(),
            lease_id,
            wait_ms,
            sent_ms: ctx.now,
        };
        ctx.send(Node::Client(self.id), self.coordinator(), msg);
        let sent_local = self.clock.read(ctx.now);
        self.phase = Phase::Acquiring {
            resource,
            lease_id,
            sent_local,
        };
        // Longer than the coordinator's wait bound, so a queued answer can still arrive.
        let timeout = wait_ms + self.ttl_ms;
        self.local_timer(ctx, timeout);
    }

    fn renew(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        let req = self.next_req();
        let msg = Message::Renew {
            req,
            resource: lease.resource.clone(),
            lease_id: lease.lease_id,
            sent_ms: ctx.now,
        };
        ctx.send(Node::Client(self.id), self.coordinator(), msg);
        let sent_local = self.clock.read(ctx.now);
        self.phase = Phase::Renewing { lease, sent_local };
        self.local_timer(ctx, self.ttl_ms / 2);
    }

    /// The validity check a careful client makes, then maybe a stall right after it.
    fn begin_effect(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        let margin = self.ttl_i64() / 10;
        if self.clock.read(ctx.now) + margin >= lease.valid_until_local {
            self.release(ctx, lease);
            return;
        }
        if ctx.faulty && ctx.rng.chance(self.pause_per_mille) {
            self.stats.pauses += 1;
            // A process stall runs on real time, not on the client's clock.
            let pause = ctx.rng.range(self.ttl_ms * 3 / 2, self.ttl_ms * 10);
            self.phase = Phase::Paused { lease };
            self.generation += 1;
            let generation = self.generation;
            ctx.timer(
                ctx.now + pause,
                Event::ClientWake {
                    client: self.id,
                    generation,
                },
            );
            return;
        }
        self.send_effect(ctx, lease);
    }

    fn send_effect(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        let req = self.next_req();
        let payload = (u64::try_from(self.id).unwrap_or(0) << 40) | req;
        let msg = Message::Effect {
            req,
            resource: lease.resource.clone(),
            token: lease.token,
            payload,
        };
        ctx.send(Node::Client(self.id), Node::Arbiter, msg);
        self.phase = Phase::Effecting { lease };
        self.local_timer(ctx, self.ttl_ms);
    }

    fn release(&mut self, ctx: &mut Ctx<'_>, lease: Lease) {
        let req = self.next_req();
        ctx.history.releases.push(SentRelease {
            at_ms: ctx.now,
            resource: lease.resource.clone(),
            lease_id: lease.lease_id,
            token: lease.token,
            client: self.id,
        });
        let msg = Message::Release {
            req,
            resource: lease.resource,
            lease_id: lease.lease_id,
        };
        ctx.send(Node::Client(self.id), self.coordinator(), msg);
        self.phase = Phase::Releasing;
        self.local_timer(ctx, self.ttl_ms / 2);
    }

    fn idle(&mut self, ctx: &mut Ctx<'_>) {
        self.phase = Phase::Idle;
        let think = ctx.rng.range(1, self.ttl_ms / 2);
        self.local_timer(ctx, think);
    }

    fn local_timer(&mut self, ctx: &mut Ctx<'_>, local_ms: u64) {
        self.generation += 1;
        let at_ms = ctx.now + self.clock.sim_ms(local_ms);
        let generation = self.generation;
        ctx.timer(
            at_ms,
            Event::ClientWake {
                client: self.id,
                generation,
            },
        );
    }

    fn next_req(&mut self) -> u64 {
        self.req += 1;
        self.req
    }

    fn ttl_i64(&self) -> i64 {
        i64::try_from(self.ttl_ms).unwrap_or(i64::MAX)
    }
}

/// A fresh lease id from the run's PRNG (the core takes randomness from its caller).
fn lease_id(rng: &mut crate::rng::Rng) -> LeaseId {
    LeaseId::from_bytes(rng.bytes16())
}
