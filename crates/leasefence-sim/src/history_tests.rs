//! The checker must catch each kind of broken history (else a green run means nothing).

use super::*;

fn r(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid")
}

fn t(v: u64) -> Token {
    Token::new(v).expect("non-zero")
}

/// Every lease of these histories lasts 5 ms by its client's view, from its answer.
const VIEW_MS: u64 = 5;

/// The lease id a history's client chose for the lease of `token`.
fn id(token: u64) -> LeaseId {
    LeaseId::from_bytes([u8::try_from(token).expect("small token"); 16])
}

fn grant(at_ms: u64, token: u64, client: usize, incarnation: u64) -> AnsweredGrant {
    AnsweredGrant {
        at_ms,
        resource: r("a"),
        token: t(token),
        client,
        lease_id: id(token),
        incarnation,
        valid_until_ms: at_ms + VIEW_MS,
    }
}

fn renewal(at_ms: u64, token: u64, client: usize, incarnation: u64) -> AnsweredRenewal {
    AnsweredRenewal {
        at_ms,
        resource: r("a"),
        token: t(token),
        client,
        incarnation,
        valid_until_ms: at_ms + VIEW_MS,
    }
}

fn load(at_ms: u64, incarnation: u64, last_token: u64, held: bool) -> Load {
    Load {
        at_ms,
        incarnation,
        records: vec![LoadedRecord {
            resource: r("a"),
            last_token: t(last_token),
            held,
        }],
    }
}

fn effect(at_ms: u64, token: u64, client: usize) -> AdmittedEffect {
    AdmittedEffect {
        at_ms,
        resource: r("a"),
        token: t(token),
        client,
        payload: at_ms,
    }
}

/// Two clients, each granted and admitted after `healed_at_ms` = 10. By the
/// client-side view the leases are [1, 6), [12, 17) and [20, 25) ms.
fn healthy() -> History {
    History {
        grants: vec![grant(1, 1, 0, 0), grant(12, 2, 1, 0), grant(20, 3, 0, 0)],
        admitted: vec![effect(2, 1, 0), effect(13, 2, 1), effect(21, 3, 0)],
        ..History::default()
    }
}

#[test]
fn a_healthy_history_has_no_violations() {
    assert_eq!(check(&healthy(), 2, 10), Vec::new());
}

#[test]
fn a_lower_token_after_a_higher_one_is_a_stale_effect() {
    let mut h = healthy();
    h.admitted.push(effect(30, 2, 1));
    let v = check(&h, 2, 10);
    assert_eq!(
        v,
        vec![Violation::StaleEffect {
            resource: r("a"),
            token: t(2),
            after: t(3),
            at_ms: 30
        }]
    );
}

#[test]
fn the_same_token_admitted_twice_is_caught() {
    let mut h = healthy();
    h.admitted.push(effect(30, 3, 0));
    assert!(matches!(
        check(&h, 2, 10).as_slice(),
        [Violation::TokenAdmittedTwice { .. }]
    ));
}

#[test]
fn reused_and_lowered_grants_are_caught() {
    let mut h = healthy();
    h.grants.push(grant(40, 3, 1, 1));
    h.grants.push(grant(41, 2, 1, 1));
    let v = check(&h, 2, 10);
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::TokenReused { token, .. } if *token == t(3)))
    );
    assert!(v.iter().any(
        |v| matches!(v, Violation::TokenLowered { token, earlier, incarnation: 1, .. }
        if *token == t(2) && *earlier == t(3))
    ));
}

#[test]
fn an_effect_with_a_token_never_granted_to_its_sender_is_caught() {
    let mut h = healthy();
    h.admitted.push(effect(30, 4, 1));
    assert_eq!(
        check(&h, 2, 10),
        vec![Violation::UnknownToken {
            resource: r("a"),
            token: t(4),
            client: 1
        }]
    );
}

#[test]
fn a_client_without_a_grant_and_effect_after_healing_is_no_progress() {
    let v = check(&healthy(), 3, 10);
    assert_eq!(
        v,
        vec![Violation::NoProgress {
            client: 2,
            granted: false,
            admitted: false
        }]
    );
    let late = check(&healthy(), 2, 15);
    assert_eq!(
        late,
        vec![Violation::NoProgress {
            client: 1,
            granted: false,
            admitted: false
        }]
    );
}

#[test]
fn digest_changes_with_the_history() {
    let a = healthy();
    let mut b = healthy();
    assert_eq!(digest(&a), digest(&b));
    b.admitted[0].payload += 1;
    assert_ne!(digest(&a), digest(&b));
}

