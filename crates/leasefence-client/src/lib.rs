//! Rust client for the leasefence coordinator, over gRPC.
//!
//! Two levels:
//! - [`Client`]'s one-call methods (`acquire`, `renew`, `release`, `status`)
//!   are a thin typed wrapper: refusals come back as
//!   [`leasefence_core::LeaseError`] values (busy, lease lost, ...), everything
//!   else (unreachable, no answer in time, internal) as
//!   [`ClientError::Transport`] or [`ClientError::Server`].
//! - Nothing waits without bound ([`ClientOptions`]): each one-call method
//!   has a deadline (default 10 s, plus the wait of an acquire that waits),
//!   and every connection sends HTTP/2 keep-alive pings, so a coordinator
//!   that stops answering — even without closing the connection — becomes a
//!   transport error instead of a hang. Streams rely on the pings alone.
//! - Self-fencing sessions: [`Client::lease`] returns a [`Lease`] renewed in
//!   the background over the `KeepAlive` stream, whose [`Lease::lost`] fires
//!   when the lease can no longer be proven held — at a local deadline even
//!   if the coordinator is unreachable (the send time of the last successful
//!   renewal + TTL − a safety margin, see [`default_margin`]; at least
//!   [`MARGIN_MIN`]); [`Client::with_lease`] runs work under a lease and
//!   cancels it on loss. The deadline is kept on [`SystemClock`]:
//!   `CLOCK_BOOTTIME` on Linux, so time the machine spent suspended counts
//!   as elapsed, as it does for the coordinator ([`clock`]).
//! - Leader election ([`election`]): [`Client::campaign`] blocks until this
//!   client leads a name and returns a [`Leader`] whose term is its fencing
//!   token; [`Client::observe`] streams [`LeaderChange`]s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasefence_client::{Client, LeaseConfig};
//! use leasefence_core::ResourceId;
//!
//! let client = Client::connect("http://127.0.0.1:7740").await?;
//! let resource = ResourceId::new("reports/daily")?;
//! let config = LeaseConfig::new(Duration::from_secs(10)).with_wait(Duration::from_secs(30));
//! let written = client
//!     .with_lease(&resource, config, |fence| async move {
//!         // Every effect carries `fence`; an arbiter rejects it once a newer token wrote.
//!         format!("written under {fence}")
//!     })
//!     .await?;
//! # let _ = written;
//! # Ok(())
//! # }
//! ```

pub mod clock;
mod deadline;
pub mod election;
mod keepalive;
mod options;
mod session;
mod watch;

pub use clock::{Clock, ClockSource, Stamp, SystemClock, TokioClock};
pub use deadline::{DEFAULT_MARGIN_FLOOR, MARGIN_MIN, default_margin};
pub use election::{CAMPAIGN_WAIT_DEFAULT, Leader, LeaderChange, LeaderChanges};
pub use options::{
    CALL_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, ClientOptions, KEEP_ALIVE_INTERVAL_DEFAULT,
    KEEP_ALIVE_TIMEOUT_DEFAULT,
};
pub use session::{Lease, LeaseConfig, WithLeaseError};
pub use watch::{LeaseWatch, Loss};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasefence_core::{Fence, Holder, Invalid, LeaseError, LeaseId, ResourceId, Token};
use leasefence_proto::status_to_error;
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use tonic::transport::Channel;

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An expected refusal from the coordinator.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The input was refused before sending.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The coordinator could not be reached, or did not answer in time.
    #[error("cannot reach the coordinator at {url}: {message}")]
    Transport { url: String, message: String },
    /// The coordinator answered with an error that is not a lease outcome.
    #[error("coordinator error: {0}")]
    Server(String),
}

/// A lease as the coordinator answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub resource: ResourceId,
    pub token: Token,
    pub lease_id: LeaseId,
    pub holder: Holder,
    pub ttl: Duration,
    pub expires_in: Duration,
}

impl LeaseInfo {
    pub fn fence(&self) -> Fence {
        Fence::new(self.resource.clone(), self.token)
    }
}

/// A resource's state, as `leasefence status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusInfo {
    pub resource: ResourceId,
    pub last_token: Option<Token>,
    /// `(holder, token, expires_in)` while held.
    pub held: Option<(Holder, Token, Duration)>,
    pub waiters: u32,
}

