//! The PostgreSQL conformance target: the fence inside a transaction at a
//! chosen isolation level (`leasefence_admit` sent unnamed, through
//! [`PreparedAdmit`], or folded into the effect's statement by
//! [`FencedStatement`]), effect tables with a random suffix.

use deadpool_postgres::{Manager, Pool};
use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use tokio_postgres::IsolationLevel;

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome, PausePoint};
use crate::postgres::{FencedStatement, PreparedAdmit, Schema};
use crate::reject::{token_from_i64, token_to_i64};

/// Connections in the target's pool. Half the racers run a transaction at
/// once while the rest queue: real contention, while two racing tests (and
/// other test binaries) stay well inside PostgreSQL's default 100 connections.
const POOL_SIZE: usize = crate::conformance::RACERS / 2;

/// How a unit admits its fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AdmitPath {
    Unnamed,
    Prepared,
    Folded,
}

/// [`AdmitPath`] with what it prepared on the unit's connection.
enum Admission {
    Unnamed,
    Prepared(PreparedAdmit),
    Folded(FencedStatement),
}

pub struct PostgresTarget {
    pool: Pool,
    isolation: IsolationLevel,
    path: AdmitPath,
    namespace: String,
    /// Where the arbiter is installed.
    schema: Schema,
    kv: String,
    history: String,
}

impl PostgresTarget {
    /// Connects to `url` (the schema must be installed) and creates the effect
    /// tables. `isolation` applies to every unit the target runs.
    pub async fn connect(url: &str, isolation: IsolationLevel) -> Result<PostgresTarget, ArbiterError> {
        PostgresTarget::connect_in(url, isolation, Schema::PUBLIC).await
    }

    /// [`Self::connect`] to the arbiter installed in `schema`.
    pub async fn connect_in(
        url: &str,
        isolation: IsolationLevel,
        schema: Schema,
    ) -> Result<PostgresTarget, ArbiterError> {
        let config: tokio_postgres::Config = url.parse().map_err(ArbiterError::Postgres)?;
        let manager = Manager::new(config, tokio_postgres::NoTls);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| ArbiterError::Task(format!("cannot build the PostgreSQL pool: {e}")))?;
        let suffix = crate::rng::hex_suffix();
        let target = PostgresTarget {
            pool,
            isolation,
            path: AdmitPath::Unnamed,
            namespace: super::fresh_namespace(),
            schema,
            kv: format!("leasefence_check_kv_{suffix}"),
            history: format!("leasefence_check_history_{suffix}"),
        };
        let client = target.pool.get().await?;
        if target.schema.installed_version(&**client).await?.is_none() {
            return Err(ArbiterError::NotInstalled { backend: "postgres" });
        }
        let ddl = format!(
            "CREATE TABLE {kv} (resource text NOT NULL, key text NOT NULL, value text NOT NULL, PRIMARY KEY (resource, key));
             CREATE TABLE {h} (resource text PRIMARY KEY, tokens bigint[] NOT NULL);",
            kv = target.kv,
            h = target.history
        );
        client.batch_execute(&ddl).await?;
        Ok(target)
    }

    /// Admits through a [`PreparedAdmit`] made from the pool's statement cache
    /// instead of the unnamed statement of [`admit`].
    pub fn with_prepared_admit(mut self) -> PostgresTarget {
        self.path = AdmitPath::Prepared;
        self
    }

    /// Folds the fence into the unit's effect statement with a
    /// [`FencedStatement`] (from the pool's statement cache). A paused unit
    /// then holds its token before it starts: its one statement takes the
    /// fence row and the effect row together.
    pub fn with_folded_fence(mut self) -> PostgresTarget {
        self.path = AdmitPath::Folded;
        self
    }

    async fn write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
        mut pause: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>>,
    ) -> Result<(), ArbiterError> {
        // The pause falls where `pause_point` says: here, before the unit,
        // or below, inside the transaction after the effect.
        if self.pause_point() == PausePoint::HoldingToken
            && let Some(pause) = pause.take()
        {
            pause.await;
        }
        let mut client = self.pool.get().await?;
        let kv = format!(
            "INSERT INTO {} (resource, key, value) VALUES ($1, $2, $3)
             ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value",
            self.kv
        );
        let admission = match self.path {
            AdmitPath::Unnamed => Admission::Unnamed,
            AdmitPath::Prepared => Admission::Prepared(self.schema.prepare_admit_cached(&client).await?),
            AdmitPath::Folded => Admission::Folded(self.schema.fenced_statement_cached(&client, &kv).await?),
        };
        let tx = client
            .build_transaction()
            .isolation_level(self.isolation)
            .start()
            .await?;
        let r = fence.resource.as_str();
        if let Admission::Folded(statement) = &admission {
            statement.execute(&*tx, fence, mode, &[&r, &key, &value]).await?;
        } else {
            // The effect goes first, so a pause inside the transaction holds
            // an effect that the later admit must roll back.
            tx.execute(&kv, &[&r, &key, &value]).await?;
            if let Some(pause) = pause {
                pause.await;
            }
            if let Admission::Prepared(p) = &admission {
                p.admit(&tx, fence, mode).await?;
            } else {
                self.schema.admit(&tx, fence, mode).await?;
            }
        }
        let token = token_to_i64("postgres", fence.token)?;
        let h = format!(
            "INSERT INTO {h} AS h (resource, tokens) VALUES ($1, ARRAY[$2::bigint])
             ON CONFLICT (resource) DO UPDATE SET tokens = h.tokens || excluded.tokens",
            h = self.history
        );
        tx.execute(&h, &[&r, &token]).await?;
        match outcome {
            Outcome::Commit => tx.commit().await?,
            Outcome::Abort => tx.rollback().await?,
        }
        Ok(())
    }
}

