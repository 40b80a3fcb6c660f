//! The embedded arbiter: an in-process fenced key-value store on redb, for
//! users without a database.
//!
//! Every write is one redb write transaction with `Durability::Immediate`
//! (fsynced before it returns) that checks the fence, records the token and
//! applies the effect: a crash can never separate the two. [`EmbeddedArbiter::write`]
//! opens the same transaction to any effect on your own redb tables.
//! Tokens are stored as `u64`: the full token range.
//!
//! With [`EmbeddedArbiter::require_signatures`] every write first checks the
//! fence's signature (see `leasefence_core::signing`) and refuses a fence the
//! coordinator did not sign with [`ArbiterError::BadSignature`], before the
//! fence is read: nothing is recorded.

use std::path::Path;

use leasefence_core::signing::Verifier;
use leasefence_core::{Fence, FenceMode, ResourceId, Token, admit};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::ArbiterError;
use crate::error::redb_err;
use crate::reject::{refused, rejected};

const BACKEND: &str = "embedded";

/// Fence key -> last admitted token.
pub const FENCES: TableDefinition<&str, u64> = TableDefinition::new("leasefence_fences");
/// The store's own key-value table, written by [`EmbeddedArbiter::put`] and
/// [`EmbeddedArbiter::delete`].
pub const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("leasefence_kv");

pub struct EmbeddedArbiter {
    db: Database,
    /// The `backend` label of its rejections.
    backend: &'static str,
    /// The keys a fence must be signed with, when signatures are required.
    verifier: Option<Verifier>,
}

impl EmbeddedArbiter {
    /// Opens (creating if needed) the store file at `path`.
    pub fn open(path: &Path) -> Result<EmbeddedArbiter, ArbiterError> {
        let db = Database::create(path).map_err(redb_err)?;
        let arbiter = EmbeddedArbiter {
            db,
            backend: BACKEND,
            verifier: None,
        };
        let mut tx = arbiter.begin()?;
        tx.open_table(FENCES).map_err(redb_err)?;
        tx.open_table(KV).map_err(redb_err)?;
        tx.set_durability(Durability::Immediate).map_err(redb_err)?;
        tx.commit().map_err(redb_err)?;
        Ok(arbiter)
    }

    /// Refuses, from now on, every fence not signed with one of `verifier`'s
    /// keys ([`ArbiterError::BadSignature`], counted and logged): unsigned,
    /// malformed, under an unknown key, or not matching its resource and token.
    pub fn require_signatures(mut self, verifier: Verifier) -> EmbeddedArbiter {
        self.verifier = Some(verifier);
        self
    }

    /// The signature check of [`Self::write`] alone: `Ok` when signatures
    /// are not required or `fence` carries a good one, else
    /// [`ArbiterError::BadSignature`] (counted and logged). For refusing a
    /// forged fence before costly work; `write` checks again regardless.
    pub fn check_signature(&self, fence: &Fence) -> Result<(), ArbiterError> {
        match &self.verifier {
            Some(verifier) => verifier
                .verify(fence, fence.signature.as_deref())
                .map_err(|reason| refused(self.backend, fence.resource.clone(), reason)),
            None => Ok(()),
        }
    }

    /// Counts and logs rejections under `backend` instead of `embedded` (for
    /// a service built on this store, such as the gateway).
    #[cfg(feature = "gateway")]
    pub(crate) fn labelled(mut self, backend: &'static str) -> EmbeddedArbiter {
        self.backend = backend;
        self
    }

    fn begin(&self) -> Result<WriteTransaction, ArbiterError> {
        let mut tx = self.db.begin_write().map_err(redb_err)?;
        tx.set_durability(Durability::Immediate).map_err(redb_err)?;
        Ok(tx)
    }

    /// In one durable write transaction: admits `fence` (or returns
    /// [`ArbiterError::Stale`], counted and logged), records its token and runs
    /// `effect`. If `effect` fails the transaction is aborted: neither the
    /// effect nor the token is kept.
    pub fn write<T, E>(
        &self,
        fence: &Fence,
        mode: FenceMode,
        effect: impl FnOnce(&WriteTransaction) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<ArbiterError>,
    {
        self.check_signature(fence)?;
        let tx = self.begin()?;
        admit_in(&tx, fence, mode, self.backend)?;
        let out = effect(&tx)?;
        tx.commit().map_err(redb_err)?;
        Ok(out)
    }

    /// Fenced `key = value`.
    pub fn put(&self, fence: &Fence, mode: FenceMode, key: &str, value: &[u8]) -> Result<(), ArbiterError> {
        self.write(fence, mode, |tx| {
            let mut kv = tx.open_table(KV).map_err(redb_err)?;
            kv.insert(key, value).map_err(redb_err)?;
            Ok(())
        })
    }

    /// Fenced delete of `key`; `true` if it existed. The token is recorded
    /// even when the key was absent: the admit itself is the effect's fence.
    pub fn delete(&self, fence: &Fence, mode: FenceMode, key: &str) -> Result<bool, ArbiterError> {
        self.write(fence, mode, |tx| {
            let mut kv = tx.open_table(KV).map_err(redb_err)?;
            let existed = kv.remove(key).map_err(redb_err)?.is_some();
            Ok(existed)
        })
    }

    /// The committed value of `key`.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ArbiterError> {
        let tx = self.db.begin_read().map_err(redb_err)?;
        let kv = tx.open_table(KV).map_err(redb_err)?;
        Ok(kv.get(key).map_err(redb_err)?.map(|v| v.value().to_vec()))
    }

    /// The recorded `last_token` of `resource`, `None` if it was never admitted.
    pub fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        let tx = self.db.begin_read().map_err(redb_err)?;
        let fences = tx.open_table(FENCES).map_err(redb_err)?;
        let v = fences.get(resource.as_str()).map_err(redb_err)?.map(|v| v.value());
        v.map(decode_token).transpose()
    }

    /// Removes every fence whose resource starts with `prefix` (for test
    /// namespaces; never do this to fences in use: it resets their tokens).
    pub fn forget_fences_with_prefix(&self, prefix: &str) -> Result<u64, ArbiterError> {
        let tx = self.begin()?;
        let removed = {
            let mut fences = tx.open_table(FENCES).map_err(redb_err)?;
            let mut removed = 0u64;
            fences
                .retain(|k, _| {
                    let keep = !k.starts_with(prefix);
                    removed += u64::from(!keep);
                    keep
                })
                .map_err(redb_err)?;
            removed
        };
        tx.commit().map_err(redb_err)?;
        Ok(removed)
    }

    /// The underlying database, for reads of your own tables.
    pub fn database(&self) -> &Database {
        &self.db
    }
}

/// The rule inside an open write transaction: check, then record.
fn admit_in(tx: &WriteTransaction, fence: &Fence, mode: FenceMode, backend: &'static str) -> Result<(), ArbiterError> {
    let mut fences = tx.open_table(FENCES).map_err(redb_err)?;
    let key = fence.resource.as_str();
    let current = fences.get(key).map_err(redb_err)?.map(|v| v.value());
    let current = current.map(decode_token).transpose()?;
    if let Err(stale) = admit(mode, &fence.resource, current, fence.token) {
        return Err(rejected(backend, stale));
    }
    fences.insert(key, fence.token.get()).map_err(redb_err)?;
    Ok(())
}

fn decode_token(v: u64) -> Result<Token, ArbiterError> {
    Token::new(v).ok_or_else(|| ArbiterError::Protocol {
        backend: BACKEND,
        message: "stored last_token 0 is not a valid token".to_string(),
    })
}
