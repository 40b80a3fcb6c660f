//! What `install` and `check` make of a Redis server's settings: an
//! `allkeys-*` eviction policy (fence keys can be evicted, and then any token
//! is admitted) is refused before anything is loaded; missing persistence and
//! a `CONFIG` the server will not answer are warnings. Throwaway servers on
//! free ports for the settings the shared one does not have; the no-persistence
//! warning against `LEASEFENCE_TEST_REDIS_URL`, which runs without persistence.

mod common;
mod redis_common;

use common::{REDIS_URL, service_url};
use leasefence_arbiter::ArbiterError;
use leasefence_arbiter::redis::{self as lf, SettingsWarning};
use redis_common::server::{Server, redis_server_available};

const MODULE_SO: &str = "LEASEFENCE_TEST_REDIS_MODULE_SO";
const NO_PERSISTENCE: [&str; 4] = ["--save", "", "--appendonly", "no"];

fn expect_unsafe<T: std::fmt::Debug>(what: &str, res: Result<T, ArbiterError>) {
    match res {
        Err(e @ ArbiterError::UnsafeSettings { .. }) => {
            let text = e.to_string();
            for needed in ["maxmemory-policy is allkeys-lru", "evict", "noeviction", "volatile-"] {
                assert!(text.contains(needed), "{what}: the refusal must say {needed:?}: {text}");
            }
        }
        other => panic!("{what}: an allkeys-lru server must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn install_and_check_refuse_an_allkeys_eviction_policy() {
    if !redis_server_available() {
        return;
    }
    let Some(so) = service_url(MODULE_SO) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = vec!["--maxmemory-policy", "allkeys-lru"];
    settings.extend(NO_PERSISTENCE);
    let server = Server::start(dir.path(), Some(std::path::Path::new(&so)), &settings);
    let url = server.url();
    let module_url = url.replacen("redis://", "redis+module://", 1);

    expect_unsafe("install redis://", leasefence_arbiter::install(&url).await);
    let mut conn = lf::connect(&url).await.expect("connect");
    assert_eq!(
        lf::installed_version(&mut conn).await.expect("probe"),
        None,
        "a refused install loads nothing"
    );
    expect_unsafe("redis::install", lf::install(&mut conn).await);
    expect_unsafe("check redis://", leasefence_arbiter::check(&url, 1).await);
    expect_unsafe(
        "install redis+module://",
        leasefence_arbiter::install(&module_url).await,
    );
    expect_unsafe("check redis+module://", leasefence_arbiter::check(&module_url, 1).await);

    // The same server with a safe policy is accepted (the module is loaded,
    // so both flavours check).
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "volatile-lru"][..])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    let installed = leasefence_arbiter::install(&url).await.expect("volatile-lru is safe");
    assert_eq!(installed.warnings, vec![SettingsWarning::NoPersistence.to_string()]);
    let report = leasefence_arbiter::check(&module_url, 2).await.expect("check");
    assert!(report.passed(), "{report:?}");
}

/// The shared server runs without persistence: install and check succeed and
/// say that a restart forgets every fence.
#[tokio::test]
async fn no_persistence_is_a_warning_on_install_and_check() {
    let Some(url) = service_url(REDIS_URL) else { return };
    let mut conn = lf::connect(&url).await.expect("connect");
    let persistence: (String, String) = (config(&mut conn, "appendonly").await, config(&mut conn, "save").await);
    assert_eq!(
        persistence,
        ("no".to_string(), String::new()),
        "{REDIS_URL} must name a server without persistence, for this test"
    );
    let installed = leasefence_arbiter::install(&url).await.expect("install");
    assert_eq!(installed.warnings.len(), 1, "{installed:?}");
    let warning = &installed.warnings[0];
    assert!(
        warning.contains("no persistence") && warning.contains("restart forgets every fence"),
        "{warning}"
    );
    assert!(warning.contains("appendonly yes"), "says what to set: {warning}");
    let report = leasefence_arbiter::check(&url, 2).await.expect("check");
    assert!(report.passed(), "{report:?}");
    assert_eq!(report.warnings, installed.warnings);
}

async fn config(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> String {
    let pair: (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .expect("CONFIG GET");
    pair.1
}

/// A managed Redis may rename or forbid CONFIG: then nothing could be
/// checked, which install says, and installs all the same.
#[tokio::test]
async fn a_server_that_hides_config_is_a_warning_not_a_failure() {
    if !redis_server_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = vec!["--rename-command", "CONFIG", ""];
    settings.extend(NO_PERSISTENCE);
    let server = Server::start(dir.path(), None, &settings);
    let installed = leasefence_arbiter::install(&server.url()).await.expect("install");
    assert_eq!(installed.warnings.len(), 1, "{installed:?}");
    assert!(
        installed.warnings[0].contains("could not be checked") && installed.warnings[0].contains("CONFIG"),
        "{}",
        installed.warnings[0]
    );
    let mut conn = lf::connect(&server.url()).await.expect("connect");
    assert_eq!(
        lf::installed_version(&mut conn).await.expect("version").as_deref(),
        Some(lf::LIBRARY_VERSION)
    );
}

/// `appendonly yes` with `appendfsync always` and `noeviction` (the
/// default): nothing to warn about.
#[tokio::test]
async fn crash_safe_settings_give_no_warning() {
    if !redis_server_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"];
    let server = Server::start(dir.path(), None, &settings);
    let installed = leasefence_arbiter::install(&server.url()).await.expect("install");
    assert_eq!(installed.warnings, Vec::<String>::new());
    let mut conn = lf::connect(&server.url()).await.expect("connect");
    assert_eq!(lf::check_settings(&mut conn).await.expect("settings"), vec![]);
}
