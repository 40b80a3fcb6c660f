//! Exact-outcome tests of the lease machine, and the helpers the other
//! machine tests share.

use super::*;
use crate::{BusyReason, StoredLease};

pub(super) fn r(s: &str) -> ResourceId {
    ResourceId::new(s).expect("valid resource")
}

pub(super) fn h(s: &str) -> Holder {
    Holder::new(s).expect("valid holder")
}

pub(super) fn at(ms: u64) -> MonoTime {
    MonoTime::from_millis(ms)
}

pub(super) fn id(n: u8) -> LeaseId {
    LeaseId::from_bytes([n; 16])
}

pub(super) fn tok(v: u64) -> Token {
    Token::new(v).expect("non-zero")
}

pub(super) fn req(res: &str, holder: &str, lease: u8, wait: bool) -> AcquireRequest {
    AcquireRequest {
        resource: r(res),
        holder: h(holder),
        ttl: Duration::from_millis(1000),
        lease_id: id(lease),
        wait,
        lock_delay: Duration::ZERO,
    }
}

pub(super) fn granted(o: Result<AcquireOutcome, LeaseError>) -> Grant {
    match o {
        Ok(AcquireOutcome::Granted(g)) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn first_grant_is_token_one_and_is_persisted() {
    let mut c = Coordinator::new(Config::default());
    let g = granted(c.acquire(at(0), req("a", "w1", 1, false)));
    assert_eq!(g.token, tok(1));
    assert_eq!(g.expires_at, at(1000));
    assert_eq!(
        c.take_effects(),
        vec![Effect::Persist(Mutation::Grant {
            resource: r("a"),
            token: tok(1),
            lease_id: id(1),
            holder: h("w1"),
            ttl: Duration::from_millis(1000),
            lock_delay: Duration::ZERO,
        })]
    );
}

#[test]
fn busy_reports_holder_and_remaining_time() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false)));
    c.take_effects();
    let err = c.acquire(at(300), req("a", "w2", 2, false)).unwrap_err();
    assert_eq!(
        err,
        LeaseError::Busy {
            resource: r("a"),
            holder: h("w1"),
            token: tok(1),
            expires_in: Duration::from_millis(700),
            reason: BusyReason::Held,
        }
    );
    assert!(c.take_effects().is_empty());
}

#[test]
fn renew_keeps_token_and_expiry_needs_a_new_grant() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false)));
    let renewed = c.renew(at(900), &r("a"), &id(1)).expect("renew in time");
    assert_eq!((renewed.token, renewed.expires_at), (tok(1), at(1900)));
    c.take_effects();
    assert_eq!(
        c.renew(at(1900), &r("a"), &id(1)),
        Err(LeaseError::LeaseLost { resource: r("a") })
    );
    assert_eq!(
        c.take_effects(),
        vec![Effect::Persist(Mutation::Release {
            resource: r("a"),
            token: tok(1),
            cause: ReleaseCause::Expired,
            lock_delay: Duration::ZERO,
        })]
    );
    let g = granted(c.acquire(at(1900), req("a", "w1", 3, false)));
    assert_eq!(g.token, tok(2));
}

#[test]
fn stale_release_never_removes_a_newer_holder() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "old", 1, false)));
    c.advance(at(1000));
    granted(c.acquire(at(1000), req("a", "new", 2, false)));
    c.take_effects();
    assert_eq!(
        c.release(at(1001), &r("a"), &id(1)),
        Err(LeaseError::LeaseLost { resource: r("a") })
    );
    assert!(c.take_effects().is_empty());
    assert_eq!(c.status(at(1001), &r("a")).held.map(|s| s.holder), Some(h("new")));
}

#[test]
fn waiters_are_served_in_fifo_order_after_release() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false)));
    let q2 = c.acquire(at(1), req("a", "w2", 2, true)).expect("queued");
    let q3 = c.acquire(at(2), req("a", "w3", 3, true)).expect("queued");
    assert_eq!(
        (q2.clone(), q3),
        (AcquireOutcome::Queued(WaiterId(1)), AcquireOutcome::Queued(WaiterId(2)))
    );
    c.take_effects();
    assert_eq!(c.release(at(10), &r("a"), &id(1)), Ok(tok(1)));
    let effects = c.take_effects();
    assert_eq!(effects.len(), 3, "{effects:?}");
    assert!(matches!(
        &effects[0],
        Effect::Persist(Mutation::Release {
            cause: ReleaseCause::Released,
            ..
        })
    ));
    assert!(matches!(&effects[1], Effect::Persist(Mutation::Grant { token, .. }) if *token == tok(2)));
    match &effects[2] {
        Effect::WakeWaiter { waiter, grant } => {
            assert_eq!(*waiter, WaiterId(1));
            assert_eq!(
                (grant.token, grant.holder.clone(), grant.expires_at),
                (tok(2), h("w2"), at(1010))
            );
        }
        other => panic!("expected a wake, got {other:?}"),
    }
    // The second waiter is served when the lease of the first expires.
    c.advance(at(1010));
    let effects = c.take_effects();
    assert!(matches!(&effects[2], Effect::WakeWaiter { waiter: WaiterId(2), grant } if grant.token == tok(3)));
}

