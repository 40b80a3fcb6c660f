//! The history of a run and the checker that judges it.
//!
//! The history holds only facts observed at the two places that matter: every
//! grant the coordinator *answered* (sent after it was durable) and every effect
//! the arbiter *admitted*. The checker re-derives the invariants from those facts
//! alone, without trusting the arbiter's or the coordinator's own state.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use leasefence_core::{ResourceId, Token};

/// A grant as answered by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnsweredGrant {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub token: Token,
    pub client: usize,
    /// How many times the coordinator had restarted when it answered.
    pub incarnation: u64,
}

/// An effect as admitted by the arbiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmittedEffect {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub token: Token,
    pub client: usize,
    pub payload: u64,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub grants: Vec<AnsweredGrant>,
    pub admitted: Vec<AdmittedEffect>,
    /// A durable write the store refused (a token regression reached the store).
    pub store_refusals: Vec<String>,
}

/// One broken rule, with what is needed to find it in the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The invariant: an effect with `token` admitted after one with `after` > it.
    StaleEffect {
        resource: ResourceId,
        token: Token,
        after: Token,
        at_ms: u64,
    },
    /// Strict mode: one grant authorizes one effect; this token was admitted twice.
    TokenAdmittedTwice {
        resource: ResourceId,
        token: Token,
        at_ms: u64,
    },
    /// Two answered grants carried the same token.
    TokenReused {
        resource: ResourceId,
        token: Token,
        at_ms: u64,
    },
    /// An answered grant was below an earlier answered grant (e.g. after a restart).
    TokenLowered {
        resource: ResourceId,
        token: Token,
        earlier: Token,
        incarnation: u64,
    },
    /// An admitted effect carried a token its sender was never granted.
    UnknownToken {
        resource: ResourceId,
        token: Token,
        client: usize,
    },
    StoreRefused(String),
    /// After the faults healed, this client never got a grant or never an effect in.
    NoProgress {
        client: usize,
        granted: bool,
        admitted: bool,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::StaleEffect {
                resource,
                token,
                after,
                at_ms,
            } => {
                write!(
                    f,
                    "stale effect on {resource}: token {token} admitted after {after} at {at_ms} ms"
                )
            }
            Violation::TokenAdmittedTwice { resource, token, at_ms } => {
                write!(f, "token {token} of {resource} admitted twice (at {at_ms} ms)")
            }
            Violation::TokenReused { resource, token, at_ms } => {
                write!(f, "token {token} of {resource} answered twice (at {at_ms} ms)")
            }
            Violation::TokenLowered {
                resource,
                token,
                earlier,
                incarnation,
            } => write!(
                f,
                "grant of {resource} answered with {token} after {earlier} (coordinator incarnation {incarnation})"
            ),
            Violation::UnknownToken {
                resource,
                token,
                client,
            } => {
                write!(
                    f,
                    "client {client} presented {resource}/{token} that it was never granted"
                )
            }
            Violation::StoreRefused(e) => write!(f, "store refused a write: {e}"),
            Violation::NoProgress {
                client,
                granted,
                admitted,
            } => write!(
                f,
                "no progress after healing: client {client} granted={granted} admitted={admitted}"
            ),
        }
    }
}

/// Checks the safety rules over the whole history and liveness over the healed tail.
pub fn check(h: &History, clients: usize, healed_at_ms: u64) -> Vec<Violation> {
    let mut out: Vec<Violation> = h.store_refusals.iter().cloned().map(Violation::StoreRefused).collect();
    check_grants(h, &mut out);
    check_effects(h, &mut out);
    for client in 0..clients {
        let granted = h.grants.iter().any(|g| g.client == client && g.at_ms >= healed_at_ms);
        let admitted = h.admitted.iter().any(|e| e.client == client && e.at_ms >= healed_at_ms);
        if !(granted && admitted) {
            out.push(Violation::NoProgress {
                client,
                granted,
                admitted,
            });
        }
    }
    out
}

fn check_grants(h: &History, out: &mut Vec<Violation>) {
    let mut seen: BTreeSet<(ResourceId, Token)> = BTreeSet::new();
    let mut highest: BTreeMap<ResourceId, Token> = BTreeMap::new();
    for g in &h.grants {
        if !seen.insert((g.resource.clone(), g.token)) {
            out.push(Violation::TokenReused {
                resource: g.resource.clone(),
                token: g.token,
                at_ms: g.at_ms,
            });
        }
        let top = highest.entry(g.resource.clone()).or_insert(g.token);
        if g.token < *top {
            out.push(Violation::TokenLowered {
                resource: g.resource.clone(),
                token: g.token,
                earlier: *top,
                incarnation: g.incarnation,
            });
        }
        *top = (*top).max(g.token);
    }
}

fn check_effects(h: &History, out: &mut Vec<Violation>) {
    let granted: BTreeSet<(ResourceId, Token, usize)> = h
        .grants
        .iter()
        .map(|g| (g.resource.clone(), g.token, g.client))
        .collect();
    let mut last: BTreeMap<ResourceId, Token> = BTreeMap::new();
    for e in &h.admitted {
        if !granted.contains(&(e.resource.clone(), e.token, e.client)) {
            out.push(Violation::UnknownToken {
                resource: e.resource.clone(),
                token: e.token,
                client: e.client,
            });
        }
        match last.get(&e.resource) {
            Some(prev) if e.token < *prev => out.push(Violation::StaleEffect {
                resource: e.resource.clone(),
                token: e.token,
                after: *prev,
                at_ms: e.at_ms,
            }),
            Some(prev) if e.token == *prev => out.push(Violation::TokenAdmittedTwice {
                resource: e.resource.clone(),
                token: e.token,
                at_ms: e.at_ms,
            }),
            _ => {}
        }
        let top = last.entry(e.resource.clone()).or_insert(e.token);
        *top = (*top).max(e.token);
    }
}

/// A 64-bit FNV-1a digest of the history: two runs of one seed must agree on it.
pub fn digest(h: &History) -> u64 {
    let mut d = Fnv::default();
    for g in &h.grants {
        d.text(&format!(
            "g {} {} {} {} {};",
            g.at_ms, g.resource, g.token, g.client, g.incarnation
        ));
    }
    for e in &h.admitted {
        d.text(&format!(
            "e {} {} {} {} {};",
            e.at_ms, e.resource, e.token, e.client, e.payload
        ));
    }
    for s in &h.store_refusals {
        d.text(s);
    }
    d.0
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn text(&mut self, s: &str) {
        for b in s.bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
