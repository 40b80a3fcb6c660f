//! The hidden `client` subcommand: one worker of a pause trial, as its own
//! process. It acquires the lease over gRPC, prints `granted TOKEN`, and with
//! `--pause` stops itself (SIGSTOP) right there — between grant and commit —
//! until the parent sends SIGCONT. Then it commits its effect through the
//! PostgreSQL arbiter with the token it was granted, however old: it does
//! **not** check its lease first, so only the arbiter stands between a stale
//! token and the table.
//!
//! With `--no-fencing` (the control run) it commits the same rows in a plain
//! transaction, without the arbiter, as a system without fencing would.
//!
//! Stdout protocol, one line each: `granted T`, `attempt T`, then
//! `committed T` (exit 0) or `rejected presented=P current=C` (exit 3).
//! Anything else is an error (exit 2, message on stderr).

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use leasefence_arbiter::postgres::{self, EffectFuture};
use leasefence_arbiter::{ArbiterError, Fence, FenceMode};
use leasefence_client::Client;
use leasefence_core::{Holder, ResourceId};
use tokio_postgres::Transaction;

/// Exit code of a client whose effect the arbiter rejected.
pub const EXIT_REJECTED: i32 = 3;

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// Coordinator URL (loopback).
    #[arg(long)]
    pub server: String,
    /// PostgreSQL URL of the arbiter.
    #[arg(long)]
    pub postgres: String,
    /// Prefix of this run's tables (`PREFIX_rows`, `PREFIX_history`).
    #[arg(long)]
    pub table: String,
    #[arg(long)]
    pub resource: String,
    /// Written into the history row and used as the lease holder.
    #[arg(long)]
    pub writer: String,
    #[arg(long, default_value_t = 250)]
    pub ttl_ms: u64,
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
    /// SIGSTOP this process right after printing the grant.
    #[arg(long)]
    pub pause: bool,
    /// Commit without the arbiter (the control run).
    #[arg(long)]
    pub no_fencing: bool,
}

/// A table prefix safe to splice into SQL: `[a-z0-9_]`, 1..=40 bytes.
pub fn check_table_prefix(prefix: &str) -> anyhow::Result<()> {
    let ok = (1..=40).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        bail!("table prefix must be 1..=40 of [a-z0-9_], got {prefix:?}");
    }
    Ok(())
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush().context("cannot flush stdout")
}

pub async fn run(a: ClientArgs) -> anyhow::Result<i32> {
    check_table_prefix(&a.table)?;
    let resource = ResourceId::new(&a.resource).context("--resource")?;
    let holder = Holder::new(&a.writer).context("--writer")?;
    // Connect to PostgreSQL first, so nothing but the commit itself is left
    // between the pause and the effect.
    let mut pg = postgres::connect(&a.postgres)
        .await
        .context("cannot connect to PostgreSQL")?;
    let client = Client::connect(&a.server).await?;
    let lease = client
        .acquire(
            &resource,
            Duration::from_millis(a.ttl_ms),
            Some(&holder),
            Duration::from_millis(a.wait_ms),
        )
        .await
        .context("acquire")?;
    say(&format!("granted {}", lease.token))?;
    if a.pause {
        // SAFETY: raise(3) on this process; it resumes on SIGCONT.
        if unsafe { libc::raise(libc::SIGSTOP) } != 0 {
            bail!("raise(SIGSTOP): {}", std::io::Error::last_os_error());
        }
    }
    let fence = lease.fence();
    say(&format!("attempt {}", lease.token))?;
    match commit(&mut pg, &a.table, &a.writer, &fence, !a.no_fencing).await {
        Ok(()) => {
            say(&format!("committed {}", lease.token))?;
            // Best effort: a paused writer's lease is long gone.
            let _ = client.release(&resource, &lease.lease_id).await;
            Ok(0)
        }
        Err(ArbiterError::Stale(s)) => {
            say(&format!("rejected presented={} current={}", s.presented, s.current))?;
            Ok(EXIT_REJECTED)
        }
        Err(e) => Err(e).context("commit"),
    }
}

/// The business row and the history row, in the arbiter's transaction, or
/// in a plain one when `fenced` is false.
async fn commit(
    pg: &mut tokio_postgres::Client,
    table: &str,
    writer: &str,
    fence: &Fence,
    fenced: bool,
) -> Result<(), ArbiterError> {
    let rows = Rows {
        upsert: format!(
            "INSERT INTO {table}_rows (resource, value, token) VALUES ($1, $2, $3) \
             ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token"
        ),
        history: format!("INSERT INTO {table}_history (resource, token, writer) VALUES ($1, $2, $3)"),
        resource: fence.resource.to_string(),
        token: i64::try_from(fence.token.get())
            .map_err(|_| leasefence_core::Invalid::new("token", "above i64::MAX"))?,
        writer: writer.to_string(),
    };
    if fenced {
        return postgres::with_fence(
            pg,
            fence,
            FenceMode::Strict,
            move |tx: &Transaction<'_>| -> EffectFuture<'_, (), ArbiterError> {
                Box::pin(async move { rows.write(tx).await })
            },
        )
        .await;
    }
    let tx = pg.transaction().await?;
    rows.write(&tx).await?;
    tx.commit().await?;
    Ok(())
}

/// What one writer commits.
struct Rows {
    upsert: String,
    history: String,
    resource: String,
    token: i64,
    writer: String,
}

impl Rows {
    async fn write(&self, tx: &Transaction<'_>) -> Result<(), ArbiterError> {
        tx.execute(self.upsert.as_str(), &[&self.resource, &self.writer, &self.token])
            .await?;
        tx.execute(self.history.as_str(), &[&self.resource, &self.token, &self.writer])
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_prefixes_that_could_inject_sql_are_refused() {
        assert!(check_table_prefix("lf_trials_0a1b").is_ok());
        assert!(check_table_prefix("").is_err());
        assert!(check_table_prefix("x; DROP TABLE y").is_err());
        assert!(check_table_prefix("Upper").is_err());
    }
}
