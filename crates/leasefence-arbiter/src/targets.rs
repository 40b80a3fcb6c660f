//! [`ConformanceTarget`](crate::ConformanceTarget)s for every backend (each
//! behind its backend's cargo feature): the
//! backend's real admit path plus a small effect model (a key-value table and
//! a per-resource history of committed tokens) written in the same atomic unit.
//!
//! Each target gets a random namespace (and, for SQL, randomly named effect
//! tables), so targets may run side by side against one database; `cleanup`
//! removes exactly what the target created.

#[cfg(feature = "embedded")]
mod embedded;
#[cfg(feature = "gateway")]
mod gateway;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "embedded")]
pub use embedded::EmbeddedTarget;
#[cfg(feature = "gateway")]
pub use gateway::GatewayTarget;
#[cfg(feature = "postgres")]
pub use postgres::PostgresTarget;
#[cfg(feature = "redis")]
pub use redis::RedisTarget;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteTarget;

/// A fresh namespace for fence keys: `leasefence-check/<random>/`.
pub fn fresh_namespace() -> String {
    format!("leasefence-check/{}/", crate::rng::hex_suffix())
}
