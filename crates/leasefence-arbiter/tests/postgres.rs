//! PostgreSQL arbiter against the real server in `LEASEFENCE_TEST_POSTGRES_URL`.

#[macro_use]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{POSTGRES_URL, fence, own_install, service_url, unique_resource};
use leasefence_arbiter::postgres::{self, SQLSTATE_INVALID, SQLSTATE_STALE, Schema, with_fence};
use leasefence_arbiter::targets::PostgresTarget;
use leasefence_arbiter::{ArbiterError, FenceMode, ResourceId};
use tokio_postgres::IsolationLevel;

async fn client() -> Option<tokio_postgres::Client> {
    let url = service_url(POSTGRES_URL)?;
    let mut c = postgres::connect(&url).await.expect("connect");
    postgres::install(&mut c).await.expect("install");
    Some(c)
}

/// The recorded `last_token` of `r`, as a number.
async fn last(c: &impl tokio_postgres::GenericClient, r: &ResourceId) -> Option<u64> {
    postgres::last_token(c, r).await.expect("last").map(|t| t.get())
}

/// A session-local table of effects, `effects (v text)`.
async fn effects_table(c: &tokio_postgres::Client) {
    c.batch_execute("CREATE TEMP TABLE effects (v text NOT NULL)")
        .await
        .expect("temp table");
}

/// `prepared`: admit through `PreparedAdmit` (its fast path and fallback)
/// instead of the unnamed statement.
async fn target(isolation: IsolationLevel, prepared: bool) -> Option<(Arc<PostgresTarget>, ())> {
    let url = service_url(POSTGRES_URL)?;
    postgres::install_url(&url).await.expect("install");
    let target = PostgresTarget::connect(&url, isolation).await.expect("target");
    let target = if prepared { target.with_prepared_admit() } else { target };
    Some((Arc::new(target), ()))
}

mod read_committed {
    use super::*;
    conformance_tests!(target(IsolationLevel::ReadCommitted, false));
    pause_kit_test!(pause_kit, target(IsolationLevel::ReadCommitted, false), 25);
}

mod read_committed_prepared {
    use super::*;
    conformance_tests!(target(IsolationLevel::ReadCommitted, true));
    pause_kit_test!(pause_kit, target(IsolationLevel::ReadCommitted, true), 25);
}

mod serializable {
    use super::*;
    conformance_tests!(target(IsolationLevel::Serializable, false));
}

mod serializable_prepared {
    use super::*;
    conformance_tests!(target(IsolationLevel::Serializable, true));
}

#[tokio::test]
async fn concurrent_installs_are_idempotent() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let installs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { postgres::install_url(&url).await })
        })
        .collect();
    for i in installs {
        i.await.expect("task").expect("install");
    }
    let c = postgres::connect(&url).await.expect("connect");
    assert_eq!(
        postgres::installed_version(&c).await.expect("version"),
        Some(postgres::SCHEMA_VERSION)
    );
}

#[tokio::test]
async fn raw_sql_stale_raises_lf001_and_aborts_the_whole_transaction() {
    let Some(mut c) = client().await else { return };
    let r = unique_resource("raw-sql");
    effects_table(&c).await;
    let tx = c.transaction().await.expect("begin");
    tx.execute("INSERT INTO effects VALUES ('five')", &[])
        .await
        .expect("effect");
    tx.execute("SELECT leasefence_admit($1, 5)", &[&r.as_str()])
        .await
        .expect("admit 5, default mode");
    tx.commit().await.expect("commit");

    let tx = c.transaction().await.expect("begin");
    tx.execute("INSERT INTO effects VALUES ('late')", &[])
        .await
        .expect("effect");
    let err = tx
        .execute("SELECT leasefence_admit($1, 5, 'strict')", &[&r.as_str()])
        .await
        .expect_err("equal token in strict mode must raise");
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), SQLSTATE_STALE);
    assert_eq!(
        db.detail(),
        Some(format!("presented=5 current=5 resource={r}").as_str())
    );
    assert!(db.message().contains("presented 5, current 5"), "{}", db.message());
    match ArbiterError::from(err) {
        ArbiterError::Stale(s) => assert_eq!((s.resource, s.presented.get(), s.current.get()), (r.clone(), 5, 5)),
        other => panic!("expected Stale, got {other:?}"),
    }
    drop(tx);
    let rows: Vec<String> = c
        .query("SELECT v FROM effects", &[])
        .await
        .expect("read")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["five"], "the rejected transaction's effect must be gone");
    assert_eq!(last(&c, &r).await, Some(5));
}

