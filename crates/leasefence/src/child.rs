//! The child of `leasefence run` and `leasefence elect`: spawned in its own
//! process group, supervised against the lease's loss, and stopped as a group
//! so that nothing it started outlives the lease: SIGTERM `grace` before the
//! self-fencing deadline, SIGKILL at the deadline at the latest.
//!
//! The lease is acquired with the grace added to its margin, so what the
//! lease reports as its deadline (and its loss) comes `grace` before the
//! real one, and renewals are paced to land before it. When the coordinator
//! refuses a renewal the lease is lost at once: SIGTERM then, SIGKILL
//! `grace` later, but never after the real deadline.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use leasefence_client::{Lease, LeaseWatch, Loss};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout_at};

use crate::tty::{self, Foreground};

/// How often to look whether a signalled process group is gone.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long to wait for a SIGKILLed group to disappear.
const KILL_WAIT: Duration = Duration::from_secs(1);

/// How the child's run ended.
pub enum Ended {
    Exited(ExitStatus),
    /// `None`: lost before the child was started.
    Lost(Loss, Option<ExitStatus>),
}

/// The child's exit code, or 128+N when signal N killed it (as shells do).
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}

/// How long after now the group must be dead: `grace`, but no later than the
/// real deadline, `grace` after the one the lease reports.
fn kill_within(watch: &LeaseWatch, grace: Duration) -> Duration {
    let overdue = watch.now().saturating_since(watch.deadline());
    grace.saturating_sub(overdue)
}

/// Spawns the child and waits for it to exit, for the lease to be lost (then
/// stops the child's group), or for SIGINT/SIGTERM to forward. `lease` must
/// have been acquired with `grace` added to its margin (see the module doc).
pub async fn supervise(lease: &Lease, mut cmd: Command, grace: Duration) -> std::io::Result<Ended> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let watch = lease.watch();
    if let Some(loss) = watch.loss() {
        return Ok(Ended::Lost(loss, None));
    }
    // Held until the group is gone; dropping it hands the terminal back.
    let foreground = Foreground::claim();
    tty::prepare(&mut cmd, foreground.as_ref());
    let mut child = cmd.spawn()?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let lost = lease.lost();
    tokio::pin!(lost);
    let ended = loop {
        tokio::select! {
            biased;
            loss = &mut lost => {
                let status = stop_group(&mut child, pgid, kill_within(&watch, grace)).await?;
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
            stop_group(&mut child, pgid, kill_within(&watch, grace)).await?;
        }
    }
    drop(foreground);
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
