//! Helpers shared by the integration tests.

pub mod pg;
pub mod pg_route;
pub mod proxy;
