//! `leasefence observe NAME [--json] [--count N]`: print one line per change
//! of an election's leadership, starting with the current state. Reconnects
//! by itself; the view may lag behind the coordinator.

use clap::Args;
use leasefence_client::LeaderChange;
use leasefence_core::ResourceId;
use serde_json::json;

use crate::cli::ServerArg;
use crate::client_cmds::failure;
use crate::out;
use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct ObserveArgs {
    /// The election's name.
    pub name: String,
    /// Print one JSON object per change.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many lines (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub server: ServerArg,
}

fn print(name: &ResourceId, change: &LeaderChange, as_json: bool) -> std::io::Result<()> {
    match (change, as_json) {
        (LeaderChange::Leader { term, holder }, true) => {
            let v = json!({ "name": name.as_str(), "state": "leader", "term": term.get(), "holder": holder.as_str() });
            out::line(format_args!("{v}"))
        }
        (LeaderChange::Vacant { last_term }, true) => {
            let v = json!({ "name": name.as_str(), "state": "vacant", "last_term": last_term.map(|t| t.get()) });
            out::line(format_args!("{v}"))
        }
        (LeaderChange::Leader { term, holder }, false) => out::line(format_args!(
            "leader {} term={term} holder={}",
            name.shown(),
            holder.shown()
        )),
        (LeaderChange::Vacant { last_term: Some(t) }, false) => {
            out::line(format_args!("vacant {} last_term={t}", name.shown()))
        }
        (LeaderChange::Vacant { last_term: None }, false) => out::line(format_args!("vacant {}", name.shown())),
    }
}

pub async fn run(a: ObserveArgs) -> CmdResult {
    let name = ResourceId::new(&a.name).map_err(Failure::invalid)?;
    let client = a.server.connect().await?;
    let mut changes = client.observe(&name);
    let mut printed = 0u64;
    let mut last_error = None;
    while let Some(item) = changes.next().await {
        match item {
            Ok(change) => {
                if !out::streamed(print(&name, &change, a.json))? {
                    return Ok(()); // the reader has gone: as after --count
                }
                printed += 1;
                if a.count.is_some_and(|c| printed >= c) {
                    return Ok(());
                }
            }
            // Nothing shown yet: say so rather than wait silently.
            Err(e) if printed == 0 => return Err(failure(e)),
            Err(e) => {
                eprintln!("observe: {e}; reconnecting");
                last_error = Some(e);
            }
        }
    }
    match last_error {
        Some(e) => Err(failure(e)),
        None => Ok(()),
    }
}
