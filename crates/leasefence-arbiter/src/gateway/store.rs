//! The gateway's durable state: the embedded arbiter's redb file
//! (`gateway.redb`: fences and the key → blob pointers, one transaction per
//! write) and the blob directories. Blocking: callers run it off the async
//! threads.
//!
//! The invariant, asserted on both sides of every write: a key points at a
//! blob that exists in full and was fsynced before the pointer was
//! committed, together with the fence that admitted it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::blob::{self, BLOBS_DIR, BlobId, Pending, TMP_DIR};
use super::precondition::{Etag, PreconditionFailed, Preconditions};
use super::{GatewayConfig, GatewayError};
use crate::ArbiterError;
use crate::embedded::EmbeddedArbiter;
use crate::error::redb_err;

/// Object key -> [`Record`], encoded by [`Record::encode`].
const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("leasefence_gateway_objects");
const DB_FILE: &str = "gateway.redb";
/// The `backend` label of the gateway's rejections.
pub(crate) const BACKEND: &str = "gateway";

/// Where a key points: its blob and what the write that made it carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) blob: BlobId,
    pub(crate) size: u64,
    pub(crate) etag: Etag,
    /// The token of the fence that admitted the write, and its fence key.
    pub(crate) token: Token,
    pub(crate) resource: ResourceId,
}

const FIXED: usize = 16 + 8 + 32 + 8;

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED + self.resource.as_str().len());
        v.extend_from_slice(&self.blob.0.to_be_bytes());
        v.extend_from_slice(&self.size.to_be_bytes());
        v.extend_from_slice(self.etag.digest());
        v.extend_from_slice(&self.token.get().to_be_bytes());
        v.extend_from_slice(self.resource.as_str().as_bytes());
        v
    }

    fn decode(key: &str, v: &[u8]) -> Result<Record, ArbiterError> {
        let corrupt = |what: &str| ArbiterError::Protocol {
            backend: "gateway",
            message: format!("the record of object {key:?} is corrupt: {what}"),
        };
        if v.len() <= FIXED {
            return Err(corrupt("too short"));
        }
        let (fixed, resource) = v.split_at(FIXED);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&fixed[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let mut blob = [0u8; 16];
        blob.copy_from_slice(&fixed[..16]);
        let mut etag = [0u8; 32];
        etag.copy_from_slice(&fixed[24..56]);
        let resource = std::str::from_utf8(resource).map_err(|_| corrupt("resource is not UTF-8"))?;
        Ok(Record {
            blob: BlobId(u128::from_be_bytes(blob)),
            size: u64_at(16),
            etag: Etag::from_digest(etag),
            token: Token::new(u64_at(56)).ok_or_else(|| corrupt("token 0"))?,
            resource: ResourceId::new(resource).map_err(|e| corrupt(&e.to_string()))?,
        })
    }
}

/// Why a write committed nothing.
#[derive(Debug)]
pub(crate) enum WriteError {
    Arbiter(ArbiterError),
    Precondition(PreconditionFailed),
    /// A delete of a key that does not exist.
    NotFound,
    Io(std::io::Error),
}

impl From<ArbiterError> for WriteError {
    fn from(e: ArbiterError) -> WriteError {
        WriteError::Arbiter(e)
    }
}

/// What the start-up sweep removed.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Swept {
    pub(crate) temp_files: u64,
    pub(crate) orphan_blobs: u64,
}

