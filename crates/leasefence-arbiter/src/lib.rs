//! Resource-side enforcement of leasefence fencing tokens: the *arbiters*.
//!
//! An arbiter keeps `last_token` per fence key durably and admits an effect only
//! if the arbiter rule holds (strict: `last < token`, monotonic: `last <= token`),
//! recording `last_token = token` in the **same atomic transaction** as the
//! effect. On reject nothing of the effect happens and the caller gets
//! [`ArbiterError::Stale`] carrying `resource`, `presented` and `current`.
//!
//! Backends, one module and one cargo feature each (all four on by default):
//! - `postgres`: the PL/pgSQL function `leasefence_admit` (usable from any
//!   language inside your own transaction) and Rust helpers around it;
//! - `sqlite`: the same contract inside a `rusqlite::Transaction`;
//! - `redis`: a Redis Functions library with fenced `SET`, `DEL`, `HSET`, `XADD`;
//! - `embedded`: an in-process fenced key-value store on redb;
//! - `gateway`: a fenced object store over HTTP, whose object bytes and
//!   fence commit together (on the embedded arbiter).
//!
//! Propagation layers, one feature each: `http` (axum extractors and
//! responses, a reqwest helper) and `grpc` (tonic interceptors and statuses),
//! both on [`propagate`]. The conformance suite, the pause kit, [`propagate`]
//! and the errors build without any feature.
//!
//! Queue consumers that apply messages through an arbiter: [`queue`] (what
//! happens to a message, whatever the broker), `nats` (JetStream, feature
//! `nats`) and `amqp` (RabbitMQ, feature `amqp`).
//!
//! Every backend passes the one [`conformance`] suite through [`ConformanceTarget`];
//! [`pause_kit`] runs the classic "paused holder" scenario against any target,
//! [`propagate`] carries a fence through HTTP headers, message headers and a
//! child's environment, and [`install`] / [`check`] dispatch on a URL for the
//! command line.

#[cfg(feature = "amqp")]
pub mod amqp;
mod dispatch;
#[cfg(feature = "embedded")]
pub mod embedded;
mod error;
#[cfg(feature = "gateway")]
pub mod gateway;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queue;
#[cfg(feature = "redis")]
pub mod redis;
// Without a backend nothing records rejections; the metric's API stays.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "redis", feature = "embedded")),
    allow(dead_code, unused_imports)
)]
mod reject;
mod rng;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub mod conformance;
pub mod pause_kit;
pub mod propagate;
pub mod targets;

pub use conformance::{ConformanceTarget, Outcome};
pub use dispatch::{BackendUrl, Installed, KeyChange, check, fence_keys, install};
pub use error::ArbiterError;
pub use pause_kit::{Counterexample, Report, pause_check};
pub use reject::{REJECTIONS_METRIC, SIGNATURE_REFUSALS_METRIC, set_rejection_prefix_segments};

pub use leasefence_core::signing::{FenceKey, SignatureError, Verifier};
pub use leasefence_core::{Fence, FenceMode, ResourceId, Stale, Token};
