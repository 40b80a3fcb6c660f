//! The one conformance suite every [`LeaseStore`] backend must pass.
//!
//! `open` must return a handle on the *same* durable state each time it is
//! called (reopening after the previous handle is dropped), so the suite can
//! check what survives a reopen. Each scenario uses its own resource names, so
//! one state may serve every scenario. Failures panic with what was expected.
//!
//! [`shared`] is the suite of the [`crate::SharedStore`] port (leadership,
//! epochs, fenced writes); it runs this one against a current leader's writer.

use std::time::Duration;

use leasefence_core::{
    Holder, LeaseId, Mutation, ReleaseCause, ResourceId, StoredLease, StoredLockDelay, StoredResource, Token,
};

use crate::{LeaseStore, StoreError};

pub mod shared;

fn res(s: &str) -> ResourceId {
    ResourceId::new(s).expect("suite uses valid names")
}

fn tok(v: u64) -> Token {
    Token::new(v).expect("suite uses non-zero tokens")
}

/// A grant of token `t` on resource `r` under the lease id `[id; 16]` (for
/// the suites and the backends' own tests).
pub fn grant(r: &str, t: u64, id: u8) -> Mutation {
    grant_with_delay(r, t, id, Duration::ZERO)
}

fn grant_with_delay(r: &str, t: u64, id: u8, lock_delay: Duration) -> Mutation {
    Mutation::Grant {
        resource: res(r),
        token: tok(t),
        lease_id: LeaseId::from_bytes([id; 16]),
        holder: Holder::new("suite").expect("valid"),
        ttl: Duration::from_millis(1234),
        lock_delay,
    }
}

/// A release of token `t` on resource `r` by its holder (for the suites and
/// the backends' own tests).
pub fn released(r: &str, t: u64) -> Mutation {
    release(r, t, ReleaseCause::Released)
}

fn release(r: &str, t: u64, cause: ReleaseCause) -> Mutation {
    release_with_delay(r, t, cause, Duration::ZERO)
}

fn release_with_delay(r: &str, t: u64, cause: ReleaseCause, lock_delay: Duration) -> Mutation {
    Mutation::Release {
        resource: res(r),
        token: tok(t),
        cause,
        lock_delay,
    }
}

fn find<S: LeaseStore>(store: &mut S, r: &str) -> Option<StoredResource> {
    let all = store.load().expect("load");
    all.into_iter().find(|x| x.resource.as_str() == r)
}

/// Runs every scenario.
pub fn run_all<S: LeaseStore>(mut open: impl FnMut() -> S) {
    grant_survives_reopen(&mut open);
    release_keeps_the_token(&mut open);
    stale_release_changes_nothing(&mut open);
    lower_or_equal_grant_is_refused_and_batch_is_atomic(&mut open);
    many_resources_in_one_batch(&mut open);
    largest_token_round_trips(&mut open);
    lock_delay_of_an_expiry_survives_reopen_until_the_next_grant(&mut open);
    release_and_stale_expiry_record_no_lock_delay(&mut open);
    upkeep_between_batches_keeps_every_record(&mut open);
}

pub fn grant_survives_reopen<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    {
        let mut s = open();
        assert_eq!(find(&mut s, "c/grant"), None, "a fresh resource has no record");
        s.apply(&[grant("c/grant", 1, 1)]).expect("apply grant");
    }
    let mut s = open();
    let expected = StoredResource {
        resource: res("c/grant"),
        last_token: tok(1),
        lease: Some(StoredLease {
            lease_id: LeaseId::from_bytes([1; 16]),
            holder: Holder::new("suite").expect("valid"),
            ttl: Duration::from_millis(1234),
            lock_delay: Duration::ZERO,
        }),
        lock_delay: None,
    };
    assert_eq!(
        find(&mut s, "c/grant"),
        Some(expected),
        "the grant and its lease survive a reopen"
    );
}

pub fn release_keeps_the_token<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    {
        let mut s = open();
        s.apply(&[grant("c/rel", 1, 1), release("c/rel", 1, ReleaseCause::Released)])
            .expect("apply");
        s.apply(&[grant("c/rel", 2, 2), release("c/rel", 2, ReleaseCause::Expired)])
            .expect("apply");
    }
    let got = find(&mut open(), "c/rel").expect("record kept after release");
    assert_eq!(
        (got.last_token, got.lease),
        (tok(2), None),
        "released: token kept, no lease"
    );
}

pub fn stale_release_changes_nothing<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    let mut s = open();
    s.apply(&[
        grant("c/stale", 1, 1),
        release("c/stale", 1, ReleaseCause::Expired),
        grant("c/stale", 2, 2),
    ])
    .expect("apply");
    s.apply(&[release("c/stale", 1, ReleaseCause::Released)])
        .expect("a stale release is not an error");
    let got = find(&mut s, "c/stale").expect("record");
    assert_eq!(got.last_token, tok(2));
    assert!(
        got.lease.is_some(),
        "a release of token 1 must not end the lease of token 2"
    );
}

