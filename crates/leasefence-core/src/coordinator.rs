//! The per-resource lease state machine, its FIFO waiters and its expiry queue.
//!
//! ```text
//! Unheld{last} --grant--> Held{token = last+1}
//! Held{n} --renew (same lease id, unexpired)--> Held{n}
//! Held{n} --release | expire--> Unheld{last = n} --grant--> Held{n+1}
//! Held{n, lock_delay d > 0} --expire at t--> Delayed{last = n, until t + d}
//! Delayed{n} --t + d passes--> Unheld{last = n}
//! ```
//!
//! A lock-delay (cf. Chubby, Consul) keeps a resource closed for a while after
//! its lease *expires*, for resources that cannot check tokens: the holder that
//! stopped renewing gets time to notice before anyone else starts. A release is
//! a clean hand-over and never starts one. Waiters stay queued through it.
//!
//! Every mutating call first advances the machine to `now` (expiring what is
//! due, ending lock-delays that are over, handing freed resources to their first
//! waiter), then applies the request. Mutations that must be durable before
//! anyone is answered come out as [`Effect`]s, in the order they must be
//! persisted. A failed call emits nothing and changes nothing but what advancing
//! to `now` changed (expiries that were due anyway).

use std::collections::BTreeMap;
use std::time::Duration;

mod entry;
mod listing;

use entry::{Delay, Entry, Held, Terms, Waiter};
pub use listing::{LIST_LIMIT_MAX, ResourcePage};

use crate::expiry::ExpiryQueue;
use crate::{Config, Holder, LeaseError, LeaseId, MonoTime, Mutation, ReleaseCause, ResourceId, StoredResource, Token};

/// A request for a lease. The caller supplies a fresh random `lease_id`.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub resource: ResourceId,
    pub holder: Holder,
    pub ttl: Duration,
    pub lease_id: LeaseId,
    /// Queue behind the current holder instead of failing with `Busy`.
    pub wait: bool,
    /// If this lease expires (is not released), keep the resource closed this
    /// long afterwards. Zero: no lock-delay. At most the config's maximum.
    pub lock_delay: Duration,
}

/// Names a queued acquire, for cancelling it and for delivering its grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

/// A lease as handed to its holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub resource: ResourceId,
    pub token: Token,
    pub lease_id: LeaseId,
    pub holder: Holder,
    pub ttl: Duration,
    pub expires_at: MonoTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Granted now; answer once the matching `Persist` effect is durable.
    Granted(Grant),
    /// Queued; the grant arrives later as [`Effect::WakeWaiter`].
    Queued(WaiterId),
}

/// What the caller must do, in this order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Persist this; nothing that follows may be answered before it is durable.
    Persist(Mutation),
    /// A queued acquire was granted (its `Persist` precedes this effect).
    WakeWaiter { waiter: WaiterId, grant: Grant },
    /// A queued acquire can never be granted.
    RejectWaiter { waiter: WaiterId, error: LeaseError },
}

/// What anyone may read about a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceStatus {
    pub resource: ResourceId,
    pub last_token: Option<Token>,
    pub held: Option<HeldStatus>,
    pub waiters: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldStatus {
    pub holder: Holder,
    pub token: Token,
    pub expires_in: Duration,
}

/// The lease machine for every resource of one coordinator.
#[derive(Clone, Debug)]
pub struct Coordinator {
    config: Config,
    /// In name order, so that a listing by prefix reads only what it returns.
    resources: BTreeMap<ResourceId, Entry>,
    /// At least one entry per held lease: (deadline, token, resource). A renewal
    /// moves the real deadline later; the stale entry is re-queued when it comes
    /// up. Entries of ended leases are dropped in bulk (see [`ExpiryQueue`]).
    deadlines: ExpiryQueue,
    held: usize,
    /// Resources in a lock-delay.
    delays: usize,
    next_waiter: u64,
    effects: Vec<Effect>,
}

/// Two coordinators are equal when their lease state is (the expiry queue is an index).
impl PartialEq for Coordinator {
    fn eq(&self, other: &Coordinator) -> bool {
        self.resources == other.resources && self.next_waiter == other.next_waiter
    }
}

impl Coordinator {
    pub fn new(config: Config) -> Coordinator {
        Coordinator {
            config,
            resources: BTreeMap::new(),
            deadlines: ExpiryQueue::default(),
            held: 0,
            delays: 0,
            next_waiter: 1,
            effects: Vec::new(),
        }
    }

