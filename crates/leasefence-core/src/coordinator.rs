//! The per-resource lease state machine, its FIFO waiters and its expiry queue.
//!
//! ```text
//! Unheld{last} --grant--> Held{token = last+1}
//! Held{n} --renew (same lease id, unexpired)--> Held{n}
//! Held{n} --release | expire--> Unheld{last = n} --grant--> Held{n+1}
//! ```
//!
//! Every mutating call first advances the machine to `now` (expiring what is
//! due, handing freed resources to their first waiter), then applies the request.
//! Mutations that must be durable before anyone is answered come out as
//! [`Effect`]s, in the order they must be persisted. A failed call changes nothing.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::expiry::ExpiryQueue;
use crate::{Holder, Invalid, LeaseError, LeaseId, MonoTime, ResourceId, Token};

/// Limits of the lease machine. Fields with invariants are private.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    ttl_min: Duration,
    ttl_max: Duration,
    waiters_max: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ttl_min: Duration::from_millis(100),
            ttl_max: Duration::from_secs(3600),
            waiters_max: 1024,
        }
    }
}

impl Config {
    /// `ttl_min` must be at least 1 ms and no more than `ttl_max`.
    pub fn new(ttl_min: Duration, ttl_max: Duration, waiters_max: usize) -> Result<Config, Invalid> {
        if ttl_min < Duration::from_millis(1) {
            return Err(Invalid::new("ttl_min", "must be at least 1ms"));
        }
        if ttl_min > ttl_max {
            return Err(Invalid::new(
                "ttl_max",
                format!(
                    "must be at least ttl_min ({} ms), got {} ms",
                    ttl_min.as_millis(),
                    ttl_max.as_millis()
                ),
            ));
        }
        Ok(Config {
            ttl_min,
            ttl_max,
            waiters_max,
        })
    }

    pub fn ttl_min(&self) -> Duration {
        self.ttl_min
    }

    pub fn ttl_max(&self) -> Duration {
        self.ttl_max
    }

    pub fn waiters_max(&self) -> usize {
        self.waiters_max
    }

    /// Checks a requested TTL against the bounds.
    pub fn check_ttl(&self, ttl: Duration) -> Result<Duration, Invalid> {
        if ttl < self.ttl_min || ttl > self.ttl_max {
            return Err(Invalid::new(
                "ttl_ms",
                format!(
                    "must be in {}..={} ms, got {} ms",
                    self.ttl_min.as_millis(),
                    self.ttl_max.as_millis(),
                    ttl.as_millis()
                ),
            ));
        }
        Ok(ttl)
    }
}

/// A request for a lease. The caller supplies a fresh random `lease_id`.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub resource: ResourceId,
    pub holder: Holder,
    pub ttl: Duration,
    pub lease_id: LeaseId,
    /// Queue behind the current holder instead of failing with `Busy`.
    pub wait: bool,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseCause {
    Released,
    Expired,
}

/// A change the store must make durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    Grant {
        resource: ResourceId,
        token: Token,
        lease_id: LeaseId,
        holder: Holder,
        ttl: Duration,
    },
    Release {
        resource: ResourceId,
        token: Token,
        cause: ReleaseCause,
    },
}

