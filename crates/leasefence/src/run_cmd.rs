//! `leasefence run RES --ttl 10s -- CMD ARGS…`: run a command while holding a
//! lease, and stop it when the lease can no longer be proven held.
//!
//! The child gets `LEASEFENCE_RESOURCE`, `LEASEFENCE_TOKEN` and
//! `LEASEFENCE_SERVER` in its environment and runs in its own process group,
//! so that everything it starts can be stopped together. On loss (the local
//! self-fencing deadline passed, or the coordinator refused a renewal) the
//! group gets SIGTERM, then SIGKILL after `--grace`, and `run` exits 4.
//! Otherwise `run` stops any processes the child left behind in its group,
//! releases the lease and exits with the child's code (128+N if killed by
//! signal N). SIGINT and SIGTERM sent to `run` are forwarded to the group.
//! Exit 3: busy after `--wait`; 126/127: CMD could not be started.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use leasefence_client::{Client, Lease, LeaseConfig, Loss};
use leasefence_core::{ENV_RESOURCE, ENV_TOKEN, Holder, ResourceId};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout_at};

use crate::cli::{ServerArg, parse_duration};
use crate::client_cmds::failure;
use crate::{CmdResult, Failure};

/// The environment variable naming the coordinator, for the child's own calls.
const ENV_SERVER: &str = "LEASEFENCE_SERVER";
/// How often to look whether a signalled process group is gone.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long to wait for a SIGKILLed group to disappear.
const KILL_WAIT: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct RunArgs {
    pub resource: String,
    /// Lease time to live; renewed about every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Wait up to this long for a busy resource (default: fail at once, exit 3).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// After SIGTERM on loss, how long before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub grace: Duration,
    /// Safety margin taken off the self-fencing deadline (default max(ttl/10, 50ms)).
    #[arg(long, value_parser = parse_duration)]
    pub margin: Option<Duration>,
    /// Holder name shown to others (default: HOST:PID).
    #[arg(long)]
    pub holder: Option<String>,
    #[command(flatten)]
    pub server: ServerArg,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

/// How the child's run ended.
enum Ended {
    Exited(ExitStatus),
    /// `None`: lost before the child was started.
    Lost(Loss, Option<ExitStatus>),
}

fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    format!("{host}:{}", std::process::id())
}

pub async fn run(a: RunArgs) -> CmdResult {
    let resource = ResourceId::new(&a.resource).map_err(Failure::invalid)?;
    let holder = Holder::new(&a.holder.clone().unwrap_or_else(default_holder)).map_err(Failure::invalid)?;
    let mut config = LeaseConfig::new(a.ttl).with_wait(a.wait).with_holder(holder);
    if let Some(m) = a.margin {
        config = config.with_margin(m);
    }
    let client = Client::connect(&a.server.server).await.map_err(failure)?;
    let lease = client.lease(&resource, config).await.map_err(failure)?;
    let (program, args) = a
        .command
        .split_first()
        .ok_or_else(|| Failure::invalid("no command given"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(ENV_RESOURCE, resource.as_str())
        .env(ENV_TOKEN, lease.token().to_string())
        .env(ENV_SERVER, &a.server.server)
        .process_group(0);
    let ended = supervise(&lease, cmd, a.grace).await;
    let name = program.to_string_lossy();
    match ended {
        Err(e) => {
            release(lease).await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            Err(Failure::new(code, anyhow::anyhow!("cannot start {name}: {e}")))
        }
        Ok(Ended::Lost(loss, status)) => {
            release(lease).await;
            let what = status.map_or("was not started".to_string(), |s| format!("was stopped ({s})"));
            Err(Failure::new(
                Failure::LOST,
                anyhow::anyhow!("lease on {resource} lost ({loss}); {name} {what}"),
            ))
        }
        Ok(Ended::Exited(status)) => finish(lease, &name, status).await,
    }
}

/// After a normal exit: still held → release and pass the child's code on.
async fn finish(lease: Lease, name: &str, status: ExitStatus) -> CmdResult {
    if let Some(loss) = lease.watch().loss() {
        release(lease).await;
        return Err(Failure::new(
            Failure::LOST,
            anyhow::anyhow!("lease lost ({loss}) before {name} ended ({status})"),
        ));
    }
    let resource = lease.resource().clone();
    if let Err(e) = lease.release().await {
        if failure(e).code == Failure::LOST {
            return Err(Failure::new(
                Failure::LOST,
                anyhow::anyhow!("lease on {resource} was lost when {name} ended ({status})"),
            ));
        }
        tracing::warn!(%resource, "release failed; the lease will expire after its TTL");
    }
    match exit_code(status) {
        0 => Ok(()),
        code => Err(Failure::new(code, anyhow::anyhow!("{name} ended: {status}"))),
    }
}

/// Best effort: a lost lease is usually gone already; if the coordinator
/// still has it (we self-fenced early), this lets the next holder in sooner.
async fn release(lease: Lease) {
    let _ = lease.release().await;
}

/// The child's exit code, or 128+N when signal N killed it (as shells do).
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}

/// Spawns the child and waits for it to exit, for the lease to be lost (then
/// stops the child's group), or for SIGINT/SIGTERM to forward.
async fn supervise(lease: &Lease, mut cmd: Command, grace: Duration) -> std::io::Result<Ended> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    if let Some(loss) = lease.watch().loss() {
        return Ok(Ended::Lost(loss, None));
    }
    let mut child = cmd.spawn()?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let lost = lease.lost();
    tokio::pin!(lost);
    let ended = loop {
        tokio::select! {
            biased;
            loss = &mut lost => {
                let status = stop_group(&mut child, pgid, grace).await?;
                break Ended::Lost(loss, Some(status));
            }
            status = child.wait() => break Ended::Exited(status?),
            _ = sigint.recv() => signal_group(pgid, libc::SIGINT),
            _ = sigterm.recv() => signal_group(pgid, libc::SIGTERM),
        }
    };
    if let Ended::Exited(_) = ended {
        // Whatever the child left running in its group must not outlive the lease.
        if group_alive(pgid) {
            stop_group(&mut child, pgid, grace).await?;
        }
    }
    Ok(ended)
}

