//! The one conformance suite every [`LeaseStore`] backend must pass.
//!
//! `open` must return a handle on the *same* durable state each time it is
//! called (reopening after the previous handle is dropped), so the suite can
//! check what survives a reopen. Each scenario uses its own resource names, so
//! one state may serve every scenario. Failures panic with what was expected.

use std::time::Duration;

use leasefence_core::{Holder, LeaseId, Mutation, ReleaseCause, ResourceId, StoredLease, StoredResource, Token};

use crate::{LeaseStore, StoreError};

fn res(s: &str) -> ResourceId {
    ResourceId::new(s).expect("suite uses valid names")
}

fn tok(v: u64) -> Token {
    Token::new(v).expect("suite uses non-zero tokens")
}

fn grant(r: &str, t: u64, id: u8) -> Mutation {
    Mutation::Grant {
        resource: res(r),
        token: tok(t),
        lease_id: LeaseId::from_bytes([id; 16]),
        holder: Holder::new("suite").expect("valid"),
        ttl: Duration::from_millis(1234),
    }
}

fn release(r: &str, t: u64, cause: ReleaseCause) -> Mutation {
    Mutation::Release {
        resource: res(r),
        token: tok(t),
        cause,
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
        }),
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
    open().apply(&batch).expect("apply batch");
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
