//! The worker process: acquires the lease on the pipeline's resource,
//! prints its grant, waits for `go` on stdin, then publishes its jobs to
//! JetStream with the fence of that grant, whether or not the grant is still
//! valid by then (as a worker that was paused cannot know).
//!
//! The driver reads the lines this process prints:
//! `granted token=T ttl_ms=MS` and then `published N jobs with token=T`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use leasefence_arbiter::{ResourceId, nats};
use leasefence_client::Client;
use leasefence_core::Holder;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::services;

#[derive(Parser, Debug)]
pub struct Args {
    /// The coordinator's URL.
    #[arg(long)]
    coordinator: String,
    /// The NATS server with JetStream.
    #[arg(long)]
    nats: String,
    /// The subject to publish the jobs to.
    #[arg(long)]
    subject: String,
    /// The leased resource.
    #[arg(long)]
    resource: String,
    /// This worker's name (the lease's holder).
    #[arg(long)]
    holder: String,
    /// Jobs to publish.
    #[arg(long)]
    jobs: u32,
    /// The lease's TTL, in milliseconds.
    #[arg(long)]
    ttl_ms: u64,
    /// How long to wait for a busy lease, in milliseconds.
    #[arg(long)]
    wait_ms: u64,
    /// Prefix of the message ids, unique per run.
    #[arg(long)]
    run_id: String,
}

/// The payload of job `job` of `holder`: `HOLDER JOB`.
pub fn payload(holder: &str, job: u32) -> String {
    format!("{holder} {job}")
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let resource = ResourceId::new(&args.resource).context("--resource")?;
    let holder = Holder::new(&args.holder).context("--holder")?;
    let js = services::jetstream(&args.nats).await?;
    let client = Client::connect(&args.coordinator)
        .await
        .with_context(|| format!("cannot reach the coordinator at {}", args.coordinator))?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let lease = client
        .acquire(&resource, ttl, Some(&holder), Duration::from_millis(args.wait_ms))
        .await
        .with_context(|| format!("acquiring {resource}"))?;
    say(&format!("granted token={} ttl_ms={}", lease.token, args.ttl_ms))?;

    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .context("reading the go signal on stdin")?;
    if line.trim() != "go" {
        bail!("expected `go` on stdin, got {:?}: not publishing", line.trim());
    }

    // Publishes with the grant's fence: this worker does not check whether
    // its lease is still valid (after a pause it cannot know); the consumer's
    // arbiter decides.
    let fence = lease.fence();
    for job in 1..=args.jobs {
        let id = format!("{}/{}/job-{job}", args.run_id, args.holder);
        nats::publish(&js, &args.subject, &fence, Some(&id), payload(&args.holder, job))
            .await
            .with_context(|| format!("publishing job {job}"))?;
    }
    say(&format!("published {} jobs with token={}", args.jobs, lease.token))?;
    Ok(ExitCode::SUCCESS)
}

/// One line to the driver, flushed at once (stdout is a pipe).
fn say(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("writing to stdout")
}
