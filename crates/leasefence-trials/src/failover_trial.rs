//! One failover trial: the fault on the active coordinator (SIGKILL, or
//! SIGSTOP past its leader TTL and SIGCONT with requests in flight), the
//! takeover, and what is checked around it. Everything observed goes into a
//! [`Tally`]; an error means the trial could not be carried out.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::task::JoinHandle;

use crate::failover_check::{Lost, Takeovers};
use crate::failover_cluster::Cluster;
use crate::failover_db::{EpochRows, StoreLook};
use crate::failover_http::Http;
use crate::failover_load::{InFlight, Load};
use crate::procs::{signal, wait_stopped};

/// Beyond the bound: how long a takeover may take before the trial gives up.
const TAKEOVER_GIVE_UP: Duration = Duration::from_secs(10);
/// How long a new leader may take to answer its first grant.
const GRANT_LIMIT: Duration = Duration::from_secs(10);
/// How long status calls may take, hints followed.
pub const STATUS_LIMIT: Duration = Duration::from_secs(10);
/// How long a woken leader may take to say it stands by.
const STEP_DOWN_LIMIT: Duration = Duration::from_secs(10);
/// After a stop, and after a step-down, before the store is read: a commit
/// sent just before the stop has reached the engine by then.
const SETTLE: Duration = Duration::from_millis(100);
/// Acquires sent to a stopped leader, and how long each may wait.
const IN_FLIGHT: usize = 4;
const IN_FLIGHT_EXTRA: Duration = Duration::from_secs(15);

/// What a run shares between trials.
pub struct Run {
    pub cluster: Cluster,
    pub load: Load,
    pub http: Http,
    /// The shared store, read directly.
    pub store: StoreLook,
    pub leader_ttl: Duration,
}

/// Everything the trials observed.
pub struct Tally {
    pub takeovers: Takeovers,
    pub lost: Lost,
    /// The coordinator that took over last, and when.
    pub last_takeover: Option<(usize, Instant)>,
    /// Fewest grants a new leader answered before the next fault.
    pub fewest_after_takeover: Option<u64>,
    pub woken: u64,
    pub slowest_step_down: Duration,
    pub in_flight: InFlight,
    pub rows_snapshotted: u64,
    pub batches_caught_open: u64,
    /// Resources whose row a deposed leader wrote (with its epoch).
    pub deposed_writes: Vec<(String, u64)>,
    /// Leadership terms that began without a fault of ours.
    pub unprovoked_terms: u64,
}

impl Tally {
    pub fn new(leader_ttl: Duration) -> Tally {
        Tally {
            takeovers: Takeovers::new(leader_ttl),
            lost: Lost::default(),
            last_takeover: None,
            fewest_after_takeover: None,
            woken: 0,
            slowest_step_down: Duration::ZERO,
            in_flight: InFlight::default(),
            rows_snapshotted: 0,
            batches_caught_open: 0,
            deposed_writes: Vec::new(),
            unprovoked_terms: 0,
        }
    }

    /// Right before a fault: how many grants the last new leader answered.
    fn before_fault(&mut self, load: &Load) {
        if let Some((by, at)) = self.last_takeover {
            let n = load.answered_by(by, at);
            self.fewest_after_takeover = Some(self.fewest_after_takeover.map_or(n, |f| f.min(n)));
        }
    }
}

impl Run {
    fn takeover_limit(&self) -> Duration {
        self.leader_ttl + TAKEOVER_GIVE_UP
    }

    /// The new leader `next` took over at `at` after a fault at `fault`: it
    /// must know every grant answered before the fault, and grant itself.
    async fn after_takeover(&self, next: usize, fault: Instant, at: Instant, tally: &mut Tally) -> anyhow::Result<()> {
        let before: Vec<_> = self.load.history().into_iter().filter(|g| g.answered < fault).collect();
        let resources: BTreeSet<String> = before.iter().map(|g| g.resource.clone()).collect();
        let resources: Vec<String> = resources.into_iter().collect();
        let last = self
            .cluster
            .last_tokens(next, &resources, &self.http, STATUS_LIMIT)
            .await
            .context("after the takeover")?;
        tally.lost.check(&before, &last);
        self.load.await_grant(next, at, GRANT_LIMIT).await?;
        tally.last_takeover = Some((next, at));
        Ok(())
    }
}

