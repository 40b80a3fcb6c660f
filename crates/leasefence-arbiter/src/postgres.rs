//! The PostgreSQL arbiter: a versioned, idempotent schema with the PL/pgSQL
//! function `leasefence_admit(resource, token, mode)`, and Rust helpers.
//!
//! `leasefence_admit` runs inside the caller's own transaction: it upserts the
//! fence row only if the rule holds and otherwise raises SQLSTATE
//! [`SQLSTATE_STALE`] (`LF001`), which aborts the transaction, so the effect and
//! the new `last_token` commit together or not at all. The full schema, with
//! its documented SQLSTATEs, is `src/sql/postgres_schema.sql`.
//!
//! Every statement the helpers send names the install schema ([`Schema`]:
//! `public` for the free functions, any other through its methods), so the
//! caller's `search_path` does not decide which `leasefence_fences` or
//! `leasefence_stale` they use.
//!
//! Signed fences: once [`add_fence_key`] has installed a key, a trigger on the
//! fence table verifies the signature every write carries (HMAC-SHA256 with
//! contrib's `pgcrypto`), inside the database, whichever path wrote it:
//! `leasefence_admit`, [`PreparedAdmit`], [`FencedStatement`], or SQL by
//! hand. The helpers pass `fence.signature` along.
//!
//! Tokens are stored as `bigint`: tokens above `i64::MAX` are refused with
//! [`ArbiterError::Invalid`] before any statement runs, never wrapped.
//! Connections are plain TCP (`NoTls`).

use std::future::Future;
use std::pin::Pin;

use leasefence_core::signing::{FenceKey, SignatureError};
use leasefence_core::{Fence, FenceMode, ResourceId, Stale, Token};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, NoTls, Statement, Transaction};

use crate::ArbiterError;
use crate::reject::token_to_i64;

mod dedup;
mod folded;
mod schema;

pub use dedup::{Once, claim_message, prune_consumed, with_fence_once};
pub use folded::{FENCE_CTE, FencedStatement, fold_fence, fold_fence_signed};
pub use schema::Schema;

const BACKEND: &str = "postgres";

/// The schema version this build installs and expects.
pub const SCHEMA_VERSION: i32 = 5;
/// SQLSTATE raised by `leasefence_admit` for a stale token.
pub const SQLSTATE_STALE: &str = "LF001";
/// SQLSTATE raised by `leasefence_admit` for an invalid argument.
pub const SQLSTATE_INVALID: &str = "LF002";
/// SQLSTATE raised by the installer when a newer schema is already installed.
pub const SQLSTATE_SCHEMA_NEWER: &str = "LF003";
/// SQLSTATE raised while fence keys are installed for a fence whose
/// signature is missing, malformed, under an unknown key or not matching.
pub const SQLSTATE_BAD_SIGNATURE: &str = "LF004";
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

/// Installs or upgrades the arbiter in `public` (idempotent, safe to run
/// concurrently); [`Schema::install`] installs elsewhere.
pub async fn install(client: &mut Client) -> Result<(), ArbiterError> {
    Schema::PUBLIC.install(client).await
}

/// Connects to `url` and [`install`]s.
pub async fn install_url(url: &str) -> Result<(), ArbiterError> {
    let mut client = connect(url).await?;
    install(&mut client).await
}

/// The schema version installed in `public`, `None` when nothing is installed.
pub async fn installed_version(client: &impl GenericClient) -> Result<Option<i32>, ArbiterError> {
    Schema::PUBLIC.installed_version(client).await
}

/// resource, token, mode, signature.
const ADMIT_TYPES: [Type; 4] = [Type::TEXT, Type::INT8, Type::TEXT, Type::TEXT];

/// Admits `fence` inside `tx` and records its token there, or returns
/// [`ArbiterError::Stale`] (counted and logged). After a rejection the
/// transaction is aborted: roll it back (dropping it does).
///
/// The statement is sent unnamed, so the server parses and plans it on every
/// call; a connection that admits often should use [`PreparedAdmit`].
pub async fn admit(tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
    Schema::PUBLIC.admit(tx, fence, mode).await
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
    Schema::PUBLIC.admit_pipelined(tx, fence, mode, effect).await
}

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
/// [`PreparedAdmit::prepare_cached`] on each checked-out object. Both
/// statements name `public`; [`Schema::prepare_admit`] prepares them for
/// another schema.
#[derive(Clone, Debug)]
pub struct PreparedAdmit {
    update: Statement,
    admit: Statement,
    /// Where the statements look, for their errors.
    schema: Schema,
}

