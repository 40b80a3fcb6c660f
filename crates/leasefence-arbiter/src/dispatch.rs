//! `install` and `check` for the command line: pick the backend from a URL.
//!
//! Schemes: `postgres://` and `postgresql://` (tokio-postgres URL syntax, no
//! TLS), `sqlite://PATH` (`sqlite:///abs/file.db` or `sqlite://rel/file.db`),
//! `redis://` (the Functions library) and `redis+module://` (the same server
//! address, through the native module), and with the `gateway` feature
//! `http://` (a running fenced object-store gateway). Anything else is an
//! [`ArbiterError::Invalid`] naming the schemes; a known scheme whose backend
//! this build left out is an [`ArbiterError::Invalid`] naming the cargo
//! feature to enable.

#[cfg(feature = "sqlite")]
use std::path::PathBuf;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "redis", feature = "gateway"))]
use std::sync::Arc;

use leasefence_core::Invalid;
#[cfg(feature = "postgres")]
use tokio_postgres::IsolationLevel;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "redis", feature = "gateway"))]
use crate::pause_check;
#[cfg(feature = "postgres")]
use crate::targets::PostgresTarget;
#[cfg(feature = "redis")]
use crate::targets::RedisTarget;
#[cfg(feature = "sqlite")]
use crate::targets::SqliteTarget;
use crate::{ArbiterError, Report};

/// A backend named by a URL; a variant exists only with its backend's feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendUrl {
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "sqlite")]
    Sqlite(PathBuf),
    #[cfg(feature = "redis")]
    Redis(String),
    /// A `redis+module://` URL, held as the `redis://` URL to connect to.
    #[cfg(feature = "redis")]
    RedisModule(String),
    /// An `http://` URL of a running `leasefence gateway`.
    #[cfg(feature = "gateway")]
    Gateway(String),
}

impl BackendUrl {
    pub fn parse(url: &str) -> Result<BackendUrl, ArbiterError> {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            #[cfg(feature = "postgres")]
            Some("postgres" | "postgresql") => Ok(BackendUrl::Postgres(url.to_string())),
            #[cfg(feature = "redis")]
            Some("redis") => Ok(BackendUrl::Redis(url.to_string())),
            #[cfg(feature = "redis")]
            Some("redis+module") => Ok(BackendUrl::RedisModule(format!(
                "redis://{}",
                &url["redis+module://".len()..]
            ))),
            #[cfg(feature = "gateway")]
            Some("http") => Ok(BackendUrl::Gateway(url.to_string())),
            #[cfg(feature = "sqlite")]
            Some("sqlite") => {
                let path = &url["sqlite://".len()..];
                if path.is_empty() || path == ":memory:" {
                    let msg = format!("sqlite:// needs a file path (sqlite:///abs/file.db), got {url:?}");
                    return Err(Invalid::new("url", msg).into());
                }
                Ok(BackendUrl::Sqlite(PathBuf::from(path)))
            }
            #[cfg(not(feature = "postgres"))]
            Some(s @ ("postgres" | "postgresql")) => Err(compiled_out(s, "postgres")),
            #[cfg(not(feature = "redis"))]
            Some(s @ ("redis" | "redis+module")) => Err(compiled_out(s, "redis")),
            #[cfg(not(feature = "sqlite"))]
            Some(s @ "sqlite") => Err(compiled_out(s, "sqlite")),
            #[cfg(not(feature = "gateway"))]
            Some(s @ "http") => Err(compiled_out(s, "gateway")),
            _ => Err(Invalid::new(
                "url",
                format!(
                    "unsupported arbiter URL {url:?}: use postgres://, postgresql://, sqlite://PATH, redis://, \
                     redis+module:// or http:// (a leasefence gateway)"
                ),
            )
            .into()),
        }
    }
}

/// A known scheme whose backend this build does not contain.
#[cfg(not(all(feature = "postgres", feature = "sqlite", feature = "redis", feature = "gateway")))]
fn compiled_out(scheme: &str, feature: &str) -> ArbiterError {
    let msg = format!(
        "{scheme}:// needs the {feature} arbiter, which this build leaves out: \
         enable the cargo feature `{feature}` of leasefence-arbiter"
    );
    Invalid::new("url", msg).into()
}

/// What [`install`] installed, for the operator: `what` (e.g. `PostgreSQL
/// schema version 4`, also the `Display`) and what about the backend's
/// settings can still lose fences (Redis: see
/// [`crate::redis::check_settings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub what: String,
    pub warnings: Vec<String>,
}

impl Installed {
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "gateway"))]
    fn new(what: String) -> Installed {
        Installed {
            what,
            warnings: Vec::new(),
        }
    }
}

impl std::fmt::Display for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

#[cfg(feature = "redis")]
fn warnings(w: Vec<crate::redis::SettingsWarning>) -> Vec<String> {
    w.iter().map(ToString::to_string).collect()
}

