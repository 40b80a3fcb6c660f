//! `queue-pipeline`: the fence carried through a queue, end to end.
//!
//! A coordinator (in this process), two worker processes that acquire one
//! lease and publish jobs with their fence to NATS JetStream, and a consumer
//! that applies each job to PostgreSQL through the PostgreSQL arbiter. The
//! first worker is SIGSTOPped between its grant and its publish; its lease
//! expires, the second worker takes over and its jobs are applied; then the
//! first resumes and publishes with its old token, and the consumer rejects
//! every one of those jobs. The last line says what the table holds.
//!
//! - [`driver`]: the story, step by step, and the outcome line.
//! - [`coordinator`]: the coordinator, served in this process.
//! - [`worker`]: the worker process (`queue-pipeline worker …`), and
//!   [`workers`]: starting, pausing and resuming it from the driver.
//! - [`consumer`]: the fenced consumer and its jobs table.
//! - [`services`]: connecting to NATS and PostgreSQL, and what a run creates
//!   there and removes again.

mod consumer;
mod coordinator;
mod driver;
mod services;
mod worker;
mod workers;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The fence carried through NATS JetStream to a PostgreSQL consumer: a
/// paused worker's late jobs are rejected.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: driver::Args,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One worker process (started by the pipeline itself).
    #[command(hide = true)]
    Worker(worker::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::Worker(args)) => worker::run(args).await,
            None => driver::run(cli.run).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
