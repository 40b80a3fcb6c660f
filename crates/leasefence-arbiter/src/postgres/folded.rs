//! The fence folded into the caller's own statement: one statement that checks
//! and records the token and makes the effect, instead of an admit statement
//! next to the effect's.
//!
//! [`fold_fence`] prefixes the caller's SQL with a data-modifying CTE,
//!
//! ```sql
//! WITH leasefence_fence AS (
//!     INSERT INTO "public".leasefence_fences AS f (resource, last_token, mode, updated_at)
//!     VALUES ($n+1::text, $n+2::bigint, $n+3::text, now())
//!     ON CONFLICT (resource) DO UPDATE SET last_token = CASE
//!         WHEN <the rule admits> THEN excluded.last_token
//!         ELSE "public".leasefence_stale(f.resource, excluded.last_token, f.last_token) END, …)
//! <the caller's statement>
//! ```
//!
//! (with the install [`Schema`] named, whatever the caller's search_path).
//! PostgreSQL runs a data-modifying CTE exactly once and to completion whether
//! or not the statement reads it, so the caller's statement need not mention
//! it. A stale token makes `leasefence_stale` raise `LF001`, which fails the
//! whole statement: its effect and the fence commit together or not at all.
//! The `ON CONFLICT` locks the newest version of the fence row before the
//! `CASE` looks at it, so racers are ordered as with `leasefence_admit` under
//! READ COMMITTED; under REPEATABLE READ and SERIALIZABLE a concurrent update
//! is SQLSTATE 40001, to retry.
//!
//! Why bother: a one-statement transaction pays for a second statement (its
//! round trip, its executor start and end) more than for the fence row
//! itself; folded, the fence costs what the row costs (see the crate README's
//! "What fencing costs").

use leasefence_core::{Fence, FenceMode, Invalid};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, Statement};

use super::{BACKEND, Schema};
use crate::ArbiterError;
use crate::reject::token_to_i64;

/// The CTE's name: a statement that already has a CTE of this name cannot be
/// fenced this way.
pub const FENCE_CTE: &str = "leasefence_fence";

/// The caller's `sql` (with `user_params` parameters, `$1..$n`) with the fence
/// folded in as a leading CTE taking resource, token and mode as parameters
/// `$n+1..$n+3`. A statement that starts with `WITH` (or `WITH RECURSIVE`)
/// gets the fence as its first CTE. Only statements PostgreSQL lets carry a
/// `WITH` can be fenced: `SELECT`, `INSERT`, `UPDATE`, `DELETE`, `VALUES`
/// (PostgreSQL 15 and older refuse `WITH` before `MERGE`). The fence is the
/// one in `public`; [`Schema::fold_fence`] folds another schema's.
///
/// The fence carries no signature: once fence keys are installed, use
/// [`fold_fence_signed`].
pub fn fold_fence(sql: &str, user_params: usize) -> Result<String, Invalid> {
    Schema::PUBLIC.fold_fence(sql, user_params)
}

/// [`fold_fence`] with a fourth fence parameter, `$n+4`: the fence's
/// signature (`text`, NULL for none). [`FencedStatement`] folds this one.
pub fn fold_fence_signed(sql: &str, user_params: usize) -> Result<String, Invalid> {
    Schema::PUBLIC.fold_fence_signed(sql, user_params)
}

impl Schema {
    /// [`fold_fence`] with this schema's fence.
    pub fn fold_fence(&self, sql: &str, user_params: usize) -> Result<String, Invalid> {
        fold(self, sql, user_params, false)
    }

    /// [`fold_fence_signed`] with this schema's fence.
    pub fn fold_fence_signed(&self, sql: &str, user_params: usize) -> Result<String, Invalid> {
        fold(self, sql, user_params, true)
    }

