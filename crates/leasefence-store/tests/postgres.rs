//! The PostgreSQL shared store against the real PostgreSQL of
//! `LEASEFENCE_TEST_POSTGRES_URL`: both conformance suites, the schema's
//! install and version check, and an engine that goes away. Each test works in
//! a schema of its own, dropped at the end (others use the same database).

mod common;

use std::time::{Duration, Instant};

use common::pg::{TestSchema, through, upstream, url};
use common::proxy::Proxy;
use leasefence_store::conformance::grant;
use leasefence_store::{Committer, LeaseStore, PostgresConfig, PostgresShared, SharedStore, StoreError, conformance};

fn tokens(w: &mut impl LeaseStore) -> Vec<(String, u64)> {
    let mut all: Vec<_> = w
        .load()
        .expect("load")
        .into_iter()
        .map(|r| (r.resource.to_string(), r.last_token.get()))
        .collect();
    all.sort();
    all
}

#[test]
fn postgres_shared_passes_the_shared_suite() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    conformance::shared::run_all(|shard| schema.open(shard));
}

#[test]
fn postgres_writer_passes_the_lease_store_suite() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    let store = schema.open(0);
    let epoch = store
        .campaign("http://a.example:7070", Duration::from_secs(60))
        .expect("campaign")
        .expect("a fresh schema's first campaign wins");
    conformance::run_all(|| store.writer(epoch).expect("writer"));
}

#[test]
fn rows_carry_the_shard_and_the_epoch_that_wrote_them() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    let (a, b) = (schema.open(3), schema.open(3));
    let ttl = Duration::from_secs(60);
    let first = a
        .campaign("http://a.example:7070", ttl)
        .expect("campaign")
        .expect("wins");
    a.writer(first)
        .expect("writer")
        .apply(&[grant("r/1", 1, 1), grant("r/2", 1, 1)])
        .expect("apply");
    a.resign(first).expect("resign");
    let second = b
        .campaign("http://b.example:7070", ttl)
        .expect("campaign")
        .expect("wins");
    b.writer(second)
        .expect("writer")
        .apply(&[grant("r/2", 2, 1)])
        .expect("apply");
    let q = |what: &str| {
        schema.column(&format!(
            "SELECT {what} FROM \"{}\".{}",
            schema.name, "leasefence_records ORDER BY resource"
        ))
    };
    assert_eq!(
        q("shard::text || ' ' || resource || ' ' || epoch::text"),
        [format!("3 r/1 {first}"), format!("3 r/2 {second}")]
    );
    let shards = schema.column(&format!(
        "SELECT shard::text || ' ' || epoch::text || ' ' || leader FROM \"{}\".leasefence_shards",
        schema.name
    ));
    assert_eq!(shards, [format!("3 {second} http://b.example:7070")]);
}

#[test]
fn a_newer_installed_schema_is_refused() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    drop(schema.open(0));
    let version = format!(
        "SELECT version::text FROM \"{}\".leasefence_schema_version WHERE component = 'store'",
        schema.name
    );
    assert_eq!(
        schema.column(&version),
        ["1"],
        "the first connection installs version 1"
    );
    schema.sql(&format!(
        "UPDATE \"{}\".leasefence_schema_version SET version = 2 WHERE component = 'store'",
        schema.name
    ));
    let err = PostgresShared::open(schema.config(0)).expect_err("a newer schema is refused");
    assert!(
        matches!(&err, StoreError::Io(m) if m.contains("version 2") && m.contains("will not downgrade")),
        "{err}"
    );
    assert_eq!(schema.column(&version), ["2"], "and left as it was");
}

#[test]
fn concurrent_first_connections_install_once_and_all_succeed() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    std::thread::scope(|scope| {
        let opens: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| PostgresShared::open(schema.config(0)).map(drop)))
            .collect();
        for o in opens {
            o.join()
                .expect("thread")
                .expect("every concurrent first connection succeeds");
        }
    });
    let components = schema.column(&format!(
        "SELECT component FROM \"{}\".leasefence_schema_version",
        schema.name
    ));
    assert_eq!(components, ["store"]);
}

#[test]
fn bad_settings_are_refused_with_what_is_allowed() {
    let bad_url = PostgresConfig::new("postgres://u:secret@host:notaport/db").expect_err("bad port");
    assert!(
        bad_url.to_string().contains("invalid PostgreSQL store URL"),
        "{bad_url}"
    );
    assert!(
        !bad_url.to_string().contains("secret"),
        "no password in errors: {bad_url}"
    );
    let config = PostgresConfig::new("postgres://u@127.0.0.1/db").expect("valid");
    let bad_schema = config.clone().with_schema("my-schema").expect_err("bad schema");
    assert!(
        bad_schema.to_string().contains("letters, digits and underscores"),
        "{bad_schema}"
    );
    assert!(config.with_call_timeout(Duration::ZERO).is_err());
}

