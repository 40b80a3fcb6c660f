//! `leasefence-trials failover`: several real coordinators on one shared
//! store (PostgreSQL or etcd), the active one SIGKILLed — or, with `--pause`,
//! SIGSTOPped past its leader TTL and SIGCONTed with requests in flight —
//! trial after trial, under clients that acquire through every coordinator
//! and follow the not-leader hints.
//!
//! Judged by [`crate::failover_check`] from the grants the clients were
//! answered: no token answered twice for a resource, tokens in real-time
//! order, no answered grant above the `last_token` a new leader reports
//! (right after each takeover, and after the last trial), every takeover
//! within leader TTL + 2 s. With `--pause` the store's records are read
//! directly (PostgreSQL rows; etcd keys, with the cargo feature `etcd`): no
//! record carries a paused leader's epoch with a value it did not have when
//! the leader was stopped ([`crate::failover_trial::pause`]).
//!
//! There is no control run: the only honest one, coordinators without epoch
//! fencing, would need a server that can be told to write unfenced.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use leasefence_arbiter::postgres;

use crate::failover_check;
use crate::failover_cluster::{Cluster, ClusterSpec};
use crate::failover_db::{StoreLook, StoreSchema};
use crate::failover_http::Http;
use crate::failover_load::{Load, LoadSpec};
use crate::failover_trial::{self, Run, STATUS_LIMIT, Tally};
use crate::procs::{Rng, coordinator_bin};
use crate::report::{EXIT_VIOLATION, Failures, Verdict};

const CLIENTS: usize = 6;
const RESOURCES: usize = 8;
/// How long the first coordinator may take to lead.
const START_LIMIT: Duration = Duration::from_secs(20);

#[derive(Args, Debug)]
pub struct FailoverArgs {
    /// The shared store: postgres://… or etcd://HOST:PORT[,HOST:PORT…].
    #[arg(long)]
    pub store: String,
    /// The run's PostgreSQL schema or etcd key prefix (default: a fresh one;
    /// a fresh PostgreSQL schema is dropped at the end).
    #[arg(long)]
    pub store_prefix: Option<String>,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=9))]
    pub coordinators: u64,
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub trials: u64,
    /// The coordinators' `--leader-ttl` (300ms..=60s).
    #[arg(long, default_value = "1s", value_parser = parse_leader_ttl)]
    pub leader_ttl: Duration,
    /// SIGSTOP the active coordinator (and SIGCONT it) instead of SIGKILL.
    #[arg(long)]
    pub pause: bool,
    /// The `leasefence` binary (default: next to this executable).
    #[arg(long)]
    pub bin: Option<PathBuf>,
}

fn parse_leader_ttl(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 1s)"))?;
    if !(Duration::from_millis(300)..=Duration::from_secs(60)).contains(&d) {
        return Err(format!("{s} is out of range; allowed: 300ms..=60s"));
    }
    Ok(d)
}

/// Which engine `--store` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Postgres,
    Etcd,
}

fn engine(store: &str) -> anyhow::Result<Engine> {
    if store.starts_with("postgres://") || store.starts_with("postgresql://") {
        Ok(Engine::Postgres)
    } else if store.starts_with("etcd://") {
        Ok(Engine::Etcd)
    } else {
        bail!("--store must be postgres://… or etcd://HOST:PORT[,HOST:PORT…]")
    }
}