    /// [`FencedStatement::prepare`] with this schema's fence.
    pub async fn fenced_statement(
        &self,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<FencedStatement, ArbiterError> {
        let user = client.prepare(sql).await?;
        let folded = self.fold_fence_signed(sql, user.params().len())?;
        let statement = client.prepare(&folded).await.map_err(|e| self.cannot_fold(sql, e))?;
        Ok(FencedStatement {
            statement,
            schema: self.clone(),
        })
    }

    /// [`FencedStatement::prepare_cached`] with this schema's fence.
    pub async fn fenced_statement_cached(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        sql: &str,
    ) -> Result<FencedStatement, ArbiterError> {
        let user = client.prepare_cached(sql).await?;
        let folded = self.fold_fence_signed(sql, user.params().len())?;
        let statement = client
            .prepare_cached(&folded)
            .await
            .map_err(|e| self.cannot_fold(sql, e))?;
        Ok(FencedStatement {
            statement,
            schema: self.clone(),
        })
    }

    /// The caller's statement prepared alone but not with the fence: say why.
    fn cannot_fold(&self, sql: &str, e: tokio_postgres::Error) -> ArbiterError {
        let code = e.as_db_error().map(|d| d.code().code());
        match code {
            Some("42601") => Invalid::new(
                "sql",
                format!(
                    "this statement cannot carry the fence (PostgreSQL allows a WITH clause only before \
                     SELECT, INSERT, UPDATE, DELETE and VALUES); use postgres::admit in its transaction instead: {}",
                    sql.trim()
                ),
            )
            .into(),
            _ => self.classify(e),
        }
    }
}

fn fold(schema: &Schema, sql: &str, user_params: usize, signed: bool) -> Result<String, Invalid> {
    let start = skip_space_and_comments(sql)?;
    if sql[start..]
        .trim_matches(|c: char| c == ';' || c.is_whitespace())
        .is_empty()
    {
        return Err(Invalid::new("sql", "the statement to fence is empty"));
    }
    let (r, t, m) = (user_params + 1, user_params + 2, user_params + 3);
    // The signature goes to the trigger that checks it, on the insert and on
    // the update alike; `excluded.signature` would not do: the trigger clears
    // it on the insert attempt.
    let (sig_column, sig_value, sig_update) = if signed {
        let s = user_params + 4;
        (
            ", signature",
            format!(", ${s}::text"),
            format!(", signature = ${s}::text"),
        )
    } else {
        ("", String::new(), String::new())
    };
    let cte = format!(
        "{FENCE_CTE} AS (INSERT INTO {fences} AS f (resource, last_token, mode, updated_at{sig_column}) \
         VALUES (${r}::text, ${t}::bigint, ${m}::text, now(){sig_value}) ON CONFLICT (resource) DO UPDATE SET \
         last_token = CASE WHEN f.last_token < excluded.last_token \
         OR (excluded.mode = 'monotonic' AND f.last_token = excluded.last_token) THEN excluded.last_token \
         ELSE {stale}(f.resource, excluded.last_token, f.last_token) END, \
         mode = excluded.mode, updated_at = excluded.updated_at{sig_update})",
        fences = schema.qualify("leasefence_fences"),
        stale = schema.qualify("leasefence_stale"),
    );
    let Some(after_with) = keyword_at(sql, start, "with") else {
        return Ok(format!("WITH {cte} {sql}"));
    };
    let next = skip_space_and_comments_from(sql, after_with)?;
    let at = keyword_at(sql, next, "recursive").unwrap_or(after_with);
    Ok(format!("{} {cte},{}", &sql[..at], &sql[at..]))
}

/// Where the SQL's first token starts.
fn skip_space_and_comments(sql: &str) -> Result<usize, Invalid> {
    skip_space_and_comments_from(sql, 0)
}

/// Skips whitespace, `-- line` comments and (nested) `/* block */` comments
/// from byte `i`.
fn skip_space_and_comments_from(sql: &str, mut i: usize) -> Result<usize, Invalid> {
    let b = sql.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b[i..].starts_with(b"--") {
            i = match b[i..].iter().position(|&c| c == b'\n') {
                Some(n) => i + n + 1,
                None => b.len(),
            };
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0usize;
            loop {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else if i >= b.len() {
                    return Err(Invalid::new("sql", "the statement has an unterminated /* comment"));
                } else {
                    i += 1;
                }
            }
        } else {
            return Ok(i);
        }
    }
}

/// The byte after `keyword` if the SQL has that keyword (any case) at `i`.
fn keyword_at(sql: &str, i: usize, keyword: &str) -> Option<usize> {
    let end = i + keyword.len();
    let word = sql.get(i..end)?;
    let boundary = sql[end..]
        .chars()
        .next()
        .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '$'));
    (word.eq_ignore_ascii_case(keyword) && boundary).then_some(end)
}

