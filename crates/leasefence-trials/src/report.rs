//! The verdict every trial kind ends with: one summary line in a fixed form,
//! and the exit code derived from it.
//!
//! ```text
//! 1000 trials, 0 stale effects, 0 token reuse, 0 acknowledged grants lost
//! ```
//!
//! A violation (any of the three counts above zero) exits 1. A run in which
//! some trials could not be carried out at all (a child timed out, PostgreSQL
//! refused a connection) checked less than it claims: it exits 2 even with
//! zero violations, after saying how many trials failed and why.

use std::fmt;

/// Exit code when every count is zero and every trial ran.
pub const EXIT_OK: i32 = 0;
/// Exit code when the invariant (or a token rule) was violated.
pub const EXIT_VIOLATION: i32 = 1;
/// Exit code when the counts are zero but some trials did not complete.
pub const EXIT_INCOMPLETE: i32 = 2;

/// The three counts every trial kind reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub trials: u64,
    /// Effects committed with a token lower than one committed before them.
    pub stale_effects: u64,
    /// Tokens committed or granted twice (or granted out of order).
    pub token_reuse: u64,
    /// Grants acknowledged to a client that the coordinator later forgot.
    pub grants_lost: u64,
}

impl Verdict {
    pub fn violations(&self) -> u64 {
        self.stale_effects + self.token_reuse + self.grants_lost
    }

    /// The process exit code for this verdict, given how many trials failed
    /// to complete.
    pub fn exit_code(&self, incomplete: u64) -> i32 {
        if self.violations() > 0 {
            EXIT_VIOLATION
        } else if incomplete > 0 {
            EXIT_INCOMPLETE
        } else {
            EXIT_OK
        }
    }
}

impl Verdict {
    /// The exit code of a control run (the arbiter switched off): 0 only when
    /// stale effects got through, because a control that finds nothing shows
    /// the trials do not exercise the fault; 2 when trials failed to complete.
    pub fn control_exit_code(&self, incomplete: u64) -> i32 {
        if incomplete > 0 {
            EXIT_INCOMPLETE
        } else if self.stale_effects > 0 {
            EXIT_OK
        } else {
            EXIT_VIOLATION
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} trials, {} stale effects, {} token reuse, {} acknowledged grants lost",
            self.trials, self.stale_effects, self.token_reuse, self.grants_lost
        )
    }
}

/// Trial failures that were not verdicts: counted, the first few kept.
#[derive(Debug, Default)]
pub struct Failures {
    count: u64,
    first: Vec<String>,
}

impl Failures {
    const KEPT: usize = 5;

    pub fn push(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < Self::KEPT {
            self.first.push(what);
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Prints the kept messages to stderr.
    pub fn print(&self) {
        for f in &self.first {
            eprintln!("trial failed: {f}");
        }
        if self.count > self.first.len() as u64 {
            eprintln!("… and {} more failed trials", self.count - self.first.len() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_has_the_fixed_form() {
        let v = Verdict {
            trials: 7,
            stale_effects: 1,
            token_reuse: 2,
            grants_lost: 3,
        };
        assert_eq!(
            v.to_string(),
            "7 trials, 1 stale effects, 2 token reuse, 3 acknowledged grants lost"
        );
        assert_eq!(v.exit_code(0), EXIT_VIOLATION);
        let clean = Verdict {
            trials: 7,
            ..Verdict::default()
        };
        assert_eq!(clean.exit_code(0), EXIT_OK);
        assert_eq!(clean.exit_code(1), EXIT_INCOMPLETE);
    }

    #[test]
    fn a_control_passes_only_when_it_catches_stale_effects() {
        let caught = Verdict {
            trials: 3,
            stale_effects: 3,
            ..Verdict::default()
        };
        assert_eq!(caught.control_exit_code(0), EXIT_OK);
        assert_eq!(caught.control_exit_code(1), EXIT_INCOMPLETE);
        let missed = Verdict {
            trials: 3,
            ..Verdict::default()
        };
        assert_eq!(missed.control_exit_code(0), EXIT_VIOLATION);
    }
}
