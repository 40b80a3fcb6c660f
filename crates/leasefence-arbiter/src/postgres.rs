//! The PostgreSQL arbiter: a versioned, idempotent schema with the PL/pgSQL
//! function `leasefence_admit(resource, token, mode)`, and Rust helpers.
//!
//! `leasefence_admit` runs inside the caller's own transaction: it upserts the
//! fence row only if the rule holds and otherwise raises SQLSTATE
//! [`SQLSTATE_STALE`] (`LF001`), which aborts the transaction, so the effect and
//! the new `last_token` commit together or not at all. The full schema, with
//! its documented SQLSTATEs, is `src/sql/postgres_schema.sql`.
//!
//! Tokens are stored as `bigint`: tokens above `i64::MAX` are refused with
//! [`ArbiterError::Invalid`] before any statement runs, never wrapped.
//! Connections are plain TCP (`NoTls`).

use std::future::Future;
use std::pin::Pin;

use leasefence_core::{Fence, FenceMode, ResourceId, Stale, Token};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, NoTls, Statement, Transaction};

use crate::ArbiterError;
use crate::reject::{observe, token_from_i64, token_to_i64};

mod folded;

pub use folded::{FENCE_CTE, FencedStatement, fold_fence};

const BACKEND: &str = "postgres";

/// The schema version this build installs and expects.
pub const SCHEMA_VERSION: i32 = 3;
/// SQLSTATE raised by `leasefence_admit` for a stale token.
pub const SQLSTATE_STALE: &str = "LF001";
/// SQLSTATE raised by `leasefence_admit` for an invalid argument.
pub const SQLSTATE_INVALID: &str = "LF002";
/// SQLSTATE raised by the installer when a newer schema is already installed.
pub const SQLSTATE_SCHEMA_NEWER: &str = "LF003";
/// The install script: run it in one transaction.
pub const SCHEMA_SQL: &str = include_str!("sql/postgres_schema.sql");

/// The future an effect passed to [`with_fence`] returns.
pub type EffectFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Connects without TLS and drives the connection on a background task.
pub async fn connect(url: &str) -> Result<Client, ArbiterError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "leasefence arbiter: PostgreSQL connection closed with an error");
        }
    });
    Ok(client)
}

/// Installs or upgrades the schema (idempotent, safe to run concurrently).
pub async fn install(client: &mut Client) -> Result<(), ArbiterError> {
    let tx = client.transaction().await?;
    tx.batch_execute(SCHEMA_SQL).await?;
    tx.commit().await?;
    Ok(())
}

/// Connects to `url` and [`install`]s.
pub async fn install_url(url: &str) -> Result<(), ArbiterError> {
    let mut client = connect(url).await?;
    install(&mut client).await
}

/// The installed schema version, `None` when nothing is installed.
pub async fn installed_version(client: &impl GenericClient) -> Result<Option<i32>, ArbiterError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('leasefence_schema_version') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT version FROM leasefence_schema_version WHERE component = 'arbiter'",
            &[],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// The statement [`admit`] sends and [`PreparedAdmit`] prepares.
pub const ADMIT_SQL: &str = "SELECT leasefence_admit($1, $2, $3)";
const ADMIT_TYPES: [Type; 3] = [Type::TEXT, Type::INT8, Type::TEXT];

/// Admits `fence` inside `tx` and records its token there, or returns
/// [`ArbiterError::Stale`] (counted and logged). After a rejection the
/// transaction is aborted: roll it back (dropping it does).
///
/// The statement is sent unnamed, so the server parses and plans it on every
/// call; a connection that admits often should use [`PreparedAdmit`].
pub async fn admit(tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
    let token = token_to_i64(BACKEND, fence.token)?;
    let (resource, mode) = (fence.resource.as_str(), mode.as_str());
    // Typed parameters: parse, bind and execute go out in one round trip,
    // instead of a prepare round trip before every admit.
    let params = [
        (&resource as &(dyn ToSql + Sync), ADMIT_TYPES[0].clone()),
        (&token, ADMIT_TYPES[1].clone()),
        (&mode, ADMIT_TYPES[2].clone()),
    ];
    admitted(tx.execute_typed(ADMIT_SQL, &params).await)
}

