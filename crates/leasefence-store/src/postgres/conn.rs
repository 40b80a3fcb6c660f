//! One PostgreSQL connection driven from blocking code: a small current-thread
//! tokio runtime of its own, the connection (made on first use and after
//! every failure, with the schema checked and installed if needed), and the
//! statements prepared on it. Every call is bounded by the call timeout.

use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Statement};

use super::schema::{SCHEMA_VERSION, Schema};
use crate::StoreError;

/// The longest the server lets a batch's transaction wait for its next
/// command before it ends the session (and with it the shard row's lock).
pub(crate) const BATCH_IDLE_MAX: Duration = Duration::from_secs(1);

/// Why a call failed.
pub(crate) enum Fail {
    /// The engine failed or could not be reached. The connection is dropped.
    Pg(tokio_postgres::Error),
    /// As [`Fail::Pg`], but while committing: whether the transaction
    /// committed is unknown, so the call is never retried.
    Committing(tokio_postgres::Error),
    /// A refusal of ours (deposed, token regression, corrupt record). `clean`:
    /// the transaction was rolled back and the connection may be reused.
    Refused { error: StoreError, clean: bool },
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail::Pg(e)
    }
}

/// The statements of the store, prepared on each connection.
pub(crate) struct Statements {
    pub campaign: Statement,
    pub renew: Statement,
    pub resign: Statement,
    pub leader: Statement,
    pub current_epoch: Statement,
    pub lock_shard: Statement,
    pub read: Statement,
    pub upsert: Statement,
    pub write_known: Statement,
    pub load: Statement,
}

pub(crate) struct Live {
    pub client: Client,
    pub st: Statements,
    /// Set by a call once it has sent its COMMIT: from then on a timeout
    /// leaves the outcome unknown.
    pub committing: std::cell::Cell<bool>,
}

pub(crate) struct Conn {
    /// `None` only while dropping.
    rt: Option<Runtime>,
    pg: tokio_postgres::Config,
    schema: Schema,
    call_timeout: Duration,
    live: Option<Live>,
}

impl Conn {
    pub(crate) fn new(pg: tokio_postgres::Config, schema: Schema, call_timeout: Duration) -> Result<Conn, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io(format!("cannot start the PostgreSQL store's runtime: {e}")))?;
        Ok(Conn {
            rt: Some(rt),
            pg,
            schema,
            call_timeout,
            live: None,
        })
    }

    /// Runs `f` on the connection, connecting first if there is none. A
    /// connection that the server or the network closed while it sat idle is
    /// replaced and `f` tried once more on the new one, unless it failed
    /// while committing. Any failure but a clean refusal drops the connection,
    /// so the next call starts on a new one.
    pub(crate) fn call<T>(&mut self, f: impl AsyncFn(&Live) -> Result<T, Fail>) -> Result<T, StoreError> {
        let Conn {
            rt,
            pg,
            schema,
            call_timeout,
            live,
        } = self;
        let rt = rt.as_ref().ok_or(StoreError::Closed)?;
        let limit = *call_timeout;
        rt.block_on(async {
            let mut retried = false;
            loop {
                let fresh = live.is_none();
                if fresh {
                    let made = tokio::time::timeout(limit, connect(pg, schema, limit)).await;
                    *live = Some(
                        made.map_err(|_| timed_out("connecting", limit))?
                            .map_err(classify_fail)?,
                    );
                }
                let Some(l) = live.as_ref() else {
                    return Err(StoreError::Closed);
                };
                l.committing.set(false);
                let out = tokio::time::timeout(limit, f(l)).await;
                let failure = match out {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(failure)) => failure,
                    Err(_) => {
                        let committing = l.committing.get();
                        *live = None;
                        return Err(match timed_out("waiting for PostgreSQL", limit) {
                            StoreError::Unavailable(m) if committing => StoreError::Indeterminate(format!(
                                "{m}, after sending COMMIT: the batch may or may not have committed"
                            )),
                            e => e,
                        });
                    }
                };
                if !matches!(failure, Fail::Refused { clean: true, .. }) {
                    *live = None;
                }
                let stale = matches!(&failure, Fail::Pg(e) if connection_lost(e));
                if stale && !fresh && !retried {
                    retried = true;
                    continue;
                }
                return Err(classify_fail(failure));
            }
        })
    }
}

