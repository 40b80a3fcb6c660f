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
//! - TLS: an `https://` coordinator is spoken to over TLS, trusting the
//!   system's roots or the CA given in [`ClientTls`] (with a client
//!   certificate for mutual TLS), set with [`ClientOptions::with_tls`]. A
//!   plaintext client on a TLS port, or a TLS client on a plaintext one,
//!   fails at once with a [`ClientError::Transport`] saying which.
//! - The frame protocol ([`FrameClient`], `leasefence://HOST:PORT`): the
//!   same one-call methods over the coordinator's lean binary port, for
//!   many short cycles at the least transport cost per call.
//! - Leader election ([`election`]): [`Client::campaign`] blocks until this
//!   client leads a name and returns a [`Leader`] whose term is its fencing
//!   token; [`Client::observe`] streams [`LeaderChange`]s.
//!
//! # Several coordinators
//!
//! Coordinators run highly available as one active and standbys over a
//! shared store. [`Client::connect_any`] takes them all; it connects to each
//! only when first needed, so some may be down. Calls go to the coordinator
//! believed active (at first the first one); a standby answers `UNAVAILABLE`
//! with the active one's URL in the [`META_LEADER`] metadata, and the client
//! switches to it (adding it to its list if it is a valid `http(s)` URL, up
//! to [`COORDINATORS_MAX`]) and retries at once. Without a hint, or when a
//! coordinator cannot be reached, it tries the next one after a short
//! backoff. All attempts together (at most two per coordinator known, at
//! least three) stay within the call's deadline. What is retried:
//!
//! - **Every call**, after an answer that proves nothing was done: a
//!   standby's not-leader refusal, or a failure to connect before the
//!   request was sent.
//! - **`renew`, `release`, `status`** (and opening a watch or a keep-alive
//!   stream), after any other transport failure too: a connection that
//!   broke after the request was sent, no answer in time (with several
//!   coordinators each attempt gets at most half the call timeout), a
//!   coordinator that cannot reach its store. Doing them twice is harmless;
//!   but a `release` that was carried out before its answer was lost
//!   answers [`LeaseError::LeaseLost`] when retried: the lease is gone
//!   either way.
//! - **`acquire` is not retried** after such an ambiguous failure: the grant
//!   may have happened, and the lease would then be held under a lease id
//!   the caller never learned until its TTL runs out. The error
//!   ([`ClientError::Transport`]) says so; acquire again when the resource
//!   is free, or after that TTL.
//!
//! A [`Lease`]'s keep-alive follows the same hints when its stream breaks,
//! stalls or is refused as not-leader, and goes on renewing on the new
//! active coordinator (which honours held leases after a takeover) until
//! its self-fencing deadline; a renewal refused as lease-lost still loses
//! the lease at once. Watches and observers resync after a takeover as
//! after a restart: the new coordinator has another `coordinator_id`.
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

mod calls;
pub mod clock;
mod coordinators;
mod deadline;
pub mod election;
pub mod frames;
mod keepalive;
mod options;
mod retry;
mod session;
mod tls;
mod watch;

pub use clock::{Clock, ClockSource, Stamp, SystemClock, TokioClock};
pub use coordinators::{COORDINATORS_MAX, META_LEADER, NOT_LEADER_PREFIX, URL_LEN_MAX, check_coordinator_url};
pub use deadline::{DEFAULT_MARGIN_FLOOR, MARGIN_MIN, default_margin};
pub use election::{CAMPAIGN_WAIT_DEFAULT, Leader, LeaderChange, LeaderChanges};
pub use frames::FrameClient;
pub use options::{
    CALL_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, ClientOptions, Credentials, KEEP_ALIVE_INTERVAL_DEFAULT,
    KEEP_ALIVE_TIMEOUT_DEFAULT,
};
pub use session::{Lease, LeaseConfig, WithLeaseError};

/// The generated gRPC client, sending the options' bearer token (if any) on every call.
pub type GrpcClient = LeasesClient<tonic::service::interceptor::InterceptedService<Channel, options::Credentials>>;
pub use tls::ClientTls;
pub use watch::{LeaseWatch, Loss};

use std::sync::Arc;
use std::time::Duration;

use leasefence_core::{Fence, Holder, Invalid, LeaseError, LeaseId, ResourceId, Token};
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use tonic::transport::Channel;

use crate::coordinators::Coordinators;
use crate::retry::{Failed, Safety};

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
    /// Refused by the coordinator's access control or a limit: `kind` is
    /// `unauthenticated`, `permission_denied` or `limit_exceeded`, and the
    /// message names what was missing (the verb and resource, the limit).
    #[error("refused ({kind}): {message}")]
    Refused { kind: String, message: String },
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
    /// The coordinator's signature over the fence, when it signs fences.
    pub signature: Option<String>,
}