/// A statement of the caller's with the fence folded in, prepared on one
/// connection: each [`execute`](Self::execute) or [`query`](Self::query)
/// admits the fence and makes the effect in one statement. Run it in a
/// transaction of the caller's, or on its own (a statement is atomic by
/// itself).
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client, fence: leasefence_arbiter::Fence)
/// # -> Result<(), leasefence_arbiter::ArbiterError> {
/// use leasefence_arbiter::{FenceMode, postgres::FencedStatement};
///
/// let pay = FencedStatement::prepare(client, "UPDATE accounts SET balance = $2 WHERE id = $1").await?;
/// pay.execute(client, &fence, FenceMode::Strict, &[&7_i64, &0_i64]).await?;
/// # Ok(())
/// # }
/// ```
///
/// The fence row is written when the statement's own rows are (a data-modifying
/// CTE runs alongside the main statement), not before them as with
/// [`admit`](super::admit) first. Two writers of one resource that take its
/// rows in opposite orders can deadlock; PostgreSQL then aborts one of them
/// with SQLSTATE 40P01, which is safe and retryable.
#[derive(Clone, Debug)]
pub struct FencedStatement {
    /// The caller's parameters, then the fence's four.
    statement: Statement,
    /// Whose fence, for its errors.
    schema: Schema,
}

impl FencedStatement {
    /// Prepares `sql` (whose parameters are `$1..$n`) with the fence of
    /// `public` folded in ([`Schema::fenced_statement`] for another schema's).
    /// Two round trips: the caller's statement alone, to learn `n` and to
    /// report its own errors as they are, then the folded one.
    pub async fn prepare(client: &impl GenericClient, sql: &str) -> Result<FencedStatement, ArbiterError> {
        Schema::PUBLIC.fenced_statement(client, sql).await
    }

    /// The same from a deadpool object's statement cache: cheap to call
    /// before every use.
    pub async fn prepare_cached(
        client: &deadpool_postgres::ClientWrapper,
        sql: &str,
    ) -> Result<FencedStatement, ArbiterError> {
        Schema::PUBLIC.fenced_statement_cached(client, sql).await
    }

    /// The prepared statement, fence included (its last four parameters:
    /// resource, token, mode, signature).
    pub fn statement(&self) -> &Statement {
        &self.statement
    }

