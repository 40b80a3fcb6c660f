//! The faults a peer suffers in person: pauses (now, or armed for the moment
//! a group commit is about to leave) and crashes (now, or armed for the moment
//! a write has just left).

use super::{PeerEvent, PeerNode, Role};
use crate::event::Ctx;

impl PeerNode {
    /// Stops the peer now (`mid_commit`: at its next group commit, before the write leaves).
    pub fn pause(&mut self, ctx: &mut Ctx<'_>, for_ms: u64, mid_commit: bool) {
        if mid_commit {
            self.armed_pause = Some(for_ms);
            return;
        }
        self.stop(ctx, for_ms);
    }

    pub(super) fn stop(&mut self, ctx: &mut Ctx<'_>, for_ms: u64) {
        if self.paused_until.is_some() {
            return;
        }
        self.stats.pauses += 1;
        self.paused_until = Some(ctx.now + for_ms);
        self.timer(ctx, ctx.now + for_ms, PeerEvent::Wake);
    }

    /// Carries on where it stopped, unaware of the pause: a write it was
    /// sending leaves now. Its deadline is checked before anything is answered.
    pub(super) fn wake(&mut self, ctx: &mut Ctx<'_>) {
        self.paused_until = None;
        if let Some((call, msg)) = self.stashed.take() {
            self.send_call(ctx, call, msg);
        }
        let now = ctx.now;
        if let Some(t) = self.term_mut()
            && now >= t.deadline_ms
        {
            self.stats.woke_past_deadline += 1;
            ctx.note(format!("coordinator {} wakes past its deadline", self.id));
        }
    }

    pub fn crash(&mut self, ctx: &mut Ctx<'_>, down_ms: u64, mid_fsync: bool) {
        if matches!(self.role, Role::Down) {
            return;
        }
        if mid_fsync && self.term_mut().is_some_and(|t| t.write.is_none()) {
            self.armed_crash = Some(down_ms);
            return;
        }
        if let Role::Leading(t) = &self.role {
            self.stats.lost_mutations += t.live.as_ref().map_or(0, |l| l.pending.len() as u64);
        }
        self.stats.crashes += 1;
        self.life += 1;
        self.role = Role::Down;
        self.paused_until = None;
        self.stashed = None;
        self.timer(ctx, ctx.now + down_ms, PeerEvent::Restart);
    }

    /// The faults have healed: armed pauses and crashes never fire.
    pub fn disarm(&mut self) {
        self.armed_pause = None;
        self.armed_crash = None;
    }
}
