//! The simulated coordinator: the real `leasefence_core::Coordinator` plus a
//! group-committing store and a crash that loses everything not yet fsynced.
//!
//! This mirrors the server's engine (ARCHITECTURE.md, "How a grant flows"):
//! mutations queue in order, one fsync makes every queued mutation durable at a
//! later simulated time, and a reply waits until everything submitted before it
//! is durable. Renewals change only memory and are answered at once. A crash
//! drops the machine, the queue, the waiters and any fsync in flight; a restart
//! rebuilds the machine with `Coordinator::recover` from the durable records.

use std::time::Duration;

use leasefence_core::{AcquireOutcome, AcquireRequest, Config, Coordinator, Holder, MonoTime, ResourceId, WaiterId};
use leasefence_store::{LeaseStore, MemoryStore};

use crate::config::{Fault, Options};
use crate::event::{Ctx, Event};
use crate::history::AnsweredGrant;
use crate::net::{Message, Node};

mod live;
use live::Live;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub crashes: u64,
    pub fsyncs: u64,
    /// Mutations queued but not durable when a crash hit.
    pub lost_mutations: u64,
}

#[derive(Debug)]
pub struct CoordinatorNode {
    config: Config,
    ttl: Duration,
    holders: Vec<Holder>,
    durable: MemoryStore,
    incarnation: u64,
    live: Option<Live>,
    /// A mid-fsync crash waiting for the next group commit to start.
    armed_crash: Option<u64>,
    /// A deliberate bug for the checker's own test: answer before the fsync.
    answer_before_durable: bool,
    pub stats: CoordinatorStats,
}

