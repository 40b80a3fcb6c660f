//! Concurrent racers: many writers with random tokens on one fence key.
//!
//! The checker reads the history the backend committed (in commit order) and
//! counts violations of the arbiter rule between neighbours. It also checks
//! that exactly the admitted writers appear in the history and that every
//! rejection is typed with its own token.

use std::collections::BTreeMap;
use std::sync::Arc;

use leasefence_core::{Fence, FenceMode, Token};
use tokio::sync::Barrier;

use super::{ConformanceTarget, Outcome, resource, tok};
use crate::ArbiterError;
use crate::rng::SplitMix64;

/// How many writers race.
pub const RACERS: usize = 32;

/// Strict racers: committed tokens strictly increase in commit order.
pub async fn racers_strict<T: ConformanceTarget>(t: &Arc<T>) {
    race(t, FenceMode::Strict, "racers-strict").await;
}

/// Monotonic racers: committed tokens never decrease in commit order.
pub async fn racers_monotonic<T: ConformanceTarget>(t: &Arc<T>) {
    race(t, FenceMode::Monotonic, "racers-monotonic").await;
}

async fn race<T: ConformanceTarget>(t: &Arc<T>, mode: FenceMode, name: &str) {
    let b = t.backend();
    let seed = crate::rng::os_seed();
    let mut rng = SplitMix64::new(seed);
    let r = resource(&**t, name);
    let tokens: Vec<u64> = (0..RACERS).map(|_| rng.range(1, (RACERS as u64) * 2)).collect();
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::with_capacity(RACERS);
    for &v in &tokens {
        let (t, barrier, fence) = (Arc::clone(t), Arc::clone(&barrier), Fence::new(r.clone(), tok(v)));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let value = v.to_string();
            t.admit_and_write(&fence, mode, "k", &value, Outcome::Commit).await
        }));
    }
    let mut admitted: BTreeMap<u64, usize> = BTreeMap::new();
    for (task, &v) in tasks.into_iter().zip(&tokens) {
        match task.await {
            Ok(Ok(())) => *admitted.entry(v).or_default() += 1,
            Ok(Err(ArbiterError::Stale(s))) => {
                assert_eq!(
                    (&s.resource, s.presented),
                    (&r, tok(v)),
                    "{b} seed {seed}: rejection fields"
                );
                let ok = match mode {
                    FenceMode::Strict => s.current >= s.presented,
                    FenceMode::Monotonic => s.current > s.presented,
                };
                assert!(ok, "{b} seed {seed}: rejected {v} although current was {}", s.current);
            }
            Ok(Err(e)) if e.is_retryable() => {} // serialization failure: not committed, retry would be stale-checked
            Ok(Err(e)) => panic!("{b} seed {seed}: racer {v} failed: {e}"),
            Err(e) => panic!("{b} seed {seed}: racer task {v} panicked: {e}"),
        }
    }
    let history = t.history(&r).await.unwrap_or_else(|e| panic!("{b}: history: {e}"));
    let violations = count_violations(mode, &history);
    assert_eq!(
        violations, 0,
        "{b} seed {seed} tokens {tokens:?}: history {history:?} violates {mode:?}"
    );
    let mut committed: BTreeMap<u64, usize> = BTreeMap::new();
    for h in &history {
        *committed.entry(h.get()).or_default() += 1;
    }
    assert_eq!(
        committed, admitted,
        "{b} seed {seed}: history must hold exactly the admitted writers"
    );
    assert!(!history.is_empty(), "{b} seed {seed}: at least one racer must commit");
    let last = history.last().copied();
    assert_eq!(
        t.last_token(&r).await.ok().flatten(),
        last,
        "{b} seed {seed}: last_token"
    );
    let value = t.read(&r, "k").await.unwrap_or_else(|e| panic!("{b}: read: {e}"));
    assert_eq!(
        value,
        last.map(|l| l.get().to_string()),
        "{b} seed {seed}: value is the last effect's"
    );
}

/// Neighbours in commit order that break the rule of `mode`.
pub fn count_violations(mode: FenceMode, history: &[Token]) -> usize {
    history
        .windows(2)
        .filter(|w| match mode {
            FenceMode::Strict => w[0] >= w[1],
            FenceMode::Monotonic => w[0] > w[1],
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_are_counted_per_mode() {
        let h: Vec<Token> = [1, 3, 3, 2, 5].iter().map(|&v| tok(v)).collect();
        assert_eq!(count_violations(FenceMode::Strict, &h), 2);
        assert_eq!(count_violations(FenceMode::Monotonic, &h), 1);
        assert_eq!(count_violations(FenceMode::Strict, &h[..2]), 0);
    }
}
