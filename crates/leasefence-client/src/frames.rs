//! [`FrameClient`]: the one-call methods over the frame protocol
//! (`leasefence://HOST:PORT`, or `leasefences://` over TLS), for callers that
//! make many short cycles and want the least transport cost per call. The
//! coordinator serves it with `serve --frames-listen`.
//!
//! Answers and refusals are the same values as [`crate::Client`]'s. What it
//! does not do (use [`crate::Client`] for these): keep-alive sessions,
//! watches, elections, force-release, and following a standby's leader
//! hint — a standby's refusal comes back as [`ClientError::Transport`]
//! naming the active coordinator's advertised URL.
//!
//! Connections: one call in flight on each; a call takes an idle connection
//! or opens one, and gives it back after a whole answer, so concurrent
//! callers on one client (it is cheap to clone) each get their own. Every
//! call has the deadline of [`ClientOptions::call_timeout`] (plus the wait
//! of an acquire); a connection whose call failed or timed out is dropped.
//!
//! Retries follow the rules of the gRPC client: a call whose connection
//! could not be opened was never sent, and fails with nothing done. On an
//! idle connection the coordinator may have closed meanwhile (after a
//! restart, say), `renew`, `release` and `status` are tried once more on a
//! new connection; `acquire` is not, since the grant may have happened: the
//! error says the outcome is unknown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasefence_core::{Holder, Invalid, LeaseId, ResourceId, Token};
use leasefence_proto::frame::{self, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::{ClientError, ClientOptions, LeaseInfo, StatusInfo};

/// Idle connections kept for reuse; more are closed when given back.
const IDLE_MAX: usize = 64;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One open connection, past its `Hello`.
struct Conn {
    io: BufReader<Box<dyn Io>>,
    buf: Vec<u8>,
}

/// A client of one coordinator over the frame protocol; cheap to clone.
#[derive(Clone)]
pub struct FrameClient {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    /// `host:port`.
    addr: String,
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    options: ClientOptions,
    idle: Mutex<Vec<Conn>>,
}

impl std::fmt::Debug for FrameClient {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameClient").field("url", &self.inner.url).finish()
    }
}

/// Whether a call may be sent again after a failure that leaves its outcome unknown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Safety {
    Once,
    Idempotent,
}