pub async fn run(a: FailoverArgs) -> anyhow::Result<i32> {
    let bin = coordinator_bin(a.bin.clone())?;
    let engine = engine(&a.store)?;
    let run_id = format!("{:012x}", Rng::from_os()?.next_u64() >> 16);
    let (prefix, fresh) = match (&a.store_prefix, engine) {
        (Some(p), _) => (p.clone(), false),
        (None, Engine::Postgres) => (format!("lf_trials_{run_id}"), true),
        (None, Engine::Etcd) => (format!("/lf-trials-{run_id}/"), true),
    };
    let store = look(engine, &a.store, &prefix).await?;
    let spec = ClusterSpec {
        bin,
        store: a.store.clone(),
        prefix: prefix.clone(),
        leader_ttl: a.leader_ttl,
    };
    let started = Cluster::start(spec, a.coordinators as usize).await;
    let outcome = match started {
        Ok(cluster) => trials(&a, cluster, store, fresh).await,
        Err(e) => {
            if fresh {
                let _ = store.remove().await;
            }
            Err(e)
        }
    };
    let (verdict, slow, failures, figures) = outcome?;
    failures.print();
    for line in figures {
        println!("{line}");
    }
    println!("{verdict}");
    Ok(match verdict.exit_code(failures.count()) {
        0 if slow > 0 => EXIT_VIOLATION,
        code => code,
    })
}

/// The direct look at the run's store.
async fn look(engine: Engine, store: &str, prefix: &str) -> anyhow::Result<StoreLook> {
    match engine {
        Engine::Postgres => {
            let schema = StoreSchema::new(prefix)?;
            let client = postgres::connect(store)
                .await
                .context("cannot connect to the PostgreSQL store")?;
            Ok(StoreLook::Postgres(client, schema))
        }
        #[cfg(feature = "etcd")]
        Engine::Etcd => Ok(StoreLook::Etcd(Box::new(
            crate::failover_etcd::EtcdStore::connect(store, prefix).await?,
        ))),
        #[cfg(not(feature = "etcd"))]
        Engine::Etcd => bail!(
            "failover on etcd reads the store's keys directly: build leasefence-trials with `--features etcd` \
             (and the coordinator with `-p leasefence --features etcd`)"
        ),
    }
}

type Outcome = (Verdict, u64, Failures, Vec<String>);

/// Runs the trials, then stops the coordinators and drops a fresh schema
/// whatever happened.
async fn trials(a: &FailoverArgs, cluster: Cluster, store: StoreLook, fresh: bool) -> anyhow::Result<Outcome> {
    let resources: Vec<String> = (0..RESOURCES).map(|i| format!("failover/{i}")).collect();
    let load = Load::start(LoadSpec {
        urls: cluster.urls(),
        clients: CLIENTS,
        resources,
        lease_ttl: Duration::from_millis(300),
        wait: Duration::from_millis(200),
        request_limit: Duration::from_secs(2),
    })?;
    let mut run = Run {
        cluster,
        load,
        http: Http::new(Duration::from_secs(2))?,
        store,
        leader_ttl: a.leader_ttl,
    };
    let outcome = fault_loop(a, &mut run).await;
    let stopped = run.cluster.stop_all().await;
    if fresh {
        run.store.remove().await?;
    }
    stopped?;
    outcome
}

