//! One coordinator of a leadership run: standby, candidate, or leader.
//!
//! A standby campaigns every quarter of the leader TTL while the store says
//! nobody leads. The winner renews every third of the leader TTL, loads the
//! records, rebuilds the machine with `Coordinator::recover` and then serves
//! as the single coordinator does (group commit, answer after durable), except
//! that a batch is a store call under its epoch, and that nothing is answered
//! once its self-fencing deadline has passed. Any failed write, a `Deposed`
//! renewal or a store call that outlasts the leader TTL ends the term: the
//! peer drops its machine and stands by (a takeover is a restart, for it too).

use std::time::Duration;

use leasefence_core::{Config, Coordinator, Holder, MonoTime, ResourceId, WaiterId};
use leasefence_store::shared::leader_deadline;
use leasefence_store::{Epoch, StoreError};

use super::{StoreCall, StoreReply};
use crate::config::LeadershipConfig;
use crate::coordinator_node::live::{Handled, Live};
use crate::event::{Ctx, Event};
use crate::net::{Message, Node};

mod faults;
mod term;
use term::Term;

/// A peer's timers and its own faults; stale once the peer's life has moved on.
#[derive(Clone, Debug)]
pub enum PeerEvent {
    CampaignDue,
    RenewDue,
    /// The machine's expiry deadline.
    Tick,
    WaitExpired {
        resource: ResourceId,
        waiter: WaiterId,
    },
    /// A store call (load or batch) still unanswered after a leader TTL.
    CallTimeout {
        call: u64,
    },
    /// The end of a pause.
    Wake,
    Restart,
    /// An armed crash, fired just after the write it waited for left.
    Crash {
        down_ms: u64,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    pub terms: u64,
    pub step_downs: u64,
    /// Terms ended by a `Deposed` answer to a write or renewal.
    pub deposed: u64,
    pub crashes: u64,
    pub pauses: u64,
    /// Pauses that hit a leader whose deadline had passed by the time it woke.
    pub woke_past_deadline: u64,
    pub lost_mutations: u64,
}

#[derive(Debug)]
enum Role {
    Down,
    /// `campaign`: the call in flight and when it was sent.
    Standby {
        campaign: Option<(u64, u64)>,
    },
    /// Won a campaign: renewing, loading (`live` is `None` until loaded), leading.
    Leading(Box<Term>),
}

#[derive(Debug)]
pub struct PeerNode {
    id: usize,
    config: Config,
    ttl: Duration,
    leader_ttl_ms: u64,
    holders: Vec<Holder>,
    /// `false`: a deliberately broken peer that answers past its deadline.
    self_fencing: bool,
    /// Bumped by a crash and by the end of a term: older timers are stale.
    life: u64,
    role: Role,
    /// Who leads, as the last campaign heard.
    hint: Option<usize>,
    next_call: u64,
    paused_until: Option<u64>,
    armed_pause: Option<u64>,
    armed_crash: Option<u64>,
    /// The call the peer was sending when it stopped; it leaves on waking.
    stashed: Option<(u64, StoreCall)>,
    pub stats: PeerStats,
}

impl PeerNode {
    pub fn new(id: usize, clients: usize, ttl_ms: u64, leader: &LeadershipConfig) -> PeerNode {
        let leader_ttl_ms = leader.leader_ttl_ms;
        let holders = (0..clients)
            .map(|i| Holder::new(&format!("client-{i}")).expect("generated holder names are valid"))
            .collect();
        PeerNode {
            id,
            config: Config::default(),
            ttl: Duration::from_millis(ttl_ms),
            leader_ttl_ms,
            holders,
            self_fencing: leader.self_fencing,
            life: 0,
            role: Role::Standby { campaign: None },
            hint: None,
            next_call: 0,
            paused_until: None,
            armed_pause: None,
            armed_crash: None,
            stashed: None,
            stats: PeerStats::default(),
        }
    }

    pub fn start(&mut self, ctx: &mut Ctx<'_>) {
        let first = ctx.rng.range(1, self.leader_ttl_ms / 4);
        self.timer(ctx, ctx.now + first, PeerEvent::CampaignDue);
    }

    /// While paused, everything addressed to the peer waits until this time.
    pub fn paused_until(&self) -> Option<u64> {
        self.paused_until
    }

