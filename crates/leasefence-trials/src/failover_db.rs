//! The failover trials' direct look at the shared store ([`StoreLook`]), and
//! its PostgreSQL half: the shard row and the record rows of one epoch, read
//! in one statement (one snapshot), whether a batch transaction holds the
//! shard row, and dropping a run's schema. The etcd half is
//! `crate::failover_etcd`.
//!
//! Tables (the store's own, `src/sql/postgres_store_schema.sql` of the store
//! crate): `leasefence_shards (shard, epoch, leader, expires_at)` and
//! `leasefence_records (shard, resource, epoch, record)`, in the run's schema.

use std::collections::BTreeSet;

use anyhow::{Context, bail};

use crate::failover_check::Row;

/// The shard every coordinator of a run leads (the store's default).
const SHARD: i64 = 0;

/// A run's schema, checked so that it can be spliced into SQL quoted.
pub struct StoreSchema {
    quoted: String,
    name: String,
}

/// The shard row and one epoch's record rows, as of one statement.
#[derive(Debug)]
pub struct EpochRows {
    /// The shard's current epoch and leader (its advertised URL).
    pub epoch: u64,
    pub leader: Option<String>,
    pub rows: BTreeSet<Row>,
}

/// A run's shared store, read directly, not through the coordinators.
pub enum StoreLook {
    Postgres(tokio_postgres::Client, StoreSchema),
    #[cfg(feature = "etcd")]
    Etcd(Box<crate::failover_etcd::EtcdStore>),
}

impl StoreLook {
    /// The shard's current epoch and leader, and the records whose last
    /// writer was `epoch`, as of one snapshot.
    pub async fn epoch_rows(&self, epoch: u64) -> anyhow::Result<EpochRows> {
        match self {
            StoreLook::Postgres(pg, schema) => schema.epoch_rows(pg, epoch).await,
            #[cfg(feature = "etcd")]
            StoreLook::Etcd(etcd) => etcd.epoch_rows(epoch).await,
        }
    }

    /// Whether a batch is being written right now. Only PostgreSQL can be
    /// caught inside one; an etcd batch is a single request.
    pub async fn batch_open(&self) -> anyhow::Result<bool> {
        match self {
            StoreLook::Postgres(pg, schema) => schema.batch_open(pg).await,
            #[cfg(feature = "etcd")]
            StoreLook::Etcd(_) => Ok(false),
        }
    }

    /// Removes the run's schema or key prefix.
    pub async fn remove(&self) -> anyhow::Result<()> {
        match self {
            StoreLook::Postgres(pg, schema) => schema.drop(pg).await,
            #[cfg(feature = "etcd")]
            StoreLook::Etcd(etcd) => etcd.delete_prefix().await,
        }
    }
}

impl StoreSchema {
    /// The rule of the store's own schema names: ASCII letters, digits and
    /// `_`, not starting with a digit, 1..=63 bytes.
    pub fn new(name: &str) -> anyhow::Result<StoreSchema> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.len() > 63 {
            bail!(
                "--store-prefix {name:?} is not a PostgreSQL store schema name: use 1..=63 ASCII letters, \
                 digits and underscores, not starting with a digit"
            );
        }
        Ok(StoreSchema {
            quoted: format!("\"{name}\""),
            name: name.to_string(),
        })
    }

    /// The shard row, and the rows whose last writer was `epoch`.
    pub async fn epoch_rows(&self, pg: &tokio_postgres::Client, epoch: u64) -> anyhow::Result<EpochRows> {
        let s = &self.quoted;
        let epoch_sql = i64::try_from(epoch).context("epoch above i64::MAX")?;
        let rows = pg
            .query(
                &format!(
                    "SELECT s.epoch, s.leader, r.resource, r.record FROM {s}.leasefence_shards s \
                     LEFT JOIN {s}.leasefence_records r ON r.shard = s.shard AND r.epoch = $2 \
                     WHERE s.shard = $1"
                ),
                &[&SHARD, &epoch_sql],
            )
            .await
            .with_context(|| format!("cannot read the store tables of schema {}", self.name))?;
        let first = rows
            .first()
            .with_context(|| format!("schema {} has no shard row: no coordinator ever led", self.name))?;
        let current: i64 = first.try_get(0)?;
        let mut out = EpochRows {
            epoch: u64::try_from(current).context("negative epoch in the shard row")?,
            leader: first.try_get(1)?,
            rows: BTreeSet::new(),
        };
        for r in &rows {
            let resource: Option<String> = r.try_get(2)?;
            let record: Option<Vec<u8>> = r.try_get(3)?;
            if let (Some(resource), Some(record)) = (resource, record) {
                out.rows.insert((resource, record));
            }
        }
        Ok(out)
    }

    /// Whether a transaction holds the shard table's row-share lock, which
    /// only a batch's `SELECT … FOR UPDATE` of the shard row takes (campaigns
    /// and renewals take row-exclusive locks).
    pub async fn batch_open(&self, pg: &tokio_postgres::Client) -> anyhow::Result<bool> {
        let row = pg
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = 'leasefence_shards' AND l.mode = 'RowShareLock' AND l.granted",
                &[&self.name],
            )
            .await
            .context("cannot read pg_locks")?;
        let n: i64 = row.try_get(0)?;
        Ok(n > 0)
    }

    /// Drops the schema and everything in it (only ever a run's own).
    pub async fn drop(&self, pg: &tokio_postgres::Client) -> anyhow::Result<()> {
        pg.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.quoted))
            .await
            .with_context(|| format!("cannot drop schema {}", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_that_could_inject_sql_are_refused() {
        assert!(StoreSchema::new("lf_trials_0a1b").is_ok());
        assert!(StoreSchema::new("Mixed_Case").is_ok());
        for bad in ["", "0abc", "a\"b", "x; DROP SCHEMA y", &"a".repeat(64)] {
            let e = StoreSchema::new(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("--store-prefix"), "{bad:?}: {e}");
        }
    }
}
