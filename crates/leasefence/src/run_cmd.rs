//! `leasefence run RES --ttl 10s -- CMD ARGS…`: run a command while holding a
//! lease, and stop it when the lease can no longer be proven held.
//!
//! The child gets `LEASEFENCE_RESOURCE`, `LEASEFENCE_TOKEN` and
//! `LEASEFENCE_SERVER` (with `LEASEFENCE_CA`, `_CERT`, `_KEY` when `--ca`,
//! `--cert`, `--key` were given) in its environment and runs in its own process group,
//! so that everything it starts can be stopped together. The group must be
//! dead by the self-fencing deadline: it gets SIGTERM `--grace` before it
//! (when no renewal has moved it by then) and SIGKILL at it, and `run` exits
//! 4; a refused renewal gets SIGTERM at once and SIGKILL `--grace` later,
//! never after the deadline. A `--grace` that does not fit in `ttl − margin`
//! is refused. Otherwise `run` stops any processes the child left behind in
//! its group, releases the lease and exits with the child's code (128+N if
//! killed by signal N). SIGINT and SIGTERM sent to `run` are forwarded to
//! the group; on a terminal the child's group is the foreground job (see
//! [`crate::tty`]). Calls to the coordinator are bounded by `--timeout`, so
//! `run` exits even when the coordinator is unreachable.
//! Exit 2: invalid flags; 3: busy after `--wait`; 126/127: CMD could not be
//! started.
//!
//! With several coordinators (`--server URL1,URL2,…`), the keep-alive moves to
//! the new active coordinator after a takeover: the child keeps running as
//! long as the takeover completes before the self-fencing deadline.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use leasefence_client::{Lease, LeaseConfig, default_margin};
use leasefence_core::{ENV_RESOURCE, ENV_SIGNATURE, ENV_TOKEN, Holder, ResourceId};
use tokio::process::Command;

use crate::child::{Ended, exit_code, supervise};
use crate::cli::{ServerArg, parse_duration};
use crate::client_cmds::{default_holder, failure};
use crate::{CmdResult, Failure};

/// The environment variable naming the coordinators (comma-separated, as
/// `--server` takes them), for the child's own calls.
const ENV_SERVER: &str = "LEASEFENCE_SERVER";
/// The longest default `--grace`.
const GRACE_DEFAULT_MAX: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub struct RunArgs {
    pub resource: String,
    /// Wait up to this long for a busy resource (default: fail at once, exit 3).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    #[command(flatten)]
    pub child: ChildArgs,
}

/// What `run` and `elect` share: the lease held for the child, and the child.
#[derive(Args, Debug)]
pub struct ChildArgs {
    /// Lease time to live; renewed about every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Time between SIGTERM and SIGKILL: SIGTERM comes this long before the
    /// self-fencing deadline, SIGKILL at it. Must be less than ttl − margin
    /// (default: a third of that, at most 2s).
    #[arg(long, value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// Safety margin taken off the self-fencing deadline (default max(ttl/10, 50ms); at least 1ms).
    #[arg(long, value_parser = parse_duration)]
    pub margin: Option<Duration>,
    /// Holder name shown to others (default: HOST:PID).
    #[arg(long)]
    pub holder: Option<String>,
    /// If the lease expires (is not released), grant the resource to nobody for this long afterwards.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub lock_delay: Duration,
    #[command(flatten)]
    pub server: ServerArg,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

/// The lease a child runs under, and how long it is given to stop.
pub(crate) struct Fencing {
    /// The lease to acquire, its margin raised by `grace` (see [`crate::child`]).
    pub config: LeaseConfig,
    pub grace: Duration,
}

impl ChildArgs {
    /// The lease configuration these flags ask for (no wait), checked
    /// before anything is acquired or started.
    pub(crate) fn fencing(&self) -> Result<Fencing, Failure> {
        let holder = Holder::new(&self.holder.clone().unwrap_or_else(default_holder)).map_err(Failure::invalid)?;
        let show = |d: Duration| humantime::format_duration(d).to_string();
        let margin = self.margin.unwrap_or_else(|| default_margin(self.ttl));
        LeaseConfig::new(self.ttl)
            .with_margin(margin)
            .margin()
            .map_err(|e| match self.margin {
                Some(_) => Failure::invalid(format!("--margin {}: {}", show(margin), e.message())),
                None => Failure::invalid(format!(
                    "--ttl {} leaves no room for its default safety margin {}: the margin {}",
                    show(self.ttl),
                    show(margin),
                    e.message()
                )),
            })?;
        // The child must be dead this long after the last renewal.
        let window = self.ttl - margin;
        let grace = match self.grace {
            None => (window / 3).min(GRACE_DEFAULT_MAX),
            Some(g) if g < window => g,
            Some(g) => {
                return Err(Failure::invalid(format!(
                    "--grace {} does not fit in --ttl {}: the command must be dead by the self-fencing \
                     deadline, ttl − margin = {} after the last renewal (margin {}); allowed: a --grace \
                     below {} (default: a third of it, at most {})",
                    show(g),
                    show(self.ttl),
                    show(window),
                    show(margin),
                    show(window),
                    show(GRACE_DEFAULT_MAX)
                )));
            }
        };
        let config = LeaseConfig::new(self.ttl)
            .with_holder(holder)
            .with_margin(margin + grace)
            .with_lock_delay(self.lock_delay);
        Ok(Fencing { config, grace })
    }