    /// The epoch this peer believes it leads under, if it has a machine.
    pub fn leading(&self) -> Option<Epoch> {
        match &self.role {
            Role::Leading(t) if t.live.is_some() => Some(t.epoch),
            _ => None,
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Node, msg: Message) {
        match (from, msg) {
            (_, _) if matches!(self.role, Role::Down) => {}
            (Node::Store, Message::StoreReply { req, reply }) => self.on_store_reply(ctx, req, reply),
            (Node::Client(c), msg) => self.on_client(ctx, c, msg),
            _ => {}
        }
    }

    pub fn on_event(&mut self, ctx: &mut Ctx<'_>, life: u64, event: PeerEvent) {
        if life != self.life {
            return;
        }
        match event {
            PeerEvent::CampaignDue => self.campaign(ctx),
            PeerEvent::RenewDue => self.renew(ctx),
            PeerEvent::Tick => {
                if let Some(t) = self.term_mut() {
                    t.tick(ctx.now);
                }
            }
            PeerEvent::WaitExpired { resource, waiter } => {
                if let Some(live) = self.term_mut().and_then(|t| t.live.as_mut()) {
                    live.wait_expired(ctx.now, &resource, waiter);
                }
            }
            PeerEvent::CallTimeout { call } => {
                if self.term_mut().is_some_and(|t| t.waits_for(call)) {
                    self.step_down(ctx, None);
                }
            }
            PeerEvent::Wake => self.wake(ctx),
            PeerEvent::Restart => {
                self.role = Role::Standby { campaign: None };
                self.start(ctx);
            }
            PeerEvent::Crash { down_ms } => self.crash(ctx, down_ms, false),
        }
        self.after_change(ctx);
    }

    fn on_client(&mut self, ctx: &mut Ctx<'_>, client: usize, msg: Message) {
        let Some(holder) = self.holders.get(client).cloned() else {
            return;
        };
        let (id, ttl, hint) = (self.id, self.ttl, self.hint.filter(|h| *h != self.id));
        let now = ctx.now;
        let loading = self.term_mut().is_some();
        let Some(t) = self.term_mut().filter(|t| t.live.is_some()) else {
            // A standby points at who leads; a leader still loading, at itself.
            let leader = if loading { Some(id) } else { hint };
            let reply = Message::NotLeader { req: msg.req(), leader };
            ctx.send(Node::Peer(id), Node::Client(client), reply);
            return;
        };
        let (epoch, answering) = (t.epoch, t.answering(now));
        let Some(live) = t.live.as_mut() else { return };
        match live.handle(now, holder, ttl, client, msg) {
            Handled::Done => {}
            // A renewal is answered at once, unless the term may not answer now.
            Handled::Now(reply, answer) if answering => {
                answer.record(ctx, client, epoch);
                ctx.send(Node::Peer(id), Node::Client(client), reply);
            }
            Handled::Now(reply, answer) => live.hold_reply_now(client, reply, answer),
            Handled::Queued {
                resource,
                waiter,
                wait_ms,
            } => self.timer(ctx, now + wait_ms, PeerEvent::WaitExpired { resource, waiter }),
        }
        self.after_change(ctx);
    }

    fn on_store_reply(&mut self, ctx: &mut Ctx<'_>, call: u64, reply: StoreReply) {
        match (&mut self.role, reply) {
            (
                Role::Standby {
                    campaign: Some((c, sent)),
                },
                StoreReply::Campaign { won, leader },
            ) if *c == call => {
                let sent = *sent;
                self.role = Role::Standby { campaign: None };
                self.hint = leader;
                if let Some(epoch) = won {
                    // The store took the leadership for a TTL from when it got
                    // the call, no earlier than we sent it.
                    self.begin_term(ctx, epoch, sent);
                }
            }
            (Role::Leading(t), StoreReply::Renew(result)) => match result {
                Ok(()) => t.renewed(call, leader_deadline(Duration::from_millis(self.leader_ttl_ms))),
                Err(e @ StoreError::Deposed { .. }) => self.step_down(ctx, Some(e)),
                Err(_) => {}
            },
            (Role::Leading(t), StoreReply::Load(result)) if t.load_call == Some(call) => match result {
                Ok(records) => {
                    t.load_call = None;
                    let machine = Coordinator::recover(self.config.clone(), MonoTime::from_millis(ctx.now), records);
                    t.live = Some(Live::new(machine));
                }
                Err(e) => self.step_down(ctx, Some(e)),
            },
            (Role::Leading(t), StoreReply::Apply(result)) if t.write.is_some_and(|(c, _)| c == call) => match result {
                Ok(()) => t.written(),
                Err(e) => self.step_down(ctx, Some(e)),
            },
            _ => {}
        }
        self.after_change(ctx);
    }

    fn campaign(&mut self, ctx: &mut Ctx<'_>) {
        let Role::Standby { campaign } = &self.role else {
            return;
        };
        // A campaign whose answer never came (a partition) is given up after a leader TTL.
        let due = campaign.is_none_or(|(_, sent)| sent + self.leader_ttl_ms < ctx.now);
        if due {
            let call = self.call(ctx, StoreCall::Campaign);
            self.role = Role::Standby {
                campaign: Some((call, ctx.now)),
            };
        }
        let next = ctx.now + self.leader_ttl_ms / 4 + ctx.rng.range(0, self.leader_ttl_ms / 8);
        self.timer(ctx, next, PeerEvent::CampaignDue);
    }

    fn begin_term(&mut self, ctx: &mut Ctx<'_>, epoch: Epoch, sent_ms: u64) {
        self.stats.terms += 1;
        ctx.note(format!("coordinator {} leads under epoch {epoch}", self.id));
        let deadline = sent_ms + ms(leader_deadline(Duration::from_millis(self.leader_ttl_ms)));
        let mut term = Term::new(epoch, deadline, self.self_fencing);
        let load = self.call(ctx, StoreCall::Load { epoch });
        term.load_call = Some(load);
        self.role = Role::Leading(Box::new(term));
        self.timer(ctx, ctx.now + self.leader_ttl_ms, PeerEvent::CallTimeout { call: load });
        self.timer(ctx, ctx.now + self.leader_ttl_ms / 3, PeerEvent::RenewDue);
    }

    fn renew(&mut self, ctx: &mut Ctx<'_>) {
        let Some(epoch) = self.term_mut().map(|t| t.epoch) else {
            return;
        };
        let call = self.call(ctx, StoreCall::Renew { epoch });
        let now = ctx.now;
        // Answers to renewals sent more than two leader TTLs ago no longer matter.
        let horizon = now.saturating_sub(2 * self.leader_ttl_ms);
        if let Some(t) = self.term_mut() {
            t.renewals.insert(call, now);
            t.renewals.retain(|_, sent| *sent >= horizon);
        }
        self.timer(ctx, now + self.leader_ttl_ms / 3, PeerEvent::RenewDue);
    }

    /// Ends the term: the machine, its queued mutations and held replies are gone.
    fn step_down(&mut self, ctx: &mut Ctx<'_>, error: Option<StoreError>) {
        let why = error
            .as_ref()
            .map_or_else(|| "a store call timed out".to_string(), |e| e.to_string());
        ctx.note(format!("coordinator {} steps down: {why}", self.id));
        if let Role::Leading(t) = &self.role {
            self.stats.lost_mutations += t.live.as_ref().map_or(0, |l| l.pending.len() as u64);
        }
        self.stats.step_downs += 1;
        if matches!(error, Some(StoreError::Deposed { .. })) {
            self.stats.deposed += 1;
        }
        self.life += 1;
        self.role = Role::Standby { campaign: None };
        let next = ctx.now + ctx.rng.range(1, self.leader_ttl_ms / 4);
        self.timer(ctx, next, PeerEvent::CampaignDue);
    }

    /// Answers what may be answered, starts a group commit if one is due, arms the expiry timer.
    fn after_change(&mut self, ctx: &mut Ctx<'_>) {
        if self.paused_until.is_some() {
            return;
        }
        let (id, now) = (self.id, ctx.now);
        let Some(t) = self.term_mut() else { return };
        t.flush(ctx, id);
        let Some((epoch, batch, upto)) = t.next_batch() else {
            self.arm_tick(ctx);
            return;
        };
        let call = self.next_call;
        self.next_call += 1;
        if let Some(t) = self.term_mut() {
            t.write = Some((call, upto));
        }
        let msg = StoreCall::Apply { epoch, batch };
        if let Some(for_ms) = self.armed_pause.take() {
            // Stopped inside the commit: the write leaves when it wakes.
            self.stashed = Some((call, msg));
            self.stop(ctx, for_ms);
            return;
        }
        self.send_call(ctx, call, msg);
        if let Some(down_ms) = self.armed_crash.take() {
            self.timer(ctx, now, PeerEvent::Crash { down_ms });
        }
        self.arm_tick(ctx);
    }

    fn arm_tick(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let Some(at) = self.term_mut().and_then(|t| t.tick_due(now)) else {
            return;
        };
        self.timer(ctx, at, PeerEvent::Tick);
    }

    fn call(&mut self, ctx: &mut Ctx<'_>, call: StoreCall) -> u64 {
        let id = self.next_call;
        self.next_call += 1;
        self.send_call(ctx, id, call);
        id
    }

    fn send_call(&mut self, ctx: &mut Ctx<'_>, id: u64, call: StoreCall) {
        if matches!(call, StoreCall::Apply { .. }) {
            self.timer(ctx, ctx.now + self.leader_ttl_ms, PeerEvent::CallTimeout { call: id });
        }
        ctx.send(Node::Peer(self.id), Node::Store, Message::StoreCall { req: id, call });
    }

    fn timer(&self, ctx: &mut Ctx<'_>, at_ms: u64, event: PeerEvent) {
        let (peer, life) = (self.id, self.life);
        ctx.timer(at_ms, Event::Peer { peer, life, event });
    }

    fn term_mut(&mut self) -> Option<&mut Term> {
        match &mut self.role {
            Role::Leading(t) => Some(t),
            _ => None,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
