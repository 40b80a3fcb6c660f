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

use std::collections::BTreeMap;

use leasefence_core::{Config, Coordinator, Holder, MonoTime, Mutation, ResourceId, StoredResource, Token, WaiterId};
use leasefence_store::{LeaseStore, MemoryStore};

use crate::config::{Fault, Options};
use crate::event::{Ctx, Event};
use crate::history::{EndedLease, Load, LoadedRecord};
use crate::net::{Message, Node};

pub(crate) mod live;
use live::{Handled, Live};

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
        let Some(holder) = self.holders.get(client).cloned() else {
            return;
        };
        // A message to a crashed coordinator is lost, like one to a dead process.
        let Some(live) = self.live.as_mut() else { return };
        match live.handle(ctx.now, holder, self.ttl, client, msg) {
            Handled::Done => {}
            Handled::Now(reply, answer) => {
                answer.record(ctx, client, self.incarnation);
                ctx.send(Node::Coordinator, Node::Client(client), reply);
            }
            Handled::Queued {
                resource,
                waiter,
                wait_ms,
            } => {
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
        live.wait_expired(ctx.now, resource, waiter);
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
        let before = self.durable.load().unwrap_or_default();
        match self.durable.apply(&batch) {
            Ok(()) => record_ended(ctx, &before, &batch),
            Err(e) => ctx.history.store_refusals.push(e.to_string()),
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
        ctx.history.loads.push(loaded(ctx.now, self.incarnation, &records));
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
            r.answer.record(ctx, r.client, incarnation);
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

/// The history's record of what a (re)start or takeover loaded.
pub(crate) fn loaded(at_ms: u64, incarnation: u64, records: &[StoredResource]) -> Load {
    let records = records
        .iter()
        .map(|r| LoadedRecord {
            resource: r.resource.clone(),
            last_token: r.last_token,
            held: r.lease.is_some(),
        })
        .collect();
    Load {
        at_ms,
        incarnation,
        records,
    }
}

/// Records every lease an applied `batch` ended in a store that held `before`.
pub(crate) fn record_ended(ctx: &mut Ctx<'_>, before: &[StoredResource], batch: &[Mutation]) {
    let mut held: BTreeMap<&ResourceId, Option<Token>> = before
        .iter()
        .map(|r| (&r.resource, r.lease.as_ref().map(|_| r.last_token)))
        .collect();
    for m in batch {
        match m {
            Mutation::Grant { resource, token, .. } => {
                held.insert(resource, Some(*token));
            }
            Mutation::Release { resource, token, .. } => {
                if held.get(resource).copied().flatten() == Some(*token) {
                    held.insert(resource, None);
                    ctx.history.ended.push(EndedLease {
                        at_ms: ctx.now,
                        resource: resource.clone(),
                        token: *token,
                    });
                }
            }
        }
    }
}
