//! The story, step by step: set up, start the coordinator and the consumer,
//! run the two workers (pausing the first between its grant and its
//! publish), then read the consumer's verdicts, its metric and the table,
//! and print the outcome line. The run's stream and table are removed
//! whatever the outcome, before that line.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Parser;
use leasefence_arbiter::ResourceId;
use leasefence_arbiter::queue::{STALE_METRIC, Tally};
use leasefence_client::Client;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use rustix::process::Signal;
use tokio::sync::{Mutex, watch};

use crate::consumer::{self, Apply, Consumer, Progress, QUEUE, TableCheck};
use crate::coordinator::Coordinator;
use crate::services::{self, Names};
use crate::workers::{Plan, Worker};

/// The workers' lease TTL: short, so that the paused worker loses its lease
/// within a second.
const TTL: Duration = Duration::from_secs(1);
/// How long the second worker may wait for the lease.
const ACQUIRE_WAIT: Duration = Duration::from_secs(10);
/// How long the consumer may take to handle what was published.
const CONSUME_LIMIT: Duration = Duration::from_secs(30);

const PAUSED: &str = "worker-a";
const CURRENT: &str = "worker-b";

#[derive(Parser, Debug)]
pub struct Args {
    /// NATS server with JetStream.
    #[arg(long, env = "LEASEFENCE_EXAMPLE_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// PostgreSQL database the consumer writes to.
    #[arg(
        long,
        env = "LEASEFENCE_EXAMPLE_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres: String,
    /// Jobs each worker publishes.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    jobs: u32,
    /// The control: the consumer inserts without the arbiter, so the paused
    /// worker's late jobs land in the table (and the run fails).
    #[arg(long)]
    without_arbiter: bool,
}

