//! `leasefence arbiter install URL` and `leasefence arbiter check URL`.

use clap::Subcommand;
use leasefence_arbiter::ArbiterError;

use crate::{CmdResult, Failure};

#[derive(Subcommand, Debug)]
pub enum ArbiterCommand {
    /// Install (or upgrade) the fence table and functions: postgres://, sqlite://PATH, redis://.
    Install { url: String },
    /// The pause test kit: prove a real arbiter rejects a paused worker's stale effect.
    Check {
        url: String,
        /// How many grant-pause-takeover-resume trials to run.
        #[arg(long, default_value_t = 100)]
        trials: u32,
    },
}

fn failure(e: ArbiterError) -> Failure {
    match e {
        ArbiterError::Invalid(_) => Failure::new(Failure::INVALID, e),
        other => Failure::new(Failure::INTERNAL, other),
    }
}

pub async fn run(c: ArbiterCommand) -> CmdResult {
    match c {
        ArbiterCommand::Install { url } => {
            leasefence_arbiter::install(&url).await.map_err(failure)?;
            println!("installed the leasefence arbiter");
            Ok(())
        }
        ArbiterCommand::Check { url, trials } => {
            let report = leasefence_arbiter::check(&url, trials).await.map_err(failure)?;
            for c in &report.counterexamples {
                println!(
                    "counterexample: trial {} on {}: paused token {}, newer token {}: {}",
                    c.trial, c.resource, c.paused_token, c.newer_token, c.what
                );
            }
            println!(
                "{} trials, {} stale accepted, {} stale rejected",
                report.trials, report.stale_accepted, report.stale_rejected
            );
            if report.passed() {
                Ok(())
            } else {
                Err(Failure::new(
                    Failure::CHECK_FAILED,
                    anyhow::anyhow!("the arbiter accepted stale effects"),
                ))
            }
        }
    }
}
