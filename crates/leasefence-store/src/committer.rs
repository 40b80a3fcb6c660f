//! Group commit: the single writer of a store.
//!
//! Callers submit mutations and await an answer; the writer thread takes every
//! mutation waiting at that moment (up to `batch_max`), applies them as one
//! transaction with one fsync, then answers them all. Under load, many grants
//! share one fsync; alone, a grant waits for exactly one.
//!
//! Order is preserved: mutations are applied in submission order, so a caller
//! that submits while holding the coordinator's lock gets the coordinator's order
//! on disk. After a failed commit the writer is poisoned and fails everything
//! after it: the process must restart and reload rather than guess what the
//! disk holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use leasefence_core::Mutation;
use tokio::sync::{mpsc, oneshot};

use crate::{LeaseStore, StoreError};

type Reply = oneshot::Sender<Result<(), StoreError>>;

struct Job {
    mutation: Mutation,
    reply: Option<Reply>,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    mutations: AtomicU64,
}

/// Totals since start, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitterStats {
    pub batches: u64,
    pub mutations: u64,
}

/// Handle to the writer thread. Cloning is cheap; the thread stops once every
/// handle is dropped and the queue is drained.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::UnboundedSender<Job>,
    counters: Arc<Counters>,
}

impl Committer {
    /// Starts the writer thread. `batch_max` bounds one transaction (at least 1).
    pub fn start<S: LeaseStore>(store: S, batch_max: usize) -> Committer {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let spawned = thread::Builder::new()
            .name("leasefence-store-writer".into())
            .spawn(move || write_loop(store, rx, batch_max.max(1), &c));
        if let Err(e) = spawned {
            // Without a writer every submission fails with `Closed`; say why once.
            tracing::error!(error = %e, "cannot start the store writer thread");
        }
        Committer { tx, counters }
    }

    /// Queues `mutation`; the receiver answers once it is durable (or failed).
    pub fn submit(&self, mutation: Mutation) -> oneshot::Receiver<Result<(), StoreError>> {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(job)) = self.tx.send(Job {
            mutation,
            reply: Some(reply),
        }) {
            if let Some(reply) = job.reply {
                let _ = reply.send(Err(StoreError::Closed));
            }
        }
        rx
    }

    /// Queues `mutation` without waiting for it (for expiries: losing one only
    /// delays the next grant by a TTL after a restart, it never endangers safety).
    pub fn submit_detached(&self, mutation: Mutation) {
        let _ = self.tx.send(Job { mutation, reply: None });
    }

    pub fn stats(&self) -> CommitterStats {
        CommitterStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            mutations: self.counters.mutations.load(Ordering::Relaxed),
        }
    }
}

fn write_loop<S: LeaseStore>(mut store: S, mut rx: mpsc::UnboundedReceiver<Job>, batch_max: usize, c: &Counters) {
    let mut poisoned = false;
    let mut jobs: Vec<Job> = Vec::with_capacity(batch_max);
    let mut batch: Vec<Mutation> = Vec::with_capacity(batch_max);
    while let Some(first) = rx.blocking_recv() {
        jobs.push(first);
        while jobs.len() < batch_max {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let result = if poisoned {
            Err(StoreError::Poisoned)
        } else {
            batch.extend(jobs.iter().map(|j| j.mutation.clone()));
            let r = store.apply(&batch);
            batch.clear();
            if let Err(e) = &r {
                tracing::error!(error = %e, "store commit failed; refusing further writes until restart");
                poisoned = true;
            }
            r
        };
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.mutations.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        for job in jobs.drain(..) {
            if let Some(reply) = job.reply {
                let _ = reply.send(result.clone());
            }
        }
    }
}
