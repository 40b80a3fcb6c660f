//! The stateright model: safe with fencing, caught without it.

use leasefence_sim::model::{LeaseModel, TOKENS_MAX, check, check_model};

#[test]
fn with_fencing_no_stale_effect_no_token_reuse_and_a_takeover_happens() {
    let report = check(true);
    assert!(report.passed(), "{report:?}");
    assert!(report.unique_states > 100, "suspiciously small state space: {report:?}");
}

#[test]
fn without_fencing_the_model_finds_a_stale_effect() {
    let report = check(false);
    assert!(report.stale_effect_found, "{report:?}");
}

#[test]
fn answering_a_grant_before_it_is_durable_is_caught_as_token_reuse() {
    let report = check_model(LeaseModel {
        clients: 2,
        tokens_max: TOKENS_MAX,
        fencing: true,
        answer_before_durable: true,
    });
    assert!(report.token_reuse_found, "{report:?}");
}

#[test]
fn three_clients_with_fencing_pass_too() {
    // Three tokens instead of four keeps the bigger client count fast.
    let report = check_model(LeaseModel {
        clients: 3,
        tokens_max: 3,
        fencing: true,
        answer_before_durable: false,
    });
    assert!(report.passed(), "{report:?}");
}
