//! Running the model check: breadth-first, to the end for a model expected to
//! be safe, to the first counter-example for one expected to break.

use stateright::{Checker, HasDiscoveries, Model};

use super::{LeaseModel, TOKENS_MAX};

/// The outcome of one exhaustive check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelReport {
    pub states: usize,
    pub unique_states: usize,
    pub max_depth: usize,
    pub stale_effect_found: bool,
    pub token_reuse_found: bool,
    pub takeover_found: bool,
}

impl ModelReport {
    /// Safe and not vacuous: no counter-example, and the dangerous case was reached.
    pub fn passed(&self) -> bool {
        !self.stale_effect_found && !self.token_reuse_found && self.takeover_found
    }

    pub fn describe_failures(&self) -> String {
        let mut found = Vec::new();
        if self.stale_effect_found {
            found.push("stale effect");
        }
        if self.token_reuse_found {
            found.push("token reuse");
        }
        if !self.takeover_found {
            found.push("takeover never reached");
        }
        if found.is_empty() {
            "none".to_string()
        } else {
            found.join(", ")
        }
    }
}

/// Explores the 2-client model breadth-first with or without fencing.
pub fn check(fencing: bool) -> ModelReport {
    check_model(LeaseModel {
        clients: 2,
        tokens_max: TOKENS_MAX,
        fencing,
        answer_before_durable: false,
    })
}

/// A model expected to be safe is explored to the end; one expected to break
/// stops at its first counter-example (the states count is then up to there).
pub fn check_model(model: LeaseModel) -> ModelReport {
    let finish = if model.fencing && !model.answer_before_durable {
        HasDiscoveries::All
    } else {
        HasDiscoveries::AnyFailures
    };
    let checker = model.checker().finish_when(finish).spawn_bfs().join();
    ModelReport {
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        stale_effect_found: checker.discovery("no stale effect").is_some(),
        token_reuse_found: checker.discovery("no token reuse").is_some(),
        takeover_found: checker.discovery("takeover").is_some(),
    }
}
