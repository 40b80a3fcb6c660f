//! Loss notification: what a holder waits on to learn that it must stop.
//!
//! The keep-alive task publishes a [`State`] on a `watch` channel: the send
//! time of the last renewal that succeeded, the deadline derived from it, and
//! a [`Loss`] once one is known. [`LeaseWatch::lost`] fires at the deadline by
//! itself, with its own timer, so it fires on time even when the keep-alive
//! task is stuck or the coordinator cannot be reached. Times are readings of
//! the client's [`Clock`] (`CLOCK_BOOTTIME` on Linux: a suspend counts).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Clock, Stamp, sleep_until};

/// Why a lease can no longer be proven held. Once lost, a lease stays lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Loss {
    /// No renewal succeeded in time: the self-fencing deadline passed
    /// (coordinator unreachable, process paused, renewals too slow).
    #[error("no renewal succeeded before the self-fencing deadline")]
    Expired,
    /// The coordinator refused a renewal: the lease expired, was released or
    /// is unknown there.
    #[error("the coordinator refused the renewal: the lease expired or was released")]
    Revoked,
    /// The coordinator renewed the lease with a different token (a protocol
    /// violation; the lease is not trusted any more).
    #[error("the coordinator answered a renewal with another token")]
    TokenChanged,
    /// The holder released the lease.
    #[error("the lease was released")]
    Released,
    /// The [`crate::Lease`] was dropped; its keep-alive stopped.
    #[error("the lease handle was dropped")]
    Dropped,
}

/// What the keep-alive task knows about the lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct State {
    /// Send time of the acquire or renewal that last succeeded.
    pub renewed_at: Stamp,
    /// The lease is provably held before this reading, not at or after it.
    pub deadline: Stamp,
    pub loss: Option<Loss>,
}

impl State {
    fn lost_at(&self, now: Stamp) -> Option<Loss> {
        match self.loss {
            Some(l) => Some(l),
            None if now >= self.deadline => Some(Loss::Expired),
            None => None,
        }
    }
}

/// The published state and the clock its times are readings of.
#[derive(Debug)]
pub(crate) struct Shared {
    tx: watch::Sender<State>,
    clock: Arc<dyn Clock>,
}

impl Shared {
    pub(crate) fn new(state: State, clock: Arc<dyn Clock>) -> StateTx {
        let (tx, _) = watch::channel(state);
        Arc::new(Shared { tx, clock })
    }

    pub(crate) fn now(&self) -> Stamp {
        self.clock.now()
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    pub(crate) fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            rx: self.tx.subscribe(),
            clock: self.clock.clone(),
        }
    }
}

impl Deref for Shared {
    type Target = watch::Sender<State>;

    fn deref(&self) -> &watch::Sender<State> {
        &self.tx
    }
}

pub(crate) type StateTx = Arc<Shared>;

/// Marks the lease lost with `loss`, unless it already is (the first loss wins).
pub(crate) fn set_lost(tx: &StateTx, loss: Loss) {
    let now = tx.now();
    tx.send_if_modified(|s| {
        let fresh = s.loss.is_none();
        if fresh {
            s.loss = Some(s.lost_at(now).unwrap_or(loss));
        }
        fresh
    });
}

/// A cheap, cloneable, `'static` view of a lease's liveness.
#[derive(Clone, Debug)]
pub struct LeaseWatch {
    rx: watch::Receiver<State>,
    clock: Arc<dyn Clock>,
}

impl LeaseWatch {
    /// True once the lease can no longer be proven held (its deadline passed
    /// or a loss was reported). Checks the clock, not only the flag.
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// The loss, if the lease is lost now.
    pub fn loss(&self) -> Option<Loss> {
        let state = *self.rx.borrow();
        if self.rx.has_changed().is_err() {
            return Some(state.loss.unwrap_or(Loss::Dropped));
        }
        state.lost_at(self.clock.now())
    }

