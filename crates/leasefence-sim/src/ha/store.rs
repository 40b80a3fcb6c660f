//! The shared store as an actor: calls arrive over the network from the
//! peers, run against the real `MemoryShared`, and the replies go back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasefence_core::{Mutation, StoredResource};
use leasefence_store::{Epoch, LeaseStore, MemoryShared, SharedStore, StoreError};

use crate::coordinator_node::{loaded, record_ended};
use crate::event::Ctx;
use crate::net::{Message, Node};

/// A peer's request to the store.
#[derive(Clone, Debug)]
pub enum StoreCall {
    Campaign,
    Renew {
        epoch: Epoch,
    },
    Load {
        epoch: Epoch,
    },
    /// One group commit: one engine transaction under `epoch`.
    Apply {
        epoch: Epoch,
        batch: Vec<Mutation>,
    },
}

#[derive(Clone, Debug)]
pub enum StoreReply {
    /// `won`: the new epoch; otherwise who leads (a peer's index), if anyone.
    Campaign {
        won: Option<Epoch>,
        leader: Option<usize>,
    },
    Renew(Result<(), StoreError>),
    Load(Result<Vec<StoredResource>, StoreError>),
    Apply(Result<(), StoreError>),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub campaigns_won: u64,
    pub batches: u64,
    /// Batches of a deposed leader refused for their epoch (epoch fencing).
    pub deposed_refused: u64,
    /// Batches of a deposed leader applied anyway (the control only).
    pub deposed_landed: u64,
}

#[derive(Debug)]
pub struct StoreNode {
    shared: MemoryShared,
    /// The simulated time the store's clock reads.
    now_ms: Arc<AtomicU64>,
    leader_ttl: Duration,
    epoch_fencing: bool,
    pub stats: StoreStats,
}

impl StoreNode {
    pub fn new(leader_ttl_ms: u64, epoch_fencing: bool) -> StoreNode {
        let now_ms = Arc::new(AtomicU64::new(0));
        let reader = Arc::clone(&now_ms);
        // Only differences between readings matter, so the origin's value
        // never reaches a verdict: the run stays a function of its seed.
        let origin = Instant::now();
        let shared = MemoryShared::with_clock(move || origin + Duration::from_millis(reader.load(Ordering::Relaxed)));
        StoreNode {
            shared,
            now_ms,
            leader_ttl: Duration::from_millis(leader_ttl_ms),
            epoch_fencing,
            stats: StoreStats::default(),
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, peer: usize, msg: Message) {
        let Message::StoreCall { req, call } = msg else {
            return;
        };
        self.now_ms.store(ctx.now, Ordering::Relaxed);
        let reply = match call {
            StoreCall::Campaign => self.campaign(peer),
            StoreCall::Renew { epoch } => StoreReply::Renew(self.shared.renew(epoch, self.leader_ttl)),
            StoreCall::Load { epoch } => {
                let records = self.shared.writer(epoch).and_then(|mut w| w.load());
                if let Ok(records) = &records {
                    ctx.history.loads.push(loaded(ctx.now, epoch, records));
                }
                StoreReply::Load(records)
            }
            StoreCall::Apply { epoch, batch } => StoreReply::Apply(self.apply(ctx, epoch, &batch)),
        };
        ctx.send(Node::Store, Node::Peer(peer), Message::StoreReply { req, reply });
    }

    fn campaign(&mut self, peer: usize) -> StoreReply {
        match self.shared.campaign(&peer.to_string(), self.leader_ttl) {
            Ok(Some(epoch)) => {
                self.stats.campaigns_won += 1;
                StoreReply::Campaign {
                    won: Some(epoch),
                    leader: Some(peer),
                }
            }
            _ => {
                let leader = self
                    .shared
                    .leader()
                    .ok()
                    .flatten()
                    .and_then(|l| l.advertise.parse().ok());
                StoreReply::Campaign { won: None, leader }
            }
        }
    }

    fn apply(&mut self, ctx: &mut Ctx<'_>, epoch: Epoch, batch: &[Mutation]) -> Result<(), StoreError> {
        self.stats.batches += 1;
        // What the records held before, to tell which leases the batch ends.
        let before = self.shared.writer(epoch).and_then(|mut w| w.load()).unwrap_or_default();
        let mut result = self.shared.writer(epoch).and_then(|mut w| w.apply(batch));
        if let Err(StoreError::Deposed { current, .. }) = result {
            if self.epoch_fencing {
                self.stats.deposed_refused += 1;
                ctx.note(format!(
                    "a batch under deposed epoch {epoch} refused (current {current})"
                ));
            } else {
                // The control: the write is not conditional on the epoch. Going
                // through the current epoch's writer applies it as if it were.
                result = self.shared.writer(current).and_then(|mut w| w.apply(batch));
                let landed = if result.is_ok() { "applied" } else { "refused" };
                ctx.note(format!(
                    "a batch of {} mutations under deposed epoch {epoch} (current {current}): {landed}",
                    batch.len()
                ));
                if result.is_ok() {
                    self.stats.deposed_landed += 1;
                }
            }
        }
        match &result {
            Ok(()) => record_ended(ctx, &before, batch),
            Err(e @ (StoreError::TokenRegression { .. } | StoreError::Corrupt { .. })) => {
                ctx.history.store_refusals.push(e.to_string());
            }
            Err(_) => {}
        }
        result
    }
}
