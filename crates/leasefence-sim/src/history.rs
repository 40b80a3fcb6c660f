//! The history of a run and the checker that judges it.
//!
//! The history holds only facts observed at the places that matter: every
//! grant and renewal a coordinator *answered* (sent after it was durable), every
//! release a client sent, every effect the arbiter *admitted*, and what each
//! coordinator loaded from the store when it (re)started or took over. The
//! checker re-derives the invariants from those facts alone, without trusting
//! the arbiter's or the coordinators' own state.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use leasefence_core::{LeaseId, ResourceId, Token};

mod leases;

/// A grant as answered by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnsweredGrant {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub token: Token,
    pub client: usize,
    /// The lease id the client chose; its release names it.
    pub lease_id: LeaseId,
    /// How many times the coordinator had restarted when it answered; with
    /// leadership, the epoch of the term that answered (a takeover is a restart).
    pub incarnation: u64,
    /// The end of the lease by the client-side view: the (true) time the
    /// client sent its acquire, plus the TTL.
    pub valid_until_ms: u64,
}

/// A renewal as answered by a coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnsweredRenewal {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub token: Token,
    pub client: usize,
    pub incarnation: u64,
    /// The time the client sent the renewal, plus the TTL.
    pub valid_until_ms: u64,
}

/// A release as a client sent it: from then on the client no longer counts
/// itself the holder of anything granted under `lease_id`, whatever becomes of
/// the message (a duplicated acquire can be granted again under the same id
/// after the client let go; the client never uses that grant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentRelease {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub lease_id: LeaseId,
    /// The token the client held under it (for the trace).
    pub token: Token,
    pub client: usize,
}

/// What a coordinator loaded from the store to rebuild its machine (after a
/// crash, or on taking over the leadership), as the store served it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    pub at_ms: u64,
    /// The incarnation (or epoch) the load starts.
    pub incarnation: u64,
    pub records: Vec<LoadedRecord>,
}

/// A lease the durable store recorded as ended (released or expired) by an
/// applied batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedLease {
    pub at_ms: u64,
    pub resource: ResourceId,
    pub token: Token,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedRecord {
    pub resource: ResourceId,
    pub last_token: Token,
    /// A lease is recorded as held (under `last_token`).
    pub held: bool,
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
    pub renewals: Vec<AnsweredRenewal>,
    pub releases: Vec<SentRelease>,
    pub loads: Vec<Load>,
    pub ended: Vec<EndedLease>,
    pub admitted: Vec<AdmittedEffect>,
    /// A durable write the store refused (a token regression reached the store).
    pub store_refusals: Vec<String>,
    /// What a replay prints about leadership (no check reads these).
    pub notes: Vec<(u64, String)>,
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
    /// Two leases of one resource were live at once by the client-side view
    /// (each from its answer to its send time + TTL, cut short by the release
    /// its client sent): `token` was answered at `at_ms`, before `other` ended.
    LeasesOverlap {
        resource: ResourceId,
        token: Token,
        other: Token,
        at_ms: u64,
    },
    /// A (re)start or takeover at `at_ms` loaded records that lost an answered
    /// grant: the token did not continue above it, or a lease still live by its
    /// client's view was not recorded as held. `loaded`: the token it loaded.
    GrantLost {
        resource: ResourceId,
        token: Token,
        loaded: Option<Token>,
        at_ms: u64,
    },
    /// The store recorded the end of a lease that was still live by its
    /// client's view: the next coordinator to load would grant it again.
    LiveLeaseEnded {
        resource: ResourceId,
        token: Token,
        at_ms: u64,
    },
    /// A coordinator term answered after a later term had answered: two leaders
    /// answering in turn, or a deposed one that kept answering.
    DeposedAnswered {
        incarnation: u64,
        after: u64,
        at_ms: u64,
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
            Violation::LeasesOverlap {
                resource,
                token,
                other,
                at_ms,
            } => write!(
                f,
                "leases overlap on {resource}: token {token} answered at {at_ms} ms while {other} was live"
            ),
            Violation::GrantLost {
                resource,
                token,
                loaded,
                at_ms,
            } => {
                let loaded = loaded.map_or_else(|| "nothing".to_string(), |t| format!("token {t}"));
                write!(
                    f,
                    "grant lost: the load at {at_ms} ms has {loaded} for {resource}, answered {token} is live or higher"
                )
            }
            Violation::LiveLeaseEnded { resource, token, at_ms } => write!(
                f,
                "the store ended lease {token} of {resource} at {at_ms} ms while it was live"
            ),
            Violation::DeposedAnswered {
                incarnation,
                after,
                at_ms,
            } => write!(
                f,
                "coordinator term {incarnation} answered at {at_ms} ms after term {after} had answered"
            ),
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
    leases::check(h, &mut out);
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
    for r in &h.renewals {
        d.text(&format!("r {} {} {} {};", r.at_ms, r.resource, r.token, r.client));
    }
    for l in &h.loads {
        d.text(&format!("l {} {} {};", l.at_ms, l.incarnation, l.records.len()));
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