impl FrameClient {
    /// Connects to `url` (`leasefence://HOST:PORT` or `leasefences://HOST:PORT`)
    /// with `options` (its token, TLS settings and timeouts), and fails if
    /// the coordinator cannot be reached or refuses the connection.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<FrameClient, ClientError> {
        options.check()?;
        let (tls, addr) = parse_url(url)?;
        let tls = match tls {
            false => None,
            true => {
                let config = options.tls().cloned().unwrap_or_default().rustls_config()?;
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
                let name = rustls::pki_types::ServerName::try_from(host)
                    .map_err(|e| Invalid::new("server", format!("{url}: {e}")))?;
                Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
            }
        };
        let client = FrameClient {
            inner: Arc::new(Inner {
                url: url.to_string(),
                addr,
                tls,
                options,
                idle: Mutex::new(Vec::new()),
            }),
        };
        let conn = client.open().await?;
        client.put_back(conn);
        Ok(client)
    }

    /// The URL this client was connected with.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Acquires `resource` for `ttl`, waiting up to `wait` (zero: fail at
    /// once if busy), as [`crate::Client::acquire`].
    pub async fn acquire(
        &self,
        resource: &ResourceId,
        ttl: Duration,
        holder: Option<&Holder>,
        wait: Duration,
    ) -> Result<LeaseInfo, ClientError> {
        let req = Request::Acquire {
            resource: resource.to_string(),
            holder: holder.map(|h| h.to_string()).unwrap_or_default(),
            ttl_ms: millis(ttl),
            wait_ms: millis(wait),
            lock_delay_ms: 0,
        };
        let limit = wait.saturating_add(self.inner.options.call_timeout());
        let answer = self.call(resource, &req, limit, Safety::Once).await?;
        lease_info(resource, answer)
    }

    pub async fn renew(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        let req = Request::Renew {
            resource: resource.to_string(),
            lease_id: *lease_id,
        };
        let answer = self.call(resource, &req, self.timeout(), Safety::Idempotent).await?;
        lease_info(resource, answer)
    }

    /// Releases the lease; returns its token.
    pub async fn release(&self, resource: &ResourceId, lease_id: &LeaseId) -> Result<Token, ClientError> {
        let req = Request::Release {
            resource: resource.to_string(),
            lease_id: *lease_id,
        };
        match self.call(resource, &req, self.timeout(), Safety::Idempotent).await? {
            Response::Released { token } => Token::new(token).ok_or_else(|| server("released token 0")),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn status(&self, resource: &ResourceId) -> Result<StatusInfo, ClientError> {
        let req = Request::Status {
            resource: resource.to_string(),
        };
        let Response::Status {
            last_token,
            held,
            waiters,
        } = self.call(resource, &req, self.timeout(), Safety::Idempotent).await?
        else {
            return Err(server("the answer to a status request was not a status"));
        };
        let held = match held {
            None => None,
            Some(h) => Some((
                Holder::new(&h.holder).map_err(|_| server("malformed holder"))?,
                Token::new(h.token).ok_or_else(|| server("held token 0"))?,
                Duration::from_millis(h.expires_in_ms),
            )),
        };
        Ok(StatusInfo {
            resource: resource.clone(),
            last_token: Token::new(last_token),
            held,
            waiters,
        })
    }

    fn timeout(&self) -> Duration {
        self.inner.options.call_timeout()
    }

    /// Sends `req` and reads its answer within `limit`, retrying once on a
    /// new connection where `safety` allows (see the module docs).
    async fn call(
        &self,
        resource: &ResourceId,
        req: &Request,
        limit: Duration,
        safety: Safety,
    ) -> Result<Response, ClientError> {
        let pooled = self.take_idle();
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open().await?,
        };
        let mut sent = exchange(&mut conn, req, limit).await;
        if reused && safety == Safety::Idempotent && matches!(sent, Err(Exchange::Io(_) | Exchange::Closed)) {
            conn = self.open().await?;
            sent = exchange(&mut conn, req, limit).await;
        }
        match sent {
            Ok(Response::Refused(r)) => {
                self.put_back(conn);
                Err(self.refusal(resource, r))
            }
            Ok(answer) => {
                self.put_back(conn);
                Ok(answer)
            }
            Err(e) => Err(self.transport(e.describe(limit, safety))),
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        self.inner.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put_back(&self, conn: Conn) {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_MAX {
            idle.push(conn);
        }
    }

    /// A new connection, through its `Hello`, within the connect timeout.
    async fn open(&self) -> Result<Conn, ClientError> {
        let limit = self.inner.options.connect_timeout();
        match tokio::time::timeout(limit, self.handshake()).await {
            Ok(opened) => opened,
            Err(_) => Err(self.transport(format!("not connected within {} ms", limit.as_millis()))),
        }
    }

    async fn handshake(&self) -> Result<Conn, ClientError> {
        let inner = &self.inner;
        let tcp = TcpStream::connect(&inner.addr)
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        // Each request is one small write its caller waits on.
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match &inner.tls {
            None => Box::new(tcp),
            Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await.map_err(|e| {
                self.transport(format!(
                    "TLS handshake failed ({e}); is the port plaintext? then use leasefence://"
                ))
            })?),
        };
        let mut conn = Conn {
            io: BufReader::new(io),
            buf: Vec::with_capacity(256),
        };
        let hello = Request::Hello {
            version: frame::VERSION,
            token: inner.options.credentials().token().map(str::to_string),
        };
        let limit = inner.options.connect_timeout();
        match exchange(&mut conn, &hello, limit).await {
            Ok(Response::Welcome { .. }) => Ok(conn),
            Ok(Response::Refused(r)) if r.kind == "tls_required" => Err(self.transport(r.message)),
            Ok(Response::Refused(r)) => Err(match r.kind.as_str() {
                "unauthenticated" | "permission_denied" | "limit_exceeded" => ClientError::Refused {
                    kind: r.kind,
                    message: r.message,
                },
                _ => self.transport(format!("refused the connection ({}): {}", r.kind, r.message)),
            }),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(self.transport(e.describe(limit, Safety::Idempotent))),
        }
    }

    fn transport(&self, message: String) -> ClientError {
        ClientError::Transport {
            url: self.inner.url.clone(),
            message,
        }
    }

    /// The error a refusal stands for, as the gRPC client reports it.
    fn refusal(&self, resource: &ResourceId, r: frame::Refusal) -> ClientError {
        if let Some(e) = r.to_lease(resource) {
            return ClientError::Lease(e);
        }
        match r.kind.as_str() {
            "unauthenticated" | "permission_denied" | "limit_exceeded" => ClientError::Refused {
                kind: r.kind,
                message: r.message,
            },
            "not_leader" | "unavailable" | "outcome_unknown" => self.transport(r.message),
            _ => ClientError::Server(r.message),
        }
    }
}

/// Why an exchange failed.
enum Exchange {
    Io(std::io::Error),
    Malformed(frame::FrameError),
    Closed,
    Timeout,
}

impl Exchange {
    fn describe(self, limit: Duration, safety: Safety) -> String {
        let what = match self {
            Exchange::Io(e) => e.to_string(),
            Exchange::Malformed(e) => format!("malformed answer: {e}"),
            Exchange::Closed => "the coordinator closed the connection".to_string(),
            Exchange::Timeout => format!("no answer within {} ms (the call timeout)", limit.as_millis()),
        };
        match safety {
            Safety::Idempotent => what,
            Safety::Once => format!("{what}; the request may have been carried out (outcome unknown)"),
        }
    }
}

/// Writes `req` and reads one answer on `conn`, within `limit`.
async fn exchange(conn: &mut Conn, req: &Request, limit: Duration) -> Result<Response, Exchange> {
    let round = async {
        frame::encode_request(req, &mut conn.buf);
        conn.io.write_all(&conn.buf).await.map_err(Exchange::Io)?;
        conn.io.flush().await.map_err(Exchange::Io)?;
        match frame::read_frame(&mut conn.io, &mut conn.buf).await {
            Ok(true) => frame::decode_response(&conn.buf).map_err(Exchange::Malformed),
            Ok(false) => Err(Exchange::Closed),
            Err(e) => Err(Exchange::Io(e)),
        }
    };
    match tokio::time::timeout(limit, round).await {
        Ok(answer) => answer,
        Err(_) => Err(Exchange::Timeout),
    }
}

/// `(tls, "host:port")` of a `leasefence(s)://HOST:PORT` URL.
fn parse_url(url: &str) -> Result<(bool, String), Invalid> {
    let allowed = "allowed: leasefence://HOST:PORT or leasefences://HOST:PORT (TLS)";
    let (tls, rest) = if let Some(rest) = url.strip_prefix("leasefences://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("leasefence://") {
        (false, rest)
    } else {
        return Err(Invalid::new("server", format!("{url:?} is not a frame URL; {allowed}")));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let port = rest.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(p))) if !host.is_empty() && p != 0 && !rest.contains('/') && !rest.contains('@') => {
            Ok((tls, rest.to_string()))
        }
        _ => Err(Invalid::new(
            "server",
            format!("{url:?} names no host and port; {allowed}"),
        )),
    }
}