impl PreparedAdmit {
    /// Prepares the two statements on `client`.
    pub async fn prepare(client: &impl GenericClient) -> Result<PreparedAdmit, ArbiterError> {
        Schema::PUBLIC.prepare_admit(client).await
    }

    /// The same from a deadpool object's statement cache: cheap to call
    /// before every transaction.
    pub async fn prepare_cached(client: &deadpool_postgres::ClientWrapper) -> Result<PreparedAdmit, ArbiterError> {
        Schema::PUBLIC.prepare_admit_cached(client).await
    }

    /// [`admit`] with the prepared statements.
    pub async fn admit(&self, tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
        let token = token_to_i64(BACKEND, fence.token)?;
        let (resource, mode) = (fence.resource.as_str(), mode.as_str());
        let signature = fence.signature.as_deref();
        let params: [&(dyn ToSql + Sync); 4] = [&resource, &token, &mode, &signature];
        let observed = |e| self.schema.classify_observed(e);
        let raised = tx.execute(&self.update, &params).await.map_err(observed)?;
        if raised == 1 {
            return Ok(());
        }
        tx.execute(&self.admit, &params).await.map(|_| ()).map_err(observed)
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

/// The recorded `last_token` of `resource` in `public`, `None` if it was
/// never admitted.
pub async fn last_token(client: &impl GenericClient, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
    Schema::PUBLIC.last_token(client, resource).await
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
    Schema::PUBLIC.with_fence(client, fence, mode, effect).await
}

/// Installs `key` in `public` (or replaces the secret of a key of the same
/// id): from then on every write of the fence table must carry a signature
/// under one of the installed keys, or fails with
/// [`ArbiterError::BadSignature`] (SQLSTATE [`SQLSTATE_BAD_SIGNATURE`]) and
/// records nothing. At most two keys (a rotation); a third is
/// [`ArbiterError::Invalid`]. Needs the role that installed the schema (the
/// key table is readable by nobody else).
pub async fn add_fence_key(client: &impl GenericClient, key: &FenceKey) -> Result<(), ArbiterError> {
    Schema::PUBLIC.add_fence_key(client, key).await
}

/// Removes the key `key_id` from `public`; `true` if it was installed. With
/// the last key gone, fences are no longer checked.
pub async fn remove_fence_key(client: &impl GenericClient, key_id: &str) -> Result<bool, ArbiterError> {
    Schema::PUBLIC.remove_fence_key(client, key_id).await
}

/// The ids of the keys installed in `public`, sorted (never the secrets).
pub async fn fence_key_ids(client: &impl GenericClient) -> Result<Vec<String>, ArbiterError> {
    Schema::PUBLIC.fence_key_ids(client).await
}

/// Maps a PostgreSQL error to ours: `LF001` becomes [`ArbiterError::Stale`]
/// (parsed from the DETAIL), `LF004` [`ArbiterError::BadSignature`], `LF002`
/// [`ArbiterError::Invalid`], an undefined
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
        SQLSTATE_BAD_SIGNATURE => match parse_signature_detail(db.detail().unwrap_or_default()) {
            Some((resource, reason)) => ArbiterError::BadSignature { resource, reason },
            None => ArbiterError::Protocol {
                backend: BACKEND,
                message: format!(
                    "unparseable {SQLSTATE_BAD_SIGNATURE} refusal: {} / {:?}",
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

/// Parses `reason=R key=K resource=NAME` (the resource last: it may contain
/// spaces; key ids never do).
fn parse_signature_detail(detail: &str) -> Option<(ResourceId, SignatureError)> {
    let rest = detail.strip_prefix("reason=")?;
    let (reason, rest) = rest.split_once(" key=")?;
    let (key, resource) = rest.split_once(" resource=")?;
    Some((
        ResourceId::new(resource).ok()?,
        SignatureError::from_reason(reason, key)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_detail_parses_every_reason() {
        let (r, e) = parse_signature_detail("reason=unknown_key key=k2 resource=a b key=c").expect("parses");
        assert_eq!((r.as_str(), e), ("a b key=c", SignatureError::UnknownKey("k2".into())));
        let (_, e) = parse_signature_detail("reason=missing key= resource=r").expect("parses");
        assert_eq!(e, SignatureError::Missing);
        assert!(parse_signature_detail("reason=stale key= resource=r").is_none());
        assert!(parse_signature_detail("reason=mismatch key=k resource=").is_none());
    }

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
