//! Group commit: the single writer of a store.
//!
//! Callers submit mutations; the writer thread takes every mutation waiting at
//! that moment (up to `batch_max`), applies them as one transaction with one
//! fsync, then moves the *durable watermark* past them. Under load, many grants
//! share one fsync; alone, a grant waits for exactly one.
//!
//! Every submission gets a sequence number ([`Seq`]), and mutations are applied
//! in that order, so a caller that submits while holding the coordinator's lock
//! gets the coordinator's order on disk — and waiting for the watermark to pass
//! a sequence number ([`Committer::durable`]) means everything submitted up to
//! it is durable, whoever submitted it. That is what lets the coordinator
//! answer only with what is on disk: it notes the last sequence number under
//! its lock and waits for it before it answers.
//!
//! Between commits the writer keeps looking for work for a short while
//! ([`IDLE_SPIN`]), yielding its CPU to any thread that wants it, before it
//! sleeps. Waking a sleeping thread is dear, on a virtual machine most of
//! all: its idle CPU is halted and must be woken by the host. On the 2-core
//! machine of run K (docs/performance-notes.md) a 200 µs spin took one
//! client from 1,372 to 1,599 cycles/s and 64 from 11,678 to 13,214
//! (medians of 3 interleaved runs).
//! The price is CPU: at most the spin once per commit, none while idle.
//! So the writer spins only after a small commit ([`SPIN_BATCH_MAX`]
//! mutations at most): a large one says that many callers are busy, the
//! next work arrives while the writer is still awake anyway, and a CPU
//! spent spinning is taken from theirs. On the seventeenth machine of
//! docs/performance-notes.md a writer that spun after every commit made
//! 10% fewer cycles at 64 clients and 16% fewer at 16 than one that never
//! did, and half again as many at one client.
//!
//! A caller that waits for its commit *alone*, with commits lately quicker
//! than the spin, keeps its runtime thread busy the same way: it looks at
//! the watermark between yields to the thread's other tasks, for at most
//! the same spin, and only then sleeps. Otherwise the writer's wake-up finds
//! that thread asleep and its CPU halted, and the host takes tens of
//! microseconds to wake it. A caller among others does not spin: the CPU is
//! then better spent on their work, and there is little idle CPU to halt.
//!
//! After a failed commit the writer is poisoned and fails everything after it:
//! the process must restart and reload rather than guess what the disk holds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leasefence_core::{Mutation, ReleaseCause};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, watch};

use crate::{LeaseStore, StoreError};

/// The writer thread's name.
const WRITER_THREAD: &str = "leasefence-store-writer";

/// How long the writer looks for more work after a commit before it sleeps.
pub const IDLE_SPIN: Duration = Duration::from_micros(200);
/// The longest spin [`Committer::start_with`] takes.
pub const IDLE_SPIN_MAX: Duration = Duration::from_millis(10);
/// The largest commit after which the writer spins (see the module's doc).
pub const SPIN_BATCH_MAX: usize = 2;

/// The position of a submitted mutation in the writer's order (the first is 1).
pub type Seq = u64;

struct Job {
    seq: Seq,
    mutation: Mutation,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    mutations: AtomicU64,
    /// How long the last commit took, in nanoseconds (for [`lone_spin`]).
    last_commit_nanos: AtomicU64,
}

/// Totals since start, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitterStats {
    pub batches: u64,
    pub mutations: u64,
}

/// How far the store is durable, as the writer last said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    /// Every mutation up to this sequence number is durable.
    pub through: Seq,
    /// Set once a commit failed: nothing after `through` will ever be durable.
    pub failed: Option<StoreError>,
    /// The last sequence number of the batch that failed.
    pub failed_through: Seq,
}

/// Handle to the writer thread. Cloning is cheap; the thread stops once every
/// handle is dropped and the queue is drained.
#[derive(Clone)]
pub struct Committer {
    /// The last sequence number handed out, locked with the send so that
    /// sequence order is queue order even for concurrent submitters.
    tx: Arc<Mutex<(Seq, mpsc::UnboundedSender<Job>)>>,
    durable: watch::Receiver<Durable>,
    /// Set once, by the commit that failed: unlike `durable`, it does not
    /// wake whoever waits on it at every commit.
    failed: watch::Receiver<Option<StoreError>>,
    counters: Arc<Counters>,
    /// Callers inside [`Committer::durable`] now.
    waiting: Arc<AtomicUsize>,
    spin: Duration,
}

/// What the writer moves: the watermark after every commit, the failure once.
struct Marks {
    durable: watch::Sender<Durable>,
    failed: watch::Sender<Option<StoreError>>,
}

impl Committer {
    /// Starts the writer thread. `batch_max` bounds one transaction (at least 1,
    /// and at most what the store takes, [`LeaseStore::batch_max`]).
    pub fn start<S: LeaseStore>(store: S, batch_max: usize) -> Committer {
        Committer::start_with(store, batch_max, IDLE_SPIN)
    }

