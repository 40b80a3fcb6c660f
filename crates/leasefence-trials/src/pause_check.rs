//! The pause trials' checker: pure, fed with what each trial observed and
//! with the history table in commit order, it returns the [`Verdict`] and the
//! per-kind figures. Nothing here trusts the clients' own account of what
//! they committed: stale effects and reused tokens are judged from the
//! history rows the arbiter let through.

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::report::Verdict;

/// What became of the paused writer A after it was resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// The arbiter refused A's old token: the expected outcome.
    Rejected,
    /// A's effect was admitted (the history will show whether it was stale).
    Committed,
    /// A exited without attempting its commit.
    NeverAttempted,
}

/// The writer names of paused clients start with this.
pub const PAUSED_WRITER_PREFIX: &str = "a-";

/// One completed trial, as the parent observed it.
#[derive(Clone, Debug)]
pub struct TrialRecord {
    pub a_token: u64,
    pub b_token: u64,
    pub a: Resumed,
    /// The coordinator's `last_token` for the resource after both grants.
    pub coordinator_last: u64,
}

/// One history row, in commit order.
#[derive(Clone, Debug)]
pub struct Commit {
    pub resource: String,
    pub token: u64,
    pub writer: String,
}

/// Per-kind figures of a pause run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub rejected: u64,
    pub a_committed: u64,
    pub never_attempted: u64,
    pub history_rows: u64,
    /// History rows written by a paused writer (`writer` starting `a-`).
    pub a_rows: u64,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "paused writer A: {} rejected by the arbiter, {} committed, {} never attempted; \
             {} history rows, {} of them by a paused writer",
            self.rejected, self.a_committed, self.never_attempted, self.history_rows, self.a_rows
        )
    }
}

/// Judges the run. `trials` counts every trial started, failed ones included.
pub fn check(trials: u64, records: &[TrialRecord], history: &[Commit]) -> (Verdict, Figures) {
    let mut v = Verdict {
        trials,
        ..Verdict::default()
    };
    let mut f = Figures {
        history_rows: history.len() as u64,
        ..Figures::default()
    };
    for r in records {
        match r.a {
            Resumed::Rejected => f.rejected += 1,
            Resumed::Committed => f.a_committed += 1,
            Resumed::NeverAttempted => f.never_attempted += 1,
        }
        // Two grants on one resource: the second must be higher.
        if r.b_token <= r.a_token {
            v.token_reuse += 1;
        }
        // The coordinator must still know the last grant it acknowledged.
        if r.coordinator_last < r.b_token {
            v.grants_lost += 1;
        }
    }
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut seen: HashSet<(&str, u64)> = HashSet::new();
    for c in history {
        if c.writer.starts_with(PAUSED_WRITER_PREFIX) {
            f.a_rows += 1;
        }
        if !seen.insert((c.resource.as_str(), c.token)) {
            v.token_reuse += 1;
        }
        let top = highest.entry(c.resource.as_str()).or_insert(0);
        if c.token < *top {
            v.stale_effects += 1;
        }
        *top = (*top).max(c.token);
    }
    (v, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(resource: &str, token: u64, writer: &str) -> Commit {
        Commit {
            resource: resource.into(),
            token,
            writer: writer.into(),
        }
    }

    fn record(a: u64, b: u64, outcome: Resumed, last: u64) -> TrialRecord {
        TrialRecord {
            a_token: a,
            b_token: b,
            a: outcome,
            coordinator_last: last,
        }
    }

    #[test]
    fn a_rejected_paused_writer_is_clean() {
        let (v, f) = check(1, &[record(1, 2, Resumed::Rejected, 2)], &[commit("r", 2, "b")]);
        assert_eq!(v.violations(), 0);
        assert_eq!((f.rejected, f.history_rows), (1, 1));
    }

    #[test]
    fn the_old_token_committed_after_the_new_one_is_a_stale_effect() {
        let history = [commit("r", 2, "b-1"), commit("r", 1, "a-1"), commit("s", 1, "a-2")];
        let (v, f) = check(1, &[record(1, 2, Resumed::Committed, 2)], &history);
        assert_eq!((v.stale_effects, v.token_reuse, f.a_committed, f.a_rows), (1, 0, 1, 2));
    }

    #[test]
    fn reused_and_lost_tokens_are_counted() {
        let history = [commit("r", 2, "b"), commit("r", 2, "a")];
        let (v, _) = check(2, &[record(2, 2, Resumed::Committed, 1)], &history);
        assert_eq!((v.token_reuse, v.grants_lost), (2, 1));
    }
}
