//! A simulated client: acquire (maybe waiting) → maybe renew → effect → release.
//!
//! The client judges its lease by its own clock, which may run fast or slow and
//! may jump (an injected clock, never the simulation's). A well-behaved client
//! checks that its lease is still valid before acting; faults make that check
//! wrong: a pause right after it (a GC stall), a slow clock, a backwards step,
//! or an effect held up in the network. The effect is sent anyway, and only
//! fencing at the arbiter keeps it from doing harm.

use leasefence_core::{LeaseId, ResourceId, Token};

use crate::event::{Ctx, Event};
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

#[derive(Debug)]
pub struct ClientNode {
    id: usize,
    ttl_ms: u64,
    resources: Vec<ResourceId>,
    pause_per_mille: u32,
    pub clock: Clock,
    generation: u64,
    req: u64,
    phase: Phase,
    pub stats: ClientStats,
}

impl ClientNode {
    pub fn new(id: usize, ttl_ms: u64, resources: Vec<ResourceId>, pause_per_mille: u32, clock: Clock) -> ClientNode {
        ClientNode {
            id,
            ttl_ms,
            resources,
            pause_per_mille,
            clock,
            generation: 0,
            req: 0,
            phase: Phase::Idle,
            stats: ClientStats::default(),
        }
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
            // A renewal that timed out leaves the lease as it was: judge it by the clock.
            Phase::Renewing { lease, .. } => {
                self.stats.timeouts += 1;
                self.begin_effect(ctx, lease);
            }
            Phase::Effecting { lease } => {
                self.stats.timeouts += 1;
                self.release(ctx, lease);
            }
            Phase::Acquiring { .. } | Phase::Releasing => {
                self.stats.timeouts += 1;
                self.idle(ctx);
            }
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, msg: Message) {
        // Late, duplicated or orphaned replies answer a request we gave up on.
        if msg.req() != self.req {
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
                // The TTL started when the coordinator got the request, after we sent it.
                let valid_until_local = sent_local + self.ttl_i64();
                let lease = Lease {
                    resource,
                    lease_id,
                    token,
                    valid_until_local,
                };
                if ctx.rng.chance(300) {
                    self.renew(ctx, lease);
                } else {
                    self.begin_effect(ctx, lease);
                }
            }
            (Phase::Renewing { mut lease, sent_local }, Message::Renewed { .. }) => {
                lease.valid_until_local = sent_local + self.ttl_i64();
                self.begin_effect(ctx, lease);
            }
            (Phase::Effecting { lease }, Message::Admitted { .. }) => {
                self.stats.admitted += 1;
                self.release(ctx, lease);
            }
            (Phase::Effecting { lease }, Message::Stale { .. }) => {
                self.stats.stale += 1;
                self.release(ctx, lease);
            }
            (phase @ (Phase::Paused { .. } | Phase::Effecting { .. }), _) => self.phase = phase,
            // Refused acquire or renewal, or a release answered: start over.
            _ => self.idle(ctx),
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
        };
        ctx.send(Node::Client(self.id), Node::Coordinator, msg);
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
        };
        ctx.send(Node::Client(self.id), Node::Coordinator, msg);
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
        let msg = Message::Release {
            req,
            resource: lease.resource,
            lease_id: lease.lease_id,
        };
        ctx.send(Node::Client(self.id), Node::Coordinator, msg);
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