/// Admits `fence` and runs `effect` **pipelined**: the admit and the effect's
/// statements go out on the connection without waiting for each other, which
/// saves the admit's round trip. Both run in `tx`, so a stale admit aborts the
/// transaction and nothing of the effect can commit, in whatever order the
/// server sees them; the effect's own statements then fail (SQLSTATE 25P02)
/// and this returns the rejection, not their error.
///
/// Only for effects made of statements on `tx`: anything else the effect does
/// (a message sent, a file written) happens before the admit is known.
pub async fn admit_pipelined<T, E, Fut>(
    tx: &Transaction<'_>,
    fence: &Fence,
    mode: FenceMode,
    effect: Fut,
) -> Result<T, E>
where
    E: From<ArbiterError>,
    Fut: Future<Output = Result<T, E>>,
{
    pipelined(admit(tx, fence, mode), effect).await
}

/// The common case of `leasefence_admit` as one plain statement: raise the
/// token of an existing fence row. It must match the rule in
/// `sql/postgres_schema.sql` (the conformance suite runs both paths).
const FAST_ADMIT_SQL: &str = "UPDATE leasefence_fences SET last_token = $2, mode = $3, updated_at = now() \
     WHERE resource = $1 AND (last_token < $2 OR ($3 = 'monotonic' AND last_token = $2))";

/// Admission prepared once on a connection, for connections that admit
/// often. Each admit is one prepared `UPDATE` of the fence row, the common
/// case; only when that changes no row (the first admit of a resource, or a
/// stale token) does it call `leasefence_admit`, which inserts the row or
/// raises `LF001`. Compared with [`admit`] this skips the server's parse and
/// plan of an unnamed statement and the PL/pgSQL call (see the
/// `fenced_vs_plain` bench and the README's "What fencing costs").
///
/// Valid only on the connection that prepared it: on another one it fails
/// with an error, never a silent pass. With a deadpool pool use
/// [`PreparedAdmit::prepare_cached`] on each checked-out object.
#[derive(Clone, Debug)]
pub struct PreparedAdmit {
    update: Statement,
    admit: Statement,
}

impl PreparedAdmit {
    /// Prepares the two statements on `client`.
    pub async fn prepare(client: &impl GenericClient) -> Result<PreparedAdmit, ArbiterError> {
        let (update, admit) = tokio::join!(
            client.prepare_typed(FAST_ADMIT_SQL, &ADMIT_TYPES),
            client.prepare_typed(ADMIT_SQL, &ADMIT_TYPES)
        );
        Ok(PreparedAdmit {
            update: update?,
            admit: admit?,
        })
    }

    /// The same from a deadpool object's statement cache: cheap to call
    /// before every transaction.
    pub async fn prepare_cached(client: &deadpool_postgres::ClientWrapper) -> Result<PreparedAdmit, ArbiterError> {
        let (update, admit) = tokio::join!(
            client.prepare_typed_cached(FAST_ADMIT_SQL, &ADMIT_TYPES),
            client.prepare_typed_cached(ADMIT_SQL, &ADMIT_TYPES)
        );
        Ok(PreparedAdmit {
            update: update?,
            admit: admit?,
        })
    }

    /// [`admit`] with the prepared statements.
    pub async fn admit(&self, tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
        let token = token_to_i64(BACKEND, fence.token)?;
        let (resource, mode) = (fence.resource.as_str(), mode.as_str());
        let params: [&(dyn ToSql + Sync); 3] = [&resource, &token, &mode];
        let raised = tx.execute(&self.update, &params).await.map_err(classify_observed)?;
        if raised == 1 {
            return Ok(());
        }
        admitted(tx.execute(&self.admit, &params).await)
    }

    /// [`admit_pipelined`] with the prepared statements. When the fast
    /// `UPDATE` changes no row, the fallback goes out after the effect's
    /// statements; if one of those failed, its error is returned (nothing
    /// commits either way).
    pub async fn admit_pipelined<T, E, Fut>(
        &self,
        tx: &Transaction<'_>,
        fence: &Fence,
        mode: FenceMode,
        effect: Fut,
    ) -> Result<T, E>
    where
        E: From<ArbiterError>,
        Fut: Future<Output = Result<T, E>>,
    {
        pipelined(self.admit(tx, fence, mode), effect).await
    }
}

fn admitted(result: Result<u64, tokio_postgres::Error>) -> Result<(), ArbiterError> {
    result.map(|_| ()).map_err(classify_observed)
}

/// [`classify`], and a rejection counted and logged.
fn classify_observed(e: tokio_postgres::Error) -> ArbiterError {
    observe(BACKEND, ArbiterError::from(e))
}