    /// [`Committer::start`], with the writer looking for work for `spin`
    /// (at most [`IDLE_SPIN_MAX`]; zero: not at all) before it sleeps, and a
    /// caller waiting alone looking for its commit as long (see the module's
    /// doc).
    pub fn start_with<S: LeaseStore>(store: S, batch_max: usize, spin: Duration) -> Committer {
        let spin = spin.min(IDLE_SPIN_MAX);
        let batch_max = batch_max.min(store.batch_max());
        let (tx, rx) = mpsc::unbounded_channel();
        let (durable_tx, durable) = watch::channel(Durable::default());
        let (failed_tx, failed) = watch::channel(None);
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let marks = Marks {
            durable: durable_tx,
            failed: failed_tx,
        };
        let spawned = thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || write_loop(store, rx, batch_max.max(1), spin, &c, &marks));
        if let Err(e) = spawned {
            // Without a writer every wait fails with `Closed`; say why once.
            tracing::error!(error = %e, "cannot start the store writer thread");
        }
        Committer {
            tx: Arc::new(Mutex::new((0, tx))),
            durable,
            failed,
            counters,
            waiting: Arc::new(AtomicUsize::new(0)),
            spin,
        }
    }

    /// Queues `mutation` and returns its sequence number; [`Committer::durable`]
    /// of it resolves once it is durable (or failed).
    pub fn submit(&self, mutation: Mutation) -> Seq {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.0 += 1;
        let seq = tx.0;
        // A closed queue shows up in `durable` as `Closed`: the writer is gone.
        let _ = tx.1.send(Job { seq, mutation });
        seq
    }

    /// While the caller waits alone (see the module's doc), looks at the
    /// watermark between yields until `seq` is durable or failed, another
    /// caller waits too, or the spin is over.
    async fn spin_alone(&self, rx: &watch::Receiver<Durable>, seq: Seq) {
        let last_commit = Duration::from_nanos(self.counters.last_commit_nanos.load(Ordering::Relaxed));
        if !lone_spin(self.waiting.load(Ordering::Relaxed), last_commit, self.spin) {
            return;
        }
        let until = Instant::now() + self.spin;
        loop {
            if settled(&rx.borrow(), seq) {
                return;
            }
            if self.waiting.load(Ordering::Relaxed) > 1 || Instant::now() >= until {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// How many callers wait in [`Committer::durable`] now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The sequence number of the last mutation submitted (0 before any).
    pub fn last_submitted(&self) -> Seq {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Resolves once every mutation up to `seq` is durable, or with the error
    /// that stopped the writer before it got there.
    pub async fn durable(&self, seq: Seq) -> Result<(), StoreError> {
        let mut rx = self.durable.clone();
        let _waiting = Waiting::enter(&self.waiting);
        self.spin_alone(&rx, seq).await;
        let state = rx.wait_for(|d| settled(d, seq)).await.map_err(|_| StoreError::Closed)?;
        match &state.failed {
            _ if seq <= state.through => Ok(()),
            Some(e) if seq <= state.failed_through => Err(e.clone()),
            _ => Err(StoreError::Poisoned),
        }
    }

    /// The writer's watermark, to follow as it moves (for publishing events
    /// only once they are durable).
    pub fn watermark(&self) -> watch::Receiver<Durable> {
        self.durable.clone()
    }

    /// Resolves with the error that stops the writer, once one does (by
    /// then [`Committer::failure`] says so too); `None` if the writer ended
    /// without failing. Commits do not wake it.
    pub fn failed(&self) -> impl std::future::Future<Output = Option<StoreError>> + Send + 'static {
        let mut failed = self.failed.clone();
        async move { failed.wait_for(Option::is_some).await.ok().and_then(|f| f.clone()) }
    }

    /// The error that stopped the writer, if one did.
    pub fn failure(&self) -> Option<StoreError> {
        self.durable.borrow().failed.clone()
    }

    pub fn stats(&self) -> CommitterStats {
        CommitterStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            mutations: self.counters.mutations.load(Ordering::Relaxed),
        }
    }
}

/// Whether the wait for `seq` is over: it is durable, or the writer failed.
fn settled(d: &Durable, seq: Seq) -> bool {
    d.through >= seq || d.failed.is_some()
}

/// Whether a caller about to wait for its commit spins first: only when it
/// is the one caller `waiting` and the `last_commit` took less than the
/// `spin`, so that its own is likely to end within it.
fn lone_spin(waiting: usize, last_commit: Duration, spin: Duration) -> bool {
    waiting == 1 && last_commit < spin
}

/// How long the writer looks for work after a commit of `last_batch`
/// mutations before it sleeps: the `spin`, after a small commit only.
fn writer_spin(last_batch: usize, spin: Duration) -> Duration {
    if last_batch <= SPIN_BATCH_MAX {
        spin
    } else {
        Duration::ZERO
    }
}

/// Counts a caller in [`Committer::durable`] until it returns or is dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(waiting: &'a AtomicUsize) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long one batch's commit took (the engine's transaction, its fsync
/// or round trips), in seconds: a histogram.
pub const COMMIT_SECONDS: &str = "leasefence_store_commit_seconds";
/// How many mutations one commit carried: a histogram.
pub const BATCH_MUTATIONS: &str = "leasefence_store_batch_mutations";
/// Grants, releases and expiries made durable: counters, moved by the writer
/// after a batch's commit and before its callers are told, so that they never
/// count what a crash could take back and always count what was answered.
pub const GRANTS_TOTAL: &str = "leasefence_grants_total";
pub const RELEASES_TOTAL: &str = "leasefence_releases_total";
pub const EXPIRIES_TOTAL: &str = "leasefence_expiries_total";
/// How long one checkpoint of the embedded store took (its commit log folded
/// into its tree, in one durable transaction; the writer waits for it), in
/// seconds: a histogram.
pub const CHECKPOINT_SECONDS: &str = "leasefence_store_checkpoint_seconds";

fn write_loop<S: LeaseStore>(
    mut store: S,
    mut rx: mpsc::UnboundedReceiver<Job>,
    batch_max: usize,
    spin: Duration,
    c: &Counters,
    marks: &Marks,
) {
    let durable = &marks.durable;
    let mut jobs: Vec<Job> = Vec::with_capacity(batch_max);
    let mut batch: Vec<Mutation> = Vec::with_capacity(batch_max);
    let recorded = Recorded::new();
    let mut last_batch = 0;
    while let Some(first) = next_job(&mut rx, writer_spin(last_batch, spin)) {
        jobs.push(first);
        while jobs.len() < batch_max {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        if durable.borrow().failed.is_none() {
            batch.extend(jobs.iter().map(|j| j.mutation.clone()));
            let started = std::time::Instant::now();
            let result = store.apply(&batch);
            let took = started.elapsed();
            recorded.commit.record(took.as_secs_f64());
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            c.last_commit_nanos.store(nanos, Ordering::Relaxed);
            recorded.batch.record(jobs.len() as f64);
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.mutations.fetch_add(jobs.len() as u64, Ordering::Relaxed);
            let last = jobs.last().map_or(0, |j| j.seq);
            // Answer the batch first; the store's upkeep waits behind it. A
            // failed upkeep fails what comes after, as a failed commit does
            // (what it reports durable already is: `through` passed it).
            let outcome = result.and_then(|()| {
                recorded.count_durable(&batch);
                durable.send_modify(|d| d.through = last);
                store.maintain()
            });
            match outcome {
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(error = %e, "store commit failed; refusing further writes until restart");
                    durable.send_modify(|d| {
                        d.failed = Some(e.clone());
                        d.failed_through = last;
                    });
                    marks.failed.send_replace(Some(e));
                }
            }
            batch.clear();
        }
        last_batch = jobs.len();
        jobs.clear();
    }
}

/// The writer's metric handles, looked up once when it starts (looked up per
/// batch, they cost more instructions than encoding the batch's records, by
/// callgrind): a recorder must be installed before the committer starts to
/// see them, as `serve` does.
struct Recorded {
    commit: metrics::Histogram,
    batch: metrics::Histogram,
    grants: metrics::Counter,
    releases: metrics::Counter,
    expiries: metrics::Counter,
}

impl Recorded {
    fn new() -> Recorded {
        Recorded {
            commit: metrics::histogram!(COMMIT_SECONDS),
            batch: metrics::histogram!(BATCH_MUTATIONS),
            grants: metrics::counter!(GRANTS_TOTAL),
            releases: metrics::counter!(RELEASES_TOTAL),
            expiries: metrics::counter!(EXPIRIES_TOTAL),
        }
    }

    /// Adds a committed batch's grants, releases and expiries to their counters.
    fn count_durable(&self, batch: &[Mutation]) {
        let (mut grants, mut releases, mut expiries) = (0u64, 0u64, 0u64);
        for m in batch {
            match m {
                Mutation::Grant { .. } => grants += 1,
                Mutation::Release {
                    cause: ReleaseCause::Released,
                    ..
                } => releases += 1,
                Mutation::Release {
                    cause: ReleaseCause::Expired,
                    ..
                } => expiries += 1,
            }
        }
        for (counter, n) in [
            (&self.grants, grants),
            (&self.releases, releases),
            (&self.expiries, expiries),
        ] {
            if n > 0 {
                counter.increment(n);
            }
        }
    }
}

/// The next job: looked for until `spin` has passed, yielding the CPU between
/// looks, then waited for asleep. `None` once every handle is gone.
fn next_job(rx: &mut mpsc::UnboundedReceiver<Job>, spin: Duration) -> Option<Job> {
    let until = Instant::now() + spin;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() < until => thread::yield_now(),
            Err(TryRecvError::Empty) => return rx.blocking_recv(),
        }
    }
}

#[cfg(test)]
#[path = "committer_tests.rs"]
mod tests;
