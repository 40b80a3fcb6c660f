//! Helpers shared by the integration tests.

pub mod pg;
pub mod proxy;
