//! Rust client for the leasefence coordinator, over gRPC.
//!
//! Two levels:
//! - [`Client`]'s one-call methods (`acquire`, `renew`, `release`, `status`)
//!   are a thin typed wrapper: refusals come back as
//!   [`leasefence_core::LeaseError`] values (busy, lease lost, ...), everything
//!   else (unreachable, internal) as [`ClientError::Transport`] or
//!   [`ClientError::Server`].
//! - Self-fencing sessions: [`Client::lease`] returns a [`Lease`] renewed in
//!   the background over the `KeepAlive` stream, whose [`Lease::lost`] fires
//!   when the lease can no longer be proven held — at a local deadline even
//!   if the coordinator is unreachable (the send time of the last successful
//!   renewal + TTL − a safety margin, see [`default_margin`]);
//!   [`Client::with_lease`] runs work under a lease and cancels it on loss.
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

mod deadline;
pub mod election;
mod keepalive;
mod session;
mod watch;

pub use deadline::{MARGIN_MIN, default_margin};
pub use election::{CAMPAIGN_WAIT_DEFAULT, Leader, LeaderChange, LeaderChanges};
pub use session::{Lease, LeaseConfig, WithLeaseError};
pub use watch::{LeaseWatch, Loss};

use std::time::Duration;

use leasefence_core::{Fence, Holder, Invalid, LeaseError, LeaseId, ResourceId, Token};
use leasefence_proto::status_to_error;
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use tonic::transport::{Channel, Endpoint};

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An expected refusal from the coordinator.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The input was refused before sending.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The coordinator could not be reached.
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
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// Connects to `url` (for example `http://127.0.0.1:7740`).
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        let transport = |message: String| ClientError::Transport {
            url: url.to_string(),
            message,
        };
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| Invalid::new("server", format!("must be a URL like http://127.0.0.1:7740: {e}")))?
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect().await.map_err(|e| transport(error_chain(&e)))?;
        Ok(Client {
            url: url.to_string(),
            inner: LeasesClient::new(channel),
        })
    }

    /// A handle on the generated gRPC client (cheap: channels are shared).
    pub(crate) fn grpc(&self) -> LeasesClient<Channel> {
        self.inner.clone()
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
        let reply = self
            .inner
            .clone()
            .acquire(req)
            .await
            .map_err(|s| self.map(resource, s))?;
        self.lease_info(resource, reply.into_inner())
    }

    pub async fn renew(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        let req = pb::RenewRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self.inner.clone().renew(req).await.map_err(|s| self.map(resource, s))?;
        self.lease_info(resource, reply.into_inner())
    }

    /// Releases the lease; returns its token.
    pub async fn release(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ClientError> {
        let req = pb::ReleaseRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_hex(),
        };
        let reply = self
            .inner
            .clone()
            .release(req)
            .await
            .map_err(|s| self.map(resource, s))?;
        Token::new(reply.into_inner().token).ok_or_else(|| ClientError::Server("released token 0".into()))
    }

    pub async fn status(&self, resource: &ResourceId) -> Result<StatusInfo, ClientError> {
        let req = pb::GetRequest {
            resource: resource.to_string(),
        };
        let s = self
            .inner
            .clone()
            .get(req)
            .await
            .map_err(|s| self.map(resource, s))?
            .into_inner();
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
