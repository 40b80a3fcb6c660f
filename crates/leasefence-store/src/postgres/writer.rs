//! The epoch-fenced writer of a [`super::PostgresShared`]: every batch is one
//! transaction that locks the shard row, checks the epoch, and upserts the
//! batch's records (computed with the store's shared rule,
//! [`crate::next_record`]), in one of two ways.
//!
//! - **Read first**, in two round trips (requests pipelined): `BEGIN`, `SELECT
//!   epoch … FOR UPDATE` of the shard row and the batch's current records
//!   (read after the lock is granted, so they include every batch committed
//!   before it); then one multi-row upsert of the changed records and
//!   `COMMIT`.
//! - **From what the writer knows**, in one round trip: each record it last
//!   read or wrote is kept with its bytes ([`crate::known`]), so a batch on
//!   records it knows (a release after its grant, the next grant of a
//!   resource) is computed before anything is sent. `BEGIN`, the shard row's
//!   lock, a write and `COMMIT` then go together. The write is conditional
//!   in the database: on the epoch, and on every record of the batch still
//!   holding the bytes it was computed from; else it writes nothing. A record
//!   someone else changed (only another writer of the same epoch can) is
//!   then read and the batch recomputed; a writer whose term ended is
//!   refused by the fence, whatever it knew.
//!
//! A batch is sent from what is known only on a connection that answered
//! its last call and was not found closed since (a server that ended it, a
//! network that reset it), so that an engine that went away is met by the
//! read, which fails as unavailable with nothing sent, rather than by a
//! write of unknown outcome.
//!
//! A deposed epoch, a token regression or a corrupt record writes nothing.

use std::collections::{BTreeMap, HashMap};

use leasefence_core::{Mutation, StoredResource};
use tokio_postgres::types::ToSql;

use super::conn::{Conn, Fail, Live};
use super::{epoch_from_sql, epoch_to_sql};
use crate::codec::{decode, encode};
use crate::known::Known;
use crate::shared::Epoch;
use crate::{LeaseStore, StoreError, next_record};

/// A record as the writer last read or wrote it: the bytes the database holds
/// (what a write from knowledge compares) and their decoding. `None`: absent.
type Seen = Option<(Vec<u8>, StoredResource)>;

/// Writes one shard's records under one epoch; from
/// [`SharedStore::writer`](crate::SharedStore::writer). It has a connection
/// of its own (made on first use), so a batch never waits behind a renewal.
pub struct PostgresWriter {
    pub(super) conn: Conn,
    pub(super) shard: u32,
    pub(super) epoch: Epoch,
    pub(super) known: Known<Seen>,
    /// Called between a batch's epoch check and its commit when it reads
    /// first, and before it is sent when it is written from what is known: a
    /// test's pause.
    #[cfg(test)]
    pub(super) pause: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
    /// Batches sent read first, and from what was known: a test's count.
    #[cfg(test)]
    pub(super) sent: (usize, usize),
}

impl std::fmt::Debug for PostgresWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresWriter")
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// What a batch writes: every record it touches as it was (what it was
/// computed from) and, where it changes, as it will be.
struct Staged<'b> {
    records: BTreeMap<&'b str, (Seen, Seen)>,
}

impl Staged<'_> {
    /// The changed records as the upsert takes them: names and encoded records.
    fn changed(&self) -> (Vec<&str>, Vec<&[u8]>) {
        let changed = self
            .records
            .iter()
            .filter_map(|(k, (_, now))| Some((*k, now.as_ref()?)));
        changed.map(|(k, (bytes, _))| (k, bytes.as_slice())).unzip()
    }

    /// Every record of the batch as it is once the batch committed.
    fn after(self) -> impl Iterator<Item = (String, Seen)> {
        let records = self.records.into_iter();
        records.map(|(k, (was, now))| (k.to_owned(), now.or(was)))
    }
}

/// The batch's records after `batch`, from `before` (every record the batch
/// touches); the whole batch fails if one mutation does. Unchanged records (a
/// stale release) are not rewritten.
fn stage<'b>(batch: &'b [Mutation], mut before: HashMap<&'b str, Seen>) -> Result<Staged<'b>, StoreError> {
    let mut next: BTreeMap<&str, Option<StoredResource>> = BTreeMap::new();
    for m in batch {
        let key = m.resource().as_str();
        let current = match next.get(key) {
            Some(staged) => staged.clone(),
            None => before.get(key).and_then(Option::as_ref).map(|(_, r)| r.clone()),
        };
        next.insert(key, next_record(current, m)?);
    }
    let records = next.into_iter().map(|(k, now)| {
        let was = before.remove(k).flatten();
        let now = now.filter(|n| was.as_ref().map(|(_, r)| r) != Some(n));
        (k, (was, now.map(|n| (encode(&n), n))))
    });
    Ok(Staged {
        records: records.collect(),
    })
}

/// How a batch sent from what was known ended.
enum FromKnown {
    Written,
    /// A record was not as known: nothing was written.
    Changed,
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
        let mut names: Vec<&str> = batch.iter().map(|m| m.resource().as_str()).collect();
        names.sort_unstable();
        names.dedup();
        // A refusal computed from what was known (a token regression, say) is
        // checked against a read before it is believed.
        let known = self.known.all(names.iter().copied());
        let staged = known.and_then(|before| stage(batch, before).ok());
        if let Some(staged) = staged
            && self.conn.alive()
        {
            match self.write_known(&staged) {
                Ok(FromKnown::Written) => {
                    self.known.learn(staged.after());
                    return Ok(());
                }
                Ok(FromKnown::Changed) => self.known.forget(),
                Err(e) => {
                    self.known.forget();
                    return Err(e);
                }
            }
        }
        match self.read_first(batch, &names) {
            Ok(staged) => {
                self.known.learn(staged.after());
                Ok(())
            }
            Err(e) => {
                self.known.forget();
                Err(e)
            }
        }
    }
}

