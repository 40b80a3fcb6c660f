//! The embedded store: one redb file under the data directory.
//!
//! redb commits with `Durability::Immediate` are fsynced before `commit`
//! returns, and a crash leaves the last committed transaction intact; that is
//! the whole durability argument. A batch is one write transaction.

use std::path::{Path, PathBuf};

use leasefence_core::{Mutation, StoredResource};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::codec::{decode, encode};
use crate::{LeaseStore, StoreError, next_record};

const RESOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("resources");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION: u64 = 1;

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

pub struct EmbeddedStore {
    db: Database,
    path: PathBuf,
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

    /// Opens (creating if needed) the store file at `path`.
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        let db = Database::create(path).map_err(|e| StoreError::Io(format!("cannot open {}: {e}", path.display())))?;
        let store = EmbeddedStore {
            db,
            path: path.to_path_buf(),
        };
        store.check_schema()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_schema(&self) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().map_err(io)?;
        tx.set_durability(Durability::Immediate).map_err(io)?;
        {
            let mut meta = tx.open_table(META).map_err(io)?;
            let found = meta.get("schema_version").map_err(io)?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION).map_err(io)?;
                }
                Some(SCHEMA_VERSION) => {}
                Some(other) => {
                    return Err(StoreError::Io(format!(
                        "{} has schema version {other}; this build reads version {SCHEMA_VERSION}",
                        self.path.display()
                    )));
                }
            }
            tx.open_table(RESOURCES).map_err(io)?;
        }
        tx.commit().map_err(io)
    }
}

impl LeaseStore for EmbeddedStore {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        let tx = self.db.begin_read().map_err(io)?;
        let table = tx.open_table(RESOURCES).map_err(io)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().map_err(io)?;
        tx.set_durability(Durability::Immediate).map_err(io)?;
        {
            let mut table = tx.open_table(RESOURCES).map_err(io)?;
            for m in batch {
                let key = m.resource().as_str();
                let current = match table.get(key).map_err(io)? {
                    Some(v) => Some(decode(key, v.value())?),
                    None => None,
                };
                if let Some(next) = next_record(current, m)? {
                    table.insert(key, encode(&next).as_slice()).map_err(io)?;
                }
            }
        }
        // Dropping `tx` on an early return above aborts it: a batch is all or nothing.
        tx.commit().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasefence_core::{Holder, LeaseId, ReleaseCause, ResourceId, StoredLease, Token};

    use super::*;

    /// A store file as the build before lock-delays wrote it (record version 1).
    fn write_version_1(path: &Path) {
        let db = Database::create(path).expect("create");
        let tx = db.begin_write().expect("begin");
        {
            let mut meta = tx.open_table(META).expect("meta");
            meta.insert("schema_version", 1).expect("insert");
            let mut table = tx.open_table(RESOURCES).expect("resources");
            let held: &[u8] = &[
                1, 0, 0, 0, 0, 0, 0, 0, 5, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 3, 232,
                0, 3, 111, 108, 100,
            ];
            table.insert("old/held", held).expect("insert");
            table
                .insert("old/free", &[1u8, 0, 0, 0, 0, 0, 0, 0, 9, 0][..])
                .expect("insert");
        }
        tx.commit().expect("commit");
    }

    #[test]
    fn a_data_dir_from_before_lock_delays_opens_and_keeps_its_meaning() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(EmbeddedStore::FILE_NAME);
        write_version_1(&path);
        let mut store = EmbeddedStore::open(&path).expect("opens");
        let mut all = store.load().expect("load");
        all.sort_by(|a, b| a.resource.cmp(&b.resource));
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[0].last_token, &all[0].lease, &all[0].lock_delay),
            (Token::new(9).expect("non-zero"), &None, &None)
        );
        assert_eq!(
            all[1].lease,
            Some(StoredLease {
                lease_id: LeaseId::from_bytes([3; 16]),
                holder: Holder::new("old").expect("valid"),
                ttl: Duration::from_millis(1000),
                lock_delay: Duration::ZERO,
            })
        );
        // Old records change like new ones.
        let resource = ResourceId::new("old/held").expect("valid");
        let expiry = Mutation::Release {
            resource,
            token: Token::new(5).expect("non-zero"),
            cause: ReleaseCause::Expired,
            lock_delay: Duration::ZERO,
        };
        store.apply(&[expiry]).expect("apply");
        let all = store.load().expect("load");
        assert!(all.iter().all(|r| r.lease.is_none()));
    }
}