    /// The current self-fencing deadline (it moves forward with each
    /// renewal), as a reading of the lease's clock (compare with [`Self::now`]).
    pub fn deadline(&self) -> Stamp {
        self.rx.borrow().deadline
    }

    /// The send time of the acquire or renewal that last succeeded.
    pub fn renewed_at(&self) -> Stamp {
        self.rx.borrow().renewed_at
    }

    /// Now, on the clock the deadline is kept on.
    pub fn now(&self) -> Stamp {
        self.clock.now()
    }

    /// How long until the deadline; zero once it passed.
    pub fn time_left(&self) -> Duration {
        self.deadline().saturating_since(self.clock.now())
    }

    /// Completes when the lease is lost: at the deadline even if nothing else
    /// happens, or earlier on a refusal, a release or a drop.
    pub async fn lost(mut self) -> Loss {
        loop {
            let state = *self.rx.borrow_and_update();
            if let Some(loss) = state.lost_at(self.clock.now()) {
                return loss;
            }
            tokio::select! {
                biased;
                () = sleep_until(self.clock.as_ref(), state.deadline) => return Loss::Expired,
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return self.rx.borrow().loss.unwrap_or(Loss::Dropped);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::clock::TokioClock;
    use crate::clock::tests::ManualClock;

    fn channel_on(clock: Arc<dyn Clock>, deadline_in: Duration) -> (StateTx, LeaseWatch) {
        let now = clock.now();
        let tx = Shared::new(
            State {
                renewed_at: now,
                deadline: now.saturating_add(deadline_in),
                loss: None,
            },
            clock,
        );
        let w = tx.watch();
        (tx, w)
    }

    fn channel(deadline_in: Duration) -> (StateTx, LeaseWatch) {
        channel_on(Arc::new(TokioClock::new()), deadline_in)
    }

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_deadline_with_nobody_renewing() {
        let (_tx, w) = channel(Duration::from_millis(900));
        let start = Instant::now();
        assert!(!w.is_lost());
        assert_eq!(w.clone().lost().await, Loss::Expired);
        assert_eq!(start.elapsed(), Duration::from_millis(900));
        assert!(w.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_moves_the_deadline_and_a_refusal_fires_at_once() {
        let (tx, w) = channel(Duration::from_millis(900));
        let start = Instant::now();
        let waiter = tokio::spawn(w.clone().lost());
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.send_modify(|s| s.deadline = s.renewed_at.saturating_add(Duration::from_millis(1_500)));
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!waiter.is_finished(), "the moved deadline holds at 1200 ms");
        set_lost(&tx, Loss::Revoked);
        assert_eq!(waiter.await.expect("joined"), Loss::Revoked);
        assert_eq!(start.elapsed(), Duration::from_millis(1_200));
        set_lost(&tx, Loss::Released);
        assert_eq!(w.loss(), Some(Loss::Revoked), "the first loss wins");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_sender_is_a_loss() {
        let (tx, w) = channel(Duration::from_secs(60));
        drop(tx);
        assert_eq!(w.loss(), Some(Loss::Dropped));
        assert_eq!(w.lost().await, Loss::Dropped);
    }

    #[tokio::test(start_paused = true)]
    async fn time_spent_suspended_counts_towards_the_deadline() {
        // The lease's clock jumps as CLOCK_BOOTTIME does over a suspend,
        // while tokio's (monotonic) clock does not move.
        let clock = Arc::new(ManualClock::default());
        let (_tx, w) = channel_on(clock.clone(), Duration::from_secs(30));
        let waiter = tokio::spawn(w.clone().lost());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!w.is_lost() && !waiter.is_finished());
        let resumed_at = Instant::now();
        clock.advance(Duration::from_secs(31));
        assert_eq!(w.loss(), Some(Loss::Expired), "lost at once, by the clock");
        assert_eq!(waiter.await.expect("joined"), Loss::Expired);
        assert!(
            resumed_at.elapsed() <= crate::clock::RECHECK,
            "noticed within a recheck"
        );
    }
}