    /// Rebuilds the machine from a store after a restart at `now`. Every lease
    /// recorded as held counts as held for its full TTL from `now`, and every
    /// recorded lock-delay lasts its full length from `now`, so a restart never
    /// lets a second holder in early.
    pub fn recover(config: Config, now: MonoTime, records: impl IntoIterator<Item = StoredResource>) -> Coordinator {
        let mut c = Coordinator::new(config);
        let records = records.into_iter();
        let mut entries = Vec::with_capacity(records.size_hint().0);
        for r in records {
            let held = r.lease.map(|l| Held {
                token: r.last_token,
                terms: Terms {
                    lease_id: l.lease_id,
                    holder: l.holder,
                    ttl: l.ttl,
                    lock_delay: l.lock_delay,
                },
                expires_at: now.saturating_add(l.ttl),
            });
            // A lease granted after the delay ended it; only an unheld resource is delayed.
            let delay = match (&held, r.lock_delay) {
                (None, Some(d)) if !d.delay.is_zero() => Some(Delay {
                    until: now.saturating_add(d.delay),
                    holder: d.holder,
                }),
                _ => None,
            };
            if let Some(h) = &held {
                c.deadlines.push((h.expires_at, h.token, r.resource.clone()));
                c.held += 1;
            }
            if let Some(d) = &delay {
                c.deadlines.push((d.until, r.last_token, r.resource.clone()));
                c.delays += 1;
            }
            let entry = Entry {
                last: Some(r.last_token),
                held: held.map(Box::new),
                delay: delay.map(Box::new),
                waiters: Default::default(),
            };
            entries.push((r.resource, entry));
        }
        // Built at once, not inserted one by one: the store hands its records
        // over (almost) in key order, and a map built from sorted input takes
        // linear time and fills its nodes, where sorted inserts compare each
        // name along the right edge and leave the nodes half full (at a
        // million idle resources, 163 B of RSS each instead of 212 B: see
        // BENCHMARKS.md). Of equal names the last wins, as with `insert`.
        c.resources = entries.into_iter().collect();
        c
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Hands over the effects produced so far, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The earliest time at which [`Coordinator::advance`] may have work.
    pub fn next_deadline(&self) -> Option<MonoTime> {
        self.deadlines.next()
    }

    /// Leases currently held (some may be past their deadline until `advance`).
    pub fn held_count(&self) -> usize {
        self.held
    }

    /// Resources in a lock-delay (some may be past its end until `advance`).
    pub fn lock_delay_count(&self) -> usize {
        self.delays
    }

    /// Entries in the expiry queue: one per held lease and per lock-delay, plus
    /// ended leases' entries not yet dropped (at most `2 × (held + lock-delays)
    /// + 64` after any grant or end).
    pub fn deadline_count(&self) -> usize {
        self.deadlines.len()
    }

    pub fn resource_count(&self) -> usize {
        self.resources.len()
    }

    /// Expires every lease due at `now` and ends every lock-delay that is
    /// over, handing each freed resource to its first waiter.
    pub fn advance(&mut self, now: MonoTime) {
        while let Some((_, token, resource)) = self.deadlines.pop_due(now) {
            let Some(entry) = self.resources.get(&resource) else {
                continue;
            };
            if let Some(h) = entry.held.as_ref().filter(|h| h.token == token) {
                if h.expires_at <= now {
                    self.end_lease(now, &resource, ReleaseCause::Expired);
                } else {
                    // Renewed since this entry was queued.
                    self.deadlines.push((h.expires_at, token, resource));
                }
            } else if let Some(d) = entry.delay.as_ref().filter(|_| entry.last == Some(token)) {
                if d.until <= now {
                    self.end_delay(now, &resource);
                } else {
                    self.deadlines.push((d.until, token, resource));
                }
            }
        }
    }

    /// The refusal an acquire without waiting would get at `now` (held, or in
    /// a lock-delay); `None` if it would be granted.
    pub fn busy(&self, now: MonoTime, resource: &ResourceId) -> Option<LeaseError> {
        self.resources.get(resource).and_then(|e| e.busy(now, resource))
    }

    pub fn acquire(&mut self, now: MonoTime, req: AcquireRequest) -> Result<AcquireOutcome, LeaseError> {
        self.advance(now);
        self.config.check_ttl(req.ttl)?;
        self.config.check_lock_delay(req.lock_delay)?;
        let terms = Terms {
            lease_id: req.lease_id,
            holder: req.holder,
            ttl: req.ttl,
            lock_delay: req.lock_delay,
        };
        let entry = self.resources.get(&req.resource);
        if let Some(busy) = entry.and_then(|e| e.busy(now, &req.resource)) {
            if !req.wait {
                return Err(busy);
            }
            let queued = entry.map_or(0, |e| e.waiters.len());
            if queued >= self.config.waiters_max() {
                return Err(LeaseError::TooManyWaiters {
                    resource: req.resource,
                    max: self.config.waiters_max(),
                });
            }
            let id = WaiterId(self.next_waiter);
            self.next_waiter += 1;
            let waiter = Waiter { id, terms };
            self.resources
                .entry(req.resource)
                .or_default()
                .waiters
                .push_back(waiter);
            return Ok(AcquireOutcome::Queued(id));
        }
        let grant = self.grant(now, req.resource, terms)?;
        Ok(AcquireOutcome::Granted(grant))
    }

    /// Extends the lease to `now + ttl`, keeping its token, if `lease_id` still holds it.
    pub fn renew(&mut self, now: MonoTime, resource: &ResourceId, lease_id: &LeaseId) -> Result<Grant, LeaseError> {
        self.advance(now);
        let lost = || LeaseError::LeaseLost {
            resource: resource.clone(),
        };
        let held = self
            .resources
            .get_mut(resource)
            .and_then(|e| e.held.as_mut())
            .ok_or_else(lost)?;
        if held.terms.lease_id != *lease_id {
            return Err(lost());
        }
        held.expires_at = now.saturating_add(held.terms.ttl);
        Ok(Grant {
            resource: resource.clone(),
            token: held.token,
            lease_id: held.terms.lease_id,
            holder: held.terms.holder.clone(),
            ttl: held.terms.ttl,
            expires_at: held.expires_at,
        })
    }

    /// Ends the lease if `lease_id` still holds it; a stale release never touches a newer holder.
    pub fn release(&mut self, now: MonoTime, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, LeaseError> {
        self.advance(now);
        let held = self.resources.get(resource).and_then(|e| e.held.as_ref());
        match held {
            Some(h) if h.terms.lease_id == *lease_id => {
                let token = h.token;
                self.end_lease(now, resource, ReleaseCause::Released);
                Ok(token)
            }
            _ => Err(LeaseError::LeaseLost {
                resource: resource.clone(),
            }),
        }
    }

    /// Ends the lease on `resource` whoever holds it (an administrator's
    /// force-release), exactly as its holder's release would: durably, with
    /// no lock-delay, handing the resource to the first waiter. The ended
    /// token, or `None` when nothing was held.
    pub fn force_release(&mut self, now: MonoTime, resource: &ResourceId) -> Option<Token> {
        self.advance(now);
        let token = self.resources.get(resource)?.held.as_ref()?.token;
        self.end_lease(now, resource, ReleaseCause::Released);
        Some(token)
    }

    /// The holder of `resource`'s lease if `lease_id` is that lease (read
    /// as of the last `advance`).
    pub fn holder_of(&self, resource: &ResourceId, lease_id: &LeaseId) -> Option<&Holder> {
        let held = self.resources.get(resource)?.held.as_ref()?;
        (held.terms.lease_id == *lease_id).then_some(&held.terms.holder)
    }

    /// Removes a queued acquire. `false` if it is no longer queued (granted or rejected).
    pub fn cancel_waiter(&mut self, resource: &ResourceId, waiter: WaiterId) -> bool {
        let Some(entry) = self.resources.get_mut(resource) else {
            return false;
        };
        let before = entry.waiters.len();
        entry.waiters.retain(|w| w.id != waiter);
        entry.waiters.len() != before
    }

    /// The resource as seen at `now` (a lease past its deadline reads as not held).
    pub fn status(&self, now: MonoTime, resource: &ResourceId) -> ResourceStatus {
        let entry = self.resources.get(resource);
        let held = entry
            .and_then(|e| e.held.as_ref())
            .filter(|h| h.expires_at > now)
            .map(|h| HeldStatus {
                holder: h.terms.holder.clone(),
                token: h.token,
                expires_in: h.expires_at.saturating_since(now),
            });
        ResourceStatus {
            resource: resource.clone(),
            last_token: entry.and_then(|e| e.last),
            held,
            waiters: entry.map_or(0, |e| e.waiters.len()),
        }
    }

    fn grant(&mut self, now: MonoTime, resource: ResourceId, terms: Terms) -> Result<Grant, LeaseError> {
        let entry = self.resources.entry(resource.clone()).or_default();
        assert!(entry.held.is_none(), "a resource is granted only while unheld");
        assert!(entry.delay.is_none(), "a resource is granted only after its lock-delay");
        let last = entry.last;
        let token = Token::after(last).ok_or_else(|| LeaseError::TokensExhausted {
            resource: resource.clone(),
        })?;
        assert!(
            Some(token) > last,
            "token invariant: a grant must exceed the last token"
        );
        let expires_at = now.saturating_add(terms.ttl);
        entry.last = Some(token);
        entry.held = Some(Box::new(Held {
            token,
            terms: terms.clone(),
            expires_at,
        }));
        self.held += 1;
        self.deadlines.push((expires_at, token, resource.clone()));
        self.compact_deadlines();
        self.effects.push(Effect::Persist(Mutation::Grant {
            resource: resource.clone(),
            token,
            lease_id: terms.lease_id,
            holder: terms.holder.clone(),
            ttl: terms.ttl,
            lock_delay: terms.lock_delay,
        }));
        Ok(Grant {
            resource,
            token,
            lease_id: terms.lease_id,
            holder: terms.holder,
            ttl: terms.ttl,
            expires_at,
        })
    }

    /// Drops the expiry-queue entries of ended leases once they are too many.
    fn compact_deadlines(&mut self) {
        let resources = &self.resources;
        let live = self.held + self.delays;
        self.deadlines.compact(live, |(_, token, resource)| {
            resources.get(resource).is_some_and(|e| e.waits_on(*token))
        });
    }

    /// Unholds `resource`. An expiry of a lease with a lock-delay closes it
    /// until the delay has passed (counted from the lease's deadline); otherwise
    /// it goes to the first waiter, if any.
    fn end_lease(&mut self, now: MonoTime, resource: &ResourceId, cause: ReleaseCause) {
        let Some(entry) = self.resources.get_mut(resource) else {
            return;
        };
        let Some(held) = entry.held.take() else { return };
        self.held -= 1;
        let lock_delay = match cause {
            ReleaseCause::Expired => held.terms.lock_delay,
            ReleaseCause::Released => Duration::ZERO,
        };
        self.effects.push(Effect::Persist(Mutation::Release {
            resource: resource.clone(),
            token: held.token,
            cause,
            lock_delay,
        }));
        if !lock_delay.is_zero() {
            let until = held.expires_at.saturating_add(lock_delay);
            entry.delay = Some(Box::new(Delay {
                until,
                holder: held.terms.holder,
            }));
            self.delays += 1;
            // Due now already if `advance` came late: then it ends in this same advance.
            self.deadlines.push((until, held.token, resource.clone()));
        }
        self.compact_deadlines();
        if lock_delay.is_zero() {
            self.grant_first_waiter(now, resource);
        }
    }

    /// Ends the lock-delay of `resource` and hands it to the first waiter, if any.
    fn end_delay(&mut self, now: MonoTime, resource: &ResourceId) {
        let Some(entry) = self.resources.get_mut(resource) else {
            return;
        };
        if entry.delay.take().is_some() {
            self.delays -= 1;
            self.grant_first_waiter(now, resource);
        }
    }

    fn grant_first_waiter(&mut self, now: MonoTime, resource: &ResourceId) {
        let Some(w) = self.resources.get_mut(resource).and_then(|e| e.waiters.pop_front()) else {
            return;
        };
        match self.grant(now, resource.clone(), w.terms) {
            Ok(grant) => self.effects.push(Effect::WakeWaiter { waiter: w.id, grant }),
            Err(error) => {
                // Only token exhaustion fails here; no waiter can ever be granted.
                let rest = self.resources.get_mut(resource).map(|e| std::mem::take(&mut e.waiters));
                for waiter in std::iter::once(w.id).chain(rest.into_iter().flatten().map(|w| w.id)) {
                    self.effects.push(Effect::RejectWaiter {
                        waiter,
                        error: error.clone(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;

#[cfg(test)]
mod lock_delay_tests;
