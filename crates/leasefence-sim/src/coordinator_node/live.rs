//! The coordinator's volatile state: everything a crash (or losing the
//! leadership) loses, and the request handling both kinds of coordinator node
//! share.
//!
//! The lease machine, the queue of mutations not yet durable, the replies held
//! back behind them, and the queued acquires waiting for a grant.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use leasefence_core::{
    AcquireOutcome, AcquireRequest, Coordinator, Effect, Holder, LeaseId, MonoTime, Mutation, ResourceId, Token,
    WaiterId,
};

use crate::event::Ctx;
use crate::history::{AnsweredGrant, AnsweredRenewal};
use crate::net::Message;

/// What a reply tells its client, as the history records it once it is sent.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Nothing the checker needs (refusals, releases).
    Plain,
    Grant {
        resource: ResourceId,
        token: Token,
        lease_id: LeaseId,
        valid_until_ms: u64,
    },
    Renewal {
        resource: ResourceId,
        token: Token,
        valid_until_ms: u64,
    },
}

impl Answer {
    /// Records the answer in the history: call it when the reply is sent.
    pub(crate) fn record(self, ctx: &mut Ctx<'_>, client: usize, incarnation: u64) {
        let at_ms = ctx.now;
        match self {
            Answer::Plain => {}
            Answer::Grant {
                resource,
                token,
                lease_id,
                valid_until_ms,
            } => ctx.history.grants.push(AnsweredGrant {
                at_ms,
                resource,
                token,
                client,
                lease_id,
                incarnation,
                valid_until_ms,
            }),
            Answer::Renewal {
                resource,
                token,
                valid_until_ms,
            } => ctx.history.renewals.push(AnsweredRenewal {
                at_ms,
                resource,
                token,
                client,
                incarnation,
                valid_until_ms,
            }),
        }
    }
}

/// A reply held back until the mutations before it are durable.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) need_seq: u64,
    pub(crate) client: usize,
    pub(crate) msg: Message,
    pub(crate) answer: Answer,
}

/// A queued acquire: who asked, and when its lease ends by the client's view.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    client: usize,
    req: u64,
    valid_until_ms: u64,
}

/// What handling a client request left for the node to do.
#[derive(Debug)]
pub(crate) enum Handled {
    /// Replies (if any) are queued behind the mutations before them.
    Done,
    /// Answer this at once: a renewal changes memory only.
    Now(Message, Answer),
    /// The acquire is queued: cancel it when its wait bound runs out.
    Queued {
        resource: ResourceId,
        waiter: WaiterId,
        wait_ms: u64,
    },
}

/// Everything a crash loses.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) machine: Coordinator,
    pub(crate) pending: VecDeque<(u64, Mutation)>,
    pub(crate) next_seq: u64,
    pub(crate) durable_seq: u64,
    pub(crate) fsync_in_flight: bool,
    pub(crate) replies: VecDeque<Reply>,
    waiters: BTreeMap<WaiterId, Waiting>,
    pub(crate) tick_at: Option<u64>,
}

impl Live {
    pub(crate) fn new(machine: Coordinator) -> Live {
        Live {
            machine,
            pending: VecDeque::new(),
            next_seq: 0,
            durable_seq: 0,
            fsync_in_flight: false,
            replies: VecDeque::new(),
            waiters: BTreeMap::new(),
            tick_at: None,
        }
    }

    /// Runs one client request through the machine, as the engine does.
    pub(crate) fn handle(
        &mut self,
        now_ms: u64,
        holder: Holder,
        ttl: Duration,
        client: usize,
        msg: Message,
    ) -> Handled {
        let now = MonoTime::from_millis(now_ms);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        match msg {
            Message::Acquire {
                req,
                resource,
                lease_id,
                wait_ms,
                sent_ms,
            } => {
                let request = AcquireRequest {
                    resource,
                    holder,
                    ttl,
                    lease_id,
                    wait: wait_ms > 0,
                    // The simulation checks fencing, which lock-delays do not change.
                    lock_delay: Duration::ZERO,
                };
                let asker = Waiting {
                    client,
                    req,
                    valid_until_ms: sent_ms.saturating_add(ttl_ms),
                };
                self.acquire(now, request, wait_ms, asker)
            }
            Message::Renew {
                req,
                resource,
                lease_id,
                sent_ms,
            } => {
                let renewed = self.machine.renew(now, &resource, &lease_id);
                self.absorb_effects();
                match renewed {
                    Ok(g) => {
                        let answer = Answer::Renewal {
                            resource,
                            token: g.token,
                            valid_until_ms: sent_ms.saturating_add(ttl_ms),
                        };
                        Handled::Now(Message::Renewed { req }, answer)
                    }
                    Err(_) => Handled::Now(Message::Refused { req }, Answer::Plain),
                }
            }
            Message::Release {
                req,
                resource,
                lease_id,
            } => {
                let released = self.machine.release(now, &resource, &lease_id).is_ok();
                self.absorb_effects();
                let reply = if released {
                    Message::Released { req }
                } else {
                    Message::Refused { req }
                };
                self.hold_reply(client, reply, Answer::Plain);
                Handled::Done
            }
            _ => Handled::Done,
        }
    }

