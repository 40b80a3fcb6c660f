//! Exact-outcome tests of lock-delays: after an expiry (never a release) the
//! resource stays closed for the lease's delay, waiters stay queued through it,
//! and a restart counts a recorded delay in full again.

use super::tests::{at, granted, h, r, tok};
use super::*;
use crate::{BusyReason, StoredLease, StoredLockDelay};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An acquire of `res` for 1 s with a lock-delay of `delay_ms`.
fn req(res: &str, holder: &str, lease: u8, wait: bool, delay_ms: u64) -> AcquireRequest {
    AcquireRequest {
        lock_delay: ms(delay_ms),
        ..super::tests::req(res, holder, lease, wait)
    }
}

fn lock_delay_busy(res: &str, holder: &str, token: u64, retry_ms: u64) -> LeaseError {
    LeaseError::Busy {
        resource: r(res),
        holder: h(holder),
        token: tok(token),
        expires_in: Duration::ZERO,
        reason: BusyReason::LockDelay { retry_in: ms(retry_ms) },
    }
}

#[test]
fn an_expiry_closes_the_resource_for_the_lock_delay() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false, 500)));
    c.take_effects();
    c.advance(at(1000));
    assert_eq!(
        c.take_effects(),
        vec![Effect::Persist(Mutation::Release {
            resource: r("a"),
            token: tok(1),
            cause: ReleaseCause::Expired,
            lock_delay: ms(500),
        })],
        "the expiry records the delay it starts"
    );
    assert_eq!(c.next_deadline(), Some(at(1500)), "the reaper wakes at the delay's end");
    assert_eq!((c.held_count(), c.lock_delay_count()), (0, 1));
    let busy = c.acquire(at(1200), req("a", "w2", 2, false, 0)).unwrap_err();
    assert_eq!(busy, lock_delay_busy("a", "w1", 1, 300));
    assert_eq!(busy.retry_in(), Some(ms(300)));
    assert_eq!(
        busy.to_string(),
        "resource a is in its lock-delay after the lease of w1 (token 1) expired; it can be granted again in 300 ms"
    );
    assert_eq!(c.busy(at(1499), &r("a")), Some(lock_delay_busy("a", "w1", 1, 1)));
    assert!(c.take_effects().is_empty(), "a refused acquire emits nothing");
    assert_eq!(granted(c.acquire(at(1500), req("a", "w2", 3, false, 0))).token, tok(2));
    assert_eq!(c.lock_delay_count(), 0);
}

#[test]
fn a_release_never_starts_a_lock_delay() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false, 5000)));
    c.take_effects();
    assert_eq!(c.release(at(10), &r("a"), &LeaseId::from_bytes([1; 16])), Ok(tok(1)));
    assert_eq!(
        c.take_effects(),
        vec![Effect::Persist(Mutation::Release {
            resource: r("a"),
            token: tok(1),
            cause: ReleaseCause::Released,
            lock_delay: Duration::ZERO,
        })]
    );
    assert_eq!(granted(c.acquire(at(10), req("a", "w2", 2, false, 0))).token, tok(2));
}

#[test]
fn waiters_stay_queued_through_the_lock_delay_and_the_first_gets_it_at_its_end() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false, 500)));
    let Ok(AcquireOutcome::Queued(first)) = c.acquire(at(1), req("a", "w2", 2, true, 0)) else {
        panic!("queued behind the holder")
    };
    c.take_effects();
    c.advance(at(1000));
    assert_eq!(
        c.take_effects().len(),
        1,
        "only the expiry: nobody is granted inside the delay"
    );
    let Ok(AcquireOutcome::Queued(second)) = c.acquire(at(1200), req("a", "w3", 3, true, 0)) else {
        panic!("queued behind the lock-delay")
    };
    c.advance(at(1499));
    assert!(c.take_effects().is_empty());
    c.advance(at(1500));
    let effects = c.take_effects();
    assert!(
        matches!(&effects[..], [
        Effect::Persist(Mutation::Grant { token, .. }),
        Effect::WakeWaiter { waiter, grant },
    ] if *token == tok(2) && *waiter == first && grant.expires_at == at(2500)),
        "{effects:?}"
    );
    assert_eq!(c.status(at(1500), &r("a")).waiters, 1);
    assert!(c.cancel_waiter(&r("a"), second));
}

