//! The PostgreSQL [`SharedStore`] (cargo feature `postgres`): the store of
//! `serve --store postgres://…`.
//!
//! Two tables in a schema of their own (`leasefence` unless configured, named
//! in every statement), installed idempotently on first connection and
//! versioned like the arbiter's (a newer installed version is refused); the
//! script is `src/sql/postgres_store_schema.sql`:
//!
//! - `leasefence_shards (shard, epoch, leader, expires_at)`: the leadership. A
//!   campaign is one `INSERT … ON CONFLICT DO UPDATE … WHERE` that bumps the
//!   epoch and sets the leader only if the row's leadership has lapsed;
//!   renew and resign are `UPDATE`s conditional on the epoch. Expiry is set
//!   and judged by the database's clock (`clock_timestamp()`), never a
//!   coordinator's.
//! - `leasefence_records (shard, resource, epoch, record)`: one row per
//!   resource, `record` being the store's record codec (the bytes the
//!   embedded store keeps, so every backend shares one format and one
//!   checked decoder), `epoch` the term that wrote it last. `resource` is
//!   `text`: use a UTF-8 database, or names outside its encoding fail.
//!
//! Each batch of the [`PostgresWriter`] is one transaction that locks the
//! shard row, checks the epoch and upserts the records: in one round trip
//! when the writer knows the batch's records (it last read or wrote them),
//! else in two. Every record of a batch is looked up by the whole primary
//! key, so a batch costs the same however many records the shard holds,
//! whatever plan PostgreSQL caches for the statements (see `schema`).
//!
//! The methods block: each handle drives tokio-postgres on a small
//! current-thread runtime of its own, so they may be called from any thread
//! that is not running async code (a `spawn_blocking` thread, the committer's
//! thread), and a handle may be dropped anywhere. (The synchronous `postgres`
//! crate would do the same with one more dependency; tokio-postgres is the
//! one the arbiter already uses.) The leadership calls share one connection;
//! each writer has its own. A connection error is
//! [`StoreError::Unavailable`] and the next call connects again; every call
//! is bounded by [`PostgresConfig::call_timeout`], which the server also
//! applies to our sessions (statement, lock and idle-in-transaction timeouts),
//! so a lost coordinator cannot keep the shard row locked. Connections are
//! plain TCP (`NoTls`), as the arbiter's.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::shared::{Epoch, LeaderInfo, SharedStore};
use crate::{SHARD_DEFAULT, StoreError};

mod conn;
mod schema;
mod writer;

#[cfg(test)]
mod tests;

use conn::{Conn, Fail, Live};
use schema::Schema;
pub use writer::PostgresWriter;

/// How to reach the engine and where the store lives in it.
#[derive(Clone)]
pub struct PostgresConfig {
    pg: tokio_postgres::Config,
    schema: Schema,
    shard: u32,
    call_timeout: Duration,
}

impl PostgresConfig {
    /// The schema the tables live in unless [`PostgresConfig::with_schema`] says otherwise.
    pub const SCHEMA_DEFAULT: &'static str = "leasefence";
    /// The bound on each call unless [`PostgresConfig::with_call_timeout`] says otherwise.
    pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    /// The longest leadership TTL a campaign or renewal takes.
    pub const LEADER_TTL_MAX: Duration = Duration::from_secs(24 * 3600);

    /// `url` is a libpq-style URL (`postgres://user[:password]@host[:port]/database[?options]`)
    /// or `key=value` string; shard [`SHARD_DEFAULT`], schema [`Self::SCHEMA_DEFAULT`].
    pub fn new(url: &str) -> Result<PostgresConfig, StoreError> {
        let mut pg: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Io(format!(
                "invalid PostgreSQL store URL: {e}; expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
            ))
        })?;
        if pg.get_hosts().is_empty() {
            return Err(StoreError::Io(
                "invalid PostgreSQL store URL: it names no host; expected postgres://USER@HOST[:PORT]/DATABASE".into(),
            ));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("leasefence-store");
        }
        Ok(PostgresConfig {
            pg,
            schema: Schema::new(Self::SCHEMA_DEFAULT)?,
            shard: SHARD_DEFAULT,
            call_timeout: Self::CALL_TIMEOUT_DEFAULT,
        })
    }

    /// The schema to keep the tables in (created if missing): 1..=63 ASCII
    /// letters, digits and underscores, not starting with a digit.
    pub fn with_schema(mut self, name: &str) -> Result<PostgresConfig, StoreError> {
        self.schema = Schema::new(name)?;
        Ok(self)
    }

    pub fn with_shard(mut self, shard: u32) -> PostgresConfig {
        self.shard = shard;
        self
    }

    /// The bound on each call (connecting included); above zero.
    pub fn with_call_timeout(mut self, limit: Duration) -> Result<PostgresConfig, StoreError> {
        if limit < Duration::from_millis(1) {
            return Err(StoreError::Io(format!(
                "invalid PostgreSQL store call timeout {limit:?}: it must be at least 1ms"
            )));
        }
        self.call_timeout = limit;
        Ok(self)
    }

    pub fn schema(&self) -> &str {
        self.schema.name()
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    fn conn(&self) -> Result<Conn, StoreError> {
        Conn::new(self.pg.clone(), self.schema.clone(), self.call_timeout)
    }
}

/// No URL, so no password, in debug output.
impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("schema", &self.schema.name())
            .field("shard", &self.shard)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// One shard of the store in PostgreSQL, as one coordinator sees it.
pub struct PostgresShared {
    config: PostgresConfig,
    control: Mutex<Conn>,
}