impl PostgresWriter {
    /// One round trip: the batch computed from what was known, written only
    /// if the epoch and every record are as known.
    fn write_known(&mut self, staged: &Staged<'_>) -> Result<FromKnown, StoreError> {
        let (shard, epoch) = (i64::from(self.shard), self.epoch);
        let epoch_sql = epoch_to_sql(epoch)?;
        let (resources, records) = staged.changed();
        let checked: Vec<&str> = staged.records.keys().copied().collect();
        let expected: Vec<Option<&[u8]>> = staged
            .records
            .values()
            .map(|(was, _)| was.as_ref().map(|(bytes, _)| bytes.as_slice()))
            .collect();
        #[cfg(test)]
        {
            self.sent.1 += 1;
            if let Some(pause) = &self.pause {
                pause();
            }
        }
        self.conn.call(async |live: &Live| {
            let c = &live.client;
            let lock_params: [&(dyn ToSql + Sync); 1] = [&shard];
            let write_params: [&(dyn ToSql + Sync); 6] =
                [&shard, &epoch_sql, &resources, &records, &checked, &expected];
            // Everything is sent at once: from here on, a call that goes
            // unanswered may have committed.
            live.committing.set(true);
            let (begin, lock, write, commit) = tokio::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&live.st.lock_shard, &lock_params),
                c.query_one(&live.st.write_known, &write_params),
                c.batch_execute("COMMIT"),
            );
            // A statement of the transaction the server refused aborted it, so
            // the COMMIT behind it rolled back: nothing was written. Anything
            // else (no answer, a lost connection, a failed BEGIN) may have.
            let refused = |e: tokio_postgres::Error| match e.as_db_error() {
                Some(_) if !super::conn::connection_lost(&e) => Fail::Pg(e),
                _ => Fail::Committing(e),
            };
            begin.map_err(Fail::Committing)?;
            let lock = lock.map_err(refused)?;
            let write = write.map_err(refused)?;
            commit.map_err(Fail::Committing)?;
            let current = match lock {
                Some(row) => epoch_from_sql(row.try_get(0)?).map_err(|error| Fail::Refused { error, clean: true })?,
                None => 0,
            };
            if current != epoch {
                let error = StoreError::Deposed { epoch, current };
                return Err(Fail::Refused { error, clean: true });
            }
            // Committed: a failure to read the answer leaves what it wrote unknown.
            let ok: bool = write.try_get(0).map_err(Fail::Committing)?;
            Ok(if ok { FromKnown::Written } else { FromKnown::Changed })
        })
    }

    /// Two round trips: the batch's records read under the shard row's lock,
    /// then the changed ones written.
    fn read_first<'b>(&mut self, batch: &'b [Mutation], names: &[&str]) -> Result<Staged<'b>, StoreError> {
        let (shard, epoch) = (i64::from(self.shard), self.epoch);
        let epoch_sql = epoch_to_sql(epoch)?;
        #[cfg(test)]
        let pause = self.pause.clone();
        #[cfg(test)]
        {
            self.sent.0 += 1;
        }
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
                read_rows(batch, names, read?)
            };
            let staged = match staged {
                Ok(staged) => staged,
                Err(error) => return Err(rollback(live, error).await),
            };
            #[cfg(test)]
            if let Some(pause) = &pause {
                pause();
            }
            let (resources, records) = staged.changed();
            let params: [&(dyn ToSql + Sync); 4] = [&shard, &epoch_sql, &resources, &records];
            live.committing.set(true);
            let upsert = c.execute(&live.st.upsert, &params);
            // An upsert that fails aborts the transaction: the COMMIT sent
            // behind it then rolls back, and the upsert's error is returned.
            let (upsert, commit) = tokio::join!(upsert, c.batch_execute("COMMIT"));
            upsert.map_err(Fail::Committing)?;
            commit.map_err(Fail::Committing)?;
            Ok(staged)
        })
    }
}

/// The batch staged from the rows read (one per name, its record NULL when
/// absent): every name of the batch is in `before`.
fn read_rows<'b>(
    batch: &'b [Mutation],
    names: &[&str],
    rows: Vec<tokio_postgres::Row>,
) -> Result<Staged<'b>, StoreError> {
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        let (resource, record): (&str, Option<&[u8]>) =
            columns(&row).map_err(|e| StoreError::Io(format!("PostgreSQL: {e}")))?;
        if let Some(record) = record {
            found.insert(resource.to_owned(), (record.to_vec(), decode(resource, record)?));
        }
    }
    let mut before: HashMap<&str, Seen> = HashMap::with_capacity(names.len());
    for m in batch {
        let key = m.resource().as_str();
        before.entry(key).or_insert_with(|| found.remove(key));
    }
    stage(batch, before)
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

fn columns<'a, R: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
) -> Result<(&'a str, R), tokio_postgres::Error> {
    Ok((row.try_get(0)?, row.try_get(1)?))
}
