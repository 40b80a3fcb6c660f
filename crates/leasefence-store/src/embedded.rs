//! The embedded store: one redb file under the data directory, with a commit
//! log beside it ([`crate::wal`]).
//!
//! A batch is durable once its resulting records are appended to the log and
//! synced; the tree takes them later in one `Durability::Immediate`
//! transaction (a *checkpoint*) that also moves the log's generation, so a
//! crash leaves the last checkpoint intact and the log holds exactly the
//! batches after it. Opening replays them and checkpoints at once. That is
//! the whole durability argument; `wal`'s module doc gives the log's rules.
//!
//! Checkpoints run between commits ([`LeaseStore::maintain`]) once the log is
//! half used or many resources are waiting, and within a commit only when a
//! record would not fit. Until then the records since the last checkpoint are
//! also kept in memory, by resource, so that the next batch reads its
//! current state from there; a resource changed a thousand times between two
//! checkpoints costs the tree one write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use leasefence_core::{Mutation, StoredResource};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::codec::{decode, encode};
use crate::wal::{Entry, LOG_BYTES, Log};
use crate::{LeaseStore, StoreError, next_record};

const RESOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("resources");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Version 2 adds the commit log; a build that reads only version 1 would
/// ignore the log's batches, so it must refuse the file instead.
const SCHEMA_VERSION: u64 = 2;
/// The versions this build opens (and upgrades to [`SCHEMA_VERSION`]).
const READS: [u64; 2] = [1, 2];
/// The generation the next log is written under (absent: 0).
const LOG_GENERATION: &str = "log_generation";
/// A checkpoint between commits once this many resources wait for the tree...
const PENDING_CHECKPOINT: usize = 8192;
/// ... or once the log is this full.
const LOG_CHECKPOINT: u64 = LOG_BYTES / 2;

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

pub struct EmbeddedStore {
    db: Database,
    path: PathBuf,
    log: Log,
    generation: u64,
    /// Each resource's record as of the last synced batch, for the resources
    /// changed since the last checkpoint.
    pending: BTreeMap<String, StoredResource>,
}

impl EmbeddedStore {
    /// The file name used inside a data directory.
    pub const FILE_NAME: &'static str = "leasefence.redb";

    /// Opens (creating if needed) the store in `data_dir`.
    pub fn open_dir(data_dir: &Path) -> Result<EmbeddedStore, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StoreError::Io(format!("cannot create data dir {}: {e}", data_dir.display())))?;
        EmbeddedStore::open(&data_dir.join(Self::FILE_NAME))
    }

    /// Opens (creating if needed) the store file at `path` and its log at
    /// [`EmbeddedStore::log_path`], replaying the log into the tree.
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        let db = Database::create(path).map_err(|e| StoreError::Io(format!("cannot open {}: {e}", path.display())))?;
        let generation = check_schema(&db, path)?;
        let (log, batches) = Log::open(&Self::log_path(path), generation)?;
        let mut store = EmbeddedStore {
            db,
            path: path.to_path_buf(),
            log,
            generation,
            pending: BTreeMap::new(),
        };
        for entries in batches {
            for (key, value) in entries {
                let record = decode(&key, &value)?;
                store.pending.insert(key, record);
            }
        }
        // Even with nothing to replay: a fresh generation for this process's
        // records, so that none can ever be read as an older one's.
        store.checkpoint()?;
        Ok(store)
    }

    /// The commit log of the store file at `path`.
    pub fn log_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".log");
        PathBuf::from(name)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves every pending record into the tree, with the next generation, in
    /// one durable transaction; then starts the log again under it.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let out = self.fold();
        metrics::histogram!(crate::CHECKPOINT_SECONDS).record(started.elapsed().as_secs_f64());
        out
    }

    /// [`EmbeddedStore::checkpoint`]'s work, untimed.
    fn fold(&mut self) -> Result<(), StoreError> {
        let next = self.generation + 1;
        let mut tx = self.db.begin_write().map_err(io)?;
        tx.set_durability(Durability::Immediate).map_err(io)?;
        {
            let mut table = tx.open_table(RESOURCES).map_err(io)?;
            for (key, record) in &self.pending {
                table.insert(key.as_str(), encode(record).as_slice()).map_err(io)?;
            }
            let mut meta = tx.open_table(META).map_err(io)?;
            meta.insert(LOG_GENERATION, next).map_err(io)?;
        }
        tx.commit().map_err(io)?;
        self.generation = next;
        self.log.restart(next);
        self.pending.clear();
        Ok(())
    }

    /// A resource's record as the last synced batch left it.
    fn current(&self, key: &str) -> Result<Option<StoredResource>, StoreError> {
        if let Some(r) = self.pending.get(key) {
            return Ok(Some(r.clone()));
        }
        let tx = self.db.begin_read().map_err(io)?;
        let table = tx.open_table(RESOURCES).map_err(io)?;
        match table.get(key).map_err(io)? {
            Some(v) => Ok(Some(decode(key, v.value())?)),
            None => Ok(None),
        }
    }
}

