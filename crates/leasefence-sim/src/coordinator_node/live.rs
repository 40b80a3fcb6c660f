//! The coordinator's volatile state: everything a crash loses.
//!
//! The lease machine, the queue of mutations not yet durable, the replies held
//! back behind them, and the queued acquires waiting for a grant.

use std::collections::{BTreeMap, VecDeque};

use leasefence_core::{Coordinator, Effect, Mutation, ResourceId, Token, WaiterId};

use crate::net::Message;

/// A reply held back until the mutations before it are durable.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) need_seq: u64,
    pub(super) client: usize,
    pub(super) msg: Message,
    pub(super) grant: Option<(ResourceId, Token)>,
}

/// Everything a crash loses.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) machine: Coordinator,
    pub(super) pending: VecDeque<(u64, Mutation)>,
    pub(super) next_seq: u64,
    pub(super) durable_seq: u64,
    pub(super) fsync_in_flight: bool,
    pub(super) replies: VecDeque<Reply>,
    pub(super) waiters: BTreeMap<WaiterId, (usize, u64)>,
    pub(super) tick_at: Option<u64>,
}

impl Live {
    pub(super) fn new(machine: Coordinator) -> Live {
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

    pub(super) fn hold_reply(&mut self, client: usize, msg: Message, grant: Option<(ResourceId, Token)>) {
        let need_seq = self.next_seq;
        self.replies.push_back(Reply {
            need_seq,
            client,
            msg,
            grant,
        });
    }

    /// Queues the machine's effects in order; wakes become replies behind their grant.
    pub(super) fn absorb_effects(&mut self) {
        for effect in self.machine.take_effects() {
            match effect {
                Effect::Persist(m) => {
                    self.pending.push_back((self.next_seq, m));
                    self.next_seq += 1;
                }
                Effect::WakeWaiter { waiter, grant } => {
                    if let Some((client, req)) = self.waiters.remove(&waiter) {
                        let msg = Message::Granted {
                            req,
                            token: grant.token,
                        };
                        self.hold_reply(client, msg, Some((grant.resource, grant.token)));
                    }
                }
                Effect::RejectWaiter { waiter, .. } => {
                    if let Some((client, req)) = self.waiters.remove(&waiter) {
                        self.hold_reply(client, Message::Refused { req }, None);
                    }
                }
            }
        }
    }
}
