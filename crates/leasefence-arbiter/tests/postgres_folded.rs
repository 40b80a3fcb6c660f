//! The fence folded into the caller's statement (`postgres::FencedStatement`)
//! against the real server in `LEASEFENCE_TEST_POSTGRES_URL`: the conformance
//! suite and the pause kit, a paused transaction, and the statement shapes.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{POSTGRES_URL, fence, service_url, unique_resource};
use leasefence_arbiter::postgres::{self, FencedStatement};
use leasefence_arbiter::targets::PostgresTarget;
use leasefence_arbiter::{ArbiterError, FenceMode};
use tokio_postgres::IsolationLevel;

async fn client() -> Option<tokio_postgres::Client> {
    let url = service_url(POSTGRES_URL)?;
    let mut c = postgres::connect(&url).await.expect("connect");
    postgres::install(&mut c).await.expect("install");
    c.batch_execute("CREATE TEMP TABLE effects (v text NOT NULL)")
        .await
        .expect("temp table");
    Some(c)
}

async fn target(isolation: IsolationLevel) -> Option<(Arc<PostgresTarget>, ())> {
    let url = service_url(POSTGRES_URL)?;
    postgres::install_url(&url).await.expect("install");
    let target = PostgresTarget::connect(&url, isolation).await.expect("target");
    Some((Arc::new(target.with_folded_fence()), ()))
}

mod read_committed {
    use super::*;
    conformance_tests!(target(IsolationLevel::ReadCommitted));
    pause_kit_test!(pause_kit, target(IsolationLevel::ReadCommitted), 25);
}

mod serializable {
    use super::*;
    conformance_tests!(target(IsolationLevel::Serializable));
}

async fn effects(c: &tokio_postgres::Client) -> Vec<String> {
    let rows = c.query("SELECT v FROM effects ORDER BY v", &[]).await.expect("read");
    rows.iter().map(|r| r.get(0)).collect()
}

/// On its own (no transaction of the caller's) one statement is atomic:
/// tokens 5, 4, 5, 6 strict, then 6 monotonic; only the admitted ones insert.
#[tokio::test]
async fn folded_statement_admits_and_writes_in_one_statement() {
    let Some(c) = client().await else { return };
    let r = unique_resource("folded");
    let insert = FencedStatement::prepare(&c, "INSERT INTO effects (v) VALUES ($1)")
        .await
        .expect("prepare");
    let steps = [
        (5u64, FenceMode::Strict, "5", Some(1)),
        (4, FenceMode::Strict, "4", None),
        (5, FenceMode::Strict, "5 again", None),
        (6, FenceMode::Strict, "6", Some(1)),
        (6, FenceMode::Monotonic, "6 again", Some(1)),
    ];
    for (token, mode, value, expect) in steps {
        let res = insert.execute(&c, &fence(&r, token), mode, &[&value]).await;
        match (res, expect) {
            (Ok(n), Some(rows)) => assert_eq!(n, rows, "{value}"),
            (Err(ArbiterError::Stale(s)), None) => {
                assert_eq!((s.resource.as_str(), s.presented.get()), (r.as_str(), token));
                assert!(s.current.get() >= token, "{s}");
            }
            (res, _) => panic!("{value}: unexpected {res:?}"),
        }
    }
    assert_eq!(effects(&c).await, ["5", "6", "6 again"]);
    assert_eq!(
        postgres::last_token(&c, &r).await.expect("last").map(|t| t.get()),
        Some(6)
    );
}

/// A holds token 1 and has already written in its open transaction; it
/// pauses; B is granted 2 and commits through the folded fence; A resumes and
/// runs its folded statement with 1. It is rejected and its whole transaction,
/// the earlier write included, leaves nothing.
#[tokio::test]
async fn paused_transaction_is_rejected_as_a_whole() {
    let Some(mut a) = client().await else { return };
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let b = postgres::connect(&url).await.expect("connect");
    let r = unique_resource("folded-pause");
    b.batch_execute("CREATE TEMP TABLE effects (v text NOT NULL)")
        .await
        .expect("temp table");
    // One shared table, so B's commit and A's rollback are both visible.
    let table = format!("lf_folded_{:016x}", getrandom::u64().expect("os randomness"));
    a.batch_execute(&format!("CREATE TABLE {table} (v text NOT NULL)"))
        .await
        .expect("table");
    let sql = format!("INSERT INTO {table} (v) VALUES ($1)");
    let a_insert = FencedStatement::prepare(&a, &sql).await.expect("prepare");
    let b_insert = FencedStatement::prepare(&b, &sql).await.expect("prepare");

    let tx = a.transaction().await.expect("begin");
    tx.execute(&format!("INSERT INTO {table} (v) VALUES ('A before its fence')"), &[])
        .await
        .expect("A's first write");
    // A is paused here; B acts.
    b_insert
        .execute(&b, &fence(&r, 2), FenceMode::Strict, &[&"B"])
        .await
        .expect("B admitted");
    let res = a_insert.execute(&tx, &fence(&r, 1), FenceMode::Strict, &[&"A"]).await;
    match res {
        Err(ArbiterError::Stale(s)) => assert_eq!((s.presented.get(), s.current.get()), (1, 2)),
        other => panic!("expected A to be stale, got {other:?}"),
    }
    // A COMMIT now ends the failed transaction as a rollback (PostgreSQL
    // answers it with ROLLBACK), as a caller's `?`-less code might send it.
    tx.commit().await.expect("COMMIT of a failed transaction rolls it back");
    let rows: Vec<String> = a
        .query(&format!("SELECT v FROM {table} ORDER BY v"), &[])
        .await
        .expect("read")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["B"], "nothing of A's transaction committed");
    a.batch_execute(&format!("DROP TABLE {table}")).await.expect("drop");
}

/// A statement with CTEs of its own and `RETURNING` rows through `query`;
/// one that cannot take a `WITH` is refused with an error that says so; a
/// wrong parameter count or a token above i64::MAX is refused before anything
/// is sent.
#[tokio::test]
async fn statement_shapes_and_input_errors() {
    let Some(c) = client().await else { return };
    let r = unique_resource("folded-shapes");
    let sql = "WITH input AS (SELECT $1::text AS v) INSERT INTO effects (v) SELECT v FROM input RETURNING v";
    let insert = FencedStatement::prepare(&c, sql).await.expect("prepare");
    let rows = insert
        .query(&c, &fence(&r, 1), FenceMode::Strict, &[&"from a CTE"])
        .await
        .expect("admitted");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "from a CTE");

    let err = FencedStatement::prepare(&c, "CREATE TEMP TABLE lf_not_fenceable (a int)")
        .await
        .expect_err("DDL cannot carry a WITH");
    match &err {
        ArbiterError::Invalid(i) => assert!(i.message().contains("WITH clause"), "{err}"),
        other => panic!("expected Invalid, got {other:?}"),
    }

    let res = insert.execute(&c, &fence(&r, 2), FenceMode::Strict, &[]).await;
    assert!(
        matches!(&res, Err(ArbiterError::Invalid(i)) if i.field() == "params"),
        "{res:?}"
    );
    let big = fence(&r, i64::MAX as u64 + 1);
    let res = insert.execute(&c, &big, FenceMode::Strict, &[&"big"]).await;
    assert!(matches!(res, Err(ArbiterError::Invalid(_))), "{res:?}");
    assert_eq!(effects(&c).await, ["from a CTE"]);
    assert_eq!(
        postgres::last_token(&c, &r).await.expect("last").map(|t| t.get()),
        Some(1)
    );
}