pub fn lower_or_equal_grant_is_refused_and_batch_is_atomic<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    let mut s = open();
    s.apply(&[grant("c/regress", 5, 1)]).expect("apply");
    for t in [5, 4] {
        let err = s.apply(&[grant("c/regress-other", 1, 2), grant("c/regress", t, 3)]);
        assert!(
            matches!(err, Err(StoreError::TokenRegression { stored: 5, .. })),
            "token {t}: {err:?}"
        );
    }
    drop(s);
    let mut s = open();
    assert_eq!(
        find(&mut s, "c/regress-other"),
        None,
        "a failed batch must write nothing"
    );
    let got = find(&mut s, "c/regress").expect("record");
    assert_eq!(
        (got.last_token, got.lease.map(|l| l.lease_id)),
        (tok(5), Some(LeaseId::from_bytes([1; 16])))
    );
}

pub fn many_resources_in_one_batch<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    let batch: Vec<Mutation> = (1..=500).map(|i| grant(&format!("c/many/{i}"), i, 1)).collect();
    let mut s = open();
    // As large batches as the store takes (etcd: one transaction's limit).
    for chunk in batch.chunks(s.batch_max().max(1)) {
        s.apply(chunk).expect("apply batch");
    }
    drop(s);
    let all = open().load().expect("load");
    let many: Vec<_> = all
        .iter()
        .filter(|r| r.resource.as_str().starts_with("c/many/"))
        .collect();
    assert_eq!(many.len(), 500);
    for r in many {
        let i: u64 = r.resource.as_str()["c/many/".len()..].parse().expect("suite name");
        assert_eq!(r.last_token, tok(i));
    }
}

pub fn largest_token_round_trips<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    open().apply(&[grant("c/max", u64::MAX, 9)]).expect("apply");
    let got = find(&mut open(), "c/max").expect("record");
    assert_eq!(got.last_token.get(), u64::MAX);
}

pub fn lock_delay_of_an_expiry_survives_reopen_until_the_next_grant<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    let delay = Duration::from_millis(5000);
    open()
        .apply(&[grant_with_delay("c/delay", 1, 1, delay)])
        .expect("apply grant");
    let held = find(&mut open(), "c/delay").expect("record");
    assert_eq!(
        held.lease.map(|l| l.lock_delay),
        Some(delay),
        "the lease's lock-delay survives a reopen, for an expiry after a restart"
    );
    open()
        .apply(&[release_with_delay("c/delay", 1, ReleaseCause::Expired, delay)])
        .expect("apply expiry");
    let got = find(&mut open(), "c/delay").expect("record");
    assert_eq!(
        (got.last_token, got.lease, got.lock_delay),
        (
            tok(1),
            None,
            Some(StoredLockDelay {
                holder: Holder::new("suite").expect("valid"),
                delay
            })
        ),
        "an expiry with a lock-delay records it, with the holder whose lease expired"
    );
    open().apply(&[grant("c/delay", 2, 2)]).expect("apply grant");
    let got = find(&mut open(), "c/delay").expect("record");
    assert_eq!(
        (got.last_token, got.lock_delay),
        (tok(2), None),
        "a grant ends the recorded lock-delay"
    );
}

pub fn release_and_stale_expiry_record_no_lock_delay<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    let delay = Duration::from_millis(5000);
    let mut s = open();
    s.apply(&[
        grant_with_delay("c/nodelay", 1, 1, delay),
        release("c/nodelay", 1, ReleaseCause::Released),
        grant_with_delay("c/nodelay", 2, 2, delay),
        release_with_delay("c/nodelay", 1, ReleaseCause::Expired, delay),
    ])
    .expect("apply");
    drop(s);
    let got = find(&mut open(), "c/nodelay").expect("record");
    assert_eq!(
        got.lock_delay, None,
        "neither a release nor a stale expiry starts a lock-delay"
    );
    assert_eq!(
        got.lease.map(|l| l.lease_id),
        Some(LeaseId::from_bytes([2; 16])),
        "a stale expiry leaves the newer lease alone"
    );
}

/// The writer calls [`LeaseStore::maintain`] after every commit; whatever a
/// backend does there (the embedded store moves its log into its tree), the
/// records read back the same, before and after a reopen. Enough resources
/// (9,000) that the embedded store checkpoints on the way.
pub fn upkeep_between_batches_keeps_every_record<S: LeaseStore>(open: &mut impl FnMut() -> S) {
    const ROUNDS: u64 = 6;
    let names: Vec<String> = (0..9000).map(|i| format!("c/upkeep/{i}")).collect();
    {
        let mut s = open();
        for round in 1..=ROUNDS {
            let batch: Vec<Mutation> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| (*i as u64).is_multiple_of(round))
                .map(|(_, r)| grant(r, round, 1))
                .collect();
            // In batches the store takes (etcd's transactions take 126).
            for part in batch.chunks(s.batch_max()) {
                s.apply(part).expect("apply");
                s.maintain().expect("upkeep");
            }
        }
        s.apply(&[release(&names[5], 5, ReleaseCause::Released)])
            .expect("apply");
        s.maintain().expect("upkeep");
        assert_eq!(find(&mut s, &names[5]).map(|r| r.last_token.get()), Some(5));
    }
    let mut s = open();
    let all: std::collections::HashMap<String, StoredResource> = s
        .load()
        .expect("load")
        .into_iter()
        .map(|x| (x.resource.to_string(), x))
        .collect();
    for (i, r) in names.iter().enumerate() {
        let last = (1..=ROUNDS).filter(|round| (i as u64).is_multiple_of(*round)).max();
        let found = all.get(r);
        assert_eq!(found.as_ref().map(|x| x.last_token.get()), last, "{r}");
        assert_eq!(
            found.map(|x| x.lease.is_some()),
            Some(i != 5),
            "{r}: held unless released"
        );
    }
}
