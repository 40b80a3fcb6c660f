//! `leasefence-trials pause`: the paused writer, with real processes.
//!
//! Per trial, on a resource of its own: client A (this binary's hidden
//! `client` subcommand) acquires with a short TTL, prints its grant and
//! SIGSTOPs itself; once `/proc` shows it stopped and the TTL has passed,
//! client B acquires a higher token and commits through the PostgreSQL
//! arbiter; then A is SIGCONTed and commits with its old token, unchecked.
//! The arbiter must reject it; the history table is the judge
//! ([`crate::pause_check`]). `--parallel` trials run at once.
//!
//! `--no-fencing` is the control: the clients commit without the arbiter, so
//! every resumed writer's old token should land after the newer one. It exits
//! 0 only when the checker finds those stale effects.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasefence_arbiter::postgres;
use leasefence_client::Client;

use crate::pause_check::{self, TrialRecord};
use crate::pause_db::Tables;
use crate::pause_trial::{self, TrialCtx};
use crate::procs::{Coordinator, Rng, coordinator_bin};
use crate::report::Failures;

#[derive(Args, Debug)]
pub struct PauseArgs {
    /// PostgreSQL URL for the arbiter (loopback).
    #[arg(long, env = "LEASEFENCE_TEST_POSTGRES_URL")]
    pub postgres: String,
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub trials: u64,
    /// Trials run at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub parallel: u64,
    /// The `leasefence` binary (default: next to this executable).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// The control: commit without the arbiter and expect stale effects.
    #[arg(long)]
    pub no_fencing: bool,
}

/// What the workers collect.
#[derive(Default)]
struct Collected {
    records: Vec<TrialRecord>,
    failures: Failures,
}

pub async fn run(a: PauseArgs) -> anyhow::Result<i32> {
    let bin = coordinator_bin(a.bin)?;
    let data = tempfile::tempdir().context("cannot create a temp data dir")?;
    let coordinator = Coordinator::start(&bin, data.path()).await?;
    let run_id = format!("{:012x}", Rng::from_os()?.next_u64() >> 16);
    let tables = Tables::new(format!("lf_trials_{run_id}"), format!("lf-trials/{run_id}/"))?;
    let mut pg = postgres::connect(&a.postgres)
        .await
        .context("cannot connect to PostgreSQL")?;
    let ctx = Arc::new(TrialCtx {
        exe: std::env::current_exe().context("cannot find the current executable")?,
        server: coordinator.url.clone(),
        postgres: a.postgres.clone(),
        table: tables.prefix().to_string(),
        resource_prefix: format!("lf-trials/{run_id}/"),
        fencing: !a.no_fencing,
        coordinator: Client::connect(&coordinator.url).await?,
    });
    // From here on the tables exist: they are dropped whatever happens.
    tables.create(&mut pg).await?;
    let collected = run_all(ctx, a.trials, a.parallel).await;
    let history = tables.history(&pg).await;
    let dropped = tables.drop_all(&pg).await;
    coordinator.kill().await?;
    let history = history?;
    dropped?;
    let collected = collected?;
    let (verdict, figures) = pause_check::check(a.trials, &collected.records, &history);
    collected.failures.print();
    println!("{figures}; {} trials failed to complete", collected.failures.count());
    println!("{verdict}");
    if a.no_fencing {
        let code = verdict.control_exit_code(collected.failures.count());
        match code {
            0 => println!(
                "control (no fencing): the checker caught {} stale effects",
                verdict.stale_effects
            ),
            _ => println!("control (no fencing): expected stale effects and found none or could not finish"),
        }
        return Ok(code);
    }
    Ok(verdict.exit_code(collected.failures.count()))
}

/// Runs `trials` trials on `parallel` workers pulling from one counter.
async fn run_all(ctx: Arc<TrialCtx>, trials: u64, parallel: u64) -> anyhow::Result<Collected> {
    let next = Arc::new(AtomicU64::new(0));
    let collected = Arc::new(Mutex::new(Collected::default()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel.min(trials) {
        let (ctx, next, collected) = (ctx.clone(), next.clone(), collected.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= trials {
                    return;
                }
                let outcome = tokio::time::timeout(pause_trial::TRIAL_LIMIT, pause_trial::run(&ctx, i)).await;
                let mut c = collected.lock().unwrap_or_else(|p| p.into_inner());
                match outcome {
                    Ok(Ok(record)) => c.records.push(record),
                    Ok(Err(e)) => c.failures.push(format!("trial {i}: {e:#}")),
                    Err(_) => c
                        .failures
                        .push(format!("trial {i}: not done within {:?}", pause_trial::TRIAL_LIMIT)),
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.context("a trial worker panicked")?;
    }
    let mut c = collected.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::take(&mut *c))
}

/// The TTL the paused writer asks for.
pub const TTL: Duration = Duration::from_millis(250);