#[tokio::test]
async fn raw_sql_invalid_arguments_raise_lf002() {
    let Some(c) = client().await else { return };
    let r = unique_resource("raw-invalid");
    for (token, mode) in [(0i64, "strict"), (-1, "strict"), (1, "loose")] {
        let err = c
            .execute("SELECT leasefence_admit($1, $2, $3)", &[&r.as_str(), &token, &mode])
            .await
            .expect_err("invalid argument must raise");
        assert_eq!(
            err.code().map(|c| c.code()),
            Some(SQLSTATE_INVALID),
            "{token} {mode}: {err:?}"
        );
        assert!(matches!(ArbiterError::from(err), ArbiterError::Invalid(_)));
    }
    assert_eq!(last(&c, &r).await, None);
}

#[tokio::test]
async fn with_fence_commits_effect_and_token_together() {
    let Some(mut c) = client().await else { return };
    let r = unique_resource("with-fence");
    effects_table(&c).await;
    let out = with_fence(&mut c, &fence(&r, 3), FenceMode::Strict, |tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO effects VALUES ('three')", &[]).await?;
            Ok::<_, ArbiterError>(33)
        })
    })
    .await
    .expect("admitted");
    assert_eq!(out, 33);
    assert_eq!(last(&c, &r).await, Some(3));

    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = Arc::clone(&ran);
    let res = with_fence(&mut c, &fence(&r, 2), FenceMode::Strict, move |tx| {
        Box::pin(async move {
            ran2.store(true, Ordering::SeqCst);
            tx.execute("INSERT INTO effects VALUES ('two')", &[]).await?;
            Ok::<_, ArbiterError>(())
        })
    })
    .await;
    match res {
        Err(ArbiterError::Stale(s)) => assert_eq!((s.presented.get(), s.current.get()), (2, 3)),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the effect must not run after a rejection");

    let failed = with_fence(&mut c, &fence(&r, 4), FenceMode::Strict, |tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO effects VALUES ('four')", &[]).await?;
            Err::<(), _>(ArbiterError::Task("effect failed on purpose".into()))
        })
    })
    .await;
    assert!(matches!(failed, Err(ArbiterError::Task(_))), "{failed:?}");
    assert_eq!(last(&c, &r).await, Some(3), "token rolled back");
    let rows: Vec<String> = c
        .query("SELECT v FROM effects", &[])
        .await
        .expect("read")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["three"]);
}

