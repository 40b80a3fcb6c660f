//! A stateright model of the protocol, small enough to explore every interleaving.
//!
//! One resource, a coordinator with a durable store (group commit: a grant is
//! answered only by the fsync that makes it durable), 2–3 clients and an arbiter
//! applying the real `leasefence_core::admit` rule. The network is a set of
//! messages that may be delivered in any order, more than once, or never
//! (reordering, duplication, loss). Leases expire at any moment (expiry as a
//! nondeterministic timer, which also covers pauses and clock skew: a client may
//! act on its lease at any time after it got it). The coordinator may crash,
//! losing memory and unsynced mutations, and recover from the durable records.
//!
//! Bounds keep the check fast: tokens up to `tokens_max`, one crash, one
//! duplicated delivery (a delivery normally consumes its message).

use std::collections::BTreeSet;

use leasefence_core::{FenceMode, ResourceId, Token, admit};
use stateright::{Model, Property};

mod check;
pub use check::{ModelReport, check, check_model};

/// No grant beyond this token by default: bounds the state space.
pub const TOKENS_MAX: u8 = 4;
pub const CRASHES_MAX: u8 = 1;
pub const DUPLICATES_MAX: u8 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseModel {
    pub clients: u8,
    /// No grant beyond this token.
    pub tokens_max: u8,
    pub fencing: bool,
    /// A deliberately broken coordinator that answers before the fsync: the
    /// check must then find token reuse (proof that the property can fail).
    pub answer_before_durable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pending {
    Grant { client: u8, token: u8 },
    Release { token: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Granted {
        client: u8,
        token: u8,
    },
    /// Who sent it does not matter to the arbiter, so it is not in the state.
    Effect {
        token: u8,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub up: bool,
    pub crashes: u8,
    pub duplicates: u8,
    /// The coordinator's memory: last token and its holder (holding `last`).
    pub last: u8,
    pub held: Option<u8>,
    pub pending: Vec<Pending>,
    /// The store's records.
    pub durable_last: u8,
    pub durable_held: Option<u8>,
    /// The token each client believes it holds.
    pub holding: Vec<Option<u8>>,
    pub net: BTreeSet<Msg>,
    pub arbiter_last: Option<u8>,
    /// History facts the properties read.
    pub max_answered: u8,
    pub answered_bad: bool,
    pub max_admitted: u8,
    pub stale_admitted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Grant(u8),
    Fsync,
    Expire,
    SendEffect(u8),
    Deliver(Msg),
    /// Deliver and keep it in flight, to be delivered again.
    Duplicate(Msg),
    Drop(Msg),
    Crash,
    Restart,
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            up: true,
            crashes: 0,
            duplicates: 0,
            last: 0,
            held: None,
            pending: Vec::new(),
            durable_last: 0,
            durable_held: None,
            holding: vec![None; usize::from(self.clients)],
            net: BTreeSet::new(),
            arbiter_last: None,
            max_answered: 0,
            answered_bad: false,
            max_admitted: 0,
            stale_admitted: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.up {
            if s.held.is_none() && s.last < self.tokens_max {
                actions.extend((0..self.clients).map(Action::Grant));
            }
            if !s.pending.is_empty() {
                actions.push(Action::Fsync);
            }
            if s.held.is_some() {
                actions.push(Action::Expire);
            }
            if s.crashes < CRASHES_MAX {
                actions.push(Action::Crash);
            }
        } else {
            actions.push(Action::Restart);
        }
        for (c, h) in (0..self.clients).zip(&s.holding) {
            if h.is_some() {
                actions.push(Action::SendEffect(c));
            }
        }
        for m in &s.net {
            actions.push(Action::Deliver(*m));
            if s.duplicates < DUPLICATES_MAX {
                actions.push(Action::Duplicate(*m));
            }
            actions.push(Action::Drop(*m));
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Grant(client) => {
                let token = n.last + 1;
                n.last = token;
                n.held = Some(client);
                n.pending.push(Pending::Grant { client, token });
                if self.answer_before_durable {
                    answer(&mut n, client, token);
                }
            }
            Action::Fsync => self.fsync(&mut n),
            Action::Expire => {
                n.held.take()?;
                n.pending.push(Pending::Release { token: n.last });
            }
            Action::SendEffect(c) => {
                let token = n.holding.get_mut(usize::from(c))?.take()?;
                n.net.insert(Msg::Effect { token });
            }
            Action::Deliver(m) => {
                n.net.remove(&m);
                self.deliver(&mut n, m);
            }
            Action::Duplicate(m) => {
                n.duplicates += 1;
                self.deliver(&mut n, m);
            }
            Action::Drop(m) => {
                n.net.remove(&m);
            }
            Action::Crash => {
                n.up = false;
                n.crashes += 1;
                n.pending.clear();
                n.held = None;
                n.last = 0;
            }
            Action::Restart => {
                // Coordinator::recover: the recorded lease stays held (its full TTL from now).
                n.up = true;
                n.last = n.durable_last;
                n.held = n.durable_held;
            }
        }
        (n != *s).then_some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no stale effect", |_, s: &State| !s.stale_admitted),
            Property::always("no token reuse", |_, s: &State| !s.answered_bad),
            Property::sometimes("takeover", |_, s: &State| s.holding.iter().flatten().count() >= 2),
        ]
    }
}

/// Records an answered grant (the history check) and puts the reply on the wire.
fn answer(n: &mut State, client: u8, token: u8) {
    // Answered tokens must strictly increase: equal is reuse, lower is a regression.
    if token <= n.max_answered {
        n.answered_bad = true;
    }
    n.max_answered = n.max_answered.max(token);
    n.net.insert(Msg::Granted { client, token });
}

impl LeaseModel {
    /// One group commit: every pending mutation becomes durable, then grants are answered.
    fn fsync(&self, n: &mut State) {
        for p in std::mem::take(&mut n.pending) {
            match p {
                Pending::Grant { client, token } => {
                    n.durable_last = token;
                    n.durable_held = Some(client);
                    if !self.answer_before_durable {
                        answer(n, client, token);
                    }
                }
                Pending::Release { token } => {
                    if n.durable_last == token {
                        n.durable_held = None;
                    }
                }
            }
        }
    }

    fn deliver(&self, n: &mut State, m: Msg) {
        match m {
            Msg::Granted { client, token } => {
                if let Some(slot @ None) = n.holding.get_mut(usize::from(client)) {
                    *slot = Some(token);
                }
            }
            Msg::Effect { token, .. } => {
                let resource = ResourceId::new("r").expect("static name is valid");
                let current = n.arbiter_last.and_then(|t| Token::new(u64::from(t)));
                let Some(presented) = Token::new(u64::from(token)) else {
                    return;
                };
                let ok = !self.fencing || admit(FenceMode::Strict, &resource, current, presented).is_ok();
                if ok {
                    if token < n.max_admitted {
                        n.stale_admitted = true;
                    }
                    n.max_admitted = n.max_admitted.max(token);
                    n.arbiter_last = Some(token);
                }
            }
        }
    }
}
