//! The real PostgreSQL of `LEASEFENCE_TEST_POSTGRES_URL` (the one place that
//! decides skip vs fail), a schema per test, and URLs through a proxy.

use std::sync::atomic::{AtomicU64, Ordering};

use leasefence_store::{PostgresConfig, PostgresShared};

const POSTGRES_URL: &str = "LEASEFENCE_TEST_POSTGRES_URL";

/// The database URL. Unset: with `CI=true` the test fails; otherwise it
/// prints a skip line and the caller returns.
pub fn url() -> Option<String> {
    match std::env::var(POSTGRES_URL) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{POSTGRES_URL} is not set but CI=true: this test needs the real PostgreSQL");
            }
            eprintln!("skipped: {POSTGRES_URL} not set");
            None
        }
    }
}

/// A schema no other test run uses, dropped (with the tables) on drop.
pub struct TestSchema {
    pub url: String,
    pub name: String,
}

impl TestSchema {
    pub fn new(url: &str) -> TestSchema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "lf_store_test_{}_{nanos}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        TestSchema {
            url: url.to_string(),
            name,
        }
    }

    pub fn config(&self, shard: u32) -> PostgresConfig {
        self.config_at(&self.url, shard)
    }

    pub fn config_at(&self, url: &str, shard: u32) -> PostgresConfig {
        PostgresConfig::new(url)
            .and_then(|c| c.with_schema(&self.name))
            .expect("valid config")
            .with_shard(shard)
    }

    pub fn open(&self, shard: u32) -> PostgresShared {
        PostgresShared::open(self.config(shard)).expect("open the store")
    }

    /// Runs `sql` (simple protocol) on a connection of its own.
    pub fn sql(&self, sql: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            client.simple_query(sql).await.expect("query")
        })
    }

    /// The first column of every row `sql` returns.
    pub fn column(&self, sql: &str) -> Vec<String> {
        self.sql(sql)
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect()
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        self.sql(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name));
    }
}

pub use super::pg_route::{through, upstream};