impl Mutation {
    pub fn resource(&self) -> &ResourceId {
        match self {
            Mutation::Grant { resource, .. } | Mutation::Release { resource, .. } => resource,
        }
    }
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

/// A resource's state as recorded by a store, for recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResource {
    pub resource: ResourceId,
    pub last_token: Token,
    /// The lease recorded as held (its token is `last_token`).
    pub lease: Option<StoredLease>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLease {
    pub lease_id: LeaseId,
    pub holder: Holder,
    pub ttl: Duration,
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

#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    token: Token,
    lease_id: LeaseId,
    holder: Holder,
    ttl: Duration,
    expires_at: MonoTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiter {
    id: WaiterId,
    holder: Holder,
    ttl: Duration,
    lease_id: LeaseId,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Entry {
    last: Option<Token>,
    held: Option<Held>,
    waiters: VecDeque<Waiter>,
}

impl Entry {
    /// Whether an expiry-queue entry for `token` still has work to find here.
    fn waits_on(&self, token: Token) -> bool {
        self.held.as_ref().is_some_and(|h| h.token == token)
    }
}

/// The lease machine for every resource of one coordinator.
#[derive(Clone, Debug)]
pub struct Coordinator {
    config: Config,
    resources: HashMap<ResourceId, Entry>,
    /// At least one entry per held lease: (deadline, token, resource). A renewal
    /// moves the real deadline later; the stale entry is re-queued when it comes
    /// up. Entries of ended leases are dropped in bulk (see [`ExpiryQueue`]).
    deadlines: ExpiryQueue,
    held: usize,
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
            resources: HashMap::new(),
            deadlines: ExpiryQueue::default(),
            held: 0,
            next_waiter: 1,
            effects: Vec::new(),
        }
    }

    /// Rebuilds the machine from a store after a restart at `now`. Every lease
    /// recorded as held counts as held for its full TTL from `now`, so a restart
    /// never lets a second holder in early.
    pub fn recover(config: Config, now: MonoTime, records: impl IntoIterator<Item = StoredResource>) -> Coordinator {
        let mut c = Coordinator::new(config);
        for r in records {
            let held = r.lease.map(|l| Held {
                token: r.last_token,
                lease_id: l.lease_id,
                holder: l.holder,
                ttl: l.ttl,
                expires_at: now.saturating_add(l.ttl),
            });
            if let Some(h) = &held {
                c.deadlines.push((h.expires_at, h.token, r.resource.clone()));
                c.held += 1;
            }
            let entry = Entry {
                last: Some(r.last_token),
                held,
                waiters: VecDeque::new(),
            };
            c.resources.insert(r.resource, entry);
        }
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

    /// Entries in the expiry queue: one per held lease plus stale ones not yet
    /// dropped (at most `2 × held + 64` after any grant).
    pub fn deadline_count(&self) -> usize {
        self.deadlines.len()
    }

    pub fn resource_count(&self) -> usize {
        self.resources.len()
    }

    /// Expires every lease due at `now`, handing each freed resource to its first waiter.
    pub fn advance(&mut self, now: MonoTime) {
        while let Some((_, token, resource)) = self.deadlines.pop_due(now) {
            let Some(entry) = self.resources.get(&resource) else {
                continue;
            };
            match &entry.held {
                Some(h) if h.token == token && h.expires_at <= now => {
                    self.end_lease(now, &resource, ReleaseCause::Expired);
                }
                Some(h) if h.token == token => {
                    self.deadlines.push((h.expires_at, token, resource));
                }
                _ => {}
            }
        }
    }

    pub fn acquire(&mut self, now: MonoTime, req: AcquireRequest) -> Result<AcquireOutcome, LeaseError> {
        self.advance(now);
        self.config.check_ttl(req.ttl)?;
        let entry = self.resources.get(&req.resource);
        if let Some(h) = entry.and_then(|e| e.held.as_ref()) {
            if !req.wait {
                return Err(LeaseError::Busy {
                    resource: req.resource,
                    holder: h.holder.clone(),
                    token: h.token,
                    expires_in: h.expires_at.saturating_since(now),
                });
            }
            let queued = entry.map_or(0, |e| e.waiters.len());
            if queued >= self.config.waiters_max {
                return Err(LeaseError::TooManyWaiters {
                    resource: req.resource,
                    max: self.config.waiters_max,
                });
            }
            let id = WaiterId(self.next_waiter);
            self.next_waiter += 1;
            let waiter = Waiter {
                id,
                holder: req.holder,
                ttl: req.ttl,
                lease_id: req.lease_id,
            };
            self.resources
                .entry(req.resource)
                .or_default()
                .waiters
                .push_back(waiter);
            return Ok(AcquireOutcome::Queued(id));
        }
        let last = entry.and_then(|e| e.last);
        let grant = self.grant(now, req.resource, last, req.lease_id, req.holder, req.ttl)?;
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
        if held.lease_id != *lease_id {
            return Err(lost());
        }
        held.expires_at = now.saturating_add(held.ttl);
        Ok(Grant {
            resource: resource.clone(),
            token: held.token,
            lease_id: held.lease_id,
            holder: held.holder.clone(),
            ttl: held.ttl,
            expires_at: held.expires_at,
        })
    }

    /// Ends the lease if `lease_id` still holds it; a stale release never touches a newer holder.
    pub fn release(&mut self, now: MonoTime, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, LeaseError> {
        self.advance(now);
        let held = self.resources.get(resource).and_then(|e| e.held.as_ref());
        match held {
            Some(h) if h.lease_id == *lease_id => {
                let token = h.token;
                self.end_lease(now, resource, ReleaseCause::Released);
                Ok(token)
            }
            _ => Err(LeaseError::LeaseLost {
                resource: resource.clone(),
            }),
        }
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
                holder: h.holder.clone(),
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

    fn grant(
        &mut self,
        now: MonoTime,
        resource: ResourceId,
        last: Option<Token>,
        lease_id: LeaseId,
        holder: Holder,
        ttl: Duration,
    ) -> Result<Grant, LeaseError> {
        let token = Token::after(last).ok_or_else(|| LeaseError::TokensExhausted {
            resource: resource.clone(),
        })?;
        assert!(
            Some(token) > last,
            "token invariant: a grant must exceed the last token"
        );
        let expires_at = now.saturating_add(ttl);
        let held = Held {
            token,
            lease_id,
            holder: holder.clone(),
            ttl,
            expires_at,
        };
        let entry = self.resources.entry(resource.clone()).or_default();
        assert!(entry.held.is_none(), "a resource is granted only while unheld");
        entry.last = Some(token);
        entry.held = Some(held);
        self.held += 1;
        self.deadlines.push((expires_at, token, resource.clone()));
        self.compact_deadlines();
        self.effects.push(Effect::Persist(Mutation::Grant {
            resource: resource.clone(),
            token,
            lease_id,
            holder: holder.clone(),
            ttl,
        }));
        Ok(Grant {
            resource,
            token,
            lease_id,
            holder,
            ttl,
            expires_at,
        })
    }

    /// Drops the expiry-queue entries of ended leases once they are too many.
    fn compact_deadlines(&mut self) {
        let resources = &self.resources;
        self.deadlines.compact(self.held, |(_, token, resource)| {
            resources.get(resource).is_some_and(|e| e.waits_on(*token))
        });
    }

    /// Unholds `resource` and hands it to the first waiter, if any.
    fn end_lease(&mut self, now: MonoTime, resource: &ResourceId, cause: ReleaseCause) {
        let Some(entry) = self.resources.get_mut(resource) else {
            return;
        };
        let Some(held) = entry.held.take() else { return };
        self.held -= 1;
        self.effects.push(Effect::Persist(Mutation::Release {
            resource: resource.clone(),
            token: held.token,
            cause,
        }));
        self.compact_deadlines();
        let Some(entry) = self.resources.get_mut(resource) else {
            return;
        };
        let Some(w) = entry.waiters.pop_front() else { return };
        let last = entry.last;
        match self.grant(now, resource.clone(), last, w.lease_id, w.holder, w.ttl) {
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
