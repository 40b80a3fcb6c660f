//! The SQLite conformance target: one connection per unit (as separate
//! processes would have), IMMEDIATE transactions, effect tables with a random
//! suffix in the same database file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome};
use crate::reject::{token_from_i64, token_to_i64};
use crate::sqlite::{admit, installed_version, last_token};

/// How long a writer waits for the database lock before failing with BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

struct Inner {
    path: PathBuf,
    namespace: String,
    kv: String,
    history: String,
}

pub struct SqliteTarget(Arc<Inner>);

impl SqliteTarget {
    /// Opens the existing database at `path` (the schema must be installed)
    /// and creates the effect tables.
    pub async fn open(path: &Path) -> Result<SqliteTarget, ArbiterError> {
        let suffix = crate::rng::hex_suffix();
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            namespace: super::fresh_namespace(),
            kv: format!("leasefence_check_kv_{suffix}"),
            history: format!("leasefence_check_history_{suffix}"),
        });
        blocking(&inner, |i| {
            let conn = open(&i.path)?;
            if installed_version(&conn)?.is_none() {
                return Err(ArbiterError::NotInstalled { backend: "sqlite" });
            }
            conn.execute_batch(&format!(
                "CREATE TABLE {kv} (resource TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (resource, key));
                 CREATE TABLE {h} (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, token INTEGER NOT NULL);",
                kv = i.kv,
                h = i.history
            ))?;
            Ok(())
        })
        .await?;
        Ok(SqliteTarget(inner))
    }
}

fn open(path: &Path) -> Result<Connection, ArbiterError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

async fn blocking<T: Send + 'static>(
    inner: &Arc<Inner>,
    f: impl FnOnce(&Inner) -> Result<T, ArbiterError> + Send + 'static,
) -> Result<T, ArbiterError> {
    let inner = Arc::clone(inner);
    tokio::task::spawn_blocking(move || f(&inner))
        .await
        .map_err(|e| ArbiterError::Task(format!("SQLite task failed: {e}")))?
}

impl ConformanceTarget for SqliteTarget {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn namespace(&self) -> &str {
        &self.0.namespace
    }

    fn token_max(&self) -> Token {
        Token::new(i64::MAX as u64).unwrap_or(Token::FIRST)
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
        blocking(&self.0, move |i| {
            let mut conn = open(&i.path)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            admit(&tx, &fence, mode)?;
            let r = fence.resource.as_str();
            tx.execute(
                &format!(
                    "INSERT INTO {} (resource, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value",
                    i.kv
                ),
                params![r, key, value],
            )?;
            let token = token_to_i64("sqlite", fence.token)?;
            tx.execute(
                &format!("INSERT INTO {} (resource, token) VALUES (?1, ?2)", i.history),
                params![r, token],
            )?;
            match outcome {
                Outcome::Commit => tx.commit()?,
                Outcome::Abort => tx.rollback()?,
            }
            Ok(())
        })
        .await
    }

    async fn read(&self, resource: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        let (r, key) = (resource.as_str().to_string(), key.to_string());
        blocking(&self.0, move |i| {
            let conn = open(&i.path)?;
            let q = format!("SELECT value FROM {} WHERE resource = ?1 AND key = ?2", i.kv);
            Ok(conn.query_row(&q, params![r, key], |row| row.get(0)).optional()?)
        })
        .await
    }

    async fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        let r = resource.clone();
        blocking(&self.0, move |i| last_token(&open(&i.path)?, &r)).await
    }

    async fn history(&self, resource: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        let r = resource.as_str().to_string();
        blocking(&self.0, move |i| {
            let conn = open(&i.path)?;
            let q = format!("SELECT token FROM {} WHERE resource = ?1 ORDER BY seq", i.history);
            let mut stmt = conn.prepare(&q)?;
            let rows = stmt.query_map(params![r], |row| row.get::<_, i64>(0))?;
            let mut out = Vec::new();
            for v in rows {
                out.push(token_from_i64("sqlite", v?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        blocking(&self.0, |i| {
            let conn = open(&i.path)?;
            conn.execute(
                "DELETE FROM leasefence_fences WHERE substr(resource, 1, length(?1)) = ?1",
                params![i.namespace],
            )?;
            conn.execute_batch(&format!(
                "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {};",
                i.kv, i.history
            ))?;
            Ok(())
        })
        .await
    }
}