impl ConformanceTarget for PostgresTarget {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn token_max(&self) -> Token {
        Token::new(i64::MAX as u64).unwrap_or(Token::FIRST)
    }

    fn pause_point(&self) -> PausePoint {
        match self.path {
            AdmitPath::Folded => PausePoint::HoldingToken,
            AdmitPath::Unnamed | AdmitPath::Prepared => PausePoint::InsideTransaction,
        }
    }

    async fn admit_and_write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> Result<(), ArbiterError> {
        self.write(fence, mode, key, value, outcome, None).await
    }

    async fn admit_and_write_paused<P>(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        pause: P,
    ) -> Result<(), ArbiterError>
    where
        P: std::future::Future<Output = ()> + Send,
    {
        self.write(fence, mode, key, value, Outcome::Commit, Some(Box::pin(pause)))
            .await
    }

    async fn read(&self, resource: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        let client = self.pool.get().await?;
        let q = format!("SELECT value FROM {} WHERE resource = $1 AND key = $2", self.kv);
        let row = client.query_opt(&q, &[&resource.as_str(), &key]).await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        let client = self.pool.get().await?;
        self.schema.last_token(&**client, resource).await
    }

    async fn history(&self, resource: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        let client = self.pool.get().await?;
        let q = format!("SELECT tokens FROM {} WHERE resource = $1", self.history);
        let row = client.query_opt(&q, &[&resource.as_str()]).await?;
        let tokens: Vec<i64> = row.map(|r| r.try_get(0)).transpose()?.unwrap_or_default();
        tokens.into_iter().map(|v| token_from_i64("postgres", v)).collect()
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        let client = self.pool.get().await?;
        let forget = format!(
            "DELETE FROM {} WHERE starts_with(resource, $1)",
            self.schema.qualify("leasefence_fences")
        );
        // The signature trigger, if any, does not fire on DELETE.
        client.execute(&forget, &[&self.namespace]).await?;
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}, {}", self.kv, self.history))
            .await?;
        Ok(())
    }
}
