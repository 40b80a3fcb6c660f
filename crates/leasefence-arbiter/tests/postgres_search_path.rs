//! The Rust helpers name the schema the arbiter is installed in, so a caller's
//! `search_path` cannot send them to look-alike objects: against the real
//! server in `LEASEFENCE_TEST_POSTGRES_URL`.

mod common;

use common::{POSTGRES_URL, fence, service_url, unique_resource};
use leasefence_arbiter::postgres::{self, FencedStatement, PreparedAdmit};
use leasefence_arbiter::{ArbiterError, FenceMode, ResourceId};

/// `(presented, current)` of a rejection, or what came instead.
fn stale(res: Result<u64, ArbiterError>) -> Result<(u64, u64), String> {
    match res {
        Err(ArbiterError::Stale(s)) => Ok((s.presented.get(), s.current.get())),
        other => Err(format!("{other:?}")),
    }
}

/// A schema of look-alikes that admit anything: `leasefence_admit` that does
/// nothing, `leasefence_stale` that returns instead of raising, and a
/// `leasefence_fences` table where `r` is at token 1.
async fn create_look_alikes(c: &tokio_postgres::Client, schema: &str, r: &ResourceId) {
    c.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.leasefence_fences (
             resource text PRIMARY KEY, last_token bigint NOT NULL, mode text NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now());
         CREATE FUNCTION {schema}.leasefence_stale(p_resource text, p_presented bigint, p_current bigint)
             RETURNS bigint LANGUAGE sql AS 'SELECT p_presented';
         CREATE FUNCTION {schema}.leasefence_admit(p_resource text, p_token bigint, p_mode text DEFAULT 'strict')
             RETURNS void LANGUAGE sql AS 'SELECT';"
    ))
    .await
    .expect("look-alike schema");
    c.execute(
        &format!("INSERT INTO {schema}.leasefence_fences (resource, last_token, mode) VALUES ($1, 1, 'strict')"),
        &[&r.as_str()],
    )
    .await
    .expect("look-alike fence row");
}

/// `r` is at token 5 in the installed schema; a caller whose search_path puts
/// look-alikes first presents the stale token 3 through every helper, and
/// every one rejects it and leaves no effect.
#[tokio::test]
async fn a_shadowing_search_path_does_not_let_a_stale_token_through() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let mut c = postgres::connect(&url).await.expect("connect");
    postgres::install(&mut c).await.expect("install");
    let r = unique_resource("search-path");
    let tx = c.transaction().await.expect("begin");
    postgres::admit(&tx, &fence(&r, 5), FenceMode::Strict)
        .await
        .expect("admit 5");
    tx.commit().await.expect("commit");

    let evil = format!("lf_evil_{:016x}", getrandom::u64().expect("os randomness"));
    create_look_alikes(&c, &evil, &r).await;
    c.batch_execute(&format!(
        "CREATE TEMP TABLE effects (v text NOT NULL); SET search_path = {evil}, public"
    ))
    .await
    .expect("search_path");
    let stale3 = fence(&r, 3);
    let mut outcomes = Vec::new();

    let tx = c.transaction().await.expect("begin");
    let res = postgres::admit(&tx, &stale3, FenceMode::Strict).await;
    outcomes.push(("admit", stale(res.map(|()| 0))));
    drop(tx);

    let prepared = PreparedAdmit::prepare(&c).await.expect("prepare");
    let tx = c.transaction().await.expect("begin");
    let res = prepared.admit(&tx, &stale3, FenceMode::Strict).await;
    outcomes.push(("PreparedAdmit", stale(res.map(|()| 0))));
    drop(tx);

    let insert = "INSERT INTO effects (v) VALUES ($1)";
    let folded = FencedStatement::prepare(&c, insert).await.expect("prepare");
    let res = folded.execute(&c, &stale3, FenceMode::Strict, &[&"folded"]).await;
    outcomes.push(("FencedStatement", stale(res)));

    let last = postgres::last_token(&c, &r).await.map(|t| t.map(|t| t.get()));
    let version = postgres::installed_version(&c).await.ok().flatten();
    let effects: i64 = c
        .query_one("SELECT count(*) FROM effects", &[])
        .await
        .expect("effects")
        .get(0);
    c.batch_execute(&format!("RESET search_path; DROP SCHEMA {evil} CASCADE"))
        .await
        .expect("drop look-alikes");

    let rejected = [
        ("admit", Ok((3, 5))),
        ("PreparedAdmit", Ok((3, 5))),
        ("FencedStatement", Ok((3, 5))),
    ];
    assert_eq!(outcomes, rejected, "under search_path {evil}, public");
    assert_eq!(effects, 0, "no effect of a stale token");
    assert_eq!(last.ok().flatten(), Some(5), "last_token reads the installed fence");
    assert_eq!(version, Some(postgres::SCHEMA_VERSION));
}
