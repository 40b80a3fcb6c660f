//! Active/standby on a shared store: campaign, lead, renew, step down.
//!
//! A coordinator on a [`SharedStore`] loops: campaign; while another leads,
//! stand by (answering with the leader's URL) and campaign again when that
//! leadership lapses; once it wins an epoch, load the shard's records and
//! serve them exactly as after a restart (every held lease honoured for a full
//! TTL from the takeover), renewing its leadership every third of the leader
//! TTL. It stops answering as leader at [`leader_deadline`] after the send
//! time of its last successful renewal — before the engine can let a standby
//! in — and steps down (discarding its memory) as soon as a renewal or a
//! commit says it was deposed or its engine failed. Every write it makes is
//! conditional on its epoch in the engine, so a coordinator that wakes from a
//! pause after a takeover cannot write a record, whatever it believes.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasefence_core::Config;
use leasefence_store::shared::leader_deadline;
use leasefence_store::{Committer, Epoch, LeaseStore, SharedStore, StoreError};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use crate::node::{Node, Role};
use crate::{ApiError, Engine};

/// How a coordinator on a shared store takes part in the election.
#[derive(Clone, Debug)]
pub struct HaConfig {
    /// How long a dead active coordinator blocks a takeover.
    pub leader_ttl: Duration,
    /// The URL clients are sent to while this coordinator is active.
    pub advertise: String,
}

impl HaConfig {
    pub const DEFAULT_LEADER_TTL: Duration = Duration::from_secs(5);
    /// The shortest leader TTL: renewals run every third of it.
    pub const LEADER_TTL_MIN: Duration = Duration::from_millis(300);
    /// The longest: a dead active coordinator blocks takeover this long.
    pub const LEADER_TTL_MAX: Duration = Duration::from_secs(300);
}

/// Until when this coordinator may still answer as leader.
pub struct LeaderGate {
    epoch: Epoch,
    until: Mutex<Option<Instant>>,
}

impl LeaderGate {
    fn new(epoch: Epoch, until: Instant) -> Arc<LeaderGate> {
        Arc::new(LeaderGate {
            epoch,
            until: Mutex::new(Some(until)),
        })
    }

    fn extend(&self, until: Instant) {
        let mut u = self.until.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(current) = u.as_mut() {
            *current = (*current).max(until);
        }
    }

    fn close(&self) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `Ok` while the leadership is confirmed.
    pub(crate) fn check(&self) -> Result<(), ApiError> {
        match *self.until.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(until) if Instant::now() < until => Ok(()),
            Some(_) => Err(ApiError::Unavailable(format!(
                "the engine has not confirmed this coordinator's leadership (epoch {}) in time",
                self.epoch
            ))),
            None => Err(ApiError::NotLeader { leader: None }),
        }
    }
}

/// What the leader's engine is built with.
pub(crate) struct EngineSetup {
    pub lease: Config,
    pub wait_max: Duration,
    pub batch_max: usize,
    pub commit_spin: Duration,
}

/// Runs `f` on a blocking thread (the shared stores' calls block).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(StoreError::Unavailable(format!("store call did not finish: {e}"))))
}

