//! The schema the arbiter is installed in. Every statement the Rust helpers
//! send names it (`"public".leasefence_fences`, `"public".leasefence_admit(…)`),
//! so a caller's `search_path` cannot lead them to objects of the same name in
//! another schema: a `leasefence_stale` that returns instead of raising, or a
//! `leasefence_fences` table that is not the fence.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;

use leasefence_core::signing::FenceKey;
use leasefence_core::{Fence, FenceMode, Invalid, ResourceId, Token};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{ADMIT_TYPES, BACKEND, EffectFuture, PreparedAdmit, SCHEMA_SQL, pipelined};
use crate::ArbiterError;
use crate::reject::{observe, token_from_i64, token_to_i64};

/// PostgreSQL's limit on an identifier (`NAMEDATALEN - 1`).
const NAME_LEN_MAX: usize = 63;

/// The name of the schema the arbiter objects live in. The free functions of
/// [`crate::postgres`] (and [`PreparedAdmit::prepare`],
/// [`FencedStatement::prepare`](super::FencedStatement::prepare)) use
/// [`Schema::PUBLIC`]; for an install elsewhere, make one with
/// [`Schema::new`] and call its methods of the same names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    name: Cow<'static, str>,
    /// `name` as a quoted identifier, ready to put in SQL.
    quoted: Cow<'static, str>,
}

impl Schema {
    /// `public`, where PostgreSQL puts objects by default.
    pub const PUBLIC: Schema = Schema {
        name: Cow::Borrowed("public"),
        quoted: Cow::Borrowed("\"public\""),
    };

    /// The schema called `name`, exactly (case included: it is quoted, as
    /// `quote_ident` would). 1..=63 bytes, no NUL.
    pub fn new(name: &str) -> Result<Schema, Invalid> {
        if name.is_empty() || name.len() > NAME_LEN_MAX || name.contains('\0') {
            let message = format!("a PostgreSQL schema name is 1..={NAME_LEN_MAX} bytes without NUL, got {name:?}");
            return Err(Invalid::new("schema", message));
        }
        Ok(Schema {
            name: Cow::Owned(name.to_owned()),
            quoted: Cow::Owned(format!("\"{}\"", name.replace('"', "\"\""))),
        })
    }

    /// The schema's name, unquoted.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `object` of this schema, qualified and ready for SQL.
    pub(crate) fn qualify(&self, object: &str) -> String {
        format!("{}.{object}", self.quoted)
    }

    /// The quoted name, for the installer's `SET LOCAL search_path`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// An error of a statement of ours that names this schema: a schema that
    /// does not exist means nothing is installed there.
    pub(crate) fn classify(&self, e: tokio_postgres::Error) -> ArbiterError {
        // PostgreSQL quotes the name: `schema "app" does not exist`.
        let quoted = format!("\"{}\"", self.name());
        let missing = e
            .as_db_error()
            .is_some_and(|db| db.code().code() == "3F000" && db.message().contains(&quoted));
        if missing {
            return ArbiterError::NotInstalled { backend: BACKEND };
        }
        super::classify(e)
    }