    /// Runs the command under `lease` (see [`run_with_lease`]).
    pub(crate) async fn run_under(&self, lease: Lease, grace: Duration) -> CmdResult {
        run_with_lease(lease, &self.server, &self.command, grace).await
    }
}

pub async fn run(a: RunArgs) -> CmdResult {
    let resource = ResourceId::new(&a.resource).map_err(Failure::invalid)?;
    let fencing = a.child.fencing()?;
    let client = a.child.server.connect().await?;
    let lease = client
        .lease(&resource, fencing.config.with_wait(a.wait))
        .await
        .map_err(failure)?;
    a.child.run_under(lease, fencing.grace).await
}

/// Runs `command` (program and arguments) under `lease`, with the fence and
/// `server` (the coordinators, and the TLS files if given) in its environment, in its own process group; stops the group on
/// loss (exit 4), otherwise releases the lease and passes the exit code on.
/// `lease` carries `grace` in its margin ([`ChildArgs::fencing`]).
pub(crate) async fn run_with_lease(
    lease: Lease,
    server: &ServerArg,
    command: &[OsString],
    grace: Duration,
) -> CmdResult {
    let resource = lease.resource().clone();
    let Some((program, args)) = command.split_first() else {
        release(lease).await;
        return Err(Failure::invalid("no command given"));
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(ENV_RESOURCE, resource.as_str())
        .env(ENV_TOKEN, lease.token().to_string())
        .env(ENV_SERVER, server.joined())
        .envs(server.tls_env())
        .process_group(0);
    // A signature inherited from an outer `run` would not match this fence.
    match lease.fence().signature {
        Some(s) => cmd.env(ENV_SIGNATURE, s),
        None => cmd.env_remove(ENV_SIGNATURE),
    };
    let ended = supervise(&lease, cmd, grace).await;
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
                anyhow::anyhow!("lease on {} lost ({loss}); {name} {what}", resource.shown()),
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
                anyhow::anyhow!("lease on {} was lost when {name} ended ({status})", resource.shown()),
            ));
        }
        tracing::warn!(resource = %resource.shown(), "release failed; the lease will expire after its TTL");
    }
    match exit_code(status) {
        0 => Ok(()),
        code => Err(Failure::new(code, anyhow::anyhow!("{name} ended: {status}"))),
    }
}

/// Best effort: a lost lease is usually gone already; if the coordinator
/// still has it (we self-fenced early), this lets the next holder in sooner.
/// Bounded by the client's call timeout, so an unreachable coordinator
/// delays the exit by at most `--timeout`.
async fn release(lease: Lease) {
    let _ = lease.release().await;
}
