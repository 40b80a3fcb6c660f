//! The pause test kit: does a paused holder's late effect get rejected?
//!
//! Each trial plays the classic scenario on a fresh fence key: A holds token
//! n and pauses (inside its open transaction where the backend allows it,
//! see [`PausePoint`]); B is granted n+1, writes and commits; A resumes and
//! tries to commit. A's effect must be rejected with a typed
//! `Stale{presented: n, current: n+1}` and must leave no trace. Everything
//! happens under the target's own namespace, removed afterwards.

use std::sync::Arc;
use std::time::Duration;

use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use tokio::sync::oneshot;

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome, PausePoint};
use crate::rng::SplitMix64;

/// Longest any single step of a trial may take before the check gives up.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest number of trials one check runs.
pub const TRIALS_MAX: u32 = 100_000;

/// The outcome of [`pause_check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub backend: &'static str,
    pub pause_point: PausePoint,
    pub trials: u32,
    /// Trials where A's stale effect was accepted: each one breaks the invariant.
    pub stale_accepted: u32,
    /// Trials where A's stale effect was rejected.
    pub stale_rejected: u32,
    /// Every trial that went wrong, with what was seen.
    pub counterexamples: Vec<Counterexample>,
    /// What about the backend's settings can lose fences although every
    /// trial passed (filled by [`crate::check`]; see `redis::check_settings`).
    pub warnings: Vec<String>,
}

impl Report {
    /// True when every trial rejected A's effect correctly and cleanly.
    pub fn passed(&self) -> bool {
        self.stale_accepted == 0 && self.counterexamples.is_empty() && self.stale_rejected == self.trials
    }
}

/// One trial that broke the contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counterexample {
    pub trial: u32,
    pub resource: ResourceId,
    /// The token A held while paused.
    pub paused_token: Token,
    /// The token B committed with.
    pub newer_token: Token,
    pub what: String,
}

/// Runs `trials` pause trials against `target` and cleans up its namespace.
/// Errors are infrastructure failures (B could not commit, a step timed out);
/// contract breaches are counted in the [`Report`].
pub async fn pause_check<T: ConformanceTarget>(target: &Arc<T>, trials: u32) -> Result<Report, ArbiterError> {
    if trials == 0 || trials > TRIALS_MAX {
        let msg = format!("must be 1..={TRIALS_MAX}, got {trials}");
        return Err(leasefence_core::Invalid::new("trials", msg).into());
    }
    let mut report = Report {
        backend: target.backend(),
        pause_point: target.pause_point(),
        trials,
        stale_accepted: 0,
        stale_rejected: 0,
        counterexamples: Vec::new(),
        warnings: Vec::new(),
    };
    let mut rng = SplitMix64::from_os();
    let mut result = Ok(());
    for trial in 0..trials {
        let n = rng.range(1, 1 << 40);
        if let Err(e) = run_trial(target, trial, n, &mut report).await {
            result = Err(e);
            break;
        }
    }
    let cleaned = target.cleanup().await;
    result?;
    cleaned?;
    Ok(report)
}

async fn run_trial<T: ConformanceTarget>(
    t: &Arc<T>,
    trial: u32,
    n: u64,
    report: &mut Report,
) -> Result<(), ArbiterError> {
    let resource = ResourceId::new(&format!("{}pause/{trial}", t.namespace()))?;
    let (a_tok, b_tok) = match (Token::new(n), Token::new(n + 1)) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(task_err("trial token out of range")),
    };
    let (reached_tx, reached_rx) = oneshot::channel::<()>();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let a = {
        let (t, fence) = (Arc::clone(t), Fence::new(resource.clone(), a_tok));
        tokio::spawn(async move {
            let pause = async move {
                let _ = reached_tx.send(());
                let _ = resume_rx.await;
            };
            t.admit_and_write_paused(&fence, FenceMode::Strict, "a", "written-by-A", pause)
                .await
        })
    };
    step(reached_rx)
        .await?
        .map_err(|_| task_err("A stopped before reaching its pause"))?;
    let b_fence = Fence::new(resource.clone(), b_tok);
    step(t.admit_and_write(&b_fence, FenceMode::Strict, "b", "written-by-B", Outcome::Commit)).await??;
    let _ = resume_tx.send(());
    let a_result = step(a).await?.map_err(|e| task_err(&format!("A panicked: {e}")))?;

    let mut problems = Vec::new();
    match a_result {
        Ok(()) => {
            report.stale_accepted += 1;
            problems.push(format!(
                "A's effect with token {n} was accepted after B committed {}",
                n + 1
            ));
        }
        Err(ArbiterError::Stale(s)) => {
            report.stale_rejected += 1;
            if (s.resource.clone(), s.presented, s.current) != (resource.clone(), a_tok, b_tok) {
                problems.push(format!("rejection names the wrong fence: {s}"));
            }
        }
        Err(e) => problems.push(format!("A's effect was refused without a typed Stale: {e}")),
    }
    problems.extend(check_state(&**t, &resource, a_tok, b_tok).await?);
    for what in problems {
        report.counterexamples.push(Counterexample {
            trial,
            resource: resource.clone(),
            paused_token: a_tok,
            newer_token: b_tok,
            what,
        });
    }
    Ok(())
}

/// After a trial only B's effect and token may be visible.
async fn check_state<T: ConformanceTarget>(
    t: &T,
    r: &ResourceId,
    a: Token,
    b: Token,
) -> Result<Vec<String>, ArbiterError> {
    let mut problems = Vec::new();
    if let Some(v) = t.read(r, "a").await? {
        problems.push(format!("A's effect is visible: a = {v:?}"));
    }
    let b_value = t.read(r, "b").await?;
    if b_value.as_deref() != Some("written-by-B") {
        problems.push(format!("B's effect is missing: b = {b_value:?}"));
    }
    let last = t.last_token(r).await?;
    if last != Some(b) {
        problems.push(format!("last_token is {last:?}, expected {b}"));
    }
    let history = t.history(r).await?;
    if history != [b] {
        problems.push(format!("history is {history:?}, expected only [{b}] (A held {a})"));
    }
    Ok(problems)
}

async fn step<F: std::future::Future>(f: F) -> Result<F::Output, ArbiterError> {
    tokio::time::timeout(STEP_TIMEOUT, f)
        .await
        .map_err(|_| task_err(&format!("a pause-check step took longer than {STEP_TIMEOUT:?}")))
}

fn task_err(msg: &str) -> ArbiterError {
    ArbiterError::Task(msg.to_string())
}