#[test]
fn cancelled_waiter_is_skipped_and_queue_is_bounded() {
    let config = Config::new(Duration::from_millis(100), Duration::from_secs(10), 1).expect("valid");
    let mut c = Coordinator::new(config);
    granted(c.acquire(at(0), req("a", "w1", 1, false)));
    let Ok(AcquireOutcome::Queued(w)) = c.acquire(at(0), req("a", "w2", 2, true)) else {
        panic!("queued")
    };
    assert_eq!(
        c.acquire(at(0), req("a", "w3", 3, true)),
        Err(LeaseError::TooManyWaiters {
            resource: r("a"),
            max: 1
        })
    );
    assert!(c.cancel_waiter(&r("a"), w));
    assert!(!c.cancel_waiter(&r("a"), w));
    c.take_effects();
    c.release(at(5), &r("a"), &id(1)).expect("release");
    assert_eq!(c.take_effects().len(), 1, "only the release; nobody is waiting");
    assert_eq!(c.status(at(5), &r("a")).held, None);
}

#[test]
fn ttl_bounds_are_enforced_with_a_clear_message() {
    let mut c = Coordinator::new(Config::default());
    let mut bad = req("a", "w", 1, false);
    bad.ttl = Duration::from_millis(99);
    let err = c.acquire(at(0), bad).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid ttl_ms: must be in 100..=3600000 ms, got 99 ms"
    );
    assert!(Config::new(Duration::ZERO, Duration::from_secs(1), 1).is_err());
    assert!(Config::new(Duration::from_secs(2), Duration::from_secs(1), 1).is_err());
}

#[test]
fn recovery_honours_held_leases_for_a_full_ttl_and_continues_tokens() {
    let records = vec![
        StoredResource {
            resource: r("held"),
            last_token: tok(41),
            lease: Some(StoredLease {
                lease_id: id(9),
                holder: h("a"),
                ttl: Duration::from_millis(500),
                lock_delay: Duration::ZERO,
            }),
            lock_delay: None,
        },
        StoredResource {
            resource: r("free"),
            last_token: tok(7),
            lease: None,
            lock_delay: None,
        },
    ];
    let mut c = Coordinator::recover(Config::default(), at(10_000), records);
    assert!(matches!(
        c.acquire(at(10_499), req("held", "b", 2, false)),
        Err(LeaseError::Busy { .. })
    ));
    assert_eq!(c.renew(at(10_400), &r("held"), &id(9)).map(|g| g.token), Ok(tok(41)));
    assert_eq!(granted(c.acquire(at(10_000), req("free", "b", 3, false))).token, tok(8));
    c.advance(at(10_900));
    assert_eq!(
        granted(c.acquire(at(10_900), req("held", "b", 4, false))).token,
        tok(42)
    );
}

#[test]
fn recovery_takes_records_in_any_order_and_the_last_of_a_name_wins() {
    let free = |name: &str, last: u64| StoredResource {
        resource: r(name),
        last_token: tok(last),
        lease: None,
        lock_delay: None,
    };
    // Out of key order, as a store's replayed tail follows its tree.
    let records = vec![free("z", 5), free("a", 3), free("m", 9), free("a", 20)];
    let mut c = Coordinator::recover(Config::default(), at(0), records);
    assert_eq!(c.resource_count(), 3);
    assert_eq!(granted(c.acquire(at(1), req("a", "x", 1, false))).token, tok(21));
    assert_eq!(granted(c.acquire(at(1), req("m", "x", 2, false))).token, tok(10));
    assert_eq!(granted(c.acquire(at(1), req("z", "x", 3, false))).token, tok(6));
}