/// SIGTERM to the group; SIGKILL if anything of it is left after `grace`.
/// Returns the leader's exit status once the group is gone (or, for orphans
/// that already exited and wait for init to reap them, [`KILL_WAIT`] later).
async fn stop_group(child: &mut Child, pgid: Option<i32>, grace: Duration) -> std::io::Result<ExitStatus> {
    signal_group(pgid, libc::SIGTERM);
    let until = Instant::now() + grace;
    let mut leader = timeout_at(until, child.wait()).await.ok().transpose()?;
    while group_alive(pgid) && Instant::now() < until {
        sleep(GROUP_POLL).await;
        if leader.is_none() {
            // Reap the leader as soon as it exits: a zombie still counts as a member.
            leader = child.try_wait()?;
        }
    }
    if group_alive(pgid) {
        signal_group(pgid, libc::SIGKILL);
    }
    let status = match leader {
        Some(status) => status,
        None => child.wait().await?,
    };
    // SIGKILL is delivered asynchronously: let the rest of the group die.
    let until = Instant::now() + KILL_WAIT;
    while group_alive(pgid) && Instant::now() < until {
        sleep(GROUP_POLL).await;
    }
    Ok(status)
}

/// Sends `sig` to the process group `pgid` (the child's pid, as it was
/// spawned with `process_group(0)`). A group that is gone is not an error.
fn signal_group(pgid: Option<i32>, sig: libc::c_int) {
    if let Some(pgid) = pgid.filter(|p| *p > 1) {
        // SAFETY: killpg only sends a signal; pgid > 1 never names "every
        // process" (0 or -1 would), and a group that is gone yields ESRCH.
        unsafe {
            libc::killpg(pgid, sig);
        }
    }
}

/// True while some process of the group has not exited. `killpg(pgid, 0)`
/// alone also counts zombies (exited orphans waiting for init to reap them),
/// so on success the members' states are read from `/proc`.
fn group_alive(pgid: Option<i32>) -> bool {
    let Some(pgid) = pgid.filter(|p| *p > 1) else {
        return false;
    };
    // SAFETY: as in `signal_group`; signal 0 sends nothing.
    if unsafe { libc::killpg(pgid, 0) } != 0 {
        return false;
    }
    match std::fs::read_dir("/proc") {
        Err(_) => true,
        Ok(entries) => entries.flatten().any(|e| is_running_member(&e.path(), pgid)),
    }
}

/// `/proc/PID/stat` is `pid (comm) state ppid pgrp …`; comm may hold spaces
/// and parentheses, so the fields are read after the last ") ".
fn is_running_member(proc_dir: &std::path::Path, pgid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
    state.is_some_and(|s| s != "Z" && s != "X") && pgrp == Some(pgid)
}
