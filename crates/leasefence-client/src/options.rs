//! How a [`crate::Client`] talks to the coordinator: per-call deadlines,
//! HTTP/2 keep-alive pings, and the clock of self-fencing deadlines.
//!
//! Nothing a client does waits without bound. A one-call method
//! (`acquire`, `renew`, `release`, `status`) fails with
//! [`crate::ClientError::Transport`] once its call timeout has passed
//! without an answer; an acquire that waits for a busy resource gets its
//! wait on top. Streams (`KeepAlive`, `Watch`) have no whole-call deadline —
//! they are meant to last — and rely on keep-alive pings instead: a
//! connection that answers no ping within the keep-alive timeout is closed,
//! which ends every stream on it with a transport error.
//!
//! With a bearer token ([`ClientOptions::with_token`]) every call carries
//! `authorization: Bearer <token>`, for a coordinator with access control.
//! The token is never printed, `Debug` included.

use std::sync::Arc;
use std::time::Duration;

use leasefence_core::Invalid;
use tonic::transport::Endpoint;

use crate::clock::{Clock, default_clock};
use crate::tls::ClientTls;

/// Default per-call deadline.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default TCP connect deadline.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default quiet time on a connection after which a ping is sent.
pub const KEEP_ALIVE_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default time a ping may go unanswered before the connection is closed.
pub const KEEP_ALIVE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// Connection settings of a [`crate::Client`]; see [`crate::Client::connect_with`].
///
/// ```
/// use std::time::Duration;
/// use leasefence_client::ClientOptions;
///
/// let options = ClientOptions::default().with_call_timeout(Duration::from_secs(2));
/// assert_eq!(options.call_timeout(), Duration::from_secs(2));
/// ```
#[derive(Clone, Debug)]
pub struct ClientOptions {
    call_timeout: Duration,
    connect_timeout: Duration,
    keep_alive_interval: Duration,
    keep_alive_timeout: Duration,
    clock: Arc<dyn Clock>,
    token: Credentials,
    tls: Option<ClientTls>,
}

impl Default for ClientOptions {
    /// 10 s per call, 5 s to connect, a ping after 5 s of quiet answered
    /// within 5 s, and [`crate::SystemClock`].
    fn default() -> ClientOptions {
        ClientOptions {
            call_timeout: CALL_TIMEOUT_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            keep_alive_interval: KEEP_ALIVE_INTERVAL_DEFAULT,
            keep_alive_timeout: KEEP_ALIVE_TIMEOUT_DEFAULT,
            clock: default_clock(),
            token: Credentials::default(),
            tls: None,
        }
    }
}

impl ClientOptions {
    /// How long a one-call method waits for its answer (plus the wait of an
    /// acquire that waits). Also bounds connecting.
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> ClientOptions {
        self.call_timeout = call_timeout;
        self
    }

    /// How long a TCP connect may take.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> ClientOptions {
        self.connect_timeout = connect_timeout;
        self
    }

    /// HTTP/2 keep-alive: a ping after `interval` without traffic (on idle
    /// connections too); the connection is closed if it goes unanswered
    /// for `timeout`.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> ClientOptions {
        self.keep_alive_interval = interval;
        self.keep_alive_timeout = timeout;
        self
    }

    /// The clock self-fencing deadlines are kept on (default
    /// [`crate::SystemClock`]: `CLOCK_BOOTTIME` on Linux). Tests inject
    /// [`crate::TokioClock`] to drive deadlines with paused time.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> ClientOptions {
        self.clock = clock;
        self
    }

    /// Sends `token` as `authorization: Bearer <token>` on every call.
    pub fn with_token(mut self, token: impl Into<String>) -> ClientOptions {
        self.token = Credentials {
            token: Some(token.into()),
        };
        self
    }

    /// The interceptor that adds the token to each call.
    pub fn credentials(&self) -> &Credentials {
        &self.token
    }

    /// The CA to trust and the client certificate to present on `https://`
    /// coordinators (default: the system's roots, no client certificate).
    pub fn with_tls(mut self, tls: ClientTls) -> ClientOptions {
        self.tls = Some(tls);
        self
    }

    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub fn keep_alive_interval(&self) -> Duration {
        self.keep_alive_interval
    }

    pub fn keep_alive_timeout(&self) -> Duration {
        self.keep_alive_timeout
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Refuses settings under which calls or connections could never succeed.
    pub(crate) fn check(&self) -> Result<(), Invalid> {
        let positive = [
            ("call_timeout", self.call_timeout),
            ("connect_timeout", self.connect_timeout),
            ("keep_alive_interval", self.keep_alive_interval),
            ("keep_alive_timeout", self.keep_alive_timeout),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(Invalid::new(field, "must be more than zero"));
            }
        }
        if let Some(t) = &self.token.token
            && (t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(Invalid::new(
                "token",
                "must be 1 or more visible ASCII characters (no spaces or control characters)",
            ));
        }
        Ok(())
    }

    /// The tonic endpoint for `url` with these settings: TLS for `https://`.
    pub(crate) fn endpoint(&self, url: &str) -> Result<Endpoint, Invalid> {
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| Invalid::new("server", format!("must be a URL like http://127.0.0.1:7740: {e}")))?;
        if url.starts_with("https://") {
            let config = self.tls.clone().unwrap_or_default().config();
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| Invalid::new("server", format!("{url}: cannot set up TLS: {e}")))?;
        }
        Ok(endpoint
            .connect_timeout(self.connect_timeout)
            .http2_keep_alive_interval(self.keep_alive_interval)
            .keep_alive_timeout(self.keep_alive_timeout)
            .keep_alive_while_idle(true))
    }
}

/// The bearer token of every call, as a tonic interceptor; `Debug` hides it.
#[derive(Clone, Default)]
pub struct Credentials {
    token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.token.is_some() { "<token>" } else { "none" };
        write!(f, "Credentials({shown})")
    }
}

impl Credentials {
    /// The bearer token, for transports other than gRPC's interceptor.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            // `check` made sure the token is visible ASCII.
            let mut value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| tonic::Status::invalid_argument("the token must be visible ASCII"))?;
            value.set_sensitive(true);
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_kept_on_the_system_clock_by_default() {
        let expected = if cfg!(target_os = "linux") {
            crate::ClockSource::BootTime
        } else {
            crate::ClockSource::Monotonic
        };
        assert_eq!(ClientOptions::default().clock().source(), expected);
    }

    #[test]
    fn zero_durations_are_refused_by_name() {
        assert!(ClientOptions::default().check().is_ok());
        let e = ClientOptions::default()
            .with_call_timeout(Duration::ZERO)
            .check()
            .unwrap_err();
        assert_eq!(e.field(), "call_timeout");
        let e = ClientOptions::default()
            .with_keep_alive(Duration::from_secs(1), Duration::ZERO)
            .check()
            .unwrap_err();
        assert_eq!(e.field(), "keep_alive_timeout");
    }

    #[test]
    fn the_token_is_checked_and_never_printed() {
        let o = ClientOptions::default().with_token("s3cret-token");
        assert!(o.check().is_ok());
        assert!(!format!("{o:?}").contains("s3cret"), "{o:?}");
        for bad in ["", "has space", "tab\t"] {
            let e = ClientOptions::default().with_token(bad).check().unwrap_err();
            assert_eq!(e.field(), "token", "{bad:?}");
        }
        let mut c = o.credentials().clone();
        let r = tonic::service::Interceptor::call(&mut c, tonic::Request::new(())).expect("ok");
        assert_eq!(
            r.metadata().get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer s3cret-token")
        );
    }
}