    fn acquire(&mut self, now: MonoTime, request: AcquireRequest, wait_ms: u64, asker: Waiting) -> Handled {
        let resource = request.resource.clone();
        let outcome = self.machine.acquire(now, request);
        self.absorb_effects();
        let Waiting { client, req, .. } = asker;
        match outcome {
            Ok(AcquireOutcome::Granted(g)) => {
                let answer = Answer::Grant {
                    resource: g.resource,
                    token: g.token,
                    lease_id: g.lease_id,
                    valid_until_ms: asker.valid_until_ms,
                };
                self.hold_reply(client, Message::Granted { req, token: g.token }, answer);
                Handled::Done
            }
            Ok(AcquireOutcome::Queued(waiter)) => {
                self.waiters.insert(waiter, asker);
                Handled::Queued {
                    resource,
                    waiter,
                    wait_ms,
                }
            }
            Err(_) => {
                self.hold_reply(client, Message::Refused { req }, Answer::Plain);
                Handled::Done
            }
        }
    }

    /// The wait bound ran out: like the engine, settle expiries, then cancel and answer busy.
    pub(crate) fn wait_expired(&mut self, now_ms: u64, resource: &ResourceId, waiter: WaiterId) {
        self.machine.advance(MonoTime::from_millis(now_ms));
        self.absorb_effects();
        if self.machine.cancel_waiter(resource, waiter)
            && let Some(w) = self.waiters.remove(&waiter)
        {
            self.hold_reply(w.client, Message::Refused { req: w.req }, Answer::Plain);
        }
    }

    pub(crate) fn hold_reply(&mut self, client: usize, msg: Message, answer: Answer) {
        let need_seq = self.next_seq;
        self.replies.push_back(Reply {
            need_seq,
            client,
            msg,
            answer,
        });
    }

    /// Holds a reply that waits for nothing durable, only for the term to answer again.
    pub(crate) fn hold_reply_now(&mut self, client: usize, msg: Message, answer: Answer) {
        self.replies.push_back(Reply {
            need_seq: 0,
            client,
            msg,
            answer,
        });
    }

    /// Queues the machine's effects in order; wakes become replies behind their grant.
    pub(crate) fn absorb_effects(&mut self) {
        for effect in self.machine.take_effects() {
            match effect {
                Effect::Persist(m) => {
                    self.pending.push_back((self.next_seq, m));
                    self.next_seq += 1;
                }
                Effect::WakeWaiter { waiter, grant } => {
                    if let Some(w) = self.waiters.remove(&waiter) {
                        let msg = Message::Granted {
                            req: w.req,
                            token: grant.token,
                        };
                        let answer = Answer::Grant {
                            resource: grant.resource,
                            token: grant.token,
                            lease_id: grant.lease_id,
                            valid_until_ms: w.valid_until_ms,
                        };
                        self.hold_reply(w.client, msg, answer);
                    }
                }
                Effect::RejectWaiter { waiter, .. } => {
                    if let Some(w) = self.waiters.remove(&waiter) {
                        self.hold_reply(w.client, Message::Refused { req: w.req }, Answer::Plain);
                    }
                }
            }
        }
    }

    /// Takes every queued mutation for one group commit: (batch, seq it ends before).
    pub(crate) fn take_batch(&mut self) -> (Vec<Mutation>, u64) {
        let batch = self.pending.drain(..).map(|(_, m)| m).collect();
        (batch, self.next_seq)
    }
}
