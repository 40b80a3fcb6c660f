//! A [`SharedStore`] in memory: the reference the shared-store conformance
//! suite compares against, and a stand-in engine for the server's tests of
//! leadership (several coordinators in one process share one instance).
//! Not durable; its clock is this process's monotonic clock.

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
}

/// Clones share one engine.
#[derive(Clone, Debug, Default)]
pub struct MemoryShared {
    state: Arc<Mutex<State>>,
    records: MemoryStore,
}

impl MemoryShared {
    pub fn new() -> MemoryShared {
        MemoryShared::default()
    }

    /// Makes the engine unreachable (`true`) or reachable again, for tests.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
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
        let now = Instant::now();
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
        let now = Instant::now();
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
        Ok(live(&s, Instant::now()).map(|a| LeaderInfo {
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
        self.shared.records.clone().apply(batch)
    }
}