impl CoordinatorNode {
    pub fn new(clients: usize, ttl_ms: u64, options: &Options) -> CoordinatorNode {
        let holders = (0..clients)
            .map(|i| Holder::new(&format!("client-{i}")).expect("generated holder names are valid"))
            .collect();
        CoordinatorNode {
            config: Config::default(),
            ttl: Duration::from_millis(ttl_ms),
            holders,
            durable: MemoryStore::new(),
            incarnation: 0,
            live: Some(Live::new(Coordinator::new(Config::default()))),
            armed_crash: None,
            answer_before_durable: options.answer_before_durable,
            stats: CoordinatorStats::default(),
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, client: usize, msg: Message) {
        let now = MonoTime::from_millis(ctx.now);
        let ttl = self.ttl;
        let Some(holder) = self.holders.get(client).cloned() else {
            return;
        };
        // A message to a crashed coordinator is lost, like one to a dead process.
        let Some(live) = self.live.as_mut() else { return };
        match msg {
            Message::Acquire {
                req,
                resource,
                lease_id,
                wait_ms,
            } => {
                let wait = wait_ms > 0;
                let request = AcquireRequest {
                    resource: resource.clone(),
                    holder,
                    ttl,
                    lease_id,
                    wait,
                    // The simulation checks fencing, which lock-delays do not change.
                    lock_delay: Duration::ZERO,
                };
                let outcome = live.machine.acquire(now, request);
                live.absorb_effects();
                match outcome {
                    Ok(AcquireOutcome::Granted(g)) => live.hold_reply(
                        client,
                        Message::Granted { req, token: g.token },
                        Some((g.resource, g.token)),
                    ),
                    Ok(AcquireOutcome::Queued(waiter)) => {
                        live.waiters.insert(waiter, (client, req));
                        let incarnation = self.incarnation;
                        ctx.timer(
                            ctx.now + wait_ms,
                            Event::WaitExpired {
                                incarnation,
                                resource,
                                waiter,
                            },
                        );
                    }
                    Err(_) => live.hold_reply(client, Message::Refused { req }, None),
                }
            }
            Message::Renew {
                req,
                resource,
                lease_id,
            } => {
                let reply = match live.machine.renew(now, &resource, &lease_id) {
                    Ok(_) => Message::Renewed { req },
                    Err(_) => Message::Refused { req },
                };
                live.absorb_effects();
                ctx.send(Node::Coordinator, Node::Client(client), reply);
            }
            Message::Release {
                req,
                resource,
                lease_id,
            } => {
                let released = live.machine.release(now, &resource, &lease_id).is_ok();
                live.absorb_effects();
                let reply = if released {
                    Message::Released { req }
                } else {
                    Message::Refused { req }
                };
                live.hold_reply(client, reply, None);
            }
            _ => {}
        }
        self.after_change(ctx);
    }

    pub fn on_tick(&mut self, ctx: &mut Ctx<'_>, incarnation: u64) {
        let Some(live) = self.live.as_mut().filter(|_| incarnation == self.incarnation) else {
            return;
        };
        live.tick_at = None;
        live.machine.advance(MonoTime::from_millis(ctx.now));
        live.absorb_effects();
        self.after_change(ctx);
    }

    /// The wait bound ran out: like the engine, settle expiries, then cancel and answer busy.
    pub fn on_wait_expired(&mut self, ctx: &mut Ctx<'_>, incarnation: u64, resource: &ResourceId, waiter: WaiterId) {
        let Some(live) = self.live.as_mut().filter(|_| incarnation == self.incarnation) else {
            return;
        };
        live.machine.advance(MonoTime::from_millis(ctx.now));
        live.absorb_effects();
        if live.machine.cancel_waiter(resource, waiter) {
            if let Some((client, req)) = live.waiters.remove(&waiter) {
                live.hold_reply(client, Message::Refused { req }, None);
            }
        }
        self.after_change(ctx);
    }

    /// One group commit finished: apply its batch to the durable store, answer.
    pub fn on_fsync_done(&mut self, ctx: &mut Ctx<'_>, incarnation: u64, upto: u64) {
        let Some(live) = self.live.as_mut().filter(|_| incarnation == self.incarnation) else {
            return;
        };
        let mut batch = Vec::new();
        while live.pending.front().is_some_and(|(seq, _)| *seq < upto) {
            if let Some((_, m)) = live.pending.pop_front() {
                batch.push(m);
            }
        }
        if let Err(e) = self.durable.apply(&batch) {
            ctx.history.store_refusals.push(e.to_string());
        }
        self.stats.fsyncs += 1;
        live.durable_seq = upto;
        live.fsync_in_flight = false;
        self.after_change(ctx);
    }

    /// The process dies: memory, queued mutations and waiters are gone.
    pub fn crash(&mut self, ctx: &mut Ctx<'_>, down_ms: u64, mid_fsync: bool) {
        if mid_fsync && self.live.as_ref().is_some_and(|l| !l.fsync_in_flight) {
            self.armed_crash = Some(down_ms);
            return;
        }
        let Some(live) = self.live.take() else { return };
        self.stats.crashes += 1;
        self.stats.lost_mutations += u64::try_from(live.pending.len()).unwrap_or(u64::MAX);
        self.incarnation += 1;
        ctx.timer(ctx.now + down_ms, Event::CoordinatorRestart);
    }

    /// The faults have healed: an armed crash never fires.
    pub fn disarm(&mut self) {
        self.armed_crash = None;
    }

    pub fn restart(&mut self, ctx: &mut Ctx<'_>) {
        let records = match self.durable.load() {
            Ok(records) => records,
            Err(e) => {
                ctx.history.store_refusals.push(e.to_string());
                Vec::new()
            }
        };
        let machine = Coordinator::recover(self.config.clone(), MonoTime::from_millis(ctx.now), records);
        self.live = Some(Live::new(machine));
        self.after_change(ctx);
    }

    /// Answers what is durable, starts a group commit if one is due, arms the expiry timer.
    fn after_change(&mut self, ctx: &mut Ctx<'_>) {
        let incarnation = self.incarnation;
        let Some(live) = self.live.as_mut() else { return };
        // Replies leave in submission order, each once everything before it is durable.
        while let Some(r) = live.replies.front() {
            if r.need_seq > live.durable_seq && !self.answer_before_durable {
                break;
            }
            let Some(r) = live.replies.pop_front() else { break };
            if let Some((resource, token)) = r.grant {
                let (at_ms, client) = (ctx.now, r.client);
                ctx.history.grants.push(AnsweredGrant {
                    at_ms,
                    resource,
                    token,
                    client,
                    incarnation,
                });
            }
            ctx.send(Node::Coordinator, Node::Client(r.client), r.msg);
        }
        if !live.fsync_in_flight && !live.pending.is_empty() {
            live.fsync_in_flight = true;
            // Mostly fast disks, sometimes a slow fsync that holds many grants back.
            let latency = if ctx.rng.chance(100) {
                ctx.rng.range(20, 200)
            } else {
                ctx.rng.range(1, 10)
            };
            let upto = live.next_seq;
            ctx.timer(ctx.now + latency, Event::FsyncDone { incarnation, upto });
            if let Some(down_ms) = self.armed_crash.take() {
                // Same instant, queued after this event: lands before the fsync does.
                let crash = Fault::CoordinatorCrash {
                    down_ms,
                    mid_fsync: false,
                };
                ctx.timer(ctx.now, Event::Fault(crash));
            }
        }
        if let Some(deadline) = live.machine.next_deadline() {
            let at = deadline.as_millis().max(ctx.now);
            if live.tick_at.is_none_or(|t| at < t) {
                live.tick_at = Some(at);
                ctx.timer(at, Event::CoordinatorTick { incarnation });
            }
        }
    }
}