#[test]
fn a_grant_answered_while_another_lease_is_live_is_an_overlap() {
    let mut h = healthy();
    h.grants[2] = grant(14, 3, 0, 0);
    assert_eq!(
        check(&h, 2, 10),
        vec![Violation::LeasesOverlap {
            resource: r("a"),
            token: t(3),
            other: t(2),
            at_ms: 14
        }]
    );
    // The holder sent its release before: it no longer counted itself the holder.
    h.releases.push(SentRelease {
        at_ms: 13,
        resource: r("a"),
        lease_id: id(2),
        token: t(2),
        client: 1,
    });
    assert_eq!(check(&h, 2, 10), Vec::new());
}

#[test]
fn a_release_ends_a_grant_under_its_lease_id_answered_after_it() {
    // A duplicated acquire granted again (token 3, same lease id as token 2)
    // after the client had released: the client never holds it.
    let mut h = healthy();
    let mut again = grant(14, 3, 1, 0);
    again.lease_id = id(2);
    h.grants[2] = again;
    h.grants.push(grant(15, 4, 0, 0));
    h.admitted[2] = effect(21, 4, 0);
    h.releases.push(SentRelease {
        at_ms: 13,
        resource: r("a"),
        lease_id: id(2),
        token: t(2),
        client: 1,
    });
    assert_eq!(check(&h, 2, 10), Vec::new());
}

#[test]
fn an_answered_renewal_extends_the_lease_by_the_client_side_view() {
    let mut h = healthy();
    h.renewals.push(renewal(16, 2, 1, 0));
    assert!(matches!(
        check(&h, 2, 10).as_slice(),
        [Violation::LeasesOverlap { token, other, at_ms: 20, .. }] if *token == t(3) && *other == t(2)
    ));
}

#[test]
fn a_load_that_drops_a_live_lease_or_lowers_the_token_loses_a_grant() {
    let mut h = healthy();
    // At 15 ms token 2 is live until 17 ms: recorded as released, it is lost.
    h.loads.push(load(15, 1, 2, false));
    assert_eq!(
        check(&h, 2, 10),
        vec![Violation::GrantLost {
            resource: r("a"),
            token: t(2),
            loaded: Some(t(2)),
            at_ms: 15
        }]
    );
    // Token 2 was answered before 18 ms; a load of token 1 loses it, held or not.
    h.loads[0] = load(18, 1, 1, true);
    assert!(matches!(
        check(&h, 2, 10).as_slice(),
        [Violation::GrantLost { token, loaded: Some(l), at_ms: 18, .. }] if *token == t(2) && *l == t(1)
    ));
    // After its client-side end the lease may be gone.
    h.loads[0] = load(18, 1, 2, false);
    assert_eq!(check(&h, 2, 10), Vec::new());
    h.loads[0] = load(15, 1, 2, true);
    assert_eq!(check(&h, 2, 10), Vec::new());
}

#[test]
fn an_earlier_term_answering_after_a_later_one_is_caught() {
    let mut h = healthy();
    h.grants[1].incarnation = 2;
    h.renewals.push(renewal(14, 2, 1, 2));
    assert_eq!(
        check(&h, 2, 10),
        vec![Violation::DeposedAnswered {
            incarnation: 0,
            after: 2,
            at_ms: 20
        }]
    );
    // A renewal answered by the old term counts as an answer too.
    h.grants[2].incarnation = 2;
    h.renewals.push(renewal(15, 2, 1, 1));
    assert!(matches!(
        check(&h, 2, 10).as_slice(),
        [Violation::DeposedAnswered {
            incarnation: 1,
            after: 2,
            at_ms: 15
        }]
    ));
}

#[test]
fn the_store_ending_a_lease_still_live_by_its_clients_view_is_caught() {
    let mut h = healthy();
    // Token 2 is live until 17 ms (a renewal takes it to 21 ms).
    h.ended.push(EndedLease {
        at_ms: 15,
        resource: r("a"),
        token: t(2),
    });
    assert_eq!(
        check(&h, 2, 10),
        vec![Violation::LiveLeaseEnded {
            resource: r("a"),
            token: t(2),
            at_ms: 15
        }]
    );
    h.ended[0].at_ms = 18;
    assert_eq!(check(&h, 2, 10), Vec::new());
    h.renewals.push(renewal(16, 2, 1, 0));
    h.grants[2] = grant(21, 3, 0, 0);
    assert!(matches!(
        check(&h, 2, 10).as_slice(),
        [Violation::LiveLeaseEnded { at_ms: 18, .. }]
    ));
}