/// Helpers pointed at a schema that does not exist say nothing is installed
/// there; installing into it says to create it.
#[tokio::test]
async fn a_missing_schema_is_not_installed() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let mut c = postgres::connect(&url).await.expect("connect");
    let missing = Schema::new("leasefence_no_such_schema").expect("valid name");
    let r = unique_resource("not-installed");
    let not_installed =
        |res: Result<(), ArbiterError>| matches!(res, Err(ArbiterError::NotInstalled { backend: "postgres" }));
    let tx = c.transaction().await.expect("begin");
    let res = missing.admit(&tx, &fence(&r, 1), FenceMode::Strict).await;
    assert!(not_installed(res), "admit");
    drop(tx);
    let res = missing.prepare_admit(&c).await.map(drop);
    assert!(not_installed(res), "prepare_admit");
    let res = missing.fenced_statement(&c, "SELECT 1").await.map(drop);
    assert!(not_installed(res), "fenced_statement");
    let res = missing.last_token(&c, &r).await.map(drop);
    assert!(not_installed(res), "last_token");
    assert_eq!(missing.installed_version(&c).await.expect("version"), None);
    match missing.install(&mut c).await {
        Err(ArbiterError::Invalid(i)) => {
            assert_eq!(i.field(), "schema");
            assert!(i.to_string().contains("CREATE SCHEMA"), "{i}");
        }
        other => panic!("install into a missing schema must be Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn check_dispatches_on_postgres_and_postgresql_schemes() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    leasefence_arbiter::install(&url).await.expect("install");
    let alt = match url.strip_prefix("postgres://") {
        Some(rest) => format!("postgresql://{rest}"),
        None => url.replacen("postgresql://", "postgres://", 1),
    };
    for u in [&url, &alt] {
        let report = leasefence_arbiter::check(u, 5).await.expect("check");
        assert!(report.passed(), "{report:?}");
        assert_eq!(
            (report.backend, report.trials, report.stale_rejected),
            ("postgres", 5, 5)
        );
    }
}

#[tokio::test]
async fn with_fence_works_on_a_pooled_connection() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    postgres::install_url(&url).await.expect("install");
    let config: tokio_postgres::Config = url.parse().expect("url");
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .expect("pool");
    let mut obj = pool.get().await.expect("connection");
    let r = unique_resource("pooled");
    with_fence(&mut obj, &fence(&r, 1), FenceMode::Strict, |_| {
        Box::pin(async { Ok::<_, ArbiterError>(()) })
    })
    .await
    .expect("admitted");
    let again = with_fence(&mut obj, &fence(&r, 1), FenceMode::Strict, |_| {
        Box::pin(async { Ok::<_, ArbiterError>(()) })
    })
    .await;
    assert!(matches!(again, Err(ArbiterError::Stale(_))), "{again:?}");
}

#[tokio::test]
async fn pipelined_admit_commits_with_the_effect_and_a_stale_one_leaves_nothing() {
    let Some(mut c) = client().await else { return };
    pipelined_case(&mut c, None).await;
}

#[tokio::test]
async fn prepared_pipelined_admit_commits_with_the_effect_and_a_stale_one_leaves_nothing() {
    let Some(mut c) = client().await else { return };
    let prepared = postgres::PreparedAdmit::prepare(&c).await.expect("prepare");
    pipelined_case(&mut c, Some(&prepared)).await;
}

/// Admits 5, 4, 5, 6 (strict), each pipelined with an insert of its own row:
/// only the rows of 5 and 6 commit.
async fn pipelined_case(c: &mut tokio_postgres::Client, prepared: Option<&postgres::PreparedAdmit>) {
    let r = unique_resource("pipelined");
    effects_table(c).await;
    for (token, value) in [(5u64, "five"), (4, "four"), (5, "five again"), (6, "six")] {
        let tx = c.transaction().await.expect("begin");
        let effect = async {
            tx.execute("INSERT INTO effects VALUES ($1)", &[&value])
                .await
                .map_err(ArbiterError::from)
        };
        let f = fence(&r, token);
        let result = match prepared {
            Some(p) => p.admit_pipelined(&tx, &f, FenceMode::Strict, effect).await,
            None => postgres::admit_pipelined(&tx, &f, FenceMode::Strict, effect).await,
        };
        match result {
            Ok(_) => tx.commit().await.expect("commit"),
            Err(ArbiterError::Stale(s)) => {
                assert_eq!(s.presented.get(), token);
                tx.rollback().await.expect("rollback");
            }
            Err(other) => panic!("token {token}: expected admitted or stale, got {other:?}"),
        }
    }
    let rows: Vec<String> = c
        .query("SELECT v FROM effects ORDER BY v", &[])
        .await
        .expect("read")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["five", "six"], "stale and equal tokens left no effect");
    assert_eq!(last(&*c, &r).await, Some(6));
}

