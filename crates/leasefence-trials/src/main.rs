//! `leasefence-trials`: the invariant checked with real processes, against
//! the release binaries (issue #5).
//!
//! - `pause`: a client process SIGSTOPped between grant and commit, past its
//!   TTL, while a second client commits through the PostgreSQL arbiter; the
//!   resumed client's old token must be rejected.
//! - `crash`: the coordinator SIGKILLed under concurrent grants and
//!   restarted, again and again, on one data dir; no acknowledged token may
//!   be reused or forgotten.
//! - `failover`: several coordinators on one shared store, the active one
//!   SIGKILLed (or SIGSTOPped past its leader TTL and resumed) again and
//!   again; no acknowledged token may be reused or forgotten, a standby must
//!   take over in time, and a deposed leader must write nothing.
//!
//! All end with `N trials, S stale effects, R token reuse, L acknowledged
//! grants lost` and exit 0 only when all three are 0 and every trial ran
//! (see [`report`] for the exit codes).

mod client_cmd;
mod crash;
mod crash_check;
mod failover;
mod failover_check;
mod failover_cluster;
mod failover_db;
#[cfg(feature = "etcd")]
mod failover_etcd;
mod failover_http;
mod failover_load;
mod failover_trial;
mod pause;
mod pause_check;
mod pause_db;
mod pause_trial;
mod procs;
mod report;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "leasefence-trials",
    version,
    about = "Real-process trials of leasefence: pause, crash and failover"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// A paused writer against the PostgreSQL arbiter, with real processes.
    Pause(pause::PauseArgs),
    /// SIGKILL of the coordinator under concurrent grants, then restart.
    Crash(crash::CrashArgs),
    /// Several coordinators on one shared store; the active one SIGKILLed or SIGSTOPped.
    Failover(failover::FailoverArgs),
    /// One trial client (spawned by `pause`).
    #[command(hide = true)]
    Client(client_cmd::ClientArgs),
}

fn main() {
    let cli = Cli::parse();
    let runtime = match &cli.command {
        // A client is one short sequential conversation.
        Cmd::Client(_) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        _ => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
    };
    let code = match runtime {
        Ok(rt) => rt.block_on(async {
            match cli.command {
                Cmd::Pause(a) => pause::run(a).await,
                Cmd::Crash(a) => crash::run(a).await,
                Cmd::Failover(a) => failover::run(a).await,
                Cmd::Client(a) => client_cmd::run(a).await,
            }
        }),
        Err(e) => Err(anyhow::Error::new(e).context("cannot start the tokio runtime")),
    };
    std::process::exit(match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("leasefence-trials: error: {e:#}");
            report::EXIT_INCOMPLETE
        }
    });
}