impl Conn {
    /// Whether there is a connection that was not found closed since its
    /// last call (by the server, the network, a proxy), as far as this
    /// process can tell without a round trip: the connection's task is first
    /// let run, so that a close that already arrived is seen. A closed
    /// connection is dropped; a call after a failure always starts without
    /// one.
    pub(crate) fn alive(&mut self) -> bool {
        let (Some(rt), Some(live)) = (self.rt.as_ref(), self.live.as_ref()) else {
            return false;
        };
        // Twice: the first turn hands the socket's events to the connection's
        // task, the second lets it run.
        rt.block_on(async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        });
        if live.client.is_closed() {
            self.live = None;
            return false;
        }
        true
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.live = None;
        // Never blocks, so a store may be dropped anywhere, async code included.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn timed_out(what: &str, limit: Duration) -> StoreError {
    StoreError::Unavailable(format!("no answer from PostgreSQL within {limit:?} while {what}"))
}

async fn connect(pg: &tokio_postgres::Config, schema: &Schema, limit: Duration) -> Result<Live, Fail> {
    let (mut client, connection) = pg.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "leasefence store: PostgreSQL connection closed");
        }
    });
    // The server ends what a lost or stuck coordinator leaves behind: above
    // all a batch's open transaction, whose lock on the shard row keeps every
    // standby's campaign waiting. A batch is idle in its transaction only for
    // one round trip, so that bound is short: a leader paused mid-batch
    // delays a takeover by at most that much.
    let ms = limit.as_millis().max(1);
    let idle_ms = limit.min(BATCH_IDLE_MAX).as_millis().max(1);
    client
        .batch_execute(&format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}; \
             SET idle_in_transaction_session_timeout = {idle_ms}"
        ))
        .await?;
    ensure_schema(&mut client, schema).await?;
    let st = prepare(&client, schema).await?;
    Ok(Live {
        client,
        st,
        committing: std::cell::Cell::new(false),
    })
}

/// Installs the schema unless this version is there already (so a
/// coordinator needs DDL rights only once), and refuses a newer one.
async fn ensure_schema(client: &mut Client, schema: &Schema) -> Result<(), Fail> {
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = 'leasefence_schema_version')",
            &[&schema.name()],
        )
        .await?
        .try_get(0)?;
    if exists {
        let sql = format!(
            "SELECT version FROM {} WHERE component = 'store'",
            schema.qualify("leasefence_schema_version")
        );
        let version: Option<i32> = client.query_opt(&sql, &[]).await?.map(|r| r.try_get(0)).transpose()?;
        match version {
            Some(SCHEMA_VERSION) => return Ok(()),
            Some(v) if v > SCHEMA_VERSION => {
                let error = StoreError::Io(schema.newer_message(v));
                return Err(Fail::Refused { error, clean: false });
            }
            _ => {}
        }
    }
    let tx = client.transaction().await?;
    tx.batch_execute(&schema.install_script()).await?;
    tx.commit().await?;
    Ok(())
}