#[test]
fn an_engine_nobody_listens_on_is_unavailable() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let err = PostgresShared::connect(&format!("postgres://postgres@127.0.0.1:{port}/test"), 0).expect_err("refused");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
}

#[test]
fn an_engine_that_goes_away_is_unavailable_until_it_returns() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    let proxy = Proxy::start(upstream(&url));
    let config = schema
        .config_at(&through(&url, proxy.addr()), 0)
        .with_call_timeout(Duration::from_secs(1))
        .expect("valid");
    let store = PostgresShared::open(config.clone()).expect("open through the proxy");
    let epoch = store
        .campaign("http://a.example:7070", Duration::from_secs(60))
        .expect("campaign")
        .expect("wins");
    let mut w = store.writer(epoch).expect("writer");
    w.apply(&[grant("u/1", 1, 1)]).expect("apply");

    proxy.cut();
    let unavailable = |r: Result<(), StoreError>, what: &str| {
        assert!(
            matches!(r, Err(StoreError::Unavailable(_))),
            "{what} with the engine gone: {r:?}"
        );
    };
    unavailable(store.leader().map(drop), "leader");
    unavailable(store.renew(epoch, Duration::from_secs(60)), "renew");
    unavailable(w.apply(&[grant("u/1", 2, 1)]), "apply");
    unavailable(w.load().map(drop), "load");
    unavailable(PostgresShared::open(config.clone()).map(drop), "open");

    proxy.restore();
    proxy.hold();
    let began = Instant::now();
    unavailable(store.leader().map(drop), "leader with the engine hanging");
    unavailable(w.apply(&[grant("u/1", 2, 1)]), "apply with the engine hanging");
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "calls are bounded by the call timeout"
    );

    proxy.restore();
    let leader = store.leader().expect("the store reconnects by itself").map(|l| l.epoch);
    assert_eq!(leader, Some(epoch));
    w.apply(&[grant("u/1", 2, 1)]).expect("the writer reconnects by itself");
    assert_eq!(tokens(&mut w), [("u/1".to_string(), 2)]);
}

#[test]
fn a_connection_the_server_ends_is_replaced_on_the_next_call() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    let app = format!("{}_app", schema.name);
    let url_app = format!("{} application_name={app}", through(&url, upstream(&url)));
    let store = PostgresShared::open(schema.config_at(&url_app, 0)).expect("open");
    let epoch = store
        .campaign("http://a.example:7070", Duration::from_secs(60))
        .expect("campaign")
        .expect("wins");
    let mut w = store.writer(epoch).expect("writer");
    w.apply(&[grant("k/1", 1, 1)]).expect("apply");
    let ended = schema.column(&format!(
        "SELECT pg_terminate_backend(pid)::text FROM pg_stat_activity WHERE application_name = '{app}'"
    ));
    assert_eq!(ended, ["true", "true"], "the leadership's and the writer's connections");
    assert_eq!(store.leader().expect("leader").map(|l| l.epoch), Some(epoch));
    w.apply(&[grant("k/1", 2, 1)]).expect("apply on a new connection");
    assert_eq!(tokens(&mut w), [("k/1".to_string(), 2)]);
}

/// The server calls the store from `spawn_blocking`, the committer from its
/// own thread; a store may be dropped inside async code.
#[test]
fn works_from_blocking_threads_and_the_committer_and_drops_in_async_code() {
    let Some(url) = url() else { return };
    let schema = TestSchema::new(&url);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(blocking_threads_committer_and_async_drop(schema.config(0)));
}

async fn blocking_threads_committer_and_async_drop(config: PostgresConfig) {
    let (store, epoch) = tokio::task::spawn_blocking(move || {
        let store = PostgresShared::open(config).expect("open");
        let epoch = store
            .campaign("http://a.example:7070", Duration::from_secs(60))
            .expect("campaign");
        (store, epoch.expect("wins"))
    })
    .await
    .expect("blocking task");
    let writer = store.writer(epoch).expect("writer (no I/O)");
    let committer = Committer::start(writer, 64);
    let seqs: Vec<_> = (1..=200u64)
        .map(|i| committer.submit(grant(&format!("c/{}", i % 10), i, 1)))
        .collect();
    for s in seqs {
        committer.durable(s).await.expect("durable");
    }
    assert!(
        committer.stats().batches < 200,
        "grants share transactions: {:?}",
        committer.stats()
    );
    drop(committer);
    let store = std::sync::Arc::new(store);
    let s = std::sync::Arc::clone(&store);
    let loaded = tokio::task::spawn_blocking(move || tokens(&mut s.writer(epoch).expect("writer")))
        .await
        .expect("blocking task");
    assert_eq!(loaded.len(), 10);
    assert!(loaded.iter().any(|(r, t)| r == "c/0" && *t == 200));
    drop(store); // in async code: must not panic
}