/// Takes part in the election until `stop` turns true; then resigns.
pub(crate) async fn run<S: SharedStore>(
    node: Arc<Node>,
    shared: Arc<S>,
    setup: EngineSetup,
    ha: HaConfig,
    mut stop: watch::Receiver<bool>,
) {
    let poll = (ha.leader_ttl / 4).max(Duration::from_millis(50));
    loop {
        if *stop.borrow() {
            return;
        }
        let (s, advertise, ttl) = (shared.clone(), ha.advertise.clone(), ha.leader_ttl);
        let sent = Instant::now();
        match blocking(move || s.campaign(&advertise, ttl)).await {
            Ok(Some(epoch)) => {
                lead(&node, &shared, &setup, &ha, epoch, sent, &mut stop).await;
                continue;
            }
            Ok(None) => {
                let s = shared.clone();
                let leader = blocking(move || s.leader()).await.ok().flatten().map(|l| l.advertise);
                node.set(Role::Standby { leader });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the store engine; not leading");
                node.set(Role::Unavailable {
                    reason: format!("cannot reach the store engine: {e}"),
                });
            }
        }
        tokio::select! {
            () = sleep(poll) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Leads `epoch` until deposed, failed, or stopped.
async fn lead<S: SharedStore>(
    node: &Arc<Node>,
    shared: &Arc<S>,
    setup: &EngineSetup,
    ha: &HaConfig,
    epoch: Epoch,
    sent: Instant,
    stop: &mut watch::Receiver<bool>,
) {
    let gate = LeaderGate::new(epoch, sent + leader_deadline(ha.leader_ttl));
    let engine = match start_engine(shared, setup, epoch, gate.clone()).await {
        Ok(engine) => engine,
        Err(e) => {
            tracing::warn!(error = %e, epoch, "won the leadership but could not load the store");
            let s = shared.clone();
            let _ = blocking(move || s.resign(epoch)).await;
            return;
        }
    };
    tracing::info!(epoch, "leading");
    metrics_term(epoch, true);
    node.set(Role::Active {
        engine: engine.clone(),
        epoch: Some(epoch),
    });
    let why = renew_until_lost(shared, ha, epoch, &gate, &engine, stop).await;
    gate.close();
    node.set(Role::Standby { leader: None });
    engine.stop_with(&ApiError::NotLeader { leader: None });
    metrics_term(epoch, false);
    if let Lost::Store(e) = &why {
        tracing::warn!(error = %e, epoch, "stepped down");
    }
    // Resign either way (it does nothing once deposed): after a failed commit
    // the next campaign, ours or a standby's, need not wait out the TTL.
    let s = shared.clone();
    if let Err(e) = blocking(move || s.resign(epoch)).await {
        tracing::warn!(error = %e, epoch, "could not resign; a standby takes over when the leadership lapses");
    }
}

fn metrics_term(epoch: Epoch, won: bool) {
    crate::metrics::term(epoch, won);
}

/// Loads the shard's records under `epoch` and starts an engine on them.
async fn start_engine<S: SharedStore>(
    shared: &Arc<S>,
    setup: &EngineSetup,
    epoch: Epoch,
    gate: Arc<LeaderGate>,
) -> Result<Arc<Engine>, StoreError> {
    let s = shared.clone();
    let (writer, records) = blocking(move || {
        let mut writer = s.writer(epoch)?;
        let records = writer.load()?;
        Ok((writer, records))
    })
    .await?;
    let committer = Committer::start_with(writer, setup.batch_max, setup.commit_spin);
    Ok(Engine::start_gated(
        setup.lease.clone(),
        setup.wait_max,
        committer,
        records,
        Some(gate),
    ))
}

enum Lost {
    Stopped,
    Store(StoreError),
}

/// Renews every third of the leader TTL until a renewal or a commit says the
/// leadership is gone, or `stop` turns true. While the engine cannot be
/// reached it keeps trying: the gate closes by itself at the deadline, and a
/// later renewal under the same epoch (nobody took over) opens it again.
async fn renew_until_lost<S: SharedStore>(
    shared: &Arc<S>,
    ha: &HaConfig,
    epoch: Epoch,
    gate: &LeaderGate,
    engine: &Arc<Engine>,
    stop: &mut watch::Receiver<bool>,
) -> Lost {
    let every = ha.leader_ttl / 3;
    let failed = engine.store_failed();
    tokio::pin!(failed);
    loop {
        tokio::select! {
            () = sleep(every) => {}
            e = &mut failed => return Lost::Store(e),
            _ = stop.changed() => return Lost::Stopped,
        }
        if *stop.borrow() {
            return Lost::Stopped;
        }
        let (s, ttl) = (shared.clone(), ha.leader_ttl);
        let sent = Instant::now();
        match blocking(move || s.renew(epoch, ttl)).await {
            Ok(()) => gate.extend(sent + leader_deadline(ha.leader_ttl)),
            Err(e @ StoreError::Deposed { .. }) => return Lost::Store(e),
            Err(e) => tracing::warn!(error = %e, epoch, "leadership renewal failed; retrying"),
        }
    }
}

/// A boxed election loop, for [`crate::Server`] to run beside the edges.
pub(crate) type Election = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
