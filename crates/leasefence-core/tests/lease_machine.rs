//! Property tests of the lease machine against random sequences of acquire,
//! renew, release, cancel and time advances over several resources.
//!
//! A model built only from what the machine answered checks: per-resource
//! tokens increase by exactly one per grant; a grant never overlaps an
//! unexpired earlier lease; no grant falls inside a lock-delay window (from an
//! expired lease's deadline for its delay), and a release never starts one; a
//! busy refusal names the right reason and time; renew after expiry is
//! `LeaseLost` and renew before it succeeds; once time is settled (every call
//! first expires what is due at `now`), a failed call emits nothing and
//! changes nothing.

use std::collections::HashMap;
use std::time::Duration;

use leasefence_core::{
    AcquireOutcome, AcquireRequest, BusyReason, Config, Coordinator, Effect, Grant, Holder, LeaseError, LeaseId,
    MonoTime, Mutation, ReleaseCause, ResourceId, Token, WaiterId,
};
use proptest::prelude::*;

const RESOURCES: [&str; 3] = ["r0", "r1", "r2"];
const LOCK_DELAY_MAX: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        res: usize,
        ttl_ms: u64,
        wait: bool,
        lock_delay_ms: u64,
    },
    Renew {
        lease: usize,
    },
    Release {
        lease: usize,
    },
    Cancel {
        waiter: usize,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..3usize,
            prop_oneof![Just(50u64), Just(100), Just(150), Just(250)],
            any::<bool>(),
            // LOCK_DELAY_MAX is 100 ms: 120 is refused as invalid.
            prop_oneof![Just(0u64), Just(0), Just(1), Just(30), Just(100), Just(120)],
        )
            .prop_map(|(res, ttl_ms, wait, lock_delay_ms)| Op::Acquire {
                res,
                ttl_ms,
                wait,
                lock_delay_ms
            }),
        (0..16usize).prop_map(|lease| Op::Renew { lease }),
        (0..16usize).prop_map(|lease| Op::Release { lease }),
        (0..8usize).prop_map(|waiter| Op::Cancel { waiter }),
        (0..200u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// What the model knows of one lease, learned from the machine's answers.
#[derive(Clone, Debug)]
struct Known {
    resource: ResourceId,
    lease_id: LeaseId,
    token: Token,
    expires_at: MonoTime,
    ttl: Duration,
    lock_delay: Duration,
    ended: bool,
}

#[derive(Default)]
struct Model {
    leases: Vec<Known>,
    last_token: HashMap<ResourceId, u64>,
    current: HashMap<ResourceId, usize>,
    waiters: Vec<(ResourceId, WaiterId)>,
    /// Per resource: no grant before this (the end of the last lock-delay).
    closed_until: HashMap<ResourceId, MonoTime>,
    /// The lock-delay each queued acquire asked for, by its lease id.
    queued_delays: HashMap<LeaseId, Duration>,
    next_id: u8,
}

impl Model {
    fn fresh_id(&mut self) -> LeaseId {
        self.next_id = self.next_id.wrapping_add(1);
        LeaseId::from_bytes([self.next_id; 16])
    }

    /// Checks and records a grant observed at `now`.
    fn granted(&mut self, now: MonoTime, g: &Grant) -> Result<(), TestCaseError> {
        let last = self.last_token.get(&g.resource).copied().unwrap_or(0);
        prop_assert_eq!(g.token.get(), last + 1, "tokens must go up by exactly one per grant");
        if let Some(until) = self.closed_until.get(&g.resource) {
            prop_assert!(
                now >= *until,
                "granted {} at {:?}, inside its lock-delay (until {:?})",
                g.resource,
                now,
                until
            );
        }
        if let Some(&i) = self.current.get(&g.resource) {
            let prev = &self.leases[i];
            prop_assert!(
                prev.ended || prev.expires_at <= now,
                "two unexpired holders of {}",
                g.resource
            );
            self.leases[i].ended = true;
        }
        self.last_token.insert(g.resource.clone(), g.token.get());
        self.current.insert(g.resource.clone(), self.leases.len());
        self.leases.push(Known {
            resource: g.resource.clone(),
            lease_id: g.lease_id,
            token: g.token,
            expires_at: g.expires_at,
            ttl: g.ttl,
            lock_delay: Duration::ZERO,
            ended: false,
        });
        Ok(())
    }

    /// Checks a busy refusal at `now` against what the model knows.
    fn busy(&self, now: MonoTime, resource: &ResourceId, e: &LeaseError) -> Result<(), TestCaseError> {
        let LeaseError::Busy { reason, token, .. } = e else {
            return Err(TestCaseError::fail(format!("not busy: {e:?}")));
        };
        let live = self
            .current
            .get(resource)
            .map(|&i| &self.leases[i])
            .filter(|k| !k.ended && k.expires_at > now);
        match (reason, live) {
            (BusyReason::Held, Some(k)) => prop_assert_eq!(*token, k.token),
            (BusyReason::LockDelay { retry_in }, None) => {
                let until = self.closed_until.get(resource).copied().unwrap_or(MonoTime::ZERO);
                prop_assert!(until > now, "lock-delay busy outside a window");
                prop_assert_eq!(*retry_in, until.saturating_since(now));
            }
            (reason, live) => prop_assert!(false, "busy {reason:?} while the live lease is {live:?}"),
        }
        Ok(())
    }

    fn observe(&mut self, now: MonoTime, effects: Vec<Effect>) -> Result<(), TestCaseError> {
        for e in effects {
            match e {
                Effect::WakeWaiter { waiter, grant } => {
                    self.waiters.retain(|(_, w)| *w != waiter);
                    self.granted(now, &grant)?;
                    let delay = self.queued_delays.remove(&grant.lease_id).unwrap_or_default();
                    if let Some(k) = self.leases.last_mut() {
                        k.lock_delay = delay;
                    }
                }
                Effect::Persist(Mutation::Release {
                    resource,
                    token,
                    cause,
                    lock_delay,
                }) => {
                    if let Some(&i) = self.current.get(&resource) {
                        let k = &self.leases[i];
                        prop_assert_eq!(k.token, token, "released token is the current one");
                        match cause {
                            ReleaseCause::Released => {
                                prop_assert_eq!(lock_delay, Duration::ZERO, "a release never starts a lock-delay")
                            }
                            ReleaseCause::Expired => prop_assert_eq!(lock_delay, k.lock_delay),
                        }
                        if !lock_delay.is_zero() {
                            self.closed_until
                                .insert(resource.clone(), k.expires_at.saturating_add(lock_delay));
                        }
                        self.leases[i].ended = true;
                    }
                }
                Effect::Persist(Mutation::Grant { .. }) => {}
                Effect::RejectWaiter { .. } => prop_assert!(false, "tokens cannot run out here"),
            }
        }
        Ok(())
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let config = Config::new(Duration::from_millis(50), Duration::from_millis(250), 3)
        .expect("valid")
        .with_lock_delay_max(LOCK_DELAY_MAX);
    let mut c = Coordinator::new(config);
    let mut m = Model::default();
    let mut now = MonoTime::ZERO;
    for op in ops {
        // Time passing is not part of a call: settle it first, then snapshot.
        c.advance(now);
        let effects = c.take_effects();
        m.observe(now, effects)?;
        let before = c.clone();
        let failed = match op {
            Op::Advance { ms } => {
                now = now.saturating_add(Duration::from_millis(ms));
                false
            }
            Op::Acquire {
                res,
                ttl_ms,
                wait,
                lock_delay_ms,
            } => {
                let resource = ResourceId::new(RESOURCES[res]).expect("valid");
                let lock_delay = Duration::from_millis(lock_delay_ms);
                let req = AcquireRequest {
                    resource: resource.clone(),
                    holder: Holder::new("h").expect("valid"),
                    ttl: Duration::from_millis(ttl_ms),
                    lease_id: m.fresh_id(),
                    wait,
                    lock_delay,
                };
                let lease_id = req.lease_id;
                match c.acquire(now, req) {
                    Ok(AcquireOutcome::Granted(g)) => {
                        m.granted(now, &g)?;
                        if let Some(k) = m.leases.last_mut() {
                            k.lock_delay = lock_delay;
                        }
                        false
                    }
                    Ok(AcquireOutcome::Queued(w)) => {
                        m.waiters.push((resource, w));
                        m.queued_delays.insert(lease_id, lock_delay);
                        false
                    }
                    Err(e @ LeaseError::Busy { .. }) => {
                        prop_assert!(!wait, "a waiting acquire queues rather than busy");
                        m.busy(now, &resource, &e)?;
                        true
                    }
                    Err(LeaseError::TooManyWaiters { .. }) => true,
                    Err(LeaseError::Invalid(e)) if lock_delay > LOCK_DELAY_MAX => {
                        prop_assert_eq!(e.field(), "lock_delay_ms");
                        true
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected {e:?}"))),
                }
            }
            Op::Renew { lease } => match m.leases.get(lease).cloned() {
                None => false,
                Some(k) => {
                    let live = !k.ended && k.expires_at > now;
                    let got = c.renew(now, &k.resource, &k.lease_id);
                    if live {
                        let g = got.map_err(|e| TestCaseError::fail(format!("renew of a live lease: {e:?}")))?;
                        prop_assert_eq!(g.token, k.token, "renew keeps the token");
                        prop_assert_eq!(g.expires_at, now.saturating_add(k.ttl));
                        m.leases[lease].expires_at = g.expires_at;
                        false
                    } else {
                        prop_assert_eq!(
                            got,
                            Err(LeaseError::LeaseLost {
                                resource: k.resource.clone()
                            })
                        );
                        true
                    }
                }
            },
            Op::Release { lease } => match m.leases.get(lease).cloned() {
                None => false,
                Some(k) => {
                    let live = !k.ended && k.expires_at > now;
                    let got = c.release(now, &k.resource, &k.lease_id);
                    if live {
                        prop_assert_eq!(got, Ok(k.token));
                    } else {
                        prop_assert_eq!(
                            got,
                            Err(LeaseError::LeaseLost {
                                resource: k.resource.clone()
                            })
                        );
                    }
                    !live
                }
            },
            Op::Cancel { waiter } => match m.waiters.get(waiter).cloned() {
                None => false,
                Some((resource, w)) => {
                    prop_assert!(
                        c.cancel_waiter(&resource, w),
                        "a waiter the model saw queued is cancellable"
                    );
                    m.waiters.remove(waiter);
                    false
                }
            },
        };
        let effects = c.take_effects();
        if failed {
            prop_assert!(effects.is_empty(), "a failed call emitted {effects:?}");
            prop_assert!(c == before, "a failed call changed the state");
        }
        m.observe(now, effects)?;
        let live = m.current.values().filter(|&&i| !m.leases[i].ended).count();
        prop_assert_eq!(c.held_count(), live, "held count matches the leases not yet ended");
        prop_assert!(
            c.deadline_count() <= 2 * c.held_count() + 64,
            "the expiry queue keeps at most 2 x live + 64 entries"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn lease_machine_keeps_its_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
