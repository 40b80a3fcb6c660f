//! What each principal holds and has waiting, counted inside the engine (under
//! its lock) so that the per-principal limits are checked against exactly
//! what the machine has; and the owner check of renew and release, made
//! under the same lock. A lease's principal is the part of its recorded
//! holder before the first `/` ([`leasefence_core::access::owner_of`]), so the
//! count is rebuilt from the store's records after a restart.

use std::collections::HashMap;
use std::sync::Arc;

use leasefence_core::access::owner_of;
use leasefence_core::{Coordinator, LeaseId, MonoTime, Mutation, ResourceId, StoredResource, WaiterId};

use crate::ApiError;
use crate::auth::AuthError;

/// Per-principal limits of one acquire, as the edge hands them to the engine.
#[derive(Clone, Debug)]
pub struct PrincipalLimit {
    pub principal: Arc<str>,
    /// Most leases the principal may hold; checked when an acquire arrives.
    pub leases_max: usize,
    /// Most acquires of the principal that may wait at once.
    pub waiters_max: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Quota {
    owners: HashMap<ResourceId, Arc<str>>,
    held: HashMap<Arc<str>, usize>,
    waiting: HashMap<WaiterId, Arc<str>>,
    waiting_by: HashMap<Arc<str>, usize>,
}

impl Quota {
    pub(crate) fn recover(records: &[StoredResource]) -> Quota {
        let mut q = Quota::default();
        for r in records {
            if let Some(lease) = &r.lease {
                q.granted(&r.resource, lease.holder.as_str());
            }
        }
        q
    }

    /// Follows a mutation the machine made.
    pub(crate) fn mutation(&mut self, m: &Mutation) {
        match m {
            Mutation::Grant { resource, holder, .. } => self.granted(resource, holder.as_str()),
            Mutation::Release { resource, .. } => {
                if let Some(owner) = self.owners.remove(resource) {
                    decrement(&mut self.held, &owner);
                }
            }
        }
    }

    fn granted(&mut self, resource: &ResourceId, holder: &str) {
        let owner = owner_of(holder);
        let key = match self.held.get_key_value(owner) {
            Some((k, _)) => k.clone(),
            None => Arc::from(owner),
        };
        *self.held.entry(key.clone()).or_default() += 1;
        if let Some(previous) = self.owners.insert(resource.clone(), key) {
            // A grant only follows the end of the previous lease; keep the count right regardless.
            decrement(&mut self.held, &previous);
        }
    }

    pub(crate) fn held_by(&self, principal: &str) -> usize {
        self.held.get(principal).copied().unwrap_or(0)
    }

    pub(crate) fn waiting_by(&self, principal: &str) -> usize {
        self.waiting_by.get(principal).copied().unwrap_or(0)
    }

    pub(crate) fn queued(&mut self, id: WaiterId, principal: Arc<str>) {
        *self.waiting_by.entry(principal.clone()).or_default() += 1;
        self.waiting.insert(id, principal);
    }

    /// A waiter left the queue (granted, refused, cancelled); no-op if not counted.
    pub(crate) fn unqueued(&mut self, id: WaiterId) {
        if let Some(p) = self.waiting.remove(&id) {
            decrement(&mut self.waiting_by, &p);
        }
    }

    pub(crate) fn clear_waiting(&mut self) {
        self.waiting.clear();
        self.waiting_by.clear();
    }
}

/// The refusal of an acquire over its principal's limits, if it is one.
pub(crate) fn over_limit(
    quota: &Quota,
    machine: &Coordinator,
    now: MonoTime,
    resource: &ResourceId,
    wait: bool,
    l: &PrincipalLimit,
) -> Option<ApiError> {
    let held = quota.held_by(&l.principal);
    if held >= l.leases_max {
        return Some(
            AuthError::limit(
                "leases-per-principal-max",
                l.leases_max,
                format!("principal {:?} holds {held} leases", l.principal),
            )
            .into(),
        );
    }
    let waiting = quota.waiting_by(&l.principal);
    if wait && waiting >= l.waiters_max && machine.busy(now, resource).is_some() {
        let what = format!("principal {:?} has {waiting} acquires waiting", l.principal);
        return Some(AuthError::limit("waiters-per-principal-max", l.waiters_max, what).into());
    }
    None
}

/// With `owner`, the refusal of a renew or release of the lease `lease_id`
/// when it is another principal's. A lease id that holds nothing is left to
/// the machine, which answers lease lost.
pub(crate) fn not_owner(
    machine: &mut Coordinator,
    now: MonoTime,
    resource: &ResourceId,
    lease_id: &LeaseId,
    owner: Option<&str>,
) -> Option<ApiError> {
    let owner = owner?;
    machine.advance(now);
    let holder = machine.holder_of(resource, lease_id)?;
    (owner_of(holder.as_str()) != owner).then(|| {
        AuthError::NotOwner {
            principal: owner.to_string(),
            resource: resource.to_string(),
        }
        .into()
    })
}

fn decrement(counts: &mut HashMap<Arc<str>, usize>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasefence_core::{Holder, LeaseId, ReleaseCause, Token};

    use super::*;

    fn grant(r: &str, holder: &str, t: u64) -> Mutation {
        Mutation::Grant {
            resource: ResourceId::new(r).expect("resource"),
            token: Token::new(t).expect("token"),
            lease_id: LeaseId::from_bytes([1; 16]),
            holder: Holder::new(holder).expect("holder"),
            ttl: Duration::from_secs(1),
            lock_delay: Duration::ZERO,
        }
    }

    fn release(r: &str, t: u64) -> Mutation {
        Mutation::Release {
            resource: ResourceId::new(r).expect("resource"),
            token: Token::new(t).expect("token"),
            cause: ReleaseCause::Expired,
            lock_delay: Duration::ZERO,
        }
    }

    #[test]
    fn leases_count_per_principal_part_of_the_holder() {
        let mut q = Quota::default();
        q.mutation(&grant("a", "w/host:1", 1));
        q.mutation(&grant("b", "w", 1));
        q.mutation(&grant("c", "x/w", 1));
        assert_eq!((q.held_by("w"), q.held_by("x")), (2, 1));
        q.mutation(&release("a", 1));
        q.mutation(&release("a", 1));
        assert_eq!(q.held_by("w"), 1, "a release of an unheld resource changes nothing");
        q.mutation(&release("b", 1));
        assert_eq!(q.held_by("w"), 0);
        assert!(!q.held.contains_key("w"), "no entry kept for nothing");
    }

    #[test]
    fn waiters_count_until_they_leave_the_queue() {
        let mut q = Quota::default();
        q.queued(WaiterId(1), Arc::from("w"));
        q.queued(WaiterId(2), Arc::from("w"));
        assert_eq!(q.waiting_by("w"), 2);
        q.unqueued(WaiterId(1));
        q.unqueued(WaiterId(1));
        q.unqueued(WaiterId(9));
        assert_eq!(q.waiting_by("w"), 1);
        q.clear_waiting();
        assert_eq!(q.waiting_by("w"), 0);
    }
}