/// A first admit through `PreparedAdmit` runs its fallback after the
/// pipelined effect; when that effect fails, its own error is returned (not
/// the fallback's "transaction aborted"), and nothing commits.
#[tokio::test]
async fn prepared_pipelined_reports_the_effects_own_error() {
    let Some(mut c) = client().await else { return };
    let prepared = postgres::PreparedAdmit::prepare(&c).await.expect("prepare");
    c.batch_execute("CREATE TEMP TABLE uniq (v text PRIMARY KEY); INSERT INTO uniq VALUES ('taken')")
        .await
        .expect("temp table");
    // Prepared, so the failing insert reaches the server before the fallback.
    let insert = c.prepare("INSERT INTO uniq VALUES ('taken')").await.expect("prepare");
    let r = unique_resource("effect-error");
    let tx = c.transaction().await.expect("begin");
    let effect = async { tx.execute(&insert, &[]).await.map_err(ArbiterError::from) };
    let res = prepared
        .admit_pipelined(&tx, &fence(&r, 1), FenceMode::Strict, effect)
        .await;
    match res {
        Err(ArbiterError::Postgres(e)) => assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e}"),
        other => panic!("expected the effect's unique violation, got {other:?}"),
    }
    drop(tx);
    assert_eq!(last(&c, &r).await, None);
}

#[tokio::test]
async fn prepared_admit_fails_on_another_connection_and_refuses_big_tokens() {
    let Some(c) = client().await else { return };
    let prepared = postgres::PreparedAdmit::prepare(&c).await.expect("prepare");
    let r = unique_resource("prepared elsewhere");

    // On another connection the statements do not exist: an error, never a
    // silent success, on the fast path (row exists) and on the first admit.
    let Some(mut other) = client().await else { return };
    for exists in [false, true] {
        if exists {
            let tx = other.transaction().await.expect("begin");
            postgres::admit(&tx, &fence(&r, 1), FenceMode::Strict)
                .await
                .expect("create the row");
            tx.commit().await.expect("commit");
        }
        let tx = other.transaction().await.expect("begin");
        let res = prepared.admit(&tx, &fence(&r, 2), FenceMode::Strict).await;
        match res {
            // 26000: invalid_sql_statement_name, named in our message.
            Err(e @ ArbiterError::Postgres(_)) => assert!(e.to_string().contains("SQLSTATE 26000"), "{e}"),
            other => panic!("row exists {exists}: expected a PostgreSQL error, got {other:?}"),
        }
    }
    assert_eq!(last(&c, &r).await, Some(1));

    // Tokens above i64::MAX are refused before anything is sent.
    let Some(mut c) = client().await else { return };
    let prepared = postgres::PreparedAdmit::prepare(&c).await.expect("prepare");
    let tx = c.transaction().await.expect("begin");
    let res = prepared
        .admit(&tx, &fence(&r, i64::MAX as u64 + 1), FenceMode::Strict)
        .await;
    assert!(matches!(res, Err(ArbiterError::Invalid(_))), "{res:?}");
}