#[test]
fn a_late_advance_counts_the_delay_from_the_lease_deadline() {
    let mut c = Coordinator::new(Config::default());
    granted(c.acquire(at(0), req("a", "w1", 1, false, 500)));
    c.acquire(at(1), req("a", "w2", 2, true, 0)).expect("queued");
    c.take_effects();
    // Nothing ran between the deadline (1000) and the delay's end (1500).
    c.advance(at(1600));
    let effects = c.take_effects();
    assert_eq!(effects.len(), 3, "expiry, then the waiter's grant: {effects:?}");
    assert_eq!(c.lock_delay_count(), 0);
}

#[test]
fn a_lock_delay_above_the_maximum_is_refused_naming_the_limit() {
    let mut c = Coordinator::new(Config::default().with_lock_delay_max(ms(10_000)));
    let err = c.acquire(at(0), req("a", "w1", 1, false, 10_001)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid lock_delay_ms: must be at most 10000 ms (this coordinator's lock-delay maximum), got 10001 ms"
    );
    assert!(c.take_effects().is_empty());
    granted(c.acquire(at(0), req("a", "w1", 1, false, 10_000)));
}

#[test]
fn recovery_counts_a_recorded_lock_delay_in_full_from_the_restart() {
    let records = vec![
        StoredResource {
            resource: r("delayed"),
            last_token: tok(7),
            lease: None,
            lock_delay: Some(StoredLockDelay {
                holder: h("gone"),
                delay: ms(500),
            }),
        },
        StoredResource {
            resource: r("held"),
            last_token: tok(3),
            lease: Some(StoredLease {
                lease_id: LeaseId::from_bytes([9; 16]),
                holder: h("a"),
                ttl: ms(1000),
                lock_delay: ms(200),
            }),
            lock_delay: None,
        },
    ];
    let mut c = Coordinator::recover(Config::default(), at(10_000), records);
    assert_eq!(c.next_deadline(), Some(at(10_500)));
    assert_eq!(
        c.acquire(at(10_499), req("delayed", "b", 1, false, 0)),
        Err(lock_delay_busy("delayed", "gone", 7, 1))
    );
    assert_eq!(
        granted(c.acquire(at(10_500), req("delayed", "b", 2, false, 0))).token,
        tok(8)
    );
    // The recovered lease keeps its lock-delay: expiring at 11_000 closes it until 11_200.
    assert_eq!(
        c.acquire(at(11_100), req("held", "b", 3, false, 0)),
        Err(lock_delay_busy("held", "a", 3, 100))
    );
    assert_eq!(
        granted(c.acquire(at(11_200), req("held", "b", 4, false, 0))).token,
        tok(4)
    );
}

#[test]
fn compaction_keeps_the_entries_of_open_lock_delays() {
    let mut c = Coordinator::new(Config::default());
    for n in 0..100u8 {
        granted(c.acquire(at(0), req(&format!("d/{n}"), "w", n, false, 60_000)));
    }
    c.advance(at(1000));
    assert_eq!(c.lock_delay_count(), 100);
    for i in 0..1000u64 {
        let g = granted(c.acquire(at(1000 + i), req("cycle", "w", 200, false, 0)));
        c.release(at(1000 + i), &r("cycle"), &g.lease_id).expect("release");
        assert!(c.deadline_count() <= 2 * (c.held_count() + c.lock_delay_count()) + 64);
    }
    c.take_effects();
    c.advance(at(61_000));
    assert_eq!(c.lock_delay_count(), 0, "every delay ended on time");
    assert_eq!(c.next_deadline(), None);
}
