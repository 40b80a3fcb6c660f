//! The pause trials' PostgreSQL side, as seen by the parent: this run's two
//! tables (`PREFIX_rows`, the business rows; `PREFIX_history`, one row per
//! committed effect), reading the history back in commit order, and cleaning
//! everything up, fence rows included.
//!
//! Commit order: every effect on a resource goes through the arbiter, whose
//! `leasefence_admit` locks that resource's fence row until the transaction
//! ends, so two commits on one resource are serialized and the history row
//! inserted later (higher `id`) belongs to the later commit.

use anyhow::Context;
use leasefence_arbiter::postgres;

use crate::pause_check::Commit;

/// This run's tables, under one random prefix.
pub struct Tables {
    prefix: String,
    /// Every resource of this run starts with it.
    resource_prefix: String,
}

impl Tables {
    pub fn new(prefix: String, resource_prefix: String) -> anyhow::Result<Tables> {
        crate::client_cmd::check_table_prefix(&prefix)?;
        Ok(Tables {
            prefix,
            resource_prefix,
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Installs the arbiter schema (idempotent) and creates the tables.
    pub async fn create(&self, pg: &mut tokio_postgres::Client) -> anyhow::Result<()> {
        postgres::install(pg)
            .await
            .context("cannot install the arbiter schema")?;
        let p = &self.prefix;
        pg.batch_execute(&format!(
            "CREATE TABLE {p}_rows (resource text PRIMARY KEY, value text NOT NULL, token bigint NOT NULL);
             CREATE TABLE {p}_history (
                 id bigserial PRIMARY KEY,
                 resource text NOT NULL,
                 token bigint NOT NULL,
                 writer text NOT NULL,
                 committed_at timestamptz NOT NULL DEFAULT clock_timestamp());"
        ))
        .await
        .with_context(|| format!("cannot create the tables {p}_rows and {p}_history"))
    }

    /// Every history row, in commit order.
    pub async fn history(&self, pg: &tokio_postgres::Client) -> anyhow::Result<Vec<Commit>> {
        let rows = pg
            .query(
                &format!(
                    "SELECT resource, token, writer FROM {}_history ORDER BY id",
                    self.prefix
                ),
                &[],
            )
            .await
            .context("cannot read the history table")?;
        rows.iter()
            .map(|r| {
                let token: i64 = r.get(1);
                Ok(Commit {
                    resource: r.get(0),
                    token: u64::try_from(token).context("negative token in the history")?,
                    writer: r.get(2),
                })
            })
            .collect()
    }

    /// Drops the tables and forgets this run's fence rows.
    pub async fn drop_all(&self, pg: &tokio_postgres::Client) -> anyhow::Result<()> {
        let p = &self.prefix;
        pg.batch_execute(&format!(
            "DROP TABLE IF EXISTS {p}_history; DROP TABLE IF EXISTS {p}_rows;"
        ))
        .await
        .context("cannot drop this run's tables")?;
        let pattern = format!("{}%", self.resource_prefix);
        pg.execute("DELETE FROM leasefence_fences WHERE resource LIKE $1", &[&pattern])
            .await
            .context("cannot delete this run's fence rows")?;
        Ok(())
    }
}
