//! A leadership term as its peer sees it: the epoch, the self-fencing
//! deadline, the machine once loaded, and the store calls in flight.

use std::collections::BTreeMap;
use std::time::Duration;

use leasefence_core::{MonoTime, Mutation};
use leasefence_store::Epoch;

use crate::coordinator_node::live::Live;
use crate::event::Ctx;
use crate::net::Node;

#[derive(Debug)]
pub(super) struct Term {
    pub(super) epoch: Epoch,
    /// Nothing is answered from this simulated time on, until a renewal
    /// succeeds: its send time plus `leader_deadline(leader_ttl)`.
    pub(super) deadline_ms: u64,
    /// `false` only in the checker's own test: the deadline is ignored.
    self_fencing: bool,
    /// `None` while the records are loading.
    pub(super) live: Option<Live>,
    pub(super) load_call: Option<u64>,
    /// The batch in flight: (call, seq it makes durable up to).
    pub(super) write: Option<(u64, u64)>,
    /// Renewals in flight: call → send time.
    pub(super) renewals: BTreeMap<u64, u64>,
}

impl Term {
    pub(super) fn new(epoch: Epoch, deadline_ms: u64, self_fencing: bool) -> Term {
        Term {
            epoch,
            deadline_ms,
            self_fencing,
            live: None,
            load_call: None,
            write: None,
            renewals: BTreeMap::new(),
        }
    }

    /// The self-fence: may this term answer anyone at `now_ms`?
    pub(super) fn answering(&self, now_ms: u64) -> bool {
        now_ms < self.deadline_ms || !self.self_fencing
    }

    /// A renewal succeeded: the term may answer until its send time + `deadline`.
    pub(super) fn renewed(&mut self, call: u64, deadline: Duration) {
        if let Some(sent) = self.renewals.remove(&call) {
            let until = sent.saturating_add(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX));
            self.deadline_ms = self.deadline_ms.max(until);
        }
    }

    pub(super) fn waits_for(&self, call: u64) -> bool {
        self.load_call == Some(call) || self.write.is_some_and(|(c, _)| c == call)
    }

    /// The batch in flight is durable.
    pub(super) fn written(&mut self) {
        if let (Some((_, upto)), Some(live)) = (self.write.take(), self.live.as_mut()) {
            live.durable_seq = upto;
        }
    }

    pub(super) fn tick(&mut self, now_ms: u64) {
        if let Some(live) = self.live.as_mut() {
            live.tick_at = None;
            live.machine.advance(MonoTime::from_millis(now_ms));
            live.absorb_effects();
        }
    }

    /// Sends every reply whose mutations are durable, in order, if the term may answer.
    pub(super) fn flush(&mut self, ctx: &mut Ctx<'_>, peer: usize) {
        if !self.answering(ctx.now) {
            return;
        }
        let Some(live) = self.live.as_mut() else { return };
        while live.replies.front().is_some_and(|r| r.need_seq <= live.durable_seq) {
            let Some(r) = live.replies.pop_front() else { break };
            r.answer.record(ctx, r.client, self.epoch);
            ctx.send(Node::Peer(peer), Node::Client(r.client), r.msg);
        }
    }

    /// The next group commit, if none is in flight and mutations are queued.
    pub(super) fn next_batch(&mut self) -> Option<(Epoch, Vec<Mutation>, u64)> {
        let live = self.live.as_mut()?;
        if self.write.is_some() || live.pending.is_empty() {
            return None;
        }
        let (batch, upto) = live.take_batch();
        Some((self.epoch, batch, upto))
    }

    /// When the expiry timer must fire, if it is not already set for then or earlier.
    pub(super) fn tick_due(&mut self, now_ms: u64) -> Option<u64> {
        let live = self.live.as_mut()?;
        let at = live.machine.next_deadline()?.as_millis().max(now_ms);
        if live.tick_at.is_some_and(|t| t <= at) {
            return None;
        }
        live.tick_at = Some(at);
        Some(at)
    }
}