#[test]
fn exhausted_tokens_are_an_error_and_reject_waiters() {
    let max = tok(u64::MAX);
    let records = vec![
        StoredResource {
            resource: r("full"),
            last_token: max,
            lease: None,
            lock_delay: None,
        },
        StoredResource {
            resource: r("last"),
            last_token: max,
            lease: Some(StoredLease {
                lease_id: id(1),
                holder: h("a"),
                ttl: Duration::from_millis(100),
                lock_delay: Duration::ZERO,
            }),
            lock_delay: None,
        },
    ];
    let mut c = Coordinator::recover(Config::default(), at(0), records);
    assert_eq!(
        c.acquire(at(0), req("full", "w", 2, false)),
        Err(LeaseError::TokensExhausted { resource: r("full") })
    );
    let Ok(AcquireOutcome::Queued(w)) = c.acquire(at(0), req("last", "w", 3, true)) else {
        panic!("queued")
    };
    c.release(at(1), &r("last"), &id(1)).expect("release");
    let effects = c.take_effects();
    assert_eq!(
        effects[1],
        Effect::RejectWaiter {
            waiter: w,
            error: LeaseError::TokensExhausted { resource: r("last") }
        }
    );
}

#[test]
fn renewal_moves_the_deadline_without_growing_the_queue() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w", 1, false)));
    for t in 1..100 {
        c.renew(at(t * 10), &r("a"), &id(1)).expect("renew");
    }
    assert_eq!((c.deadline_count(), c.held_count()), (1, 1));
    c.advance(at(1000));
    assert_eq!(c.next_deadline(), Some(at(1990)), "re-queued at the renewed deadline");
    assert!(c.status(at(1000), &r("a")).held.is_some());
}

#[test]
fn ended_leases_do_not_pile_up_in_the_expiry_queue() {
    let config = Config::new(Duration::from_millis(100), Duration::from_secs(3600), 8).expect("valid");
    let mut c = Coordinator::new(config);
    let hour = Duration::from_secs(3600);
    for n in 0..10u8 {
        let mut keep = req(&format!("kept/{n}"), "k", n, false);
        keep.ttl = hour;
        granted(c.acquire(at(0), keep));
    }
    for i in 0..100_000u64 {
        let mut cycle = req("busy", "w", 200, false);
        cycle.lease_id = LeaseId::from_bytes(i.to_be_bytes().repeat(2).try_into().expect("16 bytes"));
        cycle.ttl = hour;
        let g = granted(c.acquire(at(i), cycle));
        c.release(at(i), &r("busy"), &g.lease_id).expect("release");
        c.take_effects();
        assert!(
            c.deadline_count() <= 2 * c.held_count() + 64,
            "after {} cycles: {} queue entries for {} held leases",
            i + 1,
            c.deadline_count(),
            c.held_count()
        );
    }
    assert_eq!(c.held_count(), 10);
    // The live leases are still expired on time.
    c.advance(at(3_600_000));
    assert_eq!(c.held_count(), 0);
}

#[test]
fn force_release_ends_anyones_lease_and_hands_it_to_the_first_waiter() {
    let mut c = Coordinator::new(Config::default());
    assert_eq!(c.force_release(at(0), &r("a")), None, "nothing held");
    assert!(c.take_effects().is_empty());
    let g = Grant {
        resource: r("a"),
        token: tok(1),
        lease_id: id(1),
        holder: h("w1"),
        ttl: Duration::from_millis(1000),
        expires_at: at(1000),
    };
    // With a lock-delay asked for: a force-release, like a release, starts none.
    let mut first = req("a", "w1", 1, false);
    first.lock_delay = Duration::from_millis(5000);
    assert_eq!(granted(c.acquire(at(0), first)), g);
    assert_eq!(c.holder_of(&r("a"), &id(1)), Some(&h("w1")));
    assert_eq!(c.holder_of(&r("a"), &id(9)), None);
    c.acquire(at(1), req("a", "w2", 2, true)).expect("queued");
    c.take_effects();
    assert_eq!(c.force_release(at(10), &r("a")), Some(tok(1)));
    let effects = c.take_effects();
    assert!(matches!(
        &effects[0],
        Effect::Persist(Mutation::Release { token, cause: ReleaseCause::Released, lock_delay, .. })
            if *token == tok(1) && lock_delay.is_zero()
    ));
    assert!(matches!(&effects[2], Effect::WakeWaiter { grant, .. } if grant.token > tok(1)));
    // The old lease id is now worth nothing.
    assert_eq!(c.holder_of(&r("a"), &id(1)), None);
    assert!(c.renew(at(11), &r("a"), &id(1)).is_err());
    assert_eq!(c.holder_of(&r("a"), &id(2)), Some(&h("w2")));
}
