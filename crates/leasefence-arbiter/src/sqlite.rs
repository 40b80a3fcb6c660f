//! The SQLite arbiter: the same contract inside the caller's
//! `rusqlite::Transaction` (sync API).
//!
//! [`admit`] upserts the fence row only if the rule holds, in the caller's
//! transaction, so the effect and `last_token` commit or roll back together.
//! On a rejection it returns [`ArbiterError::Stale`] and writes nothing; the
//! caller must roll back (dropping the transaction does) so that no part of
//! its effect commits. Start writers with `TransactionBehavior::Immediate`
//! ([`with_fence`] does) so concurrent writers queue on the busy timeout
//! instead of failing to upgrade a read lock. Tokens above `i64::MAX` are
//! refused with [`ArbiterError::Invalid`].

use leasefence_core::{Fence, FenceMode, ResourceId, Stale, Token};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::ArbiterError;
use crate::reject::{rejected, token_from_i64, token_to_i64};

const BACKEND: &str = "sqlite";

/// The schema version this build installs and expects.
pub const SCHEMA_VERSION: i64 = 1;
/// The install script.
pub const SCHEMA_SQL: &str = include_str!("sql/sqlite_schema.sql");
const ADMIT_SQL: &str = include_str!("sql/sqlite_admit.sql");

/// Installs or upgrades the fence table in `conn` (idempotent), and switches
/// the database to WAL so readers do not block the writer.
pub fn install(conn: &mut Connection) -> Result<(), ArbiterError> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: Option<i64> = if table_exists(&tx, "leasefence_schema_version")? {
        tx.query_row(
            "SELECT version FROM leasefence_schema_version WHERE component = 'arbiter'",
            [],
            |r| r.get(0),
        )
        .optional()?
    } else {
        None
    };
    if let Some(v) = found.filter(|v| *v > SCHEMA_VERSION) {
        return Err(ArbiterError::Protocol {
            backend: BACKEND,
            message: format!(
                "schema version {v} is installed; this build is version {SCHEMA_VERSION} and will not downgrade it"
            ),
        });
    }
    tx.execute_batch(SCHEMA_SQL)?;
    tx.execute(
        "INSERT INTO leasefence_schema_version (component, version) VALUES ('arbiter', ?1)
         ON CONFLICT (component) DO UPDATE SET version = excluded.version",
        params![SCHEMA_VERSION],
    )?;
    tx.commit()?;
    Ok(())
}

/// The installed schema version, `None` when nothing is installed.
pub fn installed_version(conn: &Connection) -> Result<Option<i64>, ArbiterError> {
    if !table_exists(conn, "leasefence_schema_version")? {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT version FROM leasefence_schema_version WHERE component = 'arbiter'",
            [],
            |r| r.get(0),
        )
        .optional()?)
}

fn table_exists(conn: &Connection, name: &str) -> Result<bool, ArbiterError> {
    let n: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        params![name],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

/// Admits `fence` inside `tx` and records its token there, or returns
/// [`ArbiterError::Stale`] (counted and logged) having written nothing.
pub fn admit(tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
    let token = token_to_i64(BACKEND, fence.token)?;
    let resource = fence.resource.as_str();
    let mut stmt = tx.prepare_cached(ADMIT_SQL)?;
    let admitted: Option<i64> = stmt
        .query_row(params![resource, token, mode.as_str()], |r| r.get(0))
        .optional()?;
    if admitted.is_some() {
        return Ok(());
    }
    let current = last_token(tx, &fence.resource)?.ok_or_else(|| ArbiterError::Protocol {
        backend: BACKEND,
        message: format!("{resource} was neither admitted nor found"),
    })?;
    let stale = Stale {
        resource: fence.resource.clone(),
        presented: fence.token,
        current,
    };
    Err(rejected(BACKEND, stale))
}

/// The recorded `last_token` of `resource`, `None` if it was never admitted.
pub fn last_token(conn: &Connection, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
    let v: Option<i64> = conn
        .query_row(
            "SELECT last_token FROM leasefence_fences WHERE resource = ?1",
            params![resource.as_str()],
            |r| r.get(0),
        )
        .optional()?;
    v.map(|v| token_from_i64(BACKEND, v)).transpose()
}

/// Begins an IMMEDIATE transaction, admits `fence`, runs `effect` in it and
/// commits. On a rejection or an effect error nothing is committed.
pub fn with_fence<T, E>(
    conn: &mut Connection,
    fence: &Fence,
    mode: FenceMode,
    effect: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<ArbiterError>,
{
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(ArbiterError::from)?;
    admit(&tx, fence, mode)?;
    let out = effect(&tx)?;
    tx.commit().map_err(ArbiterError::from)?;
    Ok(out)
}

/// Maps a missing fence table to [`ArbiterError::NotInstalled`].
pub(crate) fn classify(e: rusqlite::Error) -> ArbiterError {
    if let rusqlite::Error::SqliteFailure(_, Some(msg)) = &e
        && msg.contains("no such table: leasefence_")
    {
        return ArbiterError::NotInstalled { backend: BACKEND };
    }
    ArbiterError::Sqlite(e)
}
