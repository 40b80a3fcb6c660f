//! Access control end to end over HTTP and gRPC: who is refused (401, 403),
//! whose lease is whose, force-release, and the limits.

mod ownership;
mod read_views;
mod refusals;
mod support;
