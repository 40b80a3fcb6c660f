//! `leasefence elect NAME --ttl 10s -- CMD ARGS…`: campaign for leadership of
//! NAME, waiting as long as it takes (queueing again each time the server's
//! wait maximum runs out), then run CMD as the leader exactly as `leasefence
//! run` runs it: `LEASEFENCE_TOKEN` is the leader's term, the child runs in
//! its own process group, which is stopped on loss (exit 4); when CMD exits,
//! leadership is resigned and CMD's exit code is passed on.

use clap::Args;
use leasefence_core::ResourceId;

use crate::client_cmds::failure;
use crate::run_cmd::ChildArgs;
use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name (a resource name).
    pub name: String,
    #[command(flatten)]
    pub child: ChildArgs,
}

pub async fn run(a: ElectArgs) -> CmdResult {
    let name = ResourceId::new(&a.name).map_err(Failure::invalid)?;
    // No wait configured: each round waits the server's default maximum.
    let fencing = a.child.fencing()?;
    let client = a.child.server.connect().await?;
    let leader = client.campaign(&name, fencing.config).await.map_err(failure)?;
    tracing::info!(%name, term = %leader.term(), "elected");
    a.child.run_under(leader.into_lease(), fencing.grace).await
}