async fn fault_loop(a: &FailoverArgs, run: &mut Run) -> anyhow::Result<Outcome> {
    let mut tally = Tally::new(a.leader_ttl);
    let mut failures = Failures::default();
    let mut rng = Rng::from_os()?;
    let start = Instant::now();
    let (first, first_epoch, _) = run.cluster.await_active(None, start, START_LIMIT).await?;
    run.load
        .await_grant(first, start, START_LIMIT)
        .await
        .context("the first leader")?;
    tally.last_takeover = Some((first, start));
    for trial in 0..a.trials {
        // Kill trials leave the new leader little time otherwise: the
        // takeover is most of a trial.
        let (lo, hi) = if a.pause { (100, 300) } else { (300, 700) };
        tokio::time::sleep(Duration::from_millis(rng.between(lo, hi))).await;
        let (active, epoch, _) = run.cluster.await_active(None, Instant::now(), START_LIMIT).await?;
        let done = if a.pause {
            failover_trial::pause(run, active, epoch, &mut tally).await
        } else {
            failover_trial::kill(run, active, &mut tally).await
        };
        if let Err(e) = done {
            failures.push(format!("trial {trial}: {e:#}"));
            // Back to a full cluster before the next trial.
            for i in 0..run.cluster.len() {
                if run.cluster.pid(i).is_err() {
                    run.cluster.spawn(i).await?;
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (active, last_epoch, _) = run.cluster.await_active(None, Instant::now(), START_LIMIT).await?;
    // Each fault ends one term; any other term ended without one (a renewal
    // that came too late on a busy machine, say) — legal, but worth saying.
    tally.unprovoked_terms = last_epoch
        .saturating_sub(first_epoch)
        .saturating_sub(tally.takeovers.count);
    let (history, hints) = run.load.finish().await;
    let mut resources: Vec<String> = history.iter().map(|g| g.resource.clone()).collect();
    resources.sort();
    resources.dedup();
    let last = run
        .cluster
        .last_tokens(active, &resources, &run.http, STATUS_LIMIT)
        .await
        .context("after the last trial")?;
    tally.lost.check(&history, &last);
    let tokens = failover_check::tokens(&history);
    let verdict = Verdict {
        trials: a.trials,
        stale_effects: tally.deposed_writes.len() as u64,
        token_reuse: tokens.total(),
        grants_lost: tally.lost.count(),
    };
    let figures = figures(a, run, &tally, &failures, history.len(), hints, tokens);
    Ok((verdict, tally.takeovers.slower_than_bound, failures, figures))
}

/// The lines printed before the verdict.
fn figures(
    a: &FailoverArgs,
    run: &Run,
    t: &Tally,
    failures: &Failures,
    grants: usize,
    hints: u64,
    tokens: failover_check::TokenCounts,
) -> Vec<String> {
    let fault = if a.pause { "SIGSTOP/SIGCONT" } else { "SIGKILL" };
    let ms = |d: Duration| d.as_millis();
    let mut out = vec![
        format!(
            "failover ({fault}), {} coordinators, leader TTL {} ms: {grants} acknowledged grants (fewest answered by a new leader before the next fault: {}), {hints} not-leader hints followed; token reuse: {} answered twice, {} out of real-time order",
            a.coordinators,
            ms(a.leader_ttl),
            t.fewest_after_takeover.unwrap_or(0),
            tokens.duplicates,
            tokens.out_of_order,
        ),
        format!(
            "takeovers: {}, slowest {} ms (bound {} ms, {} slower); {} more terms began without a fault",
            t.takeovers.count,
            ms(t.takeovers.slowest),
            ms(t.takeovers.bound),
            t.takeovers.slower_than_bound,
            t.unprovoked_terms,
        ),
    ];
    if a.pause {
        let f = &t.in_flight;
        let other: Vec<String> = f.other.iter().map(|(code, n)| format!("{n} × {code}")).collect();
        out.push(format!(
            "paused leaders: {} woke and stepped down (slowest {} ms); requests in flight when they woke: {} granted, {} not_leader, {} unavailable, {} other ({}), {} unanswered",
            t.woken,
            ms(t.slowest_step_down),
            f.granted,
            f.not_leader,
            f.unavailable,
            f.other.values().sum::<u64>(),
            if other.is_empty() { "none".to_string() } else { other.join(", ") },
            f.unanswered
        ));
    }
    out.push(if a.pause {
        let first: Vec<String> = t
            .deposed_writes
            .iter()
            .take(5)
            .map(|(r, e)| format!("{r} (epoch {e})"))
            .collect();
        format!(
            "store rows: {} under a paused leader's epoch at its stop ({} stops inside a batch), {} written under that epoch after it was deposed{}",
            t.rows_snapshotted,
            t.batches_caught_open,
            t.deposed_writes.len(),
            if first.is_empty() { String::new() } else { format!(": {}", first.join(", ")) }
        )
    } else {
        "store rows: read directly with --pause only".to_string()
    });
    let log = run.cluster.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (c, rest) = failover_check::commit_failures(&log);
    for line in rest.iter().take(10) {
        eprintln!("coordinator: {line}");
    }
    out.push(format!(
        "failed commits the coordinators logged: {} refused by the epoch check, {} cut off mid-batch (connection closed, request timed out), {} other",
        c.deposed, c.cut_off, c.other
    ));
    out.push(format!("{} trials failed to complete", failures.count()));
    out
}
