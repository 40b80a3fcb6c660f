//! `leasefence-trials crash`: SIGKILL the real coordinator under load.
//!
//! Per trial: start `leasefence serve` on the same data dir, ask it the
//! `last_token` of every resource granted so far (none may be below an
//! acknowledged grant), run 8 in-process gRPC clients acquiring, committing
//! an effect through an in-process arbiter and releasing on 4 resources, and
//! SIGKILL the coordinator 100–400 ms in (a fresh random moment each trial).
//! A last restart after the final kill checks that one too, and takes one
//! more grant per resource. Judged by [`crate::crash_check`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasefence_client::{Client, ClientError};
use leasefence_core::ResourceId;

use crate::crash_check::{Arbiter, Ledger};
use crate::procs::{Coordinator, Rng, coordinator_bin};
use crate::report::Verdict;

const WORKERS: usize = 8;
const RESOURCES: usize = 4;
const TTL: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(2);
/// After the kill, every worker must have noticed within this.
const JOIN_LIMIT: Duration = Duration::from_secs(15);

#[derive(Args, Debug)]
pub struct CrashArgs {
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub trials: u64,
    /// The `leasefence` binary (default: next to this executable).
    #[arg(long)]
    pub bin: Option<PathBuf>,
}

type Grants = Arc<Mutex<HashMap<String, Vec<u64>>>>;
type SharedArbiter = Arc<Mutex<Arbiter>>;

pub async fn run(a: CrashArgs) -> anyhow::Result<i32> {
    let bin = coordinator_bin(a.bin)?;
    let data = tempfile::tempdir().context("cannot create a temp data dir")?;
    let mut ledger = Ledger::default();
    let arbiter = SharedArbiter::default();
    let mut rng = Rng::from_os()?;
    let mut thinnest = u64::MAX;
    for trial in 0..a.trials {
        let coordinator = Coordinator::start(&bin, data.path()).await?;
        check_restart(&coordinator.url, &mut ledger).await?;
        let kill_after = Duration::from_millis(rng.between(100, 400));
        let grants = incarnation(coordinator, arbiter.clone(), kill_after)
            .await
            .with_context(|| format!("trial {trial}"))?;
        thinnest = thinnest.min(grants.values().map(|v| v.len() as u64).sum());
        ledger.close_incarnation(&grants);
    }
    final_restart(&bin, data.path(), &mut ledger).await?;
    let arbiter = arbiter.lock().unwrap_or_else(|p| p.into_inner());
    let verdict = Verdict {
        trials: a.trials,
        stale_effects: arbiter.stale_effects(),
        token_reuse: ledger.token_reuse,
        grants_lost: ledger.grants_lost,
    };
    println!(
        "crash: {} acknowledged grants (fewest in one trial: {thinnest}); in-process arbiter: {} effects admitted, {} rejected",
        ledger.grants,
        arbiter.admitted(),
        arbiter.rejected
    );
    println!("{verdict}");
    Ok(verdict.exit_code(0))
}

/// Right after a restart: what the coordinator remembers of each resource.
async fn check_restart(url: &str, ledger: &mut Ledger) -> anyhow::Result<()> {
    let client = Client::connect(url).await?;
    for name in ledger.resources() {
        let resource = ResourceId::new(&name)?;
        let status = tokio::time::timeout(JOIN_LIMIT, client.status(&resource))
            .await
            .context("status timed out")??;
        ledger.on_restart(&name, status.last_token.map_or(0, |t| t.get()));
    }
    Ok(())
}

/// Runs the workers against one incarnation and SIGKILLs it after
/// `kill_after`; returns every grant acknowledged to them.
async fn incarnation(
    coordinator: Coordinator,
    arbiter: SharedArbiter,
    kill_after: Duration,
) -> anyhow::Result<HashMap<String, Vec<u64>>> {
    let grants = Grants::default();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        workers.spawn(grant_until_dead(
            coordinator.url.clone(),
            w,
            grants.clone(),
            arbiter.clone(),
        ));
    }
    tokio::time::sleep(kill_after).await;
    coordinator.kill().await?;
    let joined = tokio::time::timeout(JOIN_LIMIT, async {
        while let Some(done) = workers.join_next().await {
            done.context("a worker panicked")?;
        }
        anyhow::Ok(())
    })
    .await;
    workers.abort_all();
    joined.context("workers still running 15 s after the kill")??;
    let mut g = grants.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::take(&mut *g))
}

/// Acquire → effect → release, as fast as possible, until the coordinator dies.
async fn grant_until_dead(url: String, worker: usize, grants: Grants, arbiter: SharedArbiter) {
    let Ok(client) = Client::connect(&url).await else {
        return;
    };
    for n in 0.. {
        let name = format!("crash/{}", (worker + n) % RESOURCES);
        let Ok(resource) = ResourceId::new(&name) else {
            return;
        };
        match client.acquire(&resource, TTL, None, WAIT).await {
            Ok(lease) => {
                grants
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(name)
                    .or_default()
                    .push(lease.token.get());
                arbiter
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .effect(&resource, lease.token);
                if client.release(&resource, &lease.lease_id).await.is_err() {
                    return;
                }
            }
            Err(ClientError::Lease(_)) => {}
            Err(_) => return,
        }
    }
}

/// One more start after the last kill: check it, then one grant per resource.
async fn final_restart(bin: &Path, data: &Path, ledger: &mut Ledger) -> anyhow::Result<()> {
    let coordinator = Coordinator::start(bin, data).await?;
    check_restart(&coordinator.url, ledger).await?;
    let client = Client::connect(&coordinator.url).await?;
    let mut grants = HashMap::new();
    for name in ledger.resources() {
        let resource = ResourceId::new(&name)?;
        // Leases held at the kill are honoured for a TTL after the restart: wait.
        let lease = tokio::time::timeout(JOIN_LIMIT, client.acquire(&resource, TTL, None, WAIT))
            .await
            .context("final acquire timed out")??;
        grants.insert(name, vec![lease.token.get()]);
    }
    ledger.close_incarnation(&grants);
    coordinator.kill().await
}
