//! `install` and `check` for the command line: pick the backend from a URL.
//!
//! Schemes: `postgres://` and `postgresql://` (tokio-postgres URL syntax, no
//! TLS), `sqlite://PATH` (`sqlite:///abs/file.db` or `sqlite://rel/file.db`),
//! `redis://` (the Functions library) and `redis+module://` (the same server
//! address, through the native module). Anything else is an
//! [`ArbiterError::Invalid`] naming the schemes.

use std::path::PathBuf;
use std::sync::Arc;

use leasefence_core::Invalid;
use tokio_postgres::IsolationLevel;

use crate::targets::{PostgresTarget, RedisTarget, SqliteTarget};
use crate::{ArbiterError, Report, pause_check};

/// A backend named by a URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendUrl {
    Postgres(String),
    Sqlite(PathBuf),
    Redis(String),
    /// A `redis+module://` URL, held as the `redis://` URL to connect to.
    RedisModule(String),
}

impl BackendUrl {
    pub fn parse(url: &str) -> Result<BackendUrl, ArbiterError> {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(BackendUrl::Postgres(url.to_string())),
            Some("redis") => Ok(BackendUrl::Redis(url.to_string())),
            Some("redis+module") => Ok(BackendUrl::RedisModule(format!("redis://{}", &url["redis+module://".len()..]))),
            Some("sqlite") => {
                let path = &url["sqlite://".len()..];
                if path.is_empty() || path == ":memory:" {
                    let msg = format!("sqlite:// needs a file path (sqlite:///abs/file.db), got {url:?}");
                    return Err(Invalid::new("url", msg).into());
                }
                Ok(BackendUrl::Sqlite(PathBuf::from(path)))
            }
            _ => Err(Invalid::new(
                "url",
                format!("unsupported arbiter URL {url:?}: use postgres://, postgresql://, sqlite://PATH, redis:// or redis+module://"),
            )
            .into()),
        }
    }
}

/// Installs (or upgrades, idempotently) the arbiter schema or functions at
/// `url`; returns what is now installed there, for the operator, e.g.
/// `PostgreSQL schema version 3`.
pub async fn install(url: &str) -> Result<String, ArbiterError> {
    match BackendUrl::parse(url)? {
        BackendUrl::Postgres(u) => {
            crate::postgres::install_url(&u).await?;
            Ok(format!("PostgreSQL schema version {}", crate::postgres::SCHEMA_VERSION))
        }
        BackendUrl::Redis(u) => {
            crate::redis::install_url(&u).await?;
            Ok(format!(
                "Redis function library version {}",
                crate::redis::LIBRARY_VERSION
            ))
        }
        BackendUrl::RedisModule(u) => {
            let mut conn = crate::redis::connect(&u).await?;
            let version = crate::redis::module_loaded(&mut conn).await?;
            Ok(format!(
                "Redis module leasefence version {version} (loaded by the server; nothing was written)"
            ))
        }
        BackendUrl::Sqlite(path) => {
            tokio::task::spawn_blocking(move || {
                let mut conn = rusqlite::Connection::open(&path)?;
                crate::sqlite::install(&mut conn)
            })
            .await
            .map_err(|e| ArbiterError::Task(format!("SQLite install task failed: {e}")))??;
            Ok(format!("SQLite schema version {}", crate::sqlite::SCHEMA_VERSION))
        }
    }
}

/// Runs `trials` pause trials against the arbiter at `url` (which must be
/// installed), in a fresh namespace that is removed afterwards.
pub async fn check(url: &str, trials: u32) -> Result<Report, ArbiterError> {
    match BackendUrl::parse(url)? {
        BackendUrl::Postgres(u) => {
            let target = PostgresTarget::connect(&u, IsolationLevel::ReadCommitted).await?;
            pause_check(&Arc::new(target), trials).await
        }
        BackendUrl::Redis(u) => pause_check(&Arc::new(RedisTarget::connect(&u).await?), trials).await,
        BackendUrl::RedisModule(u) => {
            let target = RedisTarget::connect_via(&u, crate::redis::Via::Module).await?;
            pause_check(&Arc::new(target), trials).await
        }
        BackendUrl::Sqlite(path) => pause_check(&Arc::new(SqliteTarget::open(&path).await?), trials).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        let pg = BackendUrl::parse("postgresql://u@h/db").expect("ok");
        assert_eq!(pg, BackendUrl::Postgres("postgresql://u@h/db".into()));
        assert!(matches!(
            BackendUrl::parse("postgres://h/db"),
            Ok(BackendUrl::Postgres(_))
        ));
        assert!(matches!(
            BackendUrl::parse("redis://127.0.0.1:6379"),
            Ok(BackendUrl::Redis(_))
        ));
        assert_eq!(
            BackendUrl::parse("redis+module://127.0.0.1:6390/0").expect("ok"),
            BackendUrl::RedisModule("redis://127.0.0.1:6390/0".into())
        );
        let abs = BackendUrl::parse("sqlite:///tmp/x.db").expect("ok");
        assert_eq!(abs, BackendUrl::Sqlite(PathBuf::from("/tmp/x.db")));
        let rel = BackendUrl::parse("sqlite://data/x.db").expect("ok");
        assert_eq!(rel, BackendUrl::Sqlite(PathBuf::from("data/x.db")));
        for bad in [
            "mysql://h/db",
            "sqlite://",
            "sqlite://:memory:",
            "no-scheme",
            "etcd://h",
        ] {
            match BackendUrl::parse(bad) {
                Err(ArbiterError::Invalid(i)) => assert_eq!(i.field(), "url", "{bad}"),
                other => panic!("{bad} must be Invalid, got {other:?}"),
            }
        }
        let msg = BackendUrl::parse("mysql://h").unwrap_err().to_string();
        assert!(
            msg.contains("postgres://")
                && msg.contains("redis://")
                && msg.contains("sqlite://")
                && msg.contains("redis+module://"),
            "{msg}"
        );
    }
}
