//! The crash trials' bookkeeping, pure: a [`Ledger`] of every grant the
//! coordinator acknowledged across SIGKILLs and restarts, and the in-process
//! [`Arbiter`] the workers commit their effects through.
//!
//! - **token reuse**: a token acknowledged in one incarnation that is not
//!   above every token acknowledged in earlier ones, or acknowledged twice;
//! - **acknowledged grants lost**: right after a restart, the coordinator's
//!   `last_token` for a resource is below a token it acknowledged before the
//!   kill (its first grant would then not be above the highest acknowledged);
//! - **stale effects**: an effect admitted with a token lower than one
//!   admitted before it on the same resource (0 by construction of the
//!   strict rule; recounted from the arbiter's log all the same).

use std::collections::{BTreeSet, HashMap};

use leasefence_core::{FenceMode, ResourceId, Token, admit};

/// Every acknowledged grant, per resource, across incarnations.
#[derive(Debug, Default)]
pub struct Ledger {
    acknowledged: HashMap<String, BTreeSet<u64>>,
    pub grants: u64,
    pub token_reuse: u64,
    pub grants_lost: u64,
}

impl Ledger {
    /// Resources with at least one acknowledged grant.
    pub fn resources(&self) -> Vec<String> {
        let mut r: Vec<String> = self.acknowledged.keys().cloned().collect();
        r.sort();
        r
    }

    /// After a restart: `last` is what the coordinator reports for
    /// `resource`. Every acknowledged token above it was lost.
    pub fn on_restart(&mut self, resource: &str, last: u64) {
        if let Some(set) = self.acknowledged.get(resource) {
            let above = last.checked_add(1).map_or(0, |from| set.range(from..).count());
            self.grants_lost += above as u64;
        }
    }

    /// Records one incarnation's acknowledged grants (it has been killed).
    pub fn close_incarnation(&mut self, grants: &HashMap<String, Vec<u64>>) {
        for (resource, tokens) in grants {
            let set = self.acknowledged.entry(resource.clone()).or_default();
            let floor = set.last().copied().unwrap_or(0);
            for &t in tokens {
                self.grants += 1;
                let fresh = set.insert(t);
                if !fresh || t <= floor {
                    self.token_reuse += 1;
                }
            }
        }
    }
}

/// A fenced in-memory store, applying the core's strict rule; it outlives
/// the coordinator's incarnations.
#[derive(Debug, Default)]
pub struct Arbiter {
    last: HashMap<String, Token>,
    /// Admitted effects in admission order.
    log: Vec<(String, u64)>,
    pub rejected: u64,
}

impl Arbiter {
    /// The effect of the holder of `token` on `resource`: admitted or not.
    pub fn effect(&mut self, resource: &ResourceId, token: Token) -> bool {
        let current = self.last.get(resource.as_str()).copied();
        match admit(FenceMode::Strict, resource, current, token) {
            Ok(()) => {
                self.last.insert(resource.to_string(), token);
                self.log.push((resource.to_string(), token.get()));
                true
            }
            Err(_) => {
                self.rejected += 1;
                false
            }
        }
    }

    pub fn admitted(&self) -> u64 {
        self.log.len() as u64
    }

    /// Admitted effects whose token is below one admitted before them.
    pub fn stale_effects(&self) -> u64 {
        let mut top: HashMap<&str, u64> = HashMap::new();
        let mut stale = 0;
        for (resource, token) in &self.log {
            let t = top.entry(resource.as_str()).or_insert(0);
            if *token < *t {
                stale += 1;
            }
            *t = (*t).max(*token);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(list: &[(&str, &[u64])]) -> HashMap<String, Vec<u64>> {
        list.iter().map(|(r, t)| (r.to_string(), t.to_vec())).collect()
    }

    #[test]
    fn tokens_continuing_above_the_last_incarnation_are_clean() {
        let mut l = Ledger::default();
        l.close_incarnation(&grants(&[("a", &[1, 2, 3]), ("b", &[1])]));
        l.on_restart("a", 3);
        l.on_restart("b", 1);
        l.close_incarnation(&grants(&[("a", &[4, 5])]));
        assert_eq!((l.grants, l.token_reuse, l.grants_lost), (6, 0, 0));
    }

    #[test]
    fn a_forgotten_grant_is_lost_and_its_token_reused() {
        let mut l = Ledger::default();
        l.close_incarnation(&grants(&[("a", &[1, 2, 3])]));
        l.on_restart("a", 2);
        l.close_incarnation(&grants(&[("a", &[3, 4, 4])]));
        assert_eq!((l.grants_lost, l.token_reuse), (1, 2));
    }

    #[test]
    fn the_arbiter_rejects_old_tokens_and_its_log_stays_ordered() {
        let r = ResourceId::new("r").expect("valid");
        let t = |n| Token::new(n).expect("non-zero");
        let mut a = Arbiter::default();
        assert!(a.effect(&r, t(2)));
        assert!(!a.effect(&r, t(1)));
        assert!(!a.effect(&r, t(2)));
        assert!(a.effect(&r, t(3)));
        assert_eq!((a.admitted(), a.rejected, a.stale_effects()), (2, 2, 0));
        a.log.push(("r".into(), 1));
        assert_eq!(a.stale_effects(), 1);
    }
}