fn lease_info(resource: &ResourceId, answer: Response) -> Result<LeaseInfo, ClientError> {
    let (token, lease_id, holder, ttl_ms, expires_in_ms, signature) = match answer {
        Response::Lease {
            token,
            lease_id,
            holder,
            ttl_ms,
            expires_in_ms,
            signature,
        } => (token, lease_id, holder, ttl_ms, expires_in_ms, signature),
        other => return Err(unexpected(&other)),
    };
    Ok(LeaseInfo {
        resource: resource.clone(),
        token: Token::new(token).ok_or_else(|| server("granted token 0"))?,
        lease_id,
        holder: Holder::new(&holder).map_err(|_| server("malformed holder"))?,
        ttl: Duration::from_millis(ttl_ms),
        expires_in: Duration::from_millis(expires_in_ms),
        signature: Some(signature).filter(|s| !s.is_empty()),
    })
}

fn unexpected(r: &Response) -> ClientError {
    server(&format!("unexpected answer {r:?}"))
}

fn server(message: &str) -> ClientError {
    ClientError::Server(message.to_string())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn frame_urls_are_checked() {
        assert_eq!(
            parse_url("leasefence://127.0.0.1:7741"),
            Ok((false, "127.0.0.1:7741".into()))
        );
        assert_eq!(
            parse_url("leasefences://coord.example:7741/"),
            Ok((true, "coord.example:7741".into()))
        );
        assert_eq!(parse_url("leasefence://[::1]:7741"), Ok((false, "[::1]:7741".into())));
        for bad in [
            "http://127.0.0.1:7740",
            "leasefence://127.0.0.1",
            "leasefence://:7741",
            "leasefence://h:0",
            "leasefence://h:99999",
            "leasefence://u@h:1",
            "leasefence://h:1/path",
        ] {
            let e = parse_url(bad).expect_err(bad);
            assert_eq!(e.field(), "server", "{bad}");
        }
    }
}