#[derive(Clone, Debug)]
pub struct Client {
    url: String,
    inner: LeasesClient<Channel>,
    options: ClientOptions,
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// Connects to `url` (for example `http://127.0.0.1:7740`) with the
    /// default [`ClientOptions`].
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        Client::connect_with(url, ClientOptions::default()).await
    }

    /// Connects to `url` with `options`; connecting is bounded by the call
    /// timeout as well as the connect timeout.
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        options.check()?;
        let endpoint = options.endpoint(url)?;
        let channel = match tokio::time::timeout(options.call_timeout(), endpoint.connect()).await {
            Ok(connected) => connected.map_err(|e| ClientError::Transport {
                url: url.to_string(),
                message: error_chain(&e),
            })?,
            Err(_) => {
                return Err(ClientError::Transport {
                    url: url.to_string(),
                    message: format!("not connected within {} ms", options.call_timeout().as_millis()),
                });
            }
        };
        Ok(Client {
            url: url.to_string(),
            inner: LeasesClient::new(channel),
            options,
        })
    }

    /// The settings this client was connected with.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// The clock of this client's self-fencing deadlines.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.options.clock()
    }

    /// The generated gRPC client on this client's connection (cheap:
    /// channels are shared). Keep-alive pings apply; per-call deadlines do
    /// not: bound unary calls yourself.
    pub fn grpc(&self) -> LeasesClient<Channel> {
        self.inner.clone()
    }

    /// Runs one unary call with a deadline of `limit`; an answer that does
    /// not come in time is a transport error (the call is cancelled).
    async fn call<T>(
        &self,
        resource: &ResourceId,
        limit: Duration,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer
                .map(tonic::Response::into_inner)
                .map_err(|s| self.map(resource, s)),
            Err(_) => Err(ClientError::Transport {
                url: self.url.clone(),
                message: format!("no answer within {} ms (the call timeout)", limit.as_millis()),
            }),
        }
    }

    fn map(&self, resource: &ResourceId, s: tonic::Status) -> ClientError {
        if let Some(e) = status_to_error(resource, &s) {
            return ClientError::Lease(e);
        }
        match s.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown if s.message().contains("transport") => {
                ClientError::Transport {
                    url: self.url.clone(),
                    message: s.message().to_string(),
                }
            }
            tonic::Code::Unavailable => ClientError::Transport {
                url: self.url.clone(),
                message: s.to_string(),
            },
            _ => ClientError::Server(s.to_string()),
        }
    }

    fn lease_info(&self, resource: &ResourceId, l: pb::Lease) -> Result<LeaseInfo, ClientError> {
        let bad = |what: &str| ClientError::Server(format!("coordinator sent a malformed lease: {what}"));
        Ok(LeaseInfo {
            resource: resource.clone(),
            token: Token::new(l.token).ok_or_else(|| bad("token 0"))?,
            lease_id: LeaseId::parse_hex(&l.lease_id).map_err(|_| bad("lease_id"))?,
            holder: Holder::new(&l.holder).map_err(|_| bad("holder"))?,
            ttl: Duration::from_millis(l.ttl_ms),
            expires_in: Duration::from_millis(l.expires_in_ms),
        })
    }

    /// Acquires `resource` for `ttl`, waiting up to `wait` (zero: fail at once if busy).
    pub async fn acquire(
        &self,
        resource: &ResourceId,
        ttl: Duration,
        holder: Option<&Holder>,
        wait: Duration,
    ) -> Result<LeaseInfo, ClientError> {
        let config = LeaseConfig::new(ttl).with_wait(wait);
        let config = match holder {
            Some(h) => config.with_holder(h.clone()),
            None => config,
        };
        self.acquire_with(resource, &config).await
    }

    /// Acquires `resource` once as `config` says (TTL, wait, holder,
    /// lock-delay), without a keep-alive: see [`Client::lease`] for that.
    pub async fn acquire_with(&self, resource: &ResourceId, config: &LeaseConfig) -> Result<LeaseInfo, ClientError> {
        let req = pb::AcquireRequest {
            resource: resource.to_string(),
            ttl_ms: duration_ms(config.ttl()),
            holder: config.holder().map(|h| h.to_string()).unwrap_or_default(),
            wait_ms: duration_ms(config.wait()),
            lock_delay_ms: duration_ms(config.lock_delay()),
        };
        // The coordinator may hold the call for `wait` before it answers.
        let limit = config.wait().saturating_add(self.options.call_timeout());
        let reply = self.call(resource, limit, self.grpc().acquire(req)).await?;
        self.lease_info(resource, reply)
    }

    pub async fn renew(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        let req = pb::RenewRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self
            .call(resource, self.options.call_timeout(), self.grpc().renew(req))
            .await?;
        self.lease_info(resource, reply)
    }

    /// Releases the lease; returns its token.
    pub async fn release(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ClientError> {
        let req = pb::ReleaseRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self
            .call(resource, self.options.call_timeout(), self.grpc().release(req))
            .await?;
        Token::new(reply.token).ok_or_else(|| ClientError::Server("released token 0".into()))
    }

    pub async fn status(&self, resource: &ResourceId) -> Result<StatusInfo, ClientError> {
        let req = pb::GetRequest {
            resource: resource.to_string(),
        };
        let s = self
            .call(resource, self.options.call_timeout(), self.grpc().get(req))
            .await?;
        let held = match s.held {
            None => None,
            Some(h) => Some((
                Holder::new(&h.holder).map_err(|_| ClientError::Server("malformed holder".into()))?,
                Token::new(h.token).ok_or_else(|| ClientError::Server("held token 0".into()))?,
                Duration::from_millis(h.expires_in_ms),
            )),
        };
        Ok(StatusInfo {
            resource: resource.clone(),
            last_token: Token::new(s.last_token),
            held,
            waiters: s.waiters,
        })
    }
}

/// The error and its causes on one line ("connection refused" hides in a source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