/// Installs (or upgrades, idempotently) the arbiter schema or functions at
/// `url`; returns what is now installed there. A Redis server whose settings
/// let fence keys be evicted is refused ([`ArbiterError::UnsafeSettings`])
/// before anything is loaded.
pub async fn install(url: &str) -> Result<Installed, ArbiterError> {
    match BackendUrl::parse(url)? {
        #[cfg(feature = "postgres")]
        BackendUrl::Postgres(u) => {
            crate::postgres::install_url(&u).await?;
            Ok(Installed::new(format!(
                "PostgreSQL schema version {}",
                crate::postgres::SCHEMA_VERSION
            )))
        }
        #[cfg(feature = "redis")]
        BackendUrl::Redis(u) => {
            let found = crate::redis::install_url(&u).await?;
            Ok(Installed {
                what: format!("Redis function library version {}", crate::redis::LIBRARY_VERSION),
                warnings: warnings(found),
            })
        }
        #[cfg(feature = "redis")]
        BackendUrl::RedisModule(u) => {
            let mut conn = crate::redis::connect(&u).await?;
            let found = crate::redis::check_settings(&mut conn).await?;
            let version = crate::redis::module_loaded(&mut conn).await?;
            Ok(Installed {
                what: format!("Redis module leasefence version {version} (loaded by the server; nothing was written)"),
                warnings: warnings(found),
            })
        }
        #[cfg(feature = "sqlite")]
        BackendUrl::Sqlite(path) => {
            tokio::task::spawn_blocking(move || {
                let mut conn = rusqlite::Connection::open(&path)?;
                crate::sqlite::install(&mut conn)
            })
            .await
            .map_err(|e| ArbiterError::Task(format!("SQLite install task failed: {e}")))??;
            Ok(Installed::new(format!(
                "SQLite schema version {}",
                crate::sqlite::SCHEMA_VERSION
            )))
        }
        #[cfg(feature = "gateway")]
        BackendUrl::Gateway(u) => {
            let version = crate::targets::GatewayTarget::connect(&u)
                .await?
                .check_service()
                .await?;
            Ok(Installed::new(format!(
                "leasefence gateway version {version} (it keeps its fences itself; nothing was written)"
            )))
        }
    }
}

/// A change to the verifying keys of the arbiter at a URL (signed fences).
#[derive(Clone, Copy, Debug)]
pub enum KeyChange<'a> {
    /// Install a key (or replace the secret of the key of its id); at most two.
    Add(&'a leasefence_core::signing::FenceKey),
    /// Remove the key of this id.
    Remove(&'a str),
    /// Change nothing: only list.
    List,
}

/// Applies `change` to the keys of the arbiter at `url` (`postgres://`:
/// the install's key table, the role must be the installer; `redis://`: the
/// library's key hash; `redis+module://`: the module's memory, until a
/// restart) and returns whether anything changed and the key ids now
/// installed. SQLite has no signed fences; a gateway takes its keys with
/// `--fence-key` at start.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_variables, reason = "no backend with keys")
)]
pub async fn fence_keys(url: &str, change: KeyChange<'_>) -> Result<(bool, Vec<String>), ArbiterError> {
    match BackendUrl::parse(url)? {
        #[cfg(feature = "postgres")]
        BackendUrl::Postgres(u) => {
            let client = crate::postgres::connect(&u).await?;
            let changed = match change {
                KeyChange::Add(key) => crate::postgres::add_fence_key(&client, key).await.map(|()| true)?,
                KeyChange::Remove(id) => crate::postgres::remove_fence_key(&client, id).await?,
                KeyChange::List => false,
            };
            Ok((changed, crate::postgres::fence_key_ids(&client).await?))
        }
        #[cfg(feature = "redis")]
        BackendUrl::Redis(u) => redis_keys(&u, crate::redis::Via::Functions, change).await,
        #[cfg(feature = "redis")]
        BackendUrl::RedisModule(u) => redis_keys(&u, crate::redis::Via::Module, change).await,
        #[cfg(feature = "sqlite")]
        BackendUrl::Sqlite(_) => Err(Invalid::new(
            "url",
            "the SQLite arbiter does not check fence signatures (it runs in the writer's own process)",
        )
        .into()),
        #[cfg(feature = "gateway")]
        BackendUrl::Gateway(_) => Err(Invalid::new(
            "url",
            "a gateway takes its keys at start: leasefence gateway --fence-key FILE (twice during a rotation)",
        )
        .into()),
    }
}

#[cfg(feature = "redis")]
async fn redis_keys(
    url: &str,
    via: crate::redis::Via,
    change: KeyChange<'_>,
) -> Result<(bool, Vec<String>), ArbiterError> {
    let mut conn = crate::redis::connect(url).await?;
    let changed = match change {
        KeyChange::Add(key) => via.add_fence_key(&mut conn, key).await.map(|()| true)?,
        KeyChange::Remove(id) => via.remove_fence_key(&mut conn, id).await?,
        KeyChange::List => false,
    };
    Ok((changed, via.fence_key_ids(&mut conn).await?))
}

