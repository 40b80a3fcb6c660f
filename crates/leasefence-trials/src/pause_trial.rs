//! One pause trial: spawn A, see it stop, let B write past A's TTL, resume
//! A, and collect what both reported. Children are killed when dropped, so a
//! trial cut short by its time limit leaves nothing behind.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use leasefence_client::Client;
use leasefence_core::ResourceId;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client_cmd::EXIT_REJECTED;
use crate::pause::TTL;
use crate::pause_check::{PAUSED_WRITER_PREFIX, Resumed, TrialRecord};
use crate::procs::{signal, wait_stopped};

/// A whole trial must end within this; it takes about half a second.
pub const TRIAL_LIMIT: Duration = Duration::from_secs(60);
/// One step (a line, a stop, an exit) must happen within this.
const STEP_LIMIT: Duration = Duration::from_secs(15);
/// How long B may queue for the resource.
const B_WAIT_MS: u64 = 5_000;

/// What every trial shares.
pub struct TrialCtx {
    pub exe: PathBuf,
    pub server: String,
    pub postgres: String,
    pub table: String,
    pub resource_prefix: String,
    /// False in the control run: clients commit without the arbiter.
    pub fencing: bool,
    /// The parent's own connection, for `status` after each trial.
    pub coordinator: Client,
}

impl TrialCtx {
    fn client(&self, resource: &str, writer: &str, wait_ms: u64, pause: bool) -> anyhow::Result<Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("client")
            .args(["--server", &self.server, "--postgres", &self.postgres])
            .args(["--table", &self.table, "--resource", resource, "--writer", writer])
            .args([
                "--ttl-ms",
                &TTL.as_millis().to_string(),
                "--wait-ms",
                &wait_ms.to_string(),
            ]);
        if pause {
            cmd.arg("--pause");
        }
        if !self.fencing {
            cmd.arg("--no-fencing");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot spawn a trial client")
    }
}

/// The token in a `granted T` line.
fn granted(line: &str) -> anyhow::Result<u64> {
    line.trim()
        .strip_prefix("granted ")
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("expected `granted TOKEN`, got {line:?}"))
}

pub async fn run(ctx: &TrialCtx, i: u64) -> anyhow::Result<TrialRecord> {
    let resource = format!("{}{i}", ctx.resource_prefix);
    let mut a = ctx.client(&resource, &format!("{PAUSED_WRITER_PREFIX}{i}"), 0, true)?;
    let pid = a.id().context("A exited at once")?;
    let mut a_out = BufReader::new(a.stdout.take().context("A's stdout")?);
    let mut line = String::new();
    tokio::time::timeout(STEP_LIMIT, a_out.read_line(&mut line))
        .await
        .context("A printed no grant in time")??;
    let a_token = granted(&line).context("A")?;
    wait_stopped(pid, STEP_LIMIT).await?;
    // The lease runs out while A is stopped; B may also queue for it.
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    let b_token = run_b(ctx, &resource, i).await?;
    signal(pid, libc::SIGCONT)?;
    let mut rest = String::new();
    tokio::time::timeout(STEP_LIMIT, a_out.read_to_string(&mut rest))
        .await
        .context("A did not finish in time after SIGCONT")??;
    let status = tokio::time::timeout(STEP_LIMIT, a.wait())
        .await
        .context("A did not exit in time")??;
    let outcome = resumed(&rest, status.code())?;
    let coordinator_last = ctx
        .coordinator
        .status(&ResourceId::new(&resource)?)
        .await?
        .last_token
        .map_or(0, |t| t.get());
    Ok(TrialRecord {
        a_token,
        b_token,
        a: outcome,
        coordinator_last,
    })
}

/// Runs B to the end; returns its token. B must commit.
async fn run_b(ctx: &TrialCtx, resource: &str, i: u64) -> anyhow::Result<u64> {
    let b = ctx.client(resource, &format!("b-{i}"), B_WAIT_MS, false)?;
    let out = tokio::time::timeout(STEP_LIMIT, b.wait_with_output())
        .await
        .context("B did not finish in time")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let token = granted(lines.next().unwrap_or_default()).context("B")?;
    if !out.status.success() || lines.last() != Some(&format!("committed {token}")) {
        bail!("B (token {token}) did not commit: {:?}, stdout {stdout:?}", out.status);
    }
    Ok(token)
}

/// Classifies what A printed after it was resumed.
fn resumed(stdout: &str, code: Option<i32>) -> anyhow::Result<Resumed> {
    let attempted = stdout.lines().any(|l| l.starts_with("attempt "));
    let last = stdout.lines().last().unwrap_or_default();
    match code {
        Some(0) if last.starts_with("committed ") => Ok(Resumed::Committed),
        Some(EXIT_REJECTED) if last.starts_with("rejected ") => Ok(Resumed::Rejected),
        _ if !attempted => Ok(Resumed::NeverAttempted),
        _ => bail!("A attempted its commit and failed: exit {code:?}, stdout {stdout:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumed_outputs_are_classified() {
        let rejected = "attempt 1\nrejected presented=1 current=2\n";
        assert_eq!(resumed(rejected, Some(EXIT_REJECTED)).ok(), Some(Resumed::Rejected));
        assert_eq!(
            resumed("attempt 1\ncommitted 1\n", Some(0)).ok(),
            Some(Resumed::Committed)
        );
        assert_eq!(resumed("", Some(1)).ok(), Some(Resumed::NeverAttempted));
        assert!(resumed("attempt 1\n", Some(1)).is_err());
        assert!(granted("granted 7\n").is_ok_and(|t| t == 7));
        assert!(granted("busy").is_err());
    }
}