impl PostgresShared {
    /// [`PostgresShared::open`] with shard `shard` and every other setting's default.
    pub fn connect(url: &str, shard: u32) -> Result<PostgresShared, StoreError> {
        PostgresShared::open(PostgresConfig::new(url)?.with_shard(shard))
    }

    /// Connects, installing the schema if it is not there yet. Fails with
    /// [`StoreError::Unavailable`] when the engine cannot be reached (try
    /// again later), with [`StoreError::Io`] when the engine refuses (bad
    /// credentials, no right to create the schema, a newer schema installed).
    pub fn open(config: PostgresConfig) -> Result<PostgresShared, StoreError> {
        let store = PostgresShared {
            control: Mutex::new(config.conn()?),
            config,
        };
        store.call(async |_: &Live| Ok(()))?;
        Ok(store)
    }

    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    fn call<T>(&self, f: impl AsyncFn(&Live) -> Result<T, Fail>) -> Result<T, StoreError> {
        self.lock().call(f)
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        // A panic in another caller leaves the connection in no worse state
        // than a network error would: `call` reconnects as needed.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shard(&self) -> i64 {
        i64::from(self.config.shard)
    }
}

impl std::fmt::Debug for PostgresShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresShared").field("config", &self.config).finish()
    }
}

impl SharedStore for PostgresShared {
    type Writer = PostgresWriter;

    fn campaign(&self, advertise: &str, ttl: Duration) -> Result<Option<Epoch>, StoreError> {
        let (shard, ttl) = (self.shard(), ttl_to_sql(ttl)?);
        // Retried once on a connection found dead (see `Conn::call`): if the
        // first attempt won unseen, the retry finds that leadership live and
        // returns `None`, and the shard waits one TTL for a leader. Safe.
        let won = self.call(async |live: &Live| {
            let row = live
                .client
                .query_opt(&live.st.campaign, &[&shard, &advertise, &ttl])
                .await?;
            Ok(row.map(|r| r.try_get::<_, i64>(0)).transpose()?)
        })?;
        won.map(epoch_from_sql).transpose()
    }

    fn renew(&self, epoch: Epoch, ttl: Duration) -> Result<(), StoreError> {
        let (shard, ttl) = (self.shard(), ttl_to_sql(ttl)?);
        let Ok(epoch_sql) = i64::try_from(epoch) else {
            return Err(StoreError::Deposed {
                epoch,
                current: self.current()?,
            });
        };
        let renewed = self
            .call(async |live: &Live| Ok(live.client.execute(&live.st.renew, &[&shard, &epoch_sql, &ttl]).await?))?;
        if renewed == 1 {
            return Ok(());
        }
        Err(StoreError::Deposed {
            epoch,
            current: self.current()?,
        })
    }

    fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        let shard = self.shard();
        let row = self.call(async |live: &Live| {
            let row = live.client.query_opt(&live.st.leader, &[&shard]).await?;
            Ok(row
                .map(|r| Ok::<_, tokio_postgres::Error>((r.try_get::<_, i64>(0)?, r.try_get::<_, String>(1)?)))
                .transpose()?)
        })?;
        row.map(|(epoch, advertise)| {
            Ok(LeaderInfo {
                epoch: epoch_from_sql(epoch)?,
                advertise,
            })
        })
        .transpose()
    }

    fn resign(&self, epoch: Epoch) -> Result<(), StoreError> {
        let shard = self.shard();
        let Ok(epoch) = i64::try_from(epoch) else {
            return Ok(()); // never handed out, so not current
        };
        self.call(async |live: &Live| Ok(live.client.execute(&live.st.resign, &[&shard, &epoch]).await?))?;
        Ok(())
    }

    fn writer(&self, epoch: Epoch) -> Result<PostgresWriter, StoreError> {
        // Connects on first use: making a writer does no I/O.
        Ok(PostgresWriter {
            conn: self.config.conn()?,
            shard: self.config.shard,
            epoch,
            known: Default::default(),
            #[cfg(test)]
            pause: None,
            #[cfg(test)]
            sent: (0, 0),
        })
    }
}

impl PostgresShared {
    /// The shard's current epoch (0 before its first campaign).
    fn current(&self) -> Result<Epoch, StoreError> {
        let shard = self.shard();
        let row = self.call(async |live: &Live| {
            let row = live.client.query_opt(&live.st.current_epoch, &[&shard]).await?;
            Ok(row.map(|r| r.try_get::<_, i64>(0)).transpose()?)
        })?;
        row.map_or(Ok(0), epoch_from_sql)
    }
}

fn ttl_to_sql(ttl: Duration) -> Result<i64, StoreError> {
    if ttl > PostgresConfig::LEADER_TTL_MAX {
        return Err(StoreError::Io(format!(
            "leader TTL {ttl:?} is above the most the PostgreSQL store takes, {:?}",
            PostgresConfig::LEADER_TTL_MAX
        )));
    }
    // At most a day of microseconds: far inside i64.
    Ok(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX))
}

/// An epoch as the `bigint` column holds it. No epoch above `i64::MAX` is
/// ever handed out (the column cannot hold one).
fn epoch_to_sql(epoch: Epoch) -> Result<i64, StoreError> {
    i64::try_from(epoch).map_err(|_| StoreError::Io(format!("epoch {epoch} was never handed out by this store")))
}

fn epoch_from_sql(epoch: i64) -> Result<Epoch, StoreError> {
    Epoch::try_from(epoch).map_err(|_| StoreError::Io(format!("the shard row holds a negative epoch, {epoch}")))
}