    /// Admits `fence` and runs the statement with `params` (the caller's
    /// `$1..$n`); the number of rows it changed. A stale token is
    /// [`ArbiterError::Stale`] (counted and logged), and nothing of the
    /// statement happens; inside a transaction, the transaction is aborted.
    pub async fn execute(
        &self,
        client: &impl GenericClient,
        fence: &Fence,
        mode: FenceMode,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, ArbiterError> {
        let (resource, token, mode) = self.fence_params(fence, mode, params)?;
        let signature = fence.signature.as_deref();
        let all = with_fence_params(params, &resource, &token, &mode, &signature);
        let observed = |e| self.schema.classify_observed(e);
        client.execute(&self.statement, &all).await.map_err(observed)
    }

    /// [`execute`](Self::execute) for a statement that returns rows (a
    /// `SELECT`, or `RETURNING`).
    pub async fn query(
        &self,
        client: &impl GenericClient,
        fence: &Fence,
        mode: FenceMode,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, ArbiterError> {
        let (resource, token, mode) = self.fence_params(fence, mode, params)?;
        let signature = fence.signature.as_deref();
        let all = with_fence_params(params, &resource, &token, &mode, &signature);
        let observed = |e| self.schema.classify_observed(e);
        client.query(&self.statement, &all).await.map_err(observed)
    }

    fn fence_params<'f>(
        &self,
        fence: &'f Fence,
        mode: FenceMode,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(&'f str, i64, &'static str), ArbiterError> {
        let takes = self.statement.params().len().saturating_sub(4);
        if params.len() != takes {
            let given = params.len();
            let message = format!("the statement takes {takes} parameters, {given} were given");
            return Err(Invalid::new("params", message).into());
        }
        Ok((
            fence.resource.as_str(),
            token_to_i64(BACKEND, fence.token)?,
            mode.as_str(),
        ))
    }
}

fn with_fence_params<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    resource: &'a &str,
    token: &'a i64,
    mode: &'a &'static str,
    signature: &'a Option<&str>,
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut all = Vec::with_capacity(params.len() + 4);
    all.extend_from_slice(params);
    all.extend([resource as &(dyn ToSql + Sync), token, mode, signature]);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cte_pos(folded: &str) -> usize {
        folded.find(FENCE_CTE).expect("the fence CTE is there")
    }

    #[test]
    fn plain_statement_gets_a_leading_with() {
        let f = fold_fence("UPDATE t SET v = $2 WHERE k = $1", 2).expect("folds");
        assert!(
            f.starts_with("WITH leasefence_fence AS (INSERT INTO \"public\".leasefence_fences"),
            "{f}"
        );
        assert!(f.ends_with(") UPDATE t SET v = $2 WHERE k = $1"), "{f}");
        assert!(f.contains("VALUES ($3::text, $4::bigint, $5::text, now())"), "{f}");
        assert!(
            f.contains("\"public\".leasefence_stale(f.resource, excluded.last_token, f.last_token)"),
            "{f}"
        );
    }

    #[test]
    fn the_signed_fold_passes_the_signature_to_insert_and_update() {
        let f = fold_fence_signed("UPDATE t SET v = $2 WHERE k = $1", 2).expect("folds");
        assert!(f.contains("(resource, last_token, mode, updated_at, signature)"), "{f}");
        assert!(
            f.contains("VALUES ($3::text, $4::bigint, $5::text, now(), $6::text)"),
            "{f}"
        );
        assert!(
            f.contains("updated_at = excluded.updated_at, signature = $6::text)"),
            "{f}"
        );
        assert!(!fold_fence("SELECT 1", 0).expect("folds").contains("signature"));
    }

    #[test]
    fn statement_with_its_own_ctes_gets_the_fence_first() {
        let f = fold_fence("  with a AS (SELECT 1) DELETE FROM t", 0).expect("folds");
        assert!(f.starts_with("  with leasefence_fence AS (INSERT"), "{f}");
        assert!(f.contains("$1::text, $2::bigint, $3::text"), "{f}");
        assert!(
            f.ends_with("updated_at = excluded.updated_at), a AS (SELECT 1) DELETE FROM t"),
            "{f}"
        );

        let f = fold_fence("WITH RECURSIVE r(n) AS (SELECT 1) SELECT * FROM r", 0).expect("folds");
        assert!(f.starts_with("WITH RECURSIVE leasefence_fence AS ("), "{f}");
        assert!(f.ends_with("), r(n) AS (SELECT 1) SELECT * FROM r"), "{f}");
    }

    #[test]
    fn leading_comments_are_skipped_and_kept() {
        let sql = "-- pay\n/* outer /* nested */ still */ WITH a AS (SELECT 1) SELECT 2";
        let f = fold_fence(sql, 0).expect("folds");
        assert_eq!(cte_pos(&f), sql.find(" a AS").expect("cte") + 1, "{f}");
        assert!(
            f.starts_with("-- pay\n/* outer /* nested */ still */ WITH leasefence_fence"),
            "{f}"
        );
    }

    #[test]
    fn words_that_only_start_with_with_are_not_with() {
        let f = fold_fence("withdrawals_view", 0).expect("folds");
        assert!(f.starts_with("WITH leasefence_fence"), "{f}");
        assert!(f.ends_with(") withdrawals_view"), "{f}");
        let f = fold_fence("WITH recursive_cte AS (SELECT 1) SELECT 1", 0).expect("folds");
        assert!(f.starts_with("WITH leasefence_fence"), "{f}");
        assert!(f.ends_with(", recursive_cte AS (SELECT 1) SELECT 1"), "{f}");
    }

    #[test]
    fn empty_or_unterminated_input_is_invalid() {
        for sql in ["", "   ", " ; ", "-- only a comment", "/* open"] {
            let e = fold_fence(sql, 0).expect_err(sql);
            assert_eq!(e.field(), "sql", "{sql:?}: {e}");
        }
    }
}