/// Runs `trials` pause trials against the arbiter at `url` (which must be
/// installed), in a fresh namespace that is removed afterwards. A Redis
/// server is first checked as [`install`] checks it: refused when it can
/// evict fence keys, and the report carries the warnings.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "redis")),
    allow(unused_variables, reason = "no backend to check")
)]
pub async fn check(url: &str, trials: u32) -> Result<Report, ArbiterError> {
    match BackendUrl::parse(url)? {
        #[cfg(feature = "postgres")]
        BackendUrl::Postgres(u) => {
            let target = PostgresTarget::connect(&u, IsolationLevel::ReadCommitted).await?;
            pause_check(&Arc::new(target), trials).await
        }
        #[cfg(feature = "redis")]
        BackendUrl::Redis(u) => redis_check(&u, crate::redis::Via::Functions, trials).await,
        #[cfg(feature = "redis")]
        BackendUrl::RedisModule(u) => redis_check(&u, crate::redis::Via::Module, trials).await,
        #[cfg(feature = "sqlite")]
        BackendUrl::Sqlite(path) => pause_check(&Arc::new(SqliteTarget::open(&path).await?), trials).await,
        #[cfg(feature = "gateway")]
        BackendUrl::Gateway(u) => {
            pause_check(&Arc::new(crate::targets::GatewayTarget::connect(&u).await?), trials).await
        }
    }
}

#[cfg(feature = "redis")]
async fn redis_check(url: &str, via: crate::redis::Via, trials: u32) -> Result<Report, ArbiterError> {
    let found = crate::redis::check_settings(&mut crate::redis::connect(url).await?).await?;
    let mut report = pause_check(&Arc::new(RedisTarget::connect_via(url, via).await?), trials).await?;
    report.warnings = warnings(found);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_url(url: &str) -> String {
        match BackendUrl::parse(url) {
            Err(ArbiterError::Invalid(i)) => {
                assert_eq!(i.field(), "url", "{url}");
                i.message().to_string()
            }
            other => panic!("{url} must be Invalid, got {other:?}"),
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_schemes() {
        let pg = BackendUrl::parse("postgresql://u@h/db").expect("ok");
        assert_eq!(pg, BackendUrl::Postgres("postgresql://u@h/db".into()));
        assert!(matches!(
            BackendUrl::parse("postgres://h/db"),
            Ok(BackendUrl::Postgres(_))
        ));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_schemes() {
        assert!(matches!(
            BackendUrl::parse("redis://127.0.0.1:6379"),
            Ok(BackendUrl::Redis(_))
        ));
        assert_eq!(
            BackendUrl::parse("redis+module://127.0.0.1:6390/0").expect("ok"),
            BackendUrl::RedisModule("redis://127.0.0.1:6390/0".into())
        );
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_schemes() {
        let abs = BackendUrl::parse("sqlite:///tmp/x.db").expect("ok");
        assert_eq!(abs, BackendUrl::Sqlite(PathBuf::from("/tmp/x.db")));
        let rel = BackendUrl::parse("sqlite://data/x.db").expect("ok");
        assert_eq!(rel, BackendUrl::Sqlite(PathBuf::from("data/x.db")));
        for bad in ["sqlite://", "sqlite://:memory:"] {
            assert!(invalid_url(bad).contains("file path"), "{bad}");
        }
    }

    #[test]
    fn unknown_schemes_name_every_scheme() {
        for bad in ["mysql://h/db", "no-scheme", "etcd://h"] {
            let msg = invalid_url(bad);
            assert!(
                msg.contains("postgres://")
                    && msg.contains("redis://")
                    && msg.contains("sqlite://")
                    && msg.contains("redis+module://"),
                "{msg}"
            );
        }
    }

    /// A known scheme whose backend is compiled out names the feature to
    /// enable; one compiled in parses. Runs meaningfully in every build.
    #[test]
    fn compiled_out_schemes_name_their_feature() {
        let cases = [
            ("postgres://h/db", "postgres", cfg!(feature = "postgres")),
            ("postgresql://h/db", "postgres", cfg!(feature = "postgres")),
            ("sqlite:///x.db", "sqlite", cfg!(feature = "sqlite")),
            ("redis://h", "redis", cfg!(feature = "redis")),
            ("redis+module://h", "redis", cfg!(feature = "redis")),
        ];
        for (url, feature, enabled) in cases {
            if enabled {
                assert!(BackendUrl::parse(url).is_ok(), "{url}");
            } else {
                let msg = invalid_url(url);
                assert!(msg.contains(&format!("cargo feature `{feature}`")), "{url}: {msg}");
            }
        }
    }
}
