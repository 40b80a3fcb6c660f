//! The lease machine's expiry queue: a min-heap of `(deadline, token, resource)`
//! that says when [`crate::Coordinator::advance`] next has work, without a scan
//! of every resource.
//!
//! The heap is lazy: a renewal does not move its entry (the entry is re-queued
//! at the renewed deadline when it comes up), and a release does not remove one
//! (a heap cannot). So that ended leases do not pile up, the machine calls
//! [`ExpiryQueue::compact`] after every grant and every end: once the entries
//! outnumber `2 × live + SLACK`, those that no longer name anything live are
//! dropped. A rebuild costs the queue's length and drops at least half of it,
//! each dropped entry was pushed once, so rebuilds cost amortised O(1) per push.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::{MonoTime, ResourceId, Token};

/// Entries tolerated above twice the live count before a rebuild: keeps tiny
/// queues from rebuilding on every push.
pub(crate) const SLACK: usize = 64;

/// One entry: at `.0`, look at the lease (or lock-delay) of token `.1` of `.2`.
pub(crate) type Deadline = (MonoTime, Token, ResourceId);

#[derive(Clone, Debug, Default)]
pub(crate) struct ExpiryQueue {
    heap: BinaryHeap<Reverse<Deadline>>,
}

impl ExpiryQueue {
    pub(crate) fn push(&mut self, entry: Deadline) {
        self.heap.push(Reverse(entry));
    }

    /// If the queue holds more than `2 × live + SLACK` entries (`live`: how
    /// many are still needed), keeps only those `is_live` accepts.
    pub(crate) fn compact(&mut self, live: usize, mut is_live: impl FnMut(&Deadline) -> bool) {
        if self.heap.len() > live.saturating_mul(2).saturating_add(SLACK) {
            self.heap.retain(|Reverse(e)| is_live(e));
        }
    }

    /// The earliest entry, if it is due at `now`, taken off the queue.
    pub(crate) fn pop_due(&mut self, now: MonoTime) -> Option<Deadline> {
        if self.heap.peek()?.0.0 > now {
            return None;
        }
        self.heap.pop().map(|Reverse(e)| e)
    }

    pub(crate) fn next(&self) -> Option<MonoTime> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