async fn prepare(client: &Client, schema: &Schema) -> Result<Statements, tokio_postgres::Error> {
    use Type as T;
    let sql = schema.statements();
    // Sent together: one round trip for all of them.
    let (campaign, renew, resign, leader, current_epoch, lock_shard, read, upsert, write_known, load) = tokio::try_join!(
        client.prepare_typed(&sql.campaign, &[T::INT8, T::TEXT, T::INT8]),
        client.prepare_typed(&sql.renew, &[T::INT8, T::INT8, T::INT8]),
        client.prepare_typed(&sql.resign, &[T::INT8, T::INT8]),
        client.prepare_typed(&sql.leader, &[T::INT8]),
        client.prepare_typed(&sql.current_epoch, &[T::INT8]),
        client.prepare_typed(&sql.lock_shard, &[T::INT8]),
        client.prepare_typed(&sql.read, &[T::INT8, T::TEXT_ARRAY]),
        client.prepare_typed(&sql.upsert, &[T::INT8, T::INT8, T::TEXT_ARRAY, T::BYTEA_ARRAY]),
        client.prepare_typed(
            &sql.write_known,
            &[
                T::INT8,
                T::INT8,
                T::TEXT_ARRAY,
                T::BYTEA_ARRAY,
                T::TEXT_ARRAY,
                T::BYTEA_ARRAY
            ]
        ),
        client.prepare_typed(&sql.load, &[T::INT8]),
    )?;
    Ok(Statements {
        campaign,
        renew,
        resign,
        leader,
        current_epoch,
        lock_shard,
        read,
        upsert,
        write_known,
        load,
    })
}

/// The connection itself is gone (closed, reset, refused, or ended by the
/// server: an administrator, a shutdown), as opposed to a statement that failed.
pub(crate) fn connection_lost(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08")
                || code.starts_with("57P")
                || db.code() == &SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
        }
        None => e.is_closed() || source_is_io(e),
    }
}

fn source_is_io(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// SQLSTATEs that mean "the engine cannot serve us now", not "this failed":
/// connection exceptions, a session the server ended (a shutdown, an
/// administrator, our own idle bound on a batch), resources exhausted, a
/// read-only server (a replica, or a primary demoted by a failover), and our
/// own statement and lock timeouts.
fn unavailable(code: &SqlState) -> bool {
    let code = code.code();
    code.starts_with("08")
        || code == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT.code()
        || code.starts_with("53")
        || code.starts_with("57P")
        || code == SqlState::READ_ONLY_SQL_TRANSACTION.code()
        || code == SqlState::QUERY_CANCELED.code()
        || code == SqlState::LOCK_NOT_AVAILABLE.code()
}

pub(crate) fn classify(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) if unavailable(db.code()) => StoreError::Unavailable(format!("PostgreSQL: {}", db.message())),
        Some(db) => StoreError::Io(format!("PostgreSQL error {}: {}", db.code().code(), db.message())),
        None if connection_lost(&e) => StoreError::Unavailable(format!("PostgreSQL: {}", with_cause(&e))),
        None => StoreError::Io(format!("PostgreSQL: {}", with_cause(&e))),
    }
}

/// The error and its cause (connection refused, a TLS or I/O failure):
/// tokio-postgres keeps the cause in its source, and the message that
/// carries it here is a string.
fn with_cause(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

fn classify_fail(f: Fail) -> StoreError {
    match f {
        Fail::Pg(e) => classify(e),
        Fail::Committing(e) => match classify(e) {
            StoreError::Unavailable(m) => StoreError::Indeterminate(format!(
                "{m} (while committing: the batch may or may not have committed)"
            )),
            other => other,
        },
        Fail::Refused { error, .. } => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connect error says why it failed (the cause is in tokio-postgres's
    /// source): "error connecting to server" alone leaves an operator
    /// guessing between a wrong port, a firewall and a refused login.
    #[tokio::test]
    async fn a_connect_error_says_why() {
        let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = refused.local_addr().expect("addr").port();
        drop(refused);
        let url = format!("postgres://nobody@127.0.0.1:{port}/x?connect_timeout=5");
        let e = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .err()
            .expect("nothing listens there");
        let said = classify(e).to_string();
        assert!(said.contains("PostgreSQL: error connecting to server: "), "{said}");
        assert!(said.contains("refused"), "{said}");
    }
}