/// SIGKILL the active coordinator, await the takeover, restart it.
pub async fn kill(run: &mut Run, active: usize, tally: &mut Tally) -> anyhow::Result<()> {
    tally.before_fault(&run.load);
    let fault = Instant::now();
    run.cluster.kill(active).await?;
    let limit = run.takeover_limit();
    let (next, _, took) = run.cluster.await_active(Some(active), fault, limit).await?;
    tally.takeovers.record(took);
    run.cluster.spawn(active).await?;
    run.after_takeover(next, fault, fault + took, tally).await
}

/// SIGSTOP the active coordinator (leading `epoch`) past its leader TTL,
/// await the takeover, SIGCONT it with requests in flight, see it step down,
/// and check that it wrote nothing to the store.
pub async fn pause(run: &mut Run, active: usize, epoch: u64, tally: &mut Tally) -> anyhow::Result<()> {
    tally.before_fault(&run.load);
    let pid = run.cluster.pid(active)?;
    let fault = Instant::now();
    signal(pid, libc::SIGSTOP)?;
    let stopped = while_stopped(run, active, epoch, pid, fault, tally).await;
    // Whatever happened, past the leader TTL at least, wake it.
    tokio::time::sleep_until((fault + run.leader_ttl + SETTLE).into()).await;
    signal(pid, libc::SIGCONT)?;
    let (at_stop, in_flight) = stopped?;
    let down = run.cluster.await_standby(active, STEP_DOWN_LIMIT).await?;
    tally.woken += 1;
    tally.slowest_step_down = tally.slowest_step_down.max(down);
    let answers = tokio::time::timeout(run.leader_ttl + IN_FLIGHT_EXTRA, in_flight)
        .await
        .context("the requests in flight at the woken leader did not end")?
        .context("a request in flight panicked")?;
    tally.in_flight.add(answers);
    tokio::time::sleep(SETTLE).await;
    let after = run.store.epoch_rows(epoch).await?;
    for r in crate::failover_check::deposed_writes(&at_stop.rows, &after.rows) {
        tally.deposed_writes.push((r, epoch));
    }
    Ok(())
}

/// The stopped part of a pause trial: the snapshot of the leader's rows, the
/// requests sent to it, the takeover and the new leader's checks.
async fn while_stopped(
    run: &mut Run,
    active: usize,
    epoch: u64,
    pid: u32,
    fault: Instant,
    tally: &mut Tally,
) -> anyhow::Result<(EpochRows, JoinHandle<InFlight>)> {
    wait_stopped(pid, STEP_DOWN_LIMIT).await?;
    tokio::time::sleep(SETTLE).await;
    let at_stop = run.store.epoch_rows(epoch).await?;
    let url = run.cluster.url(active);
    if at_stop.epoch != epoch || at_stop.leader.as_deref() != Some(url.as_str()) {
        bail!(
            "at the stop the store names epoch {} led by {:?}, not epoch {epoch} led by {url}",
            at_stop.epoch,
            at_stop.leader
        );
    }
    if run.store.batch_open().await? {
        tally.batches_caught_open += 1;
    }
    tally.rows_snapshotted += at_stop.rows.len() as u64;
    let in_flight = run
        .load
        .in_flight(active, IN_FLIGHT, run.leader_ttl + IN_FLIGHT_EXTRA)?;
    let limit = run.takeover_limit();
    let (next, _, took) = run.cluster.await_active(Some(active), fault, limit).await?;
    tally.takeovers.record(took);
    run.after_takeover(next, fault, fault + took, tally).await?;
    Ok((at_stop, in_flight))
}
