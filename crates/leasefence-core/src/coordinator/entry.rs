//! One resource's state inside the lease machine: its last token, the lease
//! holding it or the lock-delay keeping it closed, and its FIFO waiters.

use std::collections::VecDeque;
use std::time::Duration;

use crate::{BusyReason, Holder, LeaseError, LeaseId, MonoTime, ResourceId, Token, WaiterId};

/// What a grant needs beyond the resource: a request's or a waiter's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Terms {
    pub(super) lease_id: LeaseId,
    pub(super) holder: Holder,
    pub(super) ttl: Duration,
    pub(super) lock_delay: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) token: Token,
    pub(super) terms: Terms,
    pub(super) expires_at: MonoTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Waiter {
    pub(super) id: WaiterId,
    pub(super) terms: Terms,
}

/// A lock-delay in progress: `holder`'s lease of the resource's last token expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Delay {
    pub(super) until: MonoTime,
    pub(super) holder: Holder,
}

/// One resource. Never both `held` and `delay`; waiters only while one of them is set.
///
/// Most resources of a large coordinator are idle (only `last` set), so what
/// only a busy one needs is boxed: an idle entry is 32 bytes, not 150, and a
/// million of them fit in a hash table a fifth of the size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) last: Option<Token>,
    pub(super) held: Option<Box<Held>>,
    pub(super) delay: Option<Box<Delay>>,
    pub(super) waiters: Waiters,
}

/// A resource's FIFO waiters: no allocation while there are none. Boxed on
/// purpose (against clippy's advice for a plain field): the box is one word
/// in every entry, the queue four.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[allow(clippy::box_collection)]
pub(super) struct Waiters(Option<Box<VecDeque<Waiter>>>);

impl Waiters {
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    pub(super) fn push_back(&mut self, w: Waiter) {
        self.0.get_or_insert_with(Box::default).push_back(w);
    }

    pub(super) fn pop_front(&mut self) -> Option<Waiter> {
        let q = self.0.as_mut()?;
        let w = q.pop_front();
        if q.is_empty() {
            self.0 = None;
        }
        w
    }

    pub(super) fn retain(&mut self, keep: impl FnMut(&Waiter) -> bool) {
        if let Some(q) = self.0.as_mut() {
            q.retain(keep);
            if q.is_empty() {
                self.0 = None;
            }
        }
    }
}

impl IntoIterator for Waiters {
    type Item = Waiter;
    type IntoIter = std::collections::vec_deque::IntoIter<Waiter>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.map(|q| *q).unwrap_or_default().into_iter()
    }
}

impl Entry {
    /// Whether an expiry-queue entry for `token` still has work to find here:
    /// the lease of `token` runs, or the lock-delay its expiry started does.
    pub(super) fn waits_on(&self, token: Token) -> bool {
        self.held.as_ref().is_some_and(|h| h.token == token) || (self.delay.is_some() && self.last == Some(token))
    }

    /// The refusal an acquire without waiting gets at `now`, if any.
    pub(super) fn busy(&self, now: MonoTime, resource: &ResourceId) -> Option<LeaseError> {
        if let Some(h) = self.held.as_ref().filter(|h| h.expires_at > now) {
            return Some(LeaseError::Busy {
                resource: resource.clone(),
                holder: h.terms.holder.clone(),
                token: h.token,
                expires_in: h.expires_at.saturating_since(now),
                reason: BusyReason::Held,
            });
        }
        let (d, token) = self.delay.as_ref().filter(|d| d.until > now).zip(self.last)?;
        Some(LeaseError::Busy {
            resource: resource.clone(),
            holder: d.holder.clone(),
            token,
            expires_in: Duration::ZERO,
            reason: BusyReason::LockDelay {
                retry_in: d.until.saturating_since(now),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_entry_stays_small() {
        // The memory of a coordinator with a million idle resources is mostly
        // hash-table buckets of (name, Entry): keep the entry to four words.
        assert!(std::mem::size_of::<Entry>() <= 32, "{}", std::mem::size_of::<Entry>());
    }

    #[test]
    fn waiters_free_their_queue_once_empty() {
        let terms = Terms {
            lease_id: LeaseId::from_bytes([1; 16]),
            holder: Holder::new("h").unwrap(),
            ttl: Duration::from_secs(1),
            lock_delay: Duration::ZERO,
        };
        let mut w = Waiters::default();
        for id in 0..3 {
            w.push_back(Waiter {
                id: WaiterId(id),
                terms: terms.clone(),
            });
        }
        w.retain(|x| x.id != WaiterId(1));
        assert_eq!(w.len(), 2);
        assert_eq!(w.pop_front().map(|x| x.id), Some(WaiterId(0)));
        assert_eq!(w.pop_front().map(|x| x.id), Some(WaiterId(2)));
        assert_eq!((w.len(), w.pop_front()), (0, None));
        assert_eq!(w, Waiters::default(), "an empty queue holds no allocation");
    }
}
