//! A [`SharedStore`] in memory: the reference the shared-store conformance
//! suite compares against, and a stand-in engine for the server's tests of
//! leadership (several coordinators in one process share one instance).
//! Not durable; its clock is this process's monotonic clock, unless built with
//! [`MemoryShared::with_clock`] (a deterministic simulation judges leadership
//! by its simulated time, and must never read a real clock).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasefence_core::{Mutation, StoredResource};

use crate::shared::{Epoch, LeaderInfo, SharedStore};
use crate::{LeaseStore, MemoryStore, StoreError};

#[derive(Debug, Default)]
struct State {
    epoch: Epoch,
    /// The leader of `epoch` and when its leadership lapses, while it has one.
    leader: Option<(String, Instant)>,
    /// Set by a test: every call fails as an unreachable engine would.
    unreachable: bool,
    /// Set by a test: every write takes effect, and its answer is lost.
    answers_lost: bool,
}

/// The engine's clock: what "now" is when leadership expiry is judged.
type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Clones share one engine (and its clock).
#[derive(Clone)]
pub struct MemoryShared {
    state: Arc<Mutex<State>>,
    records: MemoryStore,
    clock: Clock,
}

impl Default for MemoryShared {
    fn default() -> MemoryShared {
        MemoryShared::with_clock(Instant::now)
    }
}

impl std::fmt::Debug for MemoryShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryShared")
            .field("state", &self.state)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl MemoryShared {
    pub fn new() -> MemoryShared {
        MemoryShared::default()
    }

    /// An engine whose clock is `clock` instead of [`Instant::now`]; only
    /// differences between its readings matter, so a clock of
    /// `origin + simulated time` gives the same verdicts on every run.
    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> MemoryShared {
        MemoryShared {
            state: Arc::default(),
            records: MemoryStore::new(),
            clock: Arc::new(clock),
        }
    }

    fn now(&self) -> Instant {
        (self.clock)()
    }

    /// Makes the engine unreachable (`true`) or reachable again, for tests.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
    }

    /// Makes every write take effect and then fail as a write whose answer
    /// was lost (`true`), or answer again, for tests.
    pub fn set_answers_lost(&self, lost: bool) {
        self.lock().answers_lost = lost;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reach(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        let s = self.lock();
        if s.unreachable {
            return Err(StoreError::Unavailable(
                "the in-memory engine is set unreachable".into(),
            ));
        }
        Ok(s)
    }
}

fn live(s: &State, now: Instant) -> Option<&str> {
    s.leader
        .as_ref()
        .filter(|(_, until)| *until > now)
        .map(|(a, _)| a.as_str())
}

fn deposed(epoch: Epoch, s: &State) -> StoreError {
    StoreError::Deposed {
        epoch,
        current: s.epoch,
    }
}

impl SharedStore for MemoryShared {
    type Writer = MemoryWriter;

    fn campaign(&self, advertise: &str, ttl: Duration) -> Result<Option<Epoch>, StoreError> {
        let mut s = self.reach()?;
        let now = self.now();
        if live(&s, now).is_some() {
            return Ok(None);
        }
        s.epoch += 1;
        s.leader = Some((advertise.to_string(), now + ttl));
        Ok(Some(s.epoch))
    }

    fn renew(&self, epoch: Epoch, ttl: Duration) -> Result<(), StoreError> {
        let mut s = self.reach()?;
        if s.epoch != epoch {
            return Err(deposed(epoch, &s));
        }
        let now = self.now();
        match &mut s.leader {
            Some((_, until)) => {
                *until = now + ttl;
                Ok(())
            }
            None => Err(deposed(epoch, &s)),
        }
    }

    fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        let s = self.reach()?;
        Ok(live(&s, self.now()).map(|a| LeaderInfo {
            epoch: s.epoch,
            advertise: a.to_string(),
        }))
    }

    fn resign(&self, epoch: Epoch) -> Result<(), StoreError> {
        let mut s = self.reach()?;
        if s.epoch == epoch {
            s.leader = None;
        }
        Ok(())
    }

    fn writer(&self, epoch: Epoch) -> Result<MemoryWriter, StoreError> {
        Ok(MemoryWriter {
            shared: self.clone(),
            epoch,
        })
    }
}

/// The epoch-fenced writer of a [`MemoryShared`].
#[derive(Debug)]
pub struct MemoryWriter {
    shared: MemoryShared,
    epoch: Epoch,
}

impl LeaseStore for MemoryWriter {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let _s = self.shared.reach()?;
        self.shared.records.clone().load()
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        // The epoch check and the write under one lock: one transaction.
        let s = self.shared.reach()?;
        if s.epoch != self.epoch {
            return Err(deposed(self.epoch, &s));
        }
        self.shared.records.clone().apply(batch)?;
        if s.answers_lost {
            return Err(StoreError::Indeterminate(
                "the in-memory engine is set to lose its answers".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A clock a test moves by hand: `origin` plus the millis in `now`.
    fn manual_clock() -> (Arc<AtomicU64>, impl Fn() -> Instant + Send + Sync + 'static) {
        let now = Arc::new(AtomicU64::new(0));
        let origin = Instant::now();
        let reader = Arc::clone(&now);
        (now, move || {
            origin + Duration::from_millis(reader.load(Ordering::SeqCst))
        })
    }

    #[test]
    fn leadership_lapses_by_the_injected_clock_not_the_process_clock() {
        let (now, clock) = manual_clock();
        let shared = MemoryShared::with_clock(clock);
        let ttl = Duration::from_secs(3600);
        assert_eq!(shared.campaign("a", ttl), Ok(Some(1)));
        assert_eq!(shared.campaign("b", ttl), Ok(None));
        // An hour on the injected clock, however little real time has passed.
        now.store(3_600_000, Ordering::SeqCst);
        assert_eq!(shared.leader(), Ok(None));
        assert_eq!(shared.campaign("b", ttl), Ok(Some(2)));
        assert_eq!(shared.renew(1, ttl), Err(StoreError::Deposed { epoch: 1, current: 2 }));
        // Renewal extends from the injected now: live just before now + ttl, not at it.
        now.store(3_600_500, Ordering::SeqCst);
        assert_eq!(shared.renew(2, ttl), Ok(()));
        now.store(7_200_499, Ordering::SeqCst);
        assert!(shared.leader().is_ok_and(|l| l.is_some_and(|l| l.epoch == 2)));
        now.store(7_200_500, Ordering::SeqCst);
        assert_eq!(shared.leader(), Ok(None));
    }

    #[test]
    fn clones_share_the_injected_clock() {
        let (now, clock) = manual_clock();
        let shared = MemoryShared::with_clock(clock);
        let other = shared.clone();
        assert_eq!(shared.campaign("a", Duration::from_millis(10)), Ok(Some(1)));
        now.store(10, Ordering::SeqCst);
        assert_eq!(other.campaign("b", Duration::from_millis(10)), Ok(Some(2)));
    }
}
