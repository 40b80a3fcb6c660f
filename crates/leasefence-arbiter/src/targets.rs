//! [`ConformanceTarget`](crate::ConformanceTarget)s for every backend: the
//! backend's real admit path plus a small effect model (a key-value table and
//! a per-resource history of committed tokens) written in the same atomic unit.
//!
//! Each target gets a random namespace (and, for SQL, randomly named effect
//! tables), so targets may run side by side against one database; `cleanup`
//! removes exactly what the target created.

mod embedded;
#[cfg(feature = "gateway")]
mod gateway;
mod postgres;
mod redis;
mod sqlite;

pub use embedded::EmbeddedTarget;
#[cfg(feature = "gateway")]
pub use gateway::GatewayTarget;
pub use postgres::PostgresTarget;
pub use redis::RedisTarget;
pub use sqlite::SqliteTarget;

/// A fresh namespace for fence keys: `leasefence-check/<random>/`.
pub fn fresh_namespace() -> String {
    format!("leasefence-check/{}/", crate::rng::hex_suffix())
}
