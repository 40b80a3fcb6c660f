//! The embedded conformance target: [`EmbeddedArbiter::write`] with the
//! effect model in two extra redb tables of the same write transaction.

use std::sync::Arc;

use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome};
use crate::embedded::EmbeddedArbiter;
use crate::error::redb_err;

/// (resource, key) -> value.
const KV: TableDefinition<(&str, &str), &str> = TableDefinition::new("leasefence_check_kv");
/// resource -> committed tokens, big-endian u64s in commit order.
const HISTORY: TableDefinition<&str, &[u8]> = TableDefinition::new("leasefence_check_history");

/// What the effect returns to abandon its transaction.
enum EffectError {
    Arbiter(ArbiterError),
    Abort,
}

impl From<ArbiterError> for EffectError {
    fn from(e: ArbiterError) -> EffectError {
        EffectError::Arbiter(e)
    }
}

pub struct EmbeddedTarget {
    arbiter: Arc<EmbeddedArbiter>,
    namespace: String,
}

impl EmbeddedTarget {
    pub fn new(arbiter: Arc<EmbeddedArbiter>) -> EmbeddedTarget {
        EmbeddedTarget {
            arbiter,
            namespace: super::fresh_namespace(),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EmbeddedArbiter) -> Result<T, ArbiterError> + Send + 'static,
    ) -> Result<T, ArbiterError> {
        let arbiter = Arc::clone(&self.arbiter);
        tokio::task::spawn_blocking(move || f(&arbiter))
            .await
            .map_err(|e| ArbiterError::Task(format!("embedded task failed: {e}")))?
    }
}

fn write_effect(
    tx: &redb::WriteTransaction,
    fence: &Fence,
    key: &str,
    value: &str,
    outcome: Outcome,
) -> Result<(), EffectError> {
    let r = fence.resource.as_str();
    let mut kv = tx.open_table(KV).map_err(redb_err)?;
    kv.insert((r, key), value).map_err(redb_err)?;
    let mut history = tx.open_table(HISTORY).map_err(redb_err)?;
    let mut tokens = history
        .get(r)
        .map_err(redb_err)?
        .map(|v| v.value().to_vec())
        .unwrap_or_default();
    tokens.extend_from_slice(&fence.token.get().to_be_bytes());
    history.insert(r, tokens.as_slice()).map_err(redb_err)?;
    match outcome {
        Outcome::Commit => Ok(()),
        Outcome::Abort => Err(EffectError::Abort),
    }
}

impl ConformanceTarget for EmbeddedTarget {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn admit_and_write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> Result<(), ArbiterError> {
        let (fence, key, value) = (fence.clone(), key.to_string(), value.to_string());
        self.blocking(
            move |a| match a.write(&fence, mode, |tx| write_effect(tx, &fence, &key, &value, outcome)) {
                Ok(()) | Err(EffectError::Abort) => Ok(()),
                Err(EffectError::Arbiter(e)) => Err(e),
            },
        )
        .await
    }

    async fn read(&self, resource: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        let (r, key) = (resource.as_str().to_string(), key.to_string());
        self.blocking(move |a| {
            let tx = a.database().begin_read().map_err(redb_err)?;
            let kv = match tx.open_table(KV) {
                Ok(kv) => kv,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(redb_err(e)),
            };
            Ok(kv
                .get((r.as_str(), key.as_str()))
                .map_err(redb_err)?
                .map(|v| v.value().to_string()))
        })
        .await
    }

    async fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        let r = resource.clone();
        self.blocking(move |a| a.last_token(&r)).await
    }

    async fn history(&self, resource: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        let r = resource.as_str().to_string();
        self.blocking(move |a| {
            let tx = a.database().begin_read().map_err(redb_err)?;
            let history = match tx.open_table(HISTORY) {
                Ok(h) => h,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(redb_err(e)),
            };
            let bytes = history
                .get(r.as_str())
                .map_err(redb_err)?
                .map(|v| v.value().to_vec())
                .unwrap_or_default();
            bytes
                .chunks_exact(8)
                .map(|c| {
                    let v = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                    Token::new(v).ok_or_else(|| ArbiterError::Protocol {
                        backend: "embedded",
                        message: "history holds token 0".to_string(),
                    })
                })
                .collect()
        })
        .await
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        let ns = self.namespace.clone();
        self.blocking(move |a| {
            a.forget_fences_with_prefix(&ns)?;
            let tx = a.database().begin_write().map_err(redb_err)?;
            {
                let mut kv = tx.open_table(KV).map_err(redb_err)?;
                kv.retain(|(r, _), _| !r.starts_with(&ns)).map_err(redb_err)?;
                let mut history = tx.open_table(HISTORY).map_err(redb_err)?;
                history.retain(|r, _| !r.starts_with(&ns)).map_err(redb_err)?;
            }
            tx.commit().map_err(redb_err)
        })
        .await
    }
}
