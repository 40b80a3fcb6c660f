//! Seeded simulation runs: fencing holds, the control is caught, replays repeat.

use leasefence_sim::{Fencing, Options, Violation, run, run_with};

/// The seeds the acceptance criteria name (CI runs ≥ 1,000 through the release binary).
const SEEDS: u64 = 200;

#[test]
fn two_hundred_seeds_with_fencing_have_no_violations() {
    let mut failures = Vec::new();
    for seed in 0..SEEDS {
        let report = run(seed, Fencing::Strict);
        if let Some(v) = report.violations.first() {
            failures.push(format!("seed {seed}: {v} ({} in all)", report.violations.len()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_control_without_fencing_finds_stale_effects_on_the_same_seeds() {
    let stale = (0..SEEDS)
        .filter(|&seed| {
            run(seed, Fencing::Off)
                .violations
                .iter()
                .any(|v| matches!(v, Violation::StaleEffect { .. }))
        })
        .count();
    assert!(stale >= 1, "no seed of {SEEDS} produced a stale effect without fencing");
}

#[test]
fn the_faults_actually_fire_across_the_seeds() {
    // A run without faults would pass vacuously; make sure the seeds exercise them.
    let reports: Vec<_> = (0..50).map(|seed| run(seed, Fencing::Strict)).collect();
    let sum = |f: &dyn Fn(&leasefence_sim::Trace) -> u64| reports.iter().map(|r| f(&r.trace)).sum::<u64>();
    assert!(sum(&|t| t.coordinator.crashes) > 0, "no coordinator crash");
    assert!(
        sum(&|t| t.coordinator.lost_mutations) > 0,
        "no crash ever lost an unsynced mutation"
    );
    assert!(sum(&|t| t.net.lost + t.net.cut) > 0, "no message lost");
    assert!(sum(&|t| t.net.duplicated) > 0, "no message duplicated");
    assert!(
        sum(&|t| t.client_stats.iter().map(|c| c.pauses).sum()) > 0,
        "no client paused"
    );
    assert!(
        sum(&|t| t.arbiter_rejected) > 0,
        "the arbiter never had to reject a stale effect"
    );
}

#[test]
fn replaying_a_seed_gives_the_same_history() {
    for seed in [0, 7, 123] {
        let a = run(seed, Fencing::Strict);
        let b = run(seed, Fencing::Strict);
        assert_eq!(a.digest, b.digest, "seed {seed}");
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.history.grants, b.history.grants, "seed {seed}");
    }
    assert_ne!(run(1, Fencing::Strict).digest, run(2, Fencing::Strict).digest);
}

/// How many of `SEEDS` seeds of a coordinator that answers before fsync show
/// a violation that `is` picks.
fn caught_answering_before_fsync(is: impl Fn(&Violation) -> bool) -> usize {
    let options = Options {
        answer_before_durable: true,
        ..Options::new(Fencing::Strict)
    };
    (0..SEEDS)
        .filter(|&seed| run_with(seed, options).violations.iter().any(&is))
        .count()
}

#[test]
fn a_coordinator_that_answers_before_fsync_is_caught_reusing_tokens() {
    // The checker's reach: mid-fsync crashes must expose an answered grant that was lost.
    let caught = caught_answering_before_fsync(|v| matches!(v, Violation::TokenReused { .. }));
    assert!(
        caught >= 1,
        "no seed of {SEEDS} caught grants answered before they were durable"
    );
}

#[test]
fn a_coordinator_that_answers_before_fsync_is_caught_losing_grants_at_restart() {
    // The load check: a restart must load every grant answered before it.
    let caught = caught_answering_before_fsync(|v| matches!(v, Violation::GrantLost { .. }));
    assert!(
        caught >= 1,
        "no restart of {SEEDS} seeds was caught losing an answered grant"
    );
}