pub(crate) struct Store {
    arbiter: EmbeddedArbiter,
    data_dir: PathBuf,
    object_size_max: u64,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> GatewayError {
    let path = path.display().to_string();
    move |source| GatewayError::Io { what, path, source }
}

impl Store {
    /// Opens the store under `config.data_dir()` and sweeps what a crash left.
    pub(crate) fn open(config: &GatewayConfig) -> Result<(Store, Swept), GatewayError> {
        let dir = config.data_dir();
        for sub in [dir.to_path_buf(), dir.join(TMP_DIR), dir.join(BLOBS_DIR)] {
            std::fs::create_dir_all(&sub).map_err(io_err("cannot create the directory", &sub))?;
        }
        let arbiter = match EmbeddedArbiter::open(&dir.join(DB_FILE)) {
            Ok(a) => match config.fence_keys() {
                Some(keys) => a.labelled(BACKEND).require_signatures(keys.clone()),
                None => a.labelled(BACKEND),
            },
            Err(ArbiterError::Embedded(redb::Error::DatabaseAlreadyOpen)) => {
                return Err(GatewayError::InUse {
                    path: dir.display().to_string(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let tx = arbiter.database().begin_write().map_err(redb_err)?;
        tx.open_table(OBJECTS).map_err(redb_err)?;
        tx.commit().map_err(redb_err)?;
        let store = Store {
            arbiter,
            data_dir: dir.to_path_buf(),
            object_size_max: config.object_size_max(),
        };
        let swept = store.sweep()?;
        Ok((store, swept))
    }

    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub(crate) fn object_size_max(&self) -> u64 {
        self.object_size_max
    }

    /// Removes every temp file and every blob no key points at; logs keys
    /// whose blob is missing or has the wrong size (the disk lost fsynced data).
    fn sweep(&self) -> Result<Swept, GatewayError> {
        let mut swept = Swept::default();
        let tmp = self.data_dir.join(TMP_DIR);
        for entry in std::fs::read_dir(&tmp).map_err(io_err("cannot read", &tmp))? {
            let path = entry.map_err(io_err("cannot read", &tmp))?.path();
            std::fs::remove_file(&path).map_err(io_err("cannot remove the temp file", &path))?;
            swept.temp_files += 1;
        }
        let referenced = self.check_referenced()?;
        let blobs = self.data_dir.join(BLOBS_DIR);
        for entry in std::fs::read_dir(&blobs).map_err(io_err("cannot read", &blobs))? {
            let path = entry.map_err(io_err("cannot read", &blobs))?.path();
            let id = path.file_name().and_then(|n| n.to_str()).and_then(BlobId::parse);
            match id {
                Some(id) if referenced.contains(&id) => {}
                Some(_) => {
                    std::fs::remove_file(&path).map_err(io_err("cannot remove the unreferenced blob", &path))?;
                    swept.orphan_blobs += 1;
                }
                None => tracing::warn!(path = %path.display(), "not a blob: left alone"),
            }
        }
        if swept.temp_files + swept.orphan_blobs > 0 {
            tracing::info!(
                swept.temp_files,
                swept.orphan_blobs,
                "removed what an interrupted write left"
            );
        }
        Ok(swept)
    }

    fn check_referenced(&self) -> Result<HashSet<BlobId>, GatewayError> {
        let mut referenced = HashSet::new();
        let tx = self.arbiter.database().begin_read().map_err(redb_err)?;
        let objects = tx.open_table(OBJECTS).map_err(redb_err)?;
        for entry in objects.iter().map_err(redb_err)? {
            let (k, v) = entry.map_err(redb_err)?;
            let r = Record::decode(k.value(), v.value())?;
            let on_disk = std::fs::metadata(blob::blob_path(&self.data_dir, r.blob)).map(|m| m.len());
            if on_disk.as_ref().ok() != Some(&r.size) {
                tracing::error!(key = k.value(), expected = r.size, found = ?on_disk, "an object's blob is missing or truncated");
            }
            referenced.insert(r.blob);
        }
        Ok(referenced)
    }

    /// In one durable transaction: admit `fence`, check `pre` against the
    /// key's current ETag, point `key` at the pending blob. On success the
    /// blob is kept and the old one removed; on any error the pending blob
    /// is removed and nothing changed. Returns the replaced record.
    pub(crate) fn commit_put(
        &self,
        key: &str,
        fence: &Fence,
        mode: FenceMode,
        pre: &Preconditions,
        mut pending: Pending,
        file: std::fs::File,
    ) -> Result<(Record, Option<Record>), WriteError> {
        blob::finish(&self.data_dir, &mut pending, file).map_err(WriteError::Io)?;
        let record = Record {
            blob: pending.id,
            size: pending.size,
            etag: pending.etag,
            token: fence.token,
            resource: fence.resource.clone(),
        };
        let old = self.arbiter.write(fence, mode, |tx| {
            let (mut objects, old) = checked(tx, key, pre)?;
            objects.insert(key, record.encode().as_slice()).map_err(redb_err)?;
            Ok::<_, WriteError>(old)
        })?;
        pending.keep();
        if let Some(old) = &old {
            self.remove_blob(old.blob);
        }
        Ok((record, old))
    }

    /// In one durable transaction: admit `fence`, check `pre`, remove `key`.
    /// A missing key is [`WriteError::NotFound`] and records no token.
    pub(crate) fn commit_delete(
        &self,
        key: &str,
        fence: &Fence,
        mode: FenceMode,
        pre: &Preconditions,
    ) -> Result<Record, WriteError> {
        let old = self.arbiter.write(fence, mode, |tx| {
            let (mut objects, old) = checked(tx, key, pre)?;
            let old = old.ok_or(WriteError::NotFound)?;
            objects.remove(key).map_err(redb_err)?;
            Ok::<_, WriteError>(old)
        })?;
        self.remove_blob(old.blob);
        Ok(old)
    }

    /// After a commit, the blob nothing points at any more; if this fails
    /// (or the process dies first) the next start sweeps it.
    fn remove_blob(&self, id: BlobId) {
        let path = blob::blob_path(&self.data_dir, id);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a replaced blob; the next start sweeps it");
        }
    }

    pub(crate) fn lookup(&self, key: &str) -> Result<Option<Record>, ArbiterError> {
        let tx = self.arbiter.database().begin_read().map_err(redb_err)?;
        let objects = tx.open_table(OBJECTS).map_err(redb_err)?;
        let v = objects.get(key).map_err(redb_err)?.map(|v| v.value().to_vec());
        v.map(|v| Record::decode(key, &v)).transpose()
    }

    /// Up to `limit` keys starting with `prefix`, in key order, after `after`
    /// if given; `true` when more follow.
    pub(crate) fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<(String, Record)>, bool), ArbiterError> {
        use std::ops::Bound;
        let tx = self.arbiter.database().begin_read().map_err(redb_err)?;
        let objects = tx.open_table(OBJECTS).map_err(redb_err)?;
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let mut out = Vec::new();
        for entry in objects.range::<&str>((start, Bound::Unbounded)).map_err(redb_err)? {
            let (k, v) = entry.map_err(redb_err)?;
            let key = k.value();
            if !key.starts_with(prefix) {
                break;
            }
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push((key.to_string(), Record::decode(key, v.value())?));
        }
        Ok((out, false))
    }

    pub(crate) fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        self.arbiter.last_token(resource)
    }

    /// The signature and the rule against the recorded token, before a body
    /// is received: a forged or stale writer is refused without sending its bytes. The commit checks
    /// again; this only saves the upload.
    pub(crate) fn precheck(&self, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
        self.arbiter.check_signature(fence)?;
        let current = self.last_token(&fence.resource)?;
        leasefence_core::admit(mode, &fence.resource, current, fence.token)
            .map_err(|stale| crate::reject::rejected(BACKEND, stale))
    }
}

type Objects<'tx> = redb::Table<'tx, &'static str, &'static [u8]>;

/// Inside a write transaction, after the fence was admitted: the objects
/// table and the key's current record, once `pre` holds against it.
fn checked<'tx>(
    tx: &'tx redb::WriteTransaction,
    key: &str,
    pre: &Preconditions,
) -> Result<(Objects<'tx>, Option<Record>), WriteError> {
    let objects = tx.open_table(OBJECTS).map_err(redb_err)?;
    let old = objects.get(key).map_err(redb_err)?.map(|v| v.value().to_vec());
    let old = old.map(|v| Record::decode(key, &v)).transpose()?;
    pre.check(old.as_ref().map(|r| r.etag))
        .map_err(WriteError::Precondition)?;
    Ok((objects, old))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_corruption_is_an_error() {
        let r = Record {
            blob: BlobId(u128::MAX - 7),
            size: 1 << 40,
            etag: Etag::from_digest([0x5a; 32]),
            token: Token::new(u64::MAX).expect("non-zero"),
            resource: ResourceId::new("tenant/7 ünïcode").expect("valid"),
        };
        let bytes = r.encode();
        assert_eq!(Record::decode("k", &bytes).expect("decodes"), r);
        assert!(Record::decode("k", &bytes[..FIXED]).is_err());
        let mut zero = bytes.clone();
        zero[56..64].copy_from_slice(&0u64.to_be_bytes());
        assert!(Record::decode("k", &zero).unwrap_err().to_string().contains("token 0"));
    }
}