/// Installs into a schema of its own (so it cannot disturb the other tests'
/// shared install), upgrades a version-1 install, refuses to downgrade a newer
/// one, and shows the function and the helpers use its own schema's table
/// whatever the caller's search_path.
#[tokio::test]
async fn install_upgrades_v1_refuses_newer_and_ignores_callers_search_path() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let mut c = postgres::connect(&url).await.expect("connect");
    let (schema, s) = own_install(&mut c, "lf_install").await;

    // What version 1 left behind: the function pinned with SET search_path,
    // CHECK constraints on the fence table.
    c.batch_execute(&format!(
        "ALTER FUNCTION {schema}.leasefence_admit(text, bigint, text, text) SET search_path = {schema}, pg_temp;
         ALTER TABLE {schema}.leasefence_fences
             ADD CONSTRAINT leasefence_fences_resource_check CHECK (octet_length(resource) BETWEEN 1 AND 512),
             ADD CONSTRAINT leasefence_fences_last_token_check CHECK (last_token >= 1),
             ADD CONSTRAINT leasefence_fences_mode_check CHECK (mode IN ('strict', 'monotonic'));
         UPDATE {schema}.leasefence_schema_version SET version = 1 WHERE component = 'arbiter'"
    ))
    .await
    .expect("simulate version 1");
    s.install(&mut c).await.expect("upgrade from version 1");
    assert_eq!(
        s.installed_version(&c).await.expect("version"),
        Some(postgres::SCHEMA_VERSION)
    );
    let config: Option<Vec<String>> = c
        .query_one(
            &format!("SELECT proconfig FROM pg_proc WHERE oid = '{schema}.leasefence_admit(text, bigint, text, text)'::regprocedure"),
            &[],
        )
        .await
        .expect("proconfig")
        .get(0);
    assert_eq!(config, None, "the per-call SET search_path is gone after the upgrade");
    let checks: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM pg_constraint WHERE conrelid = '{schema}.leasefence_fences'::regclass AND contype = 'c'"),
            &[],
        )
        .await
        .expect("constraints")
        .get(0);
    assert_eq!(checks, 0, "the per-admit CHECK constraints are gone after the upgrade");

    c.batch_execute(&format!(
        "UPDATE {schema}.leasefence_schema_version SET version = {} WHERE component = 'arbiter'",
        postgres::SCHEMA_VERSION + 1
    ))
    .await
    .expect("simulate a newer version");
    let err = s.install(&mut c).await.expect_err("no downgrade");
    let code = match &err {
        ArbiterError::Postgres(e) => e.code().map(|c| c.code().to_owned()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some(postgres::SQLSTATE_SCHEMA_NEWER), "{err}");

    // A caller whose search_path points elsewhere (here: a schema with no
    // leasefence objects) still admits into the install schema's table.
    let r = unique_resource("schema-qualified");
    c.batch_execute("SET search_path = pg_catalog")
        .await
        .expect("search_path");
    c.execute(&format!("SELECT {schema}.leasefence_admit($1, 7)"), &[&r.as_str()])
        .await
        .expect("admit with a foreign search_path");
    let last: i64 = c
        .query_one(
            &format!("SELECT last_token FROM {schema}.leasefence_fences WHERE resource = $1"),
            &[&r.as_str()],
        )
        .await
        .expect("fence row in the install schema")
        .get(0);
    assert_eq!(last, 7);
    let tx = c.transaction().await.expect("begin");
    let res = s.admit(&tx, &fence(&r, 6), FenceMode::Strict).await;
    assert!(matches!(res, Err(ArbiterError::Stale(_))), "{res:?}");
    drop(tx);
    assert_eq!(s.last_token(&c, &r).await.expect("last").map(|t| t.get()), Some(7));
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop schema");
}

/// An install changed by hand so that its columns no longer have the types
/// the helpers read (a version column made text, a last token made
/// numeric) gives an error that says so, not a panic in the caller.
#[tokio::test]
async fn an_install_altered_by_hand_is_an_error_not_a_panic() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let mut c = postgres::connect(&url).await.expect("connect");
    let (schema, s) = own_install(&mut c, "lf_altered").await;
    let r = unique_resource("altered");
    c.batch_execute(&format!(
        "INSERT INTO {schema}.leasefence_fences (resource, last_token, mode) VALUES ('{r}', 7, 'strict');
         ALTER TABLE {schema}.leasefence_schema_version ALTER COLUMN version TYPE text;
         ALTER TABLE {schema}.leasefence_fences ALTER COLUMN last_token TYPE numeric"
    ))
    .await
    .expect("alter the install");
    for (what, res) in [
        (
            "installed_version",
            s.installed_version(&c).await.map(|v| format!("{v:?}")),
        ),
        ("last_token", s.last_token(&c, &r).await.map(|t| format!("{t:?}"))),
    ] {
        match res {
            Err(ArbiterError::Postgres(e)) => {
                assert!(e.to_string().contains("error deserializing column 0"), "{what}: {e}");
            }
            other => panic!("{what}: expected a PostgreSQL error, got {other:?}"),
        }
    }
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");
}
