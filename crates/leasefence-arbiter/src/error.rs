//! The one error type of every arbiter backend.
//!
//! A stale token is an expected outcome ([`ArbiterError::Stale`]), kept apart
//! from invalid input and from backend failures so a worker can match on it
//! and re-read state instead of treating it as a transport error.

use leasefence_core::{Invalid, Stale};

/// Why a fenced effect did not happen. In every case but two nothing of the
/// effect was committed: `NotAcknowledged` and `WaitFailed` (feature `redis`)
/// come after a Redis write that the primary applied. Variants that wrap a
/// backend's own error exist only with that backend's cargo feature.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    /// The fence rejected the token: a newer (or, in strict mode, the same)
    /// token has already been recorded for the resource.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The arbiter holds fence keys and the fence's signature is missing,
    /// malformed, names a key it does not hold, or does not match the
    /// resource and token (a forged fence, or a real one replayed under
    /// another resource or token). Nothing of the effect happened and no
    /// token was recorded. Not a stale token: retrying with a newer token does
    /// not help, a fence signed by the coordinator does.
    #[error("fence for {} refused: {reason}", resource.shown())]
    BadSignature {
        resource: leasefence_core::ResourceId,
        reason: leasefence_core::signing::SignatureError,
    },
    /// Input that breaks a documented rule, e.g. a token above what the backend
    /// can store, or a URL with an unknown scheme.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The backend has no leasefence schema or functions.
    #[error("leasefence is not installed in this {backend}; run `leasefence arbiter install URL` first")]
    NotInstalled { backend: &'static str },
    #[cfg(feature = "redis")]
    /// The server does not have the `leasefence` Redis module loaded (only for
    /// [`crate::redis::Via::Module`]; the Functions library is [`Self::NotInstalled`]).
    #[error(
        "the leasefence Redis module is not loaded on this server: start redis-server with \
         --loadmodule PATH/libleasefence_redis.so (built by `cargo build --release -p leasefence-redis-module`), \
         or use the Functions library (redis://, `leasefence arbiter install`)"
    )]
    ModuleNotLoaded,
    /// The backend answered something the contract does not allow (a corrupt
    /// fence record, an unparseable rejection).
    #[error("{backend} answered outside the leasefence contract: {message}")]
    Protocol { backend: &'static str, message: String },
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL: {}", describe_postgres(.0))]
    Postgres(tokio_postgres::Error),
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[cfg(feature = "sqlite")]
    #[error("SQLite: {0}")]
    Sqlite(rusqlite::Error),
    #[cfg(feature = "redis")]
    #[error("Redis: {0}")]
    Redis(::redis::RedisError),
    /// The server's settings can lose fences (e.g. Redis may evict fence
    /// keys); `message` says which setting and what to set instead.
    #[error("{backend} settings can lose fences: {message}")]
    UnsafeSettings { backend: &'static str, message: String },
    #[cfg(feature = "redis")]
    /// A fenced Redis write was applied on the primary, but fewer replicas
    /// (or no local AOF fsync) acknowledged it within the wait's timeout than
    /// [`crate::redis::WaitFor`] asked for: a failover now could lose the
    /// write and its token. Read back before retrying.
    #[error(
        "the fenced write on {} was applied on the primary, but {wait} saw {replicas} replica(s) \
         acknowledge it{aof}: a failover before the replicas catch up could lose the write and its \
         token",
        resource.shown(),
        aof = if wait.waits_for_local_aof() && !*local_aof { " and no local AOF fsync" } else { "" }
    )]
    NotAcknowledged {
        resource: leasefence_core::ResourceId,
        wait: crate::redis::WaitFor,
        /// Replicas that acknowledged.
        replicas: u32,
        /// Whether the primary fsynced its AOF (only `WAITAOF` reports it).
        local_aof: bool,
    },
    #[cfg(feature = "redis")]
    /// A fenced Redis write was applied on the primary, but the wait after it
    /// could not run (`WAITAOF` on a server before 7.2, no reply within the
    /// connection's response timeout, ...).
    #[error("the fenced write on {} was applied on the primary, but {wait} failed: {reason}", resource.shown())]
    WaitFailed {
        resource: leasefence_core::ResourceId,
        wait: crate::redis::WaitFor,
        reason: String,
    },
    #[cfg(feature = "embedded")]
    #[error("embedded store: {0}")]
    Embedded(#[from] redb::Error),
    /// The fenced object-store gateway could not be reached, or answered
    /// outside its API (see `crate::gateway`).
    #[cfg(feature = "gateway")]
    #[error("gateway: {0}")]
    Gateway(String),
    /// A background task of the arbiter itself failed (panicked or was cancelled).
    #[error("arbiter task failed: {0}")]
    Task(String),
}

#[cfg(feature = "postgres")]
/// tokio-postgres shows a server error as just "db error"; say which one.
fn describe_postgres(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        // tokio-postgres keeps the cause (connection refused, a TLS or I/O
        // failure) in its source; say it, since this error does not pass
        // it on as its own source.
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl ArbiterError {
    /// The rejection, when this is one.
    pub fn as_stale(&self) -> Option<&Stale> {
        match self {
            ArbiterError::Stale(s) => Some(s),
            _ => None,
        }
    }

    /// True for transient conflicts where retrying the whole transaction is the
    /// right move: PostgreSQL serialization failures and deadlocks (SQLSTATE
    /// 40001, 40P01), SQLite `BUSY`/`LOCKED`. A retry of a stale effect then
    /// gets [`ArbiterError::Stale`].
    pub fn is_retryable(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            ArbiterError::Postgres(e) => e.code().is_some_and(|c| c.code() == "40001" || c.code() == "40P01"),
            #[cfg(feature = "sqlite")]
            ArbiterError::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for ArbiterError {
    /// Maps the leasefence SQLSTATEs back to typed errors, so `?` on any
    /// statement that called `leasefence_admit` yields [`ArbiterError::Stale`].
    fn from(e: tokio_postgres::Error) -> ArbiterError {
        crate::postgres::classify(e)
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for ArbiterError {
    fn from(e: rusqlite::Error) -> ArbiterError {
        crate::sqlite::classify(e)
    }
}

#[cfg(feature = "redis")]
impl From<::redis::RedisError> for ArbiterError {
    /// Maps `-STALE presented current` replies of the leasefence functions to
    /// typed errors when the resource is known; see [`crate::redis`].
    fn from(e: ::redis::RedisError) -> ArbiterError {
        crate::redis::classify(e, None)
    }
}

#[cfg(feature = "embedded")]
/// Converts any redb error (they are split by operation) into ours.
pub(crate) fn redb_err(e: impl Into<redb::Error>) -> ArbiterError {
    ArbiterError::Embedded(e.into())
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;

    /// A connect error says why it failed, not only that it did: the cause
    /// is in tokio-postgres's source, which a report of this error would
    /// not otherwise reach (it is not this error's source).
    #[tokio::test]
    async fn a_postgres_connect_error_says_why() {
        let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = refused.local_addr().expect("addr").port();
        drop(refused);
        let url = format!("postgres://nobody@127.0.0.1:{port}/x?connect_timeout=5");
        let e = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .err()
            .expect("nothing listens there");
        let said = ArbiterError::Postgres(e).to_string();
        assert!(said.starts_with("PostgreSQL: error connecting to server: "), "{said}");
        assert!(said.contains("refused"), "{said}");
    }
}
