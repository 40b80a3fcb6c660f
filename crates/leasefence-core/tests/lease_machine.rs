//! Property tests of the lease machine against random sequences of acquire,
//! renew, release, cancel and time advances over several resources.
//!
//! A model built only from what the machine answered checks: per-resource
//! tokens increase by exactly one per grant; a grant never overlaps an
//! unexpired earlier lease; renew after expiry is `LeaseLost` and renew before
//! it succeeds; a failed call emits nothing and changes nothing.

use std::collections::HashMap;
use std::time::Duration;

use leasefence_core::{
    AcquireOutcome, AcquireRequest, Config, Coordinator, Effect, Grant, Holder, LeaseError, LeaseId, MonoTime,
    Mutation, ResourceId, Token, WaiterId,
};
use proptest::prelude::*;

const RESOURCES: [&str; 3] = ["r0", "r1", "r2"];

#[derive(Clone, Debug)]
enum Op {
    Acquire { res: usize, ttl_ms: u64, wait: bool },
    Renew { lease: usize },
    Release { lease: usize },
    Cancel { waiter: usize },
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..3usize,
            prop_oneof![Just(50u64), Just(100), Just(150), Just(250)],
            any::<bool>()
        )
            .prop_map(|(res, ttl_ms, wait)| Op::Acquire { res, ttl_ms, wait }),
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
    ended: bool,
}

#[derive(Default)]
struct Model {
    leases: Vec<Known>,
    last_token: HashMap<ResourceId, u64>,
    current: HashMap<ResourceId, usize>,
    waiters: Vec<(ResourceId, WaiterId)>,
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
            ended: false,
        });
        Ok(())
    }

    fn observe(&mut self, now: MonoTime, effects: Vec<Effect>) -> Result<(), TestCaseError> {
        for e in effects {
            match e {
                Effect::WakeWaiter { waiter, grant } => {
                    self.waiters.retain(|(_, w)| *w != waiter);
                    self.granted(now, &grant)?;
                }
                Effect::Persist(Mutation::Release { resource, token, .. }) => {
                    if let Some(&i) = self.current.get(&resource) {
                        prop_assert_eq!(self.leases[i].token, token, "released token is the current one");
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
    let config = Config::new(Duration::from_millis(50), Duration::from_millis(250), 3).expect("valid");
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
            Op::Acquire { res, ttl_ms, wait } => {
                let resource = ResourceId::new(RESOURCES[res]).expect("valid");
                let req = AcquireRequest {
                    resource: resource.clone(),
                    holder: Holder::new("h").expect("valid"),
                    ttl: Duration::from_millis(ttl_ms),
                    lease_id: m.fresh_id(),
                    wait,
                };
                match c.acquire(now, req) {
                    Ok(AcquireOutcome::Granted(g)) => {
                        m.granted(now, &g)?;
                        false
                    }
                    Ok(AcquireOutcome::Queued(w)) => {
                        m.waiters.push((resource, w));
                        false
                    }
                    Err(LeaseError::Busy { .. } | LeaseError::TooManyWaiters { .. }) => true,
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
