//! `leasefence watch RES [--prefix]`: print transitions as they happen,
//! reconnecting and resuming from the last revision seen, so a dropped
//! connection loses no event (or says plainly that history was lost). The
//! connection sends keep-alive pings, so a coordinator that stops answering
//! ends the stream (and a reconnect follows) instead of a silent hang.

use std::time::Duration;

use clap::Args;
use leasefence_core::shown;
use leasefence_proto::v1 as pb;
use serde_json::json;
use tonic::Code;

use crate::cli::ServerArg;
use crate::out;
use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// A resource, or with --prefix a prefix of names ("" for all).
    pub resource: String,
    /// Watch every resource whose name starts with RESOURCE.
    #[arg(long)]
    pub prefix: bool,
    /// Print one JSON object per event.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub server: ServerArg,
}

fn kind_name(kind: i32) -> &'static str {
    match pb::watch_event::Kind::try_from(kind) {
        Ok(pb::watch_event::Kind::Granted) => "granted",
        Ok(pb::watch_event::Kind::Released) => "released",
        Ok(pb::watch_event::Kind::Expired) => "expired",
        _ => "unknown",
    }
}

fn print(e: &pb::WatchEvent, as_json: bool) -> std::io::Result<()> {
    if as_json {
        let holder = (!e.holder.is_empty()).then_some(e.holder.as_str());
        let v = json!({ "revision": e.revision, "kind": kind_name(e.kind), "resource": e.resource,
                        "token": e.token, "holder": holder });
        out::line(format_args!("{v}"))
    } else if e.holder.is_empty() {
        out::line(format_args!(
            "{} {} {} token={}",
            e.revision,
            kind_name(e.kind),
            shown(&e.resource),
            e.token
        ))
    } else {
        out::line(format_args!(
            "{} {} {} token={} holder={}",
            e.revision,
            kind_name(e.kind),
            shown(&e.resource),
            e.token,
            shown(&e.holder)
        ))
    }
}

pub async fn run(a: WatchArgs) -> CmdResult {
    if !(a.prefix && a.resource.is_empty()) {
        leasefence_core::ResourceId::new(&a.resource).map_err(Failure::invalid)?;
    }
    let client = a.server.connect().await?;
    let mut resume: Option<(u64, String)> = None;
    let mut seen = 0u64;
    let mut backoff = Duration::from_millis(100);
    let mut opened_once = false;
    loop {
        let req = pb::WatchRequest {
            resource: a.resource.clone(),
            prefix: a.prefix,
            after_revision: resume.as_ref().map(|r| r.0),
            coordinator_id: resume.as_ref().map(|r| r.1.clone()).unwrap_or_default(),
        };
        // Opening follows leader hints and skips unreachable coordinators.
        let mut stream = match client.open_watch(req).await {
            Ok(s) => s,
            Err(s) if s.code() == Code::InvalidArgument => return Err(Failure::invalid(s.message())),
            // The history to resume from is gone (a restart, or another
            // coordinator took over): say so rather than skip events.
            Err(s) if s.code() == Code::FailedPrecondition => {
                return Err(Failure::new(Failure::INTERNAL, anyhow::anyhow!("{}", s.message())));
            }
            Err(s) if !opened_once => {
                return Err(Failure::new(
                    Failure::INTERNAL,
                    anyhow::anyhow!("cannot reach {}: {}", a.server.joined(), s.message()),
                ));
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        opened_once = true;
        backoff = Duration::from_millis(100);
        while let Ok(Some(e)) = stream.message().await {
            if !out::streamed(print(&e, a.json))? {
                return Ok(()); // the reader has gone: as after --count
            }
            resume = Some((e.revision, e.coordinator_id.clone()));
            seen += 1;
            if a.count.is_some_and(|c| seen >= c) {
                return Ok(());
            }
        }
        if resume.is_none() {
            // Nothing seen yet: resume "from now" of the new connection is all we can do.
            eprintln!("watch: reconnecting");
        }
    }
}