    /// [`install`] into this schema, which must exist. The script runs with
    /// the search_path set to this schema for the transaction (the script
    /// creates its objects in `current_schema()`).
    pub async fn install(&self, client: &mut Client) -> Result<(), ArbiterError> {
        let tx = client.transaction().await?;
        let exists: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
                &[&self.name()],
            )
            .await?
            .try_get(0)?;
        if !exists {
            let message = format!(
                "schema {:?} does not exist in this database: create it first (CREATE SCHEMA), or install into another",
                self.name()
            );
            return Err(Invalid::new("schema", message).into());
        }
        // pg_temp last: a temporary table of the installer's cannot stand in
        // for one of ours while the script runs.
        let set = format!("SET LOCAL search_path = {}, pg_temp", self.quoted());
        tx.batch_execute(&set).await?;
        tx.batch_execute(SCHEMA_SQL).await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`installed_version`] of this schema.
    pub async fn installed_version(&self, client: &impl GenericClient) -> Result<Option<i32>, ArbiterError> {
        let exists: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = 'leasefence_schema_version')",
                &[&self.name()],
            )
            .await?
            .try_get(0)?;
        if !exists {
            return Ok(None);
        }
        let sql = format!(
            "SELECT version FROM {} WHERE component = 'arbiter'",
            self.qualify("leasefence_schema_version")
        );
        let row = client.query_opt(&sql, &[]).await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// The statement [`admit`] sends and [`PreparedAdmit`] prepares.
    pub fn admit_sql(&self) -> String {
        format!("SELECT {}($1, $2, $3, $4)", self.qualify("leasefence_admit"))
    }

    /// The common case of `leasefence_admit` as one plain statement: raise
    /// the token of an existing fence row. It must match the rule in
    /// `sql/postgres_schema.sql` (the conformance suite runs both paths).
    fn fast_admit_sql(&self) -> String {
        format!(
            "UPDATE {} SET last_token = $2, mode = $3, updated_at = now(), signature = $4 \
             WHERE resource = $1 AND (last_token < $2 OR ($3 = 'monotonic' AND last_token = $2))",
            self.qualify("leasefence_fences")
        )
    }

    /// [`admit`] in this schema.
    pub async fn admit(&self, tx: &Transaction<'_>, fence: &Fence, mode: FenceMode) -> Result<(), ArbiterError> {
        let token = token_to_i64(BACKEND, fence.token)?;
        let (resource, mode) = (fence.resource.as_str(), mode.as_str());
        let signature = fence.signature.as_deref();
        // Typed parameters: parse, bind and execute go out in one round trip,
        // instead of a prepare round trip before every admit.
        let params = [
            (&resource as &(dyn ToSql + Sync), ADMIT_TYPES[0].clone()),
            (&token, ADMIT_TYPES[1].clone()),
            (&mode, ADMIT_TYPES[2].clone()),
            (&signature, ADMIT_TYPES[3].clone()),
        ];
        let result = tx.execute_typed(&self.admit_sql(), &params).await;
        result.map(|_| ()).map_err(|e| self.classify_observed(e))
    }

    /// [`admit_pipelined`] in this schema.
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

    /// [`PreparedAdmit::prepare`] in this schema.
    pub async fn prepare_admit(&self, client: &impl GenericClient) -> Result<PreparedAdmit, ArbiterError> {
        let (fast, admit) = (self.fast_admit_sql(), self.admit_sql());
        let (update, admit) = tokio::join!(
            client.prepare_typed(&fast, &ADMIT_TYPES),
            client.prepare_typed(&admit, &ADMIT_TYPES)
        );
        Ok(PreparedAdmit {
            update: update.map_err(|e| self.classify(e))?,
            admit: admit.map_err(|e| self.classify(e))?,
            schema: self.clone(),
        })
    }

    /// [`PreparedAdmit::prepare_cached`] in this schema.
    pub async fn prepare_admit_cached(
        &self,
        client: &deadpool_postgres::ClientWrapper,
    ) -> Result<PreparedAdmit, ArbiterError> {
        let (fast, admit) = (self.fast_admit_sql(), self.admit_sql());
        let (update, admit) = tokio::join!(
            client.prepare_typed_cached(&fast, &ADMIT_TYPES),
            client.prepare_typed_cached(&admit, &ADMIT_TYPES)
        );
        Ok(PreparedAdmit {
            update: update.map_err(|e| self.classify(e))?,
            admit: admit.map_err(|e| self.classify(e))?,
            schema: self.clone(),
        })
    }

    /// [`classify`](Self::classify), and a rejection counted and logged.
    pub(crate) fn classify_observed(&self, e: tokio_postgres::Error) -> ArbiterError {
        observe(BACKEND, self.classify(e))
    }

    /// [`add_fence_key`](super::add_fence_key) in this schema.
    pub async fn add_fence_key(&self, client: &impl GenericClient, key: &FenceKey) -> Result<(), ArbiterError> {
        let sql = format!("SELECT {}($1, $2)", self.qualify("leasefence_fence_key_add"));
        let secret: &[u8] = key.secret();
        client
            .execute(&sql, &[&key.id(), &secret])
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    /// [`remove_fence_key`](super::remove_fence_key) in this schema.
    pub async fn remove_fence_key(&self, client: &impl GenericClient, key_id: &str) -> Result<bool, ArbiterError> {
        let sql = format!("SELECT {}($1)", self.qualify("leasefence_fence_key_remove"));
        let row = client.query_one(&sql, &[&key_id]).await.map_err(|e| self.classify(e))?;
        Ok(row.try_get(0)?)
    }

    /// [`fence_key_ids`](super::fence_key_ids) in this schema.
    pub async fn fence_key_ids(&self, client: &impl GenericClient) -> Result<Vec<String>, ArbiterError> {
        let sql = format!(
            "SELECT key_id FROM {} ORDER BY key_id",
            self.qualify("leasefence_fence_keys")
        );
        let rows = client.query(&sql, &[]).await.map_err(|e| self.classify(e))?;
        Ok(rows.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?)
    }

    /// [`last_token`] in this schema.
    pub async fn last_token(
        &self,
        client: &impl GenericClient,
        resource: &ResourceId,
    ) -> Result<Option<Token>, ArbiterError> {
        let sql = format!(
            "SELECT last_token FROM {} WHERE resource = $1",
            self.qualify("leasefence_fences")
        );
        let row = client
            .query_opt(&sql, &[&resource.as_str()])
            .await
            .map_err(|e| self.classify(e))?;
        let last = row.map(|r| r.try_get(0)).transpose()?;
        last.map(|t| token_from_i64(BACKEND, t)).transpose()
    }

    /// [`with_fence`] in this schema.
    pub async fn with_fence<T, E, F>(
        &self,
        client: &mut Client,
        fence: &Fence,
        mode: FenceMode,
        effect: F,
    ) -> Result<T, E>
    where
        E: From<ArbiterError>,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> EffectFuture<'t, T, E>,
    {
        let tx = client.transaction().await.map_err(ArbiterError::from)?;
        self.admit(&tx, fence, mode).await?;
        let out = effect(&tx).await?;
        tx.commit().await.map_err(ArbiterError::from)?;
        Ok(out)
    }
}

impl Default for Schema {
    fn default() -> Schema {
        Schema::PUBLIC
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_bounded() {
        assert_eq!(
            Schema::PUBLIC.qualify("leasefence_fences"),
            "\"public\".leasefence_fences"
        );
        assert_eq!(Schema::default(), Schema::new("public").expect("valid"));
        let odd = Schema::new("My \"App\"").expect("valid");
        assert_eq!(odd.qualify("t"), "\"My \"\"App\"\"\".t");
        assert_eq!(odd.name(), "My \"App\"");
        assert!(Schema::new(&"s".repeat(63)).is_ok());
        for bad in [String::new(), "s".repeat(64), "a\0b".to_owned()] {
            let e = Schema::new(&bad).expect_err(&bad);
            assert_eq!(e.field(), "schema", "{bad:?}: {e}");
        }
    }
}
