//! SQLite arbiter on real database files in a temp directory.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{fence, unique_resource};
use leasefence_arbiter::sqlite::{self, with_fence};
use leasefence_arbiter::targets::SqliteTarget;
use leasefence_arbiter::{ArbiterError, FenceMode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use rusqlite::{Connection, TransactionBehavior};

fn installed_db() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = Connection::open(dir.path().join("arbiter.db")).expect("open");
    sqlite::install(&mut conn).expect("install");
    (dir, conn)
}

/// The temp dir lives as long as the test that holds the guard.
async fn target() -> Option<(Arc<SqliteTarget>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("arbiter.db");
    sqlite::install(&mut Connection::open(&path).expect("open")).expect("install");
    Some((Arc::new(SqliteTarget::open(&path).await.expect("target")), dir))
}

mod suite {
    use super::*;
    conformance_tests!(target());
    pause_kit_test!(pause_kit, target(), 25);
}

#[test]
fn with_fence_commits_together_and_rejects_without_running_the_effect() {
    let (_dir, mut conn) = installed_db();
    conn.execute_batch("CREATE TABLE effects (v TEXT NOT NULL)")
        .expect("table");
    let r = unique_resource("sqlite-with-fence");
    let out = with_fence(&mut conn, &fence(&r, 3), FenceMode::Strict, |tx| {
        tx.execute("INSERT INTO effects VALUES ('three')", [])?;
        Ok::<_, ArbiterError>(3)
    });
    assert_eq!(out.expect("admitted"), 3);
    let mut ran = false;
    let res = with_fence(&mut conn, &fence(&r, 3), FenceMode::Strict, |_| {
        ran = true;
        Ok::<_, ArbiterError>(())
    });
    match res {
        Err(ArbiterError::Stale(s)) => assert_eq!((s.presented.get(), s.current.get()), (3, 3)),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert!(!ran, "the effect must not run after a rejection");
    let failed = with_fence(&mut conn, &fence(&r, 4), FenceMode::Strict, |tx| {
        tx.execute("INSERT INTO effects VALUES ('four')", [])?;
        Err::<(), _>(ArbiterError::Task("effect failed on purpose".into()))
    });
    assert!(matches!(failed, Err(ArbiterError::Task(_))));
    assert_eq!(sqlite::last_token(&conn, &r).expect("last").map(|t| t.get()), Some(3));
    let n: i64 = conn
        .query_row("SELECT count(*) FROM effects", [], |row| row.get(0))
        .expect("count");
    assert_eq!(n, 1, "only the admitted effect is committed");
}

#[test]
fn install_is_idempotent_and_missing_install_is_reported() {
    let (dir, mut conn) = installed_db();
    sqlite::install(&mut conn).expect("second install");
    assert_eq!(
        sqlite::installed_version(&conn).expect("version"),
        Some(sqlite::SCHEMA_VERSION)
    );
    let mut bare = Connection::open(dir.path().join("bare.db")).expect("open");
    assert_eq!(sqlite::installed_version(&bare).expect("version"), None);
    let tx = bare
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    let res = sqlite::admit(&tx, &fence(&unique_resource("bare"), 1), FenceMode::Strict);
    assert!(
        matches!(res, Err(ArbiterError::NotInstalled { backend: "sqlite" })),
        "{res:?}"
    );
}

#[test]
fn rejections_are_counted_with_the_backend_label() {
    let (_dir, mut conn) = installed_db();
    let r = unique_resource("sqlite-metrics");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let tx = conn.transaction().expect("begin");
        sqlite::admit(&tx, &fence(&r, 5), FenceMode::Strict).expect("admit");
        tx.commit().expect("commit");
        for stale in [5, 4] {
            let tx = conn.transaction().expect("begin");
            assert!(sqlite::admit(&tx, &fence(&r, stale), FenceMode::Strict).is_err());
        }
    });
    let counted = common::rejection_counters(&snapshotter);
    assert_eq!(
        counted,
        vec![(
            vec![("backend".to_string(), "sqlite".to_string())],
            DebugValue::Counter(2)
        )]
    );
}

#[tokio::test]
async fn install_and_check_dispatch_on_sqlite_scheme() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("cli.db").display());
    leasefence_arbiter::install(&url).await.expect("install");
    leasefence_arbiter::install(&url).await.expect("install again");
    let report = leasefence_arbiter::check(&url, 5).await.expect("check");
    assert!(report.passed(), "{report:?}");
    assert_eq!((report.backend, report.stale_rejected), ("sqlite", 5));
    let uninstalled = format!("sqlite://{}", dir.path().join("missing.db").display());
    let res = leasefence_arbiter::check(&uninstalled, 1).await;
    assert!(res.is_err(), "checking a missing database must fail: {res:?}");
}

#[tokio::test]
async fn unknown_schemes_are_refused() {
    for url in ["mysql://localhost/db", "etcd://127.0.0.1:2379", "/just/a/path"] {
        match leasefence_arbiter::check(url, 1).await {
            Err(ArbiterError::Invalid(i)) => assert_eq!(i.field(), "url"),
            other => panic!("{url}: expected Invalid, got {other:?}"),
        }
        assert!(matches!(
            leasefence_arbiter::install(url).await,
            Err(ArbiterError::Invalid(_))
        ));
    }
}
