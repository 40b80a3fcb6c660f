//! The failover trials' checker, pure: fed with every grant the clients were
//! answered, what the coordinators later reported, the takeover times and the
//! store rows seen around each pause, it counts the violations.
//!
//! - **token reuse**: per resource, a token answered twice, or a grant that
//!   does not follow real time — answered before a grant with a lower token
//!   was even asked for (that lower token was then handed out later, by a
//!   coordinator that had not seen the higher one);
//! - **acknowledged grants lost**: a token answered to a client that is above
//!   the `last_token` a coordinator reported for its resource afterwards
//!   (right after a takeover, for grants answered before the fault; and once
//!   more after the last trial, for all of them); each grant counts once;
//! - **stale effects**: store rows written under an epoch after it was
//!   deposed (see [`deposed_writes`]);
//! - takeovers slower than the bound (leader TTL + 2 s), reported apart.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// One grant as a client saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub resource: String,
    pub token: u64,
    /// When the acquire was sent, and when its answer arrived.
    pub sent: Instant,
    pub answered: Instant,
    /// Index of the coordinator that answered it.
    pub by: usize,
}

/// Tokens answered twice, and grants out of real-time order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    pub duplicates: u64,
    pub out_of_order: u64,
}

impl TokenCounts {
    pub fn total(&self) -> u64 {
        self.duplicates + self.out_of_order
    }
}

/// Judges the token rules over every answered grant.
pub fn tokens(history: &[Grant]) -> TokenCounts {
    let mut by_resource: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for g in history {
        by_resource.entry(&g.resource).or_default().push(g);
    }
    let mut counts = TokenCounts::default();
    for mut grants in by_resource.into_values() {
        grants.sort_by_key(|g| g.token);
        // The latest send time among strictly lower tokens: a grant answered
        // before it got its token ahead of real time.
        let mut latest_lower_sent: Option<Instant> = None;
        let mut i = 0;
        while i < grants.len() {
            let token = grants[i].token;
            let same = grants[i..].iter().take_while(|g| g.token == token).count();
            counts.duplicates += same as u64 - 1;
            for g in &grants[i..i + same] {
                if latest_lower_sent.is_some_and(|s| g.answered < s) {
                    counts.out_of_order += 1;
                }
            }
            for g in &grants[i..i + same] {
                latest_lower_sent = Some(latest_lower_sent.map_or(g.sent, |s| s.max(g.sent)));
            }
            i += same;
        }
    }
    counts
}

/// Grants lost, each counted once however often it is found missing.
#[derive(Debug, Default)]
pub struct Lost {
    grants: HashSet<(String, u64)>,
}

