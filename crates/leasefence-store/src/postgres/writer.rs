//! The epoch-fenced writer of a [`super::PostgresShared`]: every batch is one
//! transaction that locks the shard row, checks the epoch, and upserts the
//! batch's records, in two round trips (requests pipelined):
//!
//! 1. `BEGIN`, `SELECT epoch … FOR UPDATE` of the shard row, and the current
//!    records of the batch's resources (read after the lock is granted, so
//!    they include every batch committed before it);
//! 2. one multi-row upsert of the changed records (computed with the store's
//!    shared rule, [`crate::next_record`]) and `COMMIT`.
//!
//! A deposed epoch, a token regression or a corrupt record rolls back and
//! writes nothing.

use std::collections::{BTreeMap, HashMap};

use leasefence_core::{Mutation, StoredResource};
use tokio_postgres::types::ToSql;

use super::conn::{Conn, Fail, Live};
use super::{epoch_from_sql, epoch_to_sql};
use crate::codec::{decode, encode};
use crate::shared::Epoch;
use crate::{LeaseStore, StoreError, next_record};

/// Writes one shard's records under one epoch; from
/// [`SharedStore::writer`](crate::SharedStore::writer). It has a connection
/// of its own (made on first use), so a batch never waits behind a renewal.
pub struct PostgresWriter {
    pub(super) conn: Conn,
    pub(super) shard: u32,
    pub(super) epoch: Epoch,
    /// Called between a batch's epoch check and its commit: a test's pause.
    #[cfg(test)]
    pub(super) pause: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for PostgresWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresWriter")
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl LeaseStore for PostgresWriter {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let shard = i64::from(self.shard);
        self.conn.call(async |live: &Live| {
            let rows = live.client.query(&live.st.load, &[&shard]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let (resource, record) = columns(&row)?;
                out.push(decode(resource, record).map_err(|error| Fail::Refused { error, clean: true })?);
            }
            Ok(out)
        })
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        let (shard, epoch) = (i64::from(self.shard), self.epoch);
        let epoch_sql = epoch_to_sql(epoch)?;
        let mut names: Vec<&str> = batch.iter().map(|m| m.resource().as_str()).collect();
        names.sort_unstable();
        names.dedup();
        #[cfg(test)]
        let pause = self.pause.clone();
        self.conn.call(async |live: &Live| {
            let c = &live.client;
            let (lock_params, read_params): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 2]) =
                ([&shard], [&shard, &names]);
            let (begin, lock, read) = tokio::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&live.st.lock_shard, &lock_params),
                c.query(&live.st.read, &read_params),
            );
            begin?;
            let current = match lock? {
                Some(row) => epoch_from_sql(row.try_get(0)?).map_err(dirty)?,
                None => 0,
            };
            let staged = if current != epoch {
                Err(StoreError::Deposed { epoch, current })
            } else {
                stage(batch, read?)
            };
            let (resources, records) = match staged {
                Ok(changed) => changed,
                Err(error) => return Err(rollback(live, error).await),
            };
            #[cfg(test)]
            if let Some(pause) = &pause {
                pause();
            }
            let params: [&(dyn ToSql + Sync); 4] = [&shard, &epoch_sql, &resources, &records];
            live.committing.set(true);
            let upsert = c.execute(&live.st.upsert, &params);
            // An upsert that fails aborts the transaction: the COMMIT sent
            // behind it then rolls back, and the upsert's error is returned.
            let (upsert, commit) = tokio::join!(upsert, c.batch_execute("COMMIT"));
            upsert.map_err(Fail::Committing)?;
            commit.map_err(Fail::Committing)?;
            Ok(())
        })
    }
}

/// A refusal in the middle of a transaction that is not rolled back: the
/// connection is dropped, which ends the transaction.
fn dirty(error: StoreError) -> Fail {
    Fail::Refused { error, clean: false }
}

async fn rollback(live: &Live, error: StoreError) -> Fail {
    // Without a rollback the open transaction would keep the shard row locked;
    // if it fails, dropping the connection ends it.
    let clean = live.client.batch_execute("ROLLBACK").await.is_ok();
    Fail::Refused { error, clean }
}

/// The records `batch` changes, from the rows read, as `(resources, encoded
/// records)` for the upsert; the whole batch fails if one mutation does.
fn stage(batch: &[Mutation], rows: Vec<tokio_postgres::Row>) -> Result<(Vec<String>, Vec<Vec<u8>>), StoreError> {
    let mut before = HashMap::with_capacity(rows.len());
    for row in rows {
        let (resource, record) = columns(&row).map_err(|e| StoreError::Io(format!("PostgreSQL: {e}")))?;
        before.insert(resource.to_owned(), decode(resource, record)?);
    }
    let mut staged: BTreeMap<&str, StoredResource> = BTreeMap::new();
    for m in batch {
        let key = m.resource().as_str();
        let current = staged.get(key).or_else(|| before.get(key)).cloned();
        if let Some(next) = next_record(current, m)? {
            staged.insert(key, next);
        }
    }
    // Unchanged records (a stale release) are not rewritten.
    let changed = staged.into_iter().filter(|(k, r)| before.get(*k) != Some(r));
    Ok(changed.map(|(k, r)| (k.to_owned(), encode(&r))).unzip())
}

fn columns(row: &tokio_postgres::Row) -> Result<(&str, &[u8]), tokio_postgres::Error> {
    Ok((row.try_get(0)?, row.try_get(1)?))
}