/// The counts of the outcome line, and what else was wrong.
struct Outcome {
    applied: u64,
    rejected: u64,
    stale_applied: u64,
    problems: Vec<String>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let js = services::jetstream(&args.nats).await?;
    let pg = services::postgres(&args.postgres).await?;
    let names = Names::fresh()?;
    let pull = services::create_stream(&js, &names).await?;
    let pg = Arc::new(Mutex::new(pg));
    let outcome = async {
        services::create_table(&*pg.lock().await, &names).await?;
        story(&args, &names, pull, pg.clone(), &metrics).await
    }
    .await;
    let cleaned = services::cleanup(&js, &*pg.lock().await, &names).await;
    let mut outcome = match (outcome, cleaned) {
        (Ok(o), Ok(())) => o,
        (Ok(mut o), Err(e)) => {
            o.problems.push(format!("cleaning up: {e:#}"));
            o
        }
        (Err(e), cleaned) => {
            if let Err(c) = cleaned {
                eprintln!("error: cleaning up: {c:#}");
            }
            return Err(e);
        }
    };
    println!("cleaned up: stream {} and table {} removed", names.stream, names.table);
    if outcome.stale_applied != 0 {
        outcome
            .problems
            .push(format!("{} stale jobs reached the table", outcome.stale_applied));
    }
    for p in &outcome.problems {
        eprintln!("FAILED: {p}");
    }
    println!(
        "{} jobs applied, {} stale jobs rejected, {} stale jobs applied",
        outcome.applied, outcome.rejected, outcome.stale_applied
    );
    Ok(if outcome.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn story(
    args: &Args,
    names: &Names,
    pull: async_nats::jetstream::consumer::PullConsumer,
    pg: Arc<Mutex<tokio_postgres::Client>>,
    metrics: &PrometheusHandle,
) -> anyhow::Result<Outcome> {
    let n = u64::from(args.jobs);
    let coordinator = Coordinator::start().await?;
    let apply = if args.without_arbiter {
        Apply::Unfenced
    } else {
        Apply::Fenced
    };
    println!(
        "coordinator: in this process on {} (temporary data dir)",
        coordinator.url
    );
    println!(
        "NATS: stream {} (subject {}); PostgreSQL: table {}",
        names.stream, names.subject, names.table
    );
    println!(
        "consumer: applies each job {}",
        match apply {
            Apply::Fenced => "through the PostgreSQL arbiter (with_fence_once)",
            Apply::Unfenced => "WITHOUT the arbiter (the control: no token check)",
        }
    );
    let consumer = Consumer::start(pull.clone(), pg.clone(), names, apply);
    let mut progress = consumer.progress.clone();
    let plan = Plan {
        coordinator: &coordinator.url,
        nats: &args.nats,
        subject: &names.subject,
        resource: &names.resource,
        run_id: &names.run_id,
        jobs: args.jobs,
        ttl: TTL,
        wait: ACQUIRE_WAIT,
    };

    let tokens = run_workers(&plan, &mut progress, n).await?;
    let seen = *progress.borrow();
    let tally = consumer.stop().await?;
    println!(
        "consumer: {} applied, {} stale rejected (acknowledged once, on_stale called {} times), {} other",
        tally.applied,
        tally.stale,
        seen.stale,
        tally.total() - tally.applied - tally.stale
    );
    let info = pull.get_info().await.context("reading the stream consumer's state")?;
    let left = info.num_pending + info.num_ack_pending as u64;
    println!(
        "stream: {} jobs pending, {} delivered and not acknowledged",
        info.num_pending, info.num_ack_pending
    );
    let stale_metric = stale_counter(metrics);
    println!("consumer metrics: {STALE_METRIC}{{queue=\"{QUEUE}\"}} {stale_metric}");

    let current = current_token(&coordinator.url, &names.resource).await?;
    let table = consumer::check_table(&*pg.lock().await, names, current, CURRENT).await?;
    println!(
        "table {}: {} rows, {} of {CURRENT} with the current token {current}, {} with a lower token",
        names.table, table.rows, table.current, table.stale
    );
    coordinator.stop().await?;

    let report = Report {
        current,
        tally,
        on_stale: seen.stale,
        stale_metric,
        table,
        left,
    };
    let problems = judge(n, tokens, &report);
    Ok(Outcome {
        applied: tally.applied,
        rejected: tally.stale,
        stale_applied: table.stale,
        problems,
    })
}

/// The tokens of the two grants.
#[derive(Clone, Copy, Debug)]
struct Tokens {
    paused: u64,
    current: u64,
}

/// Worker A acquires and is stopped before it publishes; worker B waits out
/// A's lease, acquires and publishes, and its jobs are applied; A resumes
/// and publishes its late jobs. Returns once the consumer has handled all.
async fn run_workers(plan: &Plan<'_>, progress: &mut watch::Receiver<Progress>, n: u64) -> anyhow::Result<Tokens> {
    let mut a = Worker::spawn(PAUSED, plan)?;
    let token_a = a.granted().await?;
    a.signal(Signal::STOP)?;
    let stopped_at = Instant::now();
    println!(
        "{PAUSED}: granted {} token={token_a} (ttl {} ms), then SIGSTOPped before it publishes",
        plan.resource,
        plan.ttl.as_millis()
    );

    let mut b = Worker::spawn(CURRENT, plan)?;
    let token_b = b.granted().await?;
    println!(
        "{CURRENT}: granted token={token_b} after {} ms, once {PAUSED}'s lease expired",
        stopped_at.elapsed().as_millis()
    );
    b.go().await?;
    println!("{CURRENT}: {}", b.published().await?);
    wait_for(progress, "worker-b's jobs to be applied", |p| p.applied >= n).await?;
    println!("consumer: applied {CURRENT}'s {n} jobs");

    a.signal(Signal::CONT)?;
    a.go().await?;
    println!("{PAUSED}: SIGCONTed; it publishes with its old token, unaware its lease is gone");
    println!("{PAUSED}: {}", a.published().await?);
    wait_for(progress, "every job to be handled", |p| p.applied + p.stale >= 2 * n).await?;
    Ok(Tokens {
        paused: token_a,
        current: token_b,
    })
}

/// What the consumer and the table reported, against what a correct run
/// of `n` jobs per worker gives: every difference, in words.
struct Report {
    current: u64,
    tally: Tally,
    on_stale: u64,
    stale_metric: u64,
    table: TableCheck,
    /// Jobs the stream still holds for the consumer, pending or unacked.
    left: u64,
}

fn judge(n: u64, tokens: Tokens, r: &Report) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expect = |what: &str, got: u64, want: u64| {
        if got != want {
            problems.push(format!("{what}: {got}, expected {want}"));
        }
    };
    let other = r.tally.total() - r.tally.applied - r.tally.stale;
    expect("the current token", r.current, tokens.current);
    expect("jobs applied", r.tally.applied, n);
    expect("stale jobs rejected", r.tally.stale, n);
    expect("stale jobs handed to on_stale", r.on_stale, n);
    expect("deliveries with another verdict", other, 0);
    expect("jobs left in the stream", r.left, 0);
    expect(STALE_METRIC, r.stale_metric, n);
    expect("rows in the table", r.table.rows, n);
    expect("rows of the current worker", r.table.current, n);
    if tokens.current <= tokens.paused {
        problems.push(format!(
            "{CURRENT}'s token {} is not above {PAUSED}'s {}",
            tokens.current, tokens.paused
        ));
    }
    problems
}

/// Waits until the consumer's progress satisfies `done`, at most
/// [`CONSUME_LIMIT`].
async fn wait_for(
    progress: &mut watch::Receiver<Progress>,
    what: &str,
    done: impl FnMut(&Progress) -> bool,
) -> anyhow::Result<()> {
    let waited = tokio::time::timeout(CONSUME_LIMIT, progress.wait_for(done))
        .await
        .map(|r| r.is_ok());
    match waited {
        Ok(true) => Ok(()),
        Ok(false) => Err(anyhow!("the consumer stopped while waiting for {what}")),
        Err(_) => {
            let p = *progress.borrow();
            Err(anyhow!(
                "waited {} s for {what}; the consumer handled {} jobs, applied {}, rejected {} as stale",
                CONSUME_LIMIT.as_secs(),
                p.handled,
                p.applied,
                p.stale
            ))
        }
    }
}

/// The resource's last token, as the coordinator says.
async fn current_token(url: &str, resource: &str) -> anyhow::Result<u64> {
    let resource = ResourceId::new(resource).context("the run's resource")?;
    let client = Client::connect(url).await.context("connecting to the coordinator")?;
    let status = client
        .status(&resource)
        .await
        .context("reading the resource's status")?;
    status
        .last_token
        .map(|t| t.get())
        .ok_or_else(|| anyhow!("the coordinator has no token for {resource}"))
}

/// `leasefence_stale_messages_total{queue="queue-pipeline"}` as the
/// installed recorder renders it (0 when never incremented).
fn stale_counter(metrics: &PrometheusHandle) -> u64 {
    let label = format!("queue=\"{QUEUE}\"");
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(&format!("{STALE_METRIC}{{")) && l.contains(&label))
        .find_map(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0)
}
