//! The checks leadership adds, from answered facts and client facts alone:
//!
//! - by the client-side view, no two leases of a resource are live at once;
//! - a (re)start or takeover loads every grant answered before it: tokens
//!   continue above it, and a lease still live by its client's view is held;
//! - the store never records the end of a lease still live by its client's
//!   view (else the next coordinator to load grants it again);
//! - terms answer one after another: once a later term has answered, an
//!   earlier one never answers again.
//!
//! A lease's client-side view starts when a coordinator answers its grant and
//! ends at the latest send time of its acquire or of an answered renewal, plus
//! the TTL: a client cannot count on more than that, and a coordinator that
//! honours it must keep everyone else out for that long. A release the client
//! sends ends every lease under its lease id at once.

use std::collections::{BTreeMap, BTreeSet};

use leasefence_core::{LeaseId, ResourceId, Token};

use super::{History, Load, Violation};

/// One lease by the client-side view.
#[derive(Debug, Default)]
struct View {
    /// The first answer (grant or renewal) for it.
    start_ms: u64,
    lease_id: Option<LeaseId>,
    /// Every answer: (answered at, valid until).
    answers: Vec<(u64, u64)>,
    /// The first release its client sent.
    released_ms: Option<u64>,
}

impl View {
    /// Where the view ends counting only answers sent before `at_ms`.
    fn end_before(&self, at_ms: u64) -> u64 {
        let end = self
            .answers
            .iter()
            .filter(|(answered, _)| *answered < at_ms)
            .map(|(_, until)| *until)
            .max()
            .unwrap_or(0);
        self.released_ms.map_or(end, |r| end.min(r))
    }

    fn live_at(&self, at_ms: u64) -> bool {
        self.start_ms < at_ms && self.end_before(at_ms) > at_ms
    }
}

type Views = BTreeMap<ResourceId, BTreeMap<Token, View>>;

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let views = views(h);
    check_overlaps(&views, out);
    for load in &h.loads {
        check_load(h, &views, load, out);
    }
    for e in &h.ended {
        let live = views
            .get(&e.resource)
            .and_then(|v| v.get(&e.token))
            .is_some_and(|v| v.live_at(e.at_ms));
        if live {
            out.push(Violation::LiveLeaseEnded {
                resource: e.resource.clone(),
                token: e.token,
                at_ms: e.at_ms,
            });
        }
    }
    check_terms(h, out);
}

fn views(h: &History) -> Views {
    let mut views = Views::new();
    let answers = h
        .grants
        .iter()
        .map(|g| (&g.resource, g.token, Some(g.lease_id), g.at_ms, g.valid_until_ms))
        .chain(
            h.renewals
                .iter()
                .map(|r| (&r.resource, r.token, None, r.at_ms, r.valid_until_ms)),
        );
    for (resource, token, lease_id, at_ms, until_ms) in answers {
        let view = views
            .entry(resource.clone())
            .or_default()
            .entry(token)
            .or_insert_with(|| View {
                start_ms: at_ms,
                ..View::default()
            });
        view.start_ms = view.start_ms.min(at_ms);
        view.lease_id = view.lease_id.or(lease_id);
        view.answers.push((at_ms, until_ms));
    }
    let mut released: BTreeMap<(&ResourceId, [u8; 16]), u64> = BTreeMap::new();
    for r in &h.releases {
        let at = released.entry((&r.resource, *r.lease_id.as_bytes())).or_insert(r.at_ms);
        *at = (*at).min(r.at_ms);
    }
    for (resource, leases) in &mut views {
        for view in leases.values_mut() {
            view.released_ms = view
                .lease_id
                .and_then(|id| released.get(&(resource, *id.as_bytes())).copied());
        }
    }
    views
}

/// Sweeps each resource's leases by start: one starting before the latest end
/// so far overlaps the lease that ends there.
fn check_overlaps(views: &Views, out: &mut Vec<Violation>) {
    for (resource, leases) in views {
        let mut by_start: Vec<(u64, u64, Token)> = leases
            .iter()
            .map(|(token, v)| (v.start_ms, v.end_before(u64::MAX), *token))
            .filter(|(start, end, _)| start < end)
            .collect();
        by_start.sort();
        let mut latest: Option<(u64, Token)> = None;
        for (start, end, token) in by_start {
            if let Some((other_end, other)) = latest
                && start < other_end
            {
                out.push(Violation::LeasesOverlap {
                    resource: resource.clone(),
                    token,
                    other,
                    at_ms: start,
                });
            }
            if latest.is_none_or(|(e, _)| end > e) {
                latest = Some((end, token));
            }
        }
    }
}

/// At most one violation per resource and load: the highest token it lost.
fn check_load(h: &History, views: &Views, load: &Load, out: &mut Vec<Violation>) {
    let t = load.at_ms;
    let loaded: BTreeMap<&ResourceId, (Token, bool)> = load
        .records
        .iter()
        .map(|r| (&r.resource, (r.last_token, r.held)))
        .collect();
    let mut top: BTreeMap<&ResourceId, Token> = BTreeMap::new();
    for g in h.grants.iter().filter(|g| g.at_ms < t) {
        let e = top.entry(&g.resource).or_insert(g.token);
        *e = (*e).max(g.token);
    }
    let mut lost: BTreeMap<&ResourceId, Token> = BTreeMap::new();
    for (resource, token) in &top {
        if loaded.get(resource).is_none_or(|(last, _)| last < token) {
            lost.insert(resource, *token);
        }
    }
    for (resource, leases) in views {
        for (token, _) in leases.iter().filter(|(_, v)| v.live_at(t)) {
            if loaded.get(resource) != Some(&(*token, true)) {
                let e = lost.entry(resource).or_insert(*token);
                *e = (*e).max(*token);
            }
        }
    }
    for (resource, token) in lost {
        out.push(Violation::GrantLost {
            resource: resource.clone(),
            token,
            loaded: loaded.get(resource).map(|(last, _)| *last),
            at_ms: t,
        });
    }
}

/// Once a later term has answered, an earlier one must never answer again.
fn check_terms(h: &History, out: &mut Vec<Violation>) {
    let mut answers: Vec<(u64, u64)> = h
        .grants
        .iter()
        .map(|g| (g.at_ms, g.incarnation))
        .chain(h.renewals.iter().map(|r| (r.at_ms, r.incarnation)))
        .collect();
    answers.sort();
    let mut highest = None;
    let mut reported = BTreeSet::new();
    for (at_ms, incarnation) in answers {
        match highest {
            Some(after) if incarnation < after => {
                if reported.insert((incarnation, after)) {
                    out.push(Violation::DeposedAnswered {
                        incarnation,
                        after,
                        at_ms,
                    });
                }
            }
            _ => highest = Some(incarnation),
        }
    }
}
