//! `leasefence elect NAME --ttl 10s -- CMD ARGS…`: campaign for leadership of
//! NAME, waiting as long as it takes (queueing again each time the server's
//! wait maximum runs out), then run CMD as the leader exactly as `leasefence
//! run` runs it: `LEASEFENCE_TOKEN` is the leader's term, the child runs in
//! its own process group, which is stopped on loss (exit 4); when CMD exits,
//! leadership is resigned and CMD's exit code is passed on.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use leasefence_client::{Client, LeaseConfig};
use leasefence_core::{Holder, ResourceId};

use crate::cli::{ServerArg, parse_duration};
use crate::client_cmds::failure;
use crate::run_cmd::{default_holder, run_with_lease};
use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name (a resource name).
    pub name: String,
    /// Leadership lease time to live; renewed about every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// After SIGTERM on loss, how long before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub grace: Duration,
    /// Safety margin taken off the self-fencing deadline (default max(ttl/10, 50ms)).
    #[arg(long, value_parser = parse_duration)]
    pub margin: Option<Duration>,
    /// Holder name observers see (default: HOST:PID).
    #[arg(long)]
    pub holder: Option<String>,
    #[command(flatten)]
    pub server: ServerArg,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

pub async fn run(a: ElectArgs) -> CmdResult {
    let name = ResourceId::new(&a.name).map_err(Failure::invalid)?;
    let holder = Holder::new(&a.holder.clone().unwrap_or_else(default_holder)).map_err(Failure::invalid)?;
    // No wait configured: each round waits the server's default maximum.
    let mut config = LeaseConfig::new(a.ttl).with_holder(holder);
    if let Some(m) = a.margin {
        config = config.with_margin(m);
    }
    let client = Client::connect(&a.server.server).await.map_err(failure)?;
    let leader = client.campaign(&name, config).await.map_err(failure)?;
    tracing::info!(%name, term = %leader.term(), "elected");
    run_with_lease(leader.into_lease(), &a.server.server, &a.command, a.grace).await
}