impl Lost {
    /// `last` is each resource's `last_token` as a coordinator reported it
    /// after every grant of `acknowledged` was answered (absent: none).
    pub fn check(&mut self, acknowledged: &[Grant], last: &HashMap<String, u64>) {
        for g in acknowledged {
            if g.token > last.get(&g.resource).copied().unwrap_or(0) {
                self.grants.insert((g.resource.clone(), g.token));
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.grants.len() as u64
    }
}

/// The time from each fault to the first other coordinator saying it is active.
#[derive(Debug)]
pub struct Takeovers {
    pub bound: Duration,
    pub count: u64,
    pub slowest: Duration,
    pub slower_than_bound: u64,
}

impl Takeovers {
    /// The bound of the design: a standby takes over within leader TTL + 2 s.
    pub fn new(leader_ttl: Duration) -> Takeovers {
        Takeovers {
            bound: leader_ttl + Duration::from_secs(2),
            count: 0,
            slowest: Duration::ZERO,
            slower_than_bound: 0,
        }
    }

    pub fn record(&mut self, took: Duration) {
        self.count += 1;
        self.slowest = self.slowest.max(took);
        if took > self.bound {
            self.slower_than_bound += 1;
        }
    }
}

/// One store row: its resource and its record bytes.
pub type Row = (String, Vec<u8>);

/// The rows carrying a paused leader's epoch after it stepped down that were
/// not there, byte for byte, when it was stopped: what the deposed leader
/// wrote. Rows that left the epoch since (the new leader overwrote them) are
/// fine; a write that reproduced a snapshotted row's exact bytes cannot be
/// told apart and changes nothing.
pub fn deposed_writes(at_stop: &BTreeSet<Row>, after_step_down: &BTreeSet<Row>) -> Vec<String> {
    after_step_down
        .difference(at_stop)
        .map(|(resource, _)| resource.clone())
        .collect()
}

/// The commits the coordinators logged as failed: refused by the epoch
/// check, cut off mid-batch (the engine ended the session of a stopped
/// leader), and any other failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitFailures {
    pub deposed: u64,
    pub cut_off: u64,
    pub other: u64,
}

/// Sorts the coordinators' error lines; the lines that are not a failed
/// commit, and the failed commits of no known kind, are returned for the
/// operator to read.
pub fn commit_failures(log: &[String]) -> (CommitFailures, Vec<&str>) {
    let mut f = CommitFailures::default();
    let mut rest = Vec::new();
    for line in log {
        if !line.contains("store commit failed") {
            rest.push(line.as_str());
        } else if line.contains("error=deposed") {
            f.deposed += 1;
        } else if line.contains("connection closed") || line.contains("Timeout expired") {
            // PostgreSQL closed the stopped leader's connection, or the
            // leader's own request timer to etcd ran out while it was stopped.
            f.cut_off += 1;
        } else {
            f.other += 1;
            rest.push(line.as_str());
        }
    }
    (f, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant on `r` sent at `sent` ms and answered at `answered` ms after `t0`.
    fn g(t0: Instant, r: &str, token: u64, sent: u64, answered: u64) -> Grant {
        Grant {
            resource: r.into(),
            token,
            sent: t0 + Duration::from_millis(sent),
            answered: t0 + Duration::from_millis(answered),
            by: 0,
        }
    }

    #[test]
    fn increasing_tokens_in_real_time_are_clean() {
        let t0 = Instant::now();
        // Overlapping requests may be answered in either order.
        let h = [
            g(t0, "a", 1, 0, 10),
            g(t0, "a", 3, 5, 12),
            g(t0, "a", 2, 6, 30),
            g(t0, "b", 1, 0, 1),
        ];
        assert_eq!(tokens(&h), TokenCounts::default());
    }

    #[test]
    fn a_token_answered_twice_is_reuse() {
        let t0 = Instant::now();
        let h = [g(t0, "a", 1, 0, 10), g(t0, "a", 2, 20, 30), g(t0, "a", 2, 40, 50)];
        assert_eq!(
            tokens(&h),
            TokenCounts {
                duplicates: 1,
                out_of_order: 0
            }
        );
    }

    #[test]
    fn a_higher_token_answered_before_a_lower_one_was_asked_for_is_out_of_order() {
        let t0 = Instant::now();
        // Token 5 answered at 10 ms; token 4 asked for only at 20 ms.
        let h = [g(t0, "a", 5, 0, 10), g(t0, "a", 4, 20, 30), g(t0, "b", 9, 0, 10)];
        assert_eq!(tokens(&h).out_of_order, 1);
        assert_eq!(tokens(&h).total(), 1);
    }

    #[test]
    fn grants_above_the_reported_last_token_are_lost_once() {
        let t0 = Instant::now();
        let h = [g(t0, "a", 1, 0, 1), g(t0, "a", 2, 2, 3), g(t0, "b", 1, 0, 1)];
        let mut lost = Lost::default();
        lost.check(&h, &HashMap::from([("a".to_string(), 2), ("b".to_string(), 1)]));
        assert_eq!(lost.count(), 0);
        lost.check(&h, &HashMap::from([("a".to_string(), 1)]));
        assert_eq!(lost.count(), 2, "a/2 and b/1 (b not reported at all)");
        lost.check(&h, &HashMap::from([("a".to_string(), 1)]));
        assert_eq!(lost.count(), 2, "found twice, counted once");
    }

    #[test]
    fn takeovers_past_the_bound_are_counted() {
        let mut t = Takeovers::new(Duration::from_secs(1));
        t.record(Duration::from_millis(1200));
        t.record(Duration::from_millis(3100));
        assert_eq!(
            (t.count, t.slowest, t.slower_than_bound),
            (2, Duration::from_millis(3100), 1)
        );
    }

    #[test]
    fn only_rows_new_under_the_old_epoch_are_deposed_writes() {
        let row = |r: &str, b: u8| (r.to_string(), vec![b]);
        let at_stop = BTreeSet::from([row("a", 1), row("b", 1)]);
        // "a" was overwritten by the new leader (gone from the epoch): fine.
        assert!(deposed_writes(&at_stop, &BTreeSet::from([row("b", 1)])).is_empty());
        // "b" rewritten and "c" created under the old epoch: two writes.
        let after = BTreeSet::from([row("a", 1), row("b", 2), row("c", 1)]);
        assert_eq!(deposed_writes(&at_stop, &after), vec!["b".to_string(), "c".to_string()]);
    }

    #[test]
    fn failed_commits_in_the_coordinators_log_are_sorted() {
        let log: Vec<String> = [
            "T ERROR leasefence_store::committer: store commit failed; refusing further writes until restart error=deposed: epoch 2 is no longer current (the shard's epoch is 3)",
            "T ERROR leasefence_store::committer: store commit failed; refusing further writes until restart error=store write of unknown outcome (it may or may not have taken effect): PostgreSQL: connection closed (while committing: the batch may or may not have committed)",
            "T ERROR leasefence_store::committer: store commit failed; refusing further writes until restart error=store write of unknown outcome (it may or may not have taken effect): etcd write the batch: grpc request error: code: 'The operation was cancelled', message: \"Timeout expired\"",
            "T ERROR leasefence_store::committer: store commit failed; error=corrupt",
            "T ERROR something else",
        ]
        .map(String::from)
        .to_vec();
        let (f, rest) = commit_failures(&log);
        assert_eq!(
            f,
            CommitFailures {
                deposed: 1,
                cut_off: 2,
                other: 1
            }
        );
        assert_eq!(
            rest,
            vec![
                "T ERROR leasefence_store::committer: store commit failed; error=corrupt",
                "T ERROR something else"
            ],
            "a failed commit of no known kind is shown too"
        );
    }
}