async fn pipelined<T, E, A, Fut>(admit: A, effect: Fut) -> Result<T, E>
where
    E: From<ArbiterError>,
    A: Future<Output = Result<(), ArbiterError>>,
    Fut: Future<Output = Result<T, E>>,
{
    // `biased`: the admit is polled (and so sent) first.
    let (admitted, out) = tokio::join!(biased; admit, effect);
    match (admitted, out) {
        (Ok(()), out) => out,
        // The admit ran after the effect had already failed (the fallback of
        // `PreparedAdmit` on a first admit): the effect's error is the news.
        (Err(e), Err(effect_error)) if in_failed_transaction(&e) => Err(effect_error),
        (Err(e), _) => Err(e.into()),
    }
}

/// SQLSTATE 25P02: a statement sent after an earlier one failed.
fn in_failed_transaction(e: &ArbiterError) -> bool {
    matches!(e, ArbiterError::Postgres(pg) if pg.code().is_some_and(|c| c.code() == "25P02"))
}

/// The recorded `last_token` of `resource`, `None` if it was never admitted.
pub async fn last_token(client: &impl GenericClient, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
    let row = client
        .query_opt(
            "SELECT last_token FROM leasefence_fences WHERE resource = $1",
            &[&resource.as_str()],
        )
        .await?;
    row.map(|r| token_from_i64(BACKEND, r.get(0))).transpose()
}

/// Begins a transaction, admits `fence`, runs `effect` in it and commits. On a
/// rejection or an effect error the transaction is rolled back and nothing of
/// the effect happens. Works with a pooled connection too (`&mut *object`).
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client, fence: leasefence_arbiter::Fence)
/// # -> Result<(), leasefence_arbiter::ArbiterError> {
/// use leasefence_arbiter::{ArbiterError, FenceMode, postgres::with_fence};
///
/// with_fence(client, &fence, FenceMode::Strict, |tx| {
///     Box::pin(async move {
///         tx.execute("UPDATE accounts SET balance = 0 WHERE id = 7", &[]).await?;
///         Ok::<_, ArbiterError>(())
///     })
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn with_fence<T, E, F>(client: &mut Client, fence: &Fence, mode: FenceMode, effect: F) -> Result<T, E>
where
    E: From<ArbiterError>,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> EffectFuture<'t, T, E>,
{
    let tx = client.transaction().await.map_err(ArbiterError::from)?;
    admit(&tx, fence, mode).await?;
    let out = effect(&tx).await?;
    tx.commit().await.map_err(ArbiterError::from)?;
    Ok(out)
}

/// Maps a PostgreSQL error to ours: `LF001` becomes [`ArbiterError::Stale`]
/// (parsed from the DETAIL), `LF002` [`ArbiterError::Invalid`], an undefined
/// `leasefence_admit` or table [`ArbiterError::NotInstalled`].
pub(crate) fn classify(e: tokio_postgres::Error) -> ArbiterError {
    let Some(db) = e.as_db_error() else {
        return ArbiterError::Postgres(e);
    };
    match db.code().code() {
        SQLSTATE_STALE => match parse_stale_detail(db.detail().unwrap_or_default()) {
            Some(stale) => ArbiterError::Stale(stale),
            None => ArbiterError::Protocol {
                backend: BACKEND,
                message: format!(
                    "unparseable {SQLSTATE_STALE} rejection: {} / {:?}",
                    db.message(),
                    db.detail()
                ),
            },
        },
        SQLSTATE_INVALID => ArbiterError::Invalid(leasefence_core::Invalid::new("argument", db.message())),
        // undefined_function, undefined_table
        "42883" | "42P01" if db.message().contains("leasefence_") => ArbiterError::NotInstalled { backend: BACKEND },
        _ => ArbiterError::Postgres(e),
    }
}

/// Parses `presented=N current=M resource=R` (the resource is last because it
/// may contain spaces).
fn parse_stale_detail(detail: &str) -> Option<Stale> {
    let rest = detail.strip_prefix("presented=")?;
    let (presented, rest) = rest.split_once(" current=")?;
    let (current, resource) = rest.split_once(" resource=")?;
    Some(Stale {
        resource: ResourceId::new(resource).ok()?,
        presented: Token::new(presented.parse().ok()?)?,
        current: Token::new(current.parse().ok()?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_detail_round_trips_resources_with_spaces() {
        let s = parse_stale_detail("presented=5 current=9 resource=orders 42 current=1").expect("parses");
        assert_eq!(s.resource.as_str(), "orders 42 current=1");
        assert_eq!((s.presented.get(), s.current.get()), (5, 9));
        assert!(parse_stale_detail("presented=0 current=9 resource=r").is_none());
        assert!(parse_stale_detail("presented=5 current= resource=r").is_none());
        assert!(parse_stale_detail("garbage").is_none());
    }
}
