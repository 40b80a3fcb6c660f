//! The checker must catch each kind of broken history (else a green run means nothing).

use super::*;

fn r(name: &str) -> ResourceId {
    ResourceId::new(name).expect("valid")
}

fn t(v: u64) -> Token {
    Token::new(v).expect("non-zero")
}

fn grant(at_ms: u64, token: u64, client: usize, incarnation: u64) -> AnsweredGrant {
    AnsweredGrant {
        at_ms,
        resource: r("a"),
        token: t(token),
        client,
        incarnation,
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

/// Two clients, each granted and admitted after `healed_at_ms` = 10.
fn healthy() -> History {
    History {
        grants: vec![grant(1, 1, 0, 0), grant(12, 2, 1, 0), grant(20, 3, 0, 0)],
        admitted: vec![effect(2, 1, 0), effect(13, 2, 1), effect(21, 3, 0)],
        store_refusals: Vec::new(),
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