impl LeaseInfo {
    /// The fence to carry with every effect, with its signature when there is one.
    pub fn fence(&self) -> Fence {
        let fence = Fence::new(self.resource.clone(), self.token);
        match &self.signature {
            Some(s) => fence.with_signature(s.clone()),
            None => fence,
        }
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

/// A client of one or more coordinators: cheap to clone (clones share the
/// connections and the belief of which coordinator is active).
#[derive(Clone, Debug)]
pub struct Client {
    coordinators: Arc<Coordinators>,
    options: ClientOptions,
}

impl Client {
    /// Connects to `url` (for example `http://127.0.0.1:7740`) with the
    /// default [`ClientOptions`].
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        Client::connect_with(url, ClientOptions::default()).await
    }

    /// Connects to `url` with `options`, and fails if it cannot; connecting
    /// is bounded by the call timeout as well as the connect timeout. If
    /// `url` turns out to be a standby, calls follow its leader hint as
    /// [`Client::connect_any_with`] describes.
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        options.check()?;
        check_coordinator_url(url)?;
        let endpoint = options.endpoint(url)?;
        let channel = match tokio::time::timeout(options.call_timeout(), endpoint.connect()).await {
            Ok(connected) => connected.map_err(|e| ClientError::Transport {
                url: url.to_string(),
                message: tls::mismatch(url, &e).unwrap_or_else(|| error_chain(&e)),
            })?,
            Err(_) => {
                return Err(ClientError::Transport {
                    url: url.to_string(),
                    message: format!("not connected within {} ms", options.call_timeout().as_millis()),
                });
            }
        };
        let coordinators = Coordinators::new(vec![(url.to_string(), channel)], options.clone());
        Ok(Client {
            coordinators: Arc::new(coordinators),
            options,
        })
    }

    /// A client of several coordinators (active and standbys on one store),
    /// with the default [`ClientOptions`]; see [`Client::connect_any_with`].
    pub async fn connect_any<S: AsRef<str>>(urls: &[S]) -> Result<Client, ClientError> {
        Client::connect_any_with(urls, ClientOptions::default()).await
    }

    /// A client of several coordinators. Nothing is connected yet (each
    /// connection is made when first used), so coordinators that are down
    /// do not stop it; only an empty or too long list (more than
    /// [`COORDINATORS_MAX`]) or an entry that is not an `http(s)://` URL is
    /// refused (field `server`). Duplicates count once. Calls go to the
    /// coordinator believed active (at first the first one given) and move
    /// on as the crate docs describe ("Several coordinators").
    pub async fn connect_any_with<S: AsRef<str>>(urls: &[S], options: ClientOptions) -> Result<Client, ClientError> {
        options.check()?;
        if urls.is_empty() {
            let allowed = "no coordinator given; allowed: one or more URLs like http://127.0.0.1:7740";
            return Err(Invalid::new("server", allowed).into());
        }
        let mut channels: Vec<(String, Channel)> = Vec::new();
        for url in urls {
            let url = url.as_ref();
            check_coordinator_url(url)?;
            if channels.iter().any(|(known, _)| known == url) {
                continue;
            }
            if channels.len() == COORDINATORS_MAX {
                let many = format!("more than {COORDINATORS_MAX} coordinators given");
                return Err(Invalid::new("server", many).into());
            }
            channels.push((url.to_string(), options.endpoint(url)?.connect_lazy()));
        }
        Ok(Client {
            coordinators: Arc::new(Coordinators::new(channels, options.clone())),
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

    /// The coordinators this client knows: those it was given, then those
    /// leader hints named.
    pub fn coordinators(&self) -> Vec<String> {
        self.coordinators.urls()
    }

    /// The coordinator the next call goes to first.
    pub fn active(&self) -> String {
        self.coordinators.pick().url
    }

    /// The generated gRPC client on the connection to the coordinator
    /// believed active (cheap: channels are shared). Keep-alive pings apply;
    /// per-call deadlines, leader hints and retries do not: bound unary
    /// calls yourself, or use [`Client::open_watch`] for watches.
    pub fn grpc(&self) -> GrpcClient {
        self.coordinators.pick().grpc
    }

    /// Opens a `Watch` stream on the active coordinator, following leader
    /// hints and trying the others as an idempotent call does (opening a
    /// watch changes nothing), within the call timeout. Errors are the
    /// coordinator's statuses (`FAILED_PRECONDITION`: the history to resume
    /// from is gone, as after a restart or a takeover), or `UNAVAILABLE`.
    pub async fn open_watch(
        &self,
        request: pb::WatchRequest,
    ) -> Result<tonic::Streaming<pb::WatchEvent>, tonic::Status> {
        let opened = self
            .attempts(self.options.call_timeout(), Safety::Idempotent, |mut grpc| {
                let request = request.clone();
                async move { grpc.watch(request).await }
            })
            .await;
        opened.map_err(|f| match f {
            Failed::Status { status, .. } => status,
            Failed::NoAnswer { url, limit, .. } => tonic::Status::unavailable(format!(
                "{url}: no answer within {} ms (the call timeout)",
                limit.as_millis()
            )),
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