/// Checks (and upgrades) the schema version; returns the log's generation.
fn check_schema(db: &Database, path: &Path) -> Result<u64, StoreError> {
    let mut tx = db.begin_write().map_err(io)?;
    tx.set_durability(Durability::Immediate).map_err(io)?;
    let generation = {
        let mut meta = tx.open_table(META).map_err(io)?;
        let found = meta.get("schema_version").map_err(io)?.map(|v| v.value());
        match found {
            Some(v) if !READS.contains(&v) => {
                return Err(StoreError::Io(format!(
                    "{} has schema version {v}; this build reads versions {READS:?}",
                    path.display()
                )));
            }
            Some(SCHEMA_VERSION) => {}
            _ => {
                meta.insert("schema_version", SCHEMA_VERSION).map_err(io)?;
            }
        }
        let generation = meta.get(LOG_GENERATION).map_err(io)?.map_or(0, |v| v.value());
        tx.open_table(RESOURCES).map_err(io)?;
        generation
    };
    tx.commit().map_err(io)?;
    Ok(generation)
}

impl LeaseStore for EmbeddedStore {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let tx = self.db.begin_read().map_err(io)?;
        let table = tx.open_table(RESOURCES).map_err(io)?;
        // Sized at once (the tree keeps its length): growing it by doubling
        // copied every record about once more at a million.
        let rows = usize::try_from(table.len().map_err(io)?).unwrap_or(0);
        let mut out = Vec::with_capacity(rows.saturating_add(self.pending.len()));
        for row in table.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            if !self.pending.contains_key(k.value()) {
                out.push(decode(k.value(), v.value())?);
            }
        }
        out.extend(self.pending.values().cloned());
        Ok(out)
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        // The batch's records, computed in full before anything is written:
        // a refused mutation leaves the log, the tree and `pending` untouched.
        let mut changed: BTreeMap<&str, StoredResource> = BTreeMap::new();
        for m in batch {
            let key = m.resource().as_str();
            let current = match changed.get(key) {
                Some(r) => Some(r.clone()),
                None => self.current(key)?,
            };
            if let Some(next) = next_record(current, m)? {
                changed.insert(key, next);
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let entries: Vec<Entry> = changed.iter().map(|(k, r)| ((*k).to_string(), encode(r))).collect();
        if self.log.used() > 0 && self.log.used() + Log::record_len(&entries) > LOG_BYTES {
            self.checkpoint()?;
        }
        self.log.append(&entries)?;
        for (key, record) in changed {
            self.pending.insert(key.to_string(), record);
        }
        Ok(())
    }

    fn maintain(&mut self) -> Result<(), StoreError> {
        if self.pending.len() >= PENDING_CHECKPOINT || self.log.used() >= LOG_CHECKPOINT {
            self.checkpoint()?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "embedded_tests.rs"]
mod tests;
