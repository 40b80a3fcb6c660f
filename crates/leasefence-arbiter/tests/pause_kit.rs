//! The pause kit must notice a broken arbiter: a target that records effects
//! but ignores tokens has to produce counterexamples, not a pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use leasefence_arbiter::conformance::{ConformanceTarget, Outcome};
use leasefence_arbiter::{ArbiterError, Fence, FenceMode, ResourceId, Token, pause_check};

/// Applies every effect, never checks a fence: exactly the bug the kit exists for.
#[derive(Default)]
struct IgnoresFences {
    kv: Mutex<HashMap<(String, String), String>>,
    history: Mutex<HashMap<String, Vec<Token>>>,
}

impl ConformanceTarget for IgnoresFences {
    fn backend(&self) -> &'static str {
        "ignores-fences"
    }

    fn namespace(&self) -> &str {
        "leasefence-check/broken/"
    }

    fn token_max(&self) -> Token {
        Token::new(u64::MAX).expect("non-zero")
    }

    async fn admit_and_write(
        &self,
        f: &Fence,
        _: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> Result<(), ArbiterError> {
        if outcome == Outcome::Commit {
            let r = f.resource.as_str().to_string();
            self.kv
                .lock()
                .expect("lock")
                .insert((r.clone(), key.to_string()), value.to_string());
            self.history.lock().expect("lock").entry(r).or_default().push(f.token);
        }
        Ok(())
    }

    async fn read(&self, r: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        Ok(self
            .kv
            .lock()
            .expect("lock")
            .get(&(r.as_str().to_string(), key.to_string()))
            .cloned())
    }

    async fn last_token(&self, r: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        Ok(self
            .history
            .lock()
            .expect("lock")
            .get(r.as_str())
            .and_then(|h| h.last().copied()))
    }

    async fn history(&self, r: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        Ok(self
            .history
            .lock()
            .expect("lock")
            .get(r.as_str())
            .cloned()
            .unwrap_or_default())
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_broken_arbiter_fails_the_pause_check_with_counterexamples() {
    let report = pause_check(&Arc::new(IgnoresFences::default()), 7).await.expect("runs");
    assert!(!report.passed());
    assert_eq!((report.trials, report.stale_accepted, report.stale_rejected), (7, 7, 0));
    let first = report.counterexamples.first().expect("counterexamples");
    assert_eq!(first.newer_token.get(), first.paused_token.get() + 1);
    assert!(
        report.counterexamples.iter().any(|c| c.what.contains("accepted")),
        "{report:?}"
    );
    assert!(
        report
            .counterexamples
            .iter()
            .any(|c| c.what.contains("A's effect is visible")),
        "{report:?}"
    );
}

#[tokio::test]
async fn zero_trials_is_invalid() {
    let res = pause_check(&Arc::new(IgnoresFences::default()), 0).await;
    assert!(
        matches!(res, Err(ArbiterError::Invalid(ref i)) if i.field() == "trials"),
        "{res:?}"
    );
}
