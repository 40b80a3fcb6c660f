//! The frame edge: the lean binary protocol of [`leasefence_proto::frame`]
//! on a port of its own (`serve --frames-listen`), for clients that make
//! many short cycles. It answers acquire, renew, release and status with
//! the same engine calls, validation ([`crate::wire`]), access checks and
//! refusal kinds as the gRPC edge; only the encoding is leaner (no HTTP/2,
//! no protobuf, one call in flight per connection, no task between the
//! socket and the engine).
//!
//! A connection is identified once, by its `Hello`: the bearer token it
//! carries, else the client certificate of its TLS handshake. The port
//! speaks TLS exactly when the main port does, with the same certificate
//! and client CA; a plaintext client on it is answered with a refusal
//! frame it can show, not a TLS alert. Bad frames are answered with an
//! `invalid` refusal (field `frame`); a frame whose length is out of bounds
//! ends the connection after that answer, since the stream can no longer be
//! read in step. The same connection limit as the main port applies, counted
//! on its own, and so does the main port's idle timeout
//! (`ServerConfig::connection_idle`): a connection with no request for that
//! long is closed. From protocol version 2 on it is first told so, with a
//! `Closing` frame, and served for [`IDLE_CLOSE_GRACE`] more, so that a
//! request its client sent before reading that is answered, not lost in
//! doubt; a version-1 connection, whose client would not understand that
//! frame, is closed without notice. A connection may not stall inside a
//! frame: a frame must arrive whole, and each answer be taken, within
//! [`FRAME_TIMEOUT`], or the connection is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasefence_core::access::Verb;
use leasefence_core::{Grant, LeaseError};
use leasefence_proto::frame::{self, HeldBy, Refusal, Request, Response};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::auth::{Access, AuthError, Caller};
use crate::edge::serve::IDLE_CLOSE_GRACE;
use crate::peer::PeerCertificate;
use crate::tls::{Tls, peer_certificate};
use crate::{ApiError, Engine, Node, wire};

/// Longest a client may take from connecting to its `Hello` (TLS included).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a frame may take to arrive whole once its first byte has, and an
/// answer to be taken by the client. The idle timeout ends a connection
/// that sends nothing; one that stalls inside a frame, or stops reading its
/// answers, would otherwise hold its connection and its slot for ever.
#[cfg(not(test))]
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Short in tests, which wait it out.
#[cfg(test)]
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(1);

/// What every connection of the port shares.
struct Shared {
    node: Arc<Node>,
    access: Arc<Access>,
    tls: Option<(tokio_rustls::TlsAcceptor, bool)>,
    connections: Arc<Semaphore>,
    /// How long a connection may wait for its next request before it is closed.
    idle: Duration,
}

/// Accepts frame connections until `stop` turns true; each connection ends
/// at its next idle moment once it does.
pub(crate) async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    access: Arc<Access>,
    tls: Option<Tls>,
    idle: Duration,
    stop: watch::Receiver<bool>,
) {
    let max = access.limits().connections_max.min(Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        node,
        access,
        tls: tls.map(|t| (t.acceptor(), t.client_auth())),
        connections: Arc::new(Semaphore::new(max)),
        idle,
    });
    let mut stopped = stop.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "frame port: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        crate::tcp::accepted(&stream);
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(permit) = shared.connections.clone().try_acquire_owned() else {
                let mut stream = stream;
                let limit = shared.access.limits().connections_max;
                let e = AuthError::limit("connections-max", limit, format!("{limit} connections are open"));
                let _ = answer(&mut stream, &auth_refusal(&e)).await;
                return;
            };
            open(stream, peer, &shared, stop).await;
            drop(permit);
        });
    }
}

/// Runs the TLS handshake when the port has TLS, then the connection.
async fn open(stream: TcpStream, peer: SocketAddr, shared: &Shared, stop: watch::Receiver<bool>) {
    let Some((acceptor, client_auth)) = &shared.tls else {
        return connection(stream, None, false, shared, stop).await;
    };
    let mut first = [0u8; 1];
    match tokio::time::timeout(HELLO_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1..)) => {}
        _ => return,
    }
    if first[0] != 0x16 {
        tracing::warn!(%peer, "frame port: refused a plaintext connection (this port speaks TLS)");
        let mut stream = stream;
        let _ = answer(&mut stream, &Refusal::new("tls_required", TLS_REQUIRED)).await;
        return;
    }
    match tokio::time::timeout(HELLO_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| peer_certificate(leaf.as_ref()));
            let anonymous = cert.is_none() && *client_auth;
            connection(tls, cert, anonymous, shared, stop).await;
        }
        Ok(Err(e)) => tracing::warn!(%peer, error = %e, "frame port: TLS handshake failed"),
        Err(_) => tracing::warn!(%peer, "frame port: TLS handshake not finished in time: closed"),
    }
}

/// What a plaintext client on a TLS frame port is told.
pub const TLS_REQUIRED: &str = "this leasefence frame port speaks TLS: use leasefences:// (plaintext refused)";

/// One connection: `Hello`, then one answer per request until the client
/// closes, a frame cannot be read in step, the connection idles out, or the
/// server stops.
async fn connection<S>(
    io: S,
    cert: Option<PeerCertificate>,
    anonymous: bool,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // One call in flight: reads and writes take turns on one buffered stream.
    let mut io = BufReader::new(io);
    let mut buf = Vec::with_capacity(256);
    let hello = tokio::time::timeout(HELLO_TIMEOUT, frame::read_frame(&mut io, &mut buf)).await;
    let caller = match hello {
        Ok(Ok(true)) => match frame::decode_request(&buf) {
            Ok(Request::Hello { version, token }) => welcome(version, token, cert.as_ref(), anonymous, shared)
                .map(|caller| (caller, version.min(frame::VERSION))),
            Ok(_) => Err(Box::new(Refusal::new(
                "invalid",
                "invalid frame: the first frame of a connection must be Hello",
            ))),
            Err(e) => Err(Box::new(Refusal::from_lease(&LeaseError::Invalid(e.invalid())))),
        },
        Ok(Err(e)) => Err(Box::new(unreadable(&e))),
        // Closed or silent before a hello: nothing to answer.
        Ok(Ok(false)) | Err(_) => return,
    };
    let (caller, version) = match caller {
        Ok(c) => c,
        Err(refusal) => {
            let _ = answer(&mut io, &refusal).await;
            return;
        }
    };
    if answer_frame(&mut io, &Response::Welcome { version }, &mut buf)
        .await
        .is_err()
    {
        return;
    }
    let mut out = Vec::with_capacity(256);
    // Set once the client has been told that the connection is closing.
    let mut closing = false;
    // The idle timer is moved on only when it fires, so that a busy
    // connection does not touch the runtime's timer on every request.
    let mut last = Instant::now();
    let timer = tokio::time::sleep_until(after(last, shared.idle));
    tokio::pin!(timer);
    // One wait for the stop for the connection's life: a new one per request
    // would join and leave the watch's waiters each time.
    let stopped = stop.wait_for(|s| *s);
    tokio::pin!(stopped);
    loop {
        // Biased: once stopping, a request that arrives is not begun; one
        // that has begun to arrive is served before the idle timer counts.
        let waited = tokio::select! {
            biased;
            _ = &mut stopped => return,
            r = io.fill_buf() => Waited::Began(r.map(|b| !b.is_empty())),
            () = &mut timer => Waited::Idle,
        };
        let next = match waited {
            Waited::Began(Ok(true)) => tokio::select! {
                biased;
                _ = &mut stopped => return,
                r = read_whole(&mut io, &mut buf) => r.map(|()| true),
            },
            Waited::Began(other) => other,
            Waited::Idle => {
                let due = after(last, if closing { IDLE_CLOSE_GRACE } else { shared.idle });
                if due > Instant::now() {
                    timer.as_mut().reset(due);
                    continue;
                }
                if closing || version < 2 {
                    return;
                }
                // Nothing is in flight from this side; a request the client
                // sends before it reads this is still served, after it.
                if answer_frame(&mut io, &Response::Closing, &mut out).await.is_err() {
                    return;
                }
                closing = true;
                last = Instant::now();
                timer.as_mut().reset(last + IDLE_CLOSE_GRACE);
                continue;
            }
        };
        let response = match next {
            Ok(true) => match frame::decode_request(&buf) {
                Ok(request) => call(shared, &caller, request).await,
                Err(e) => Response::Refused(refused(ApiError::Lease(LeaseError::Invalid(e.invalid())))),
            },
            Ok(false) => return,
            Err(e) => {
                // Out of step (or broken): say why if the socket still takes it, then close.
                let _ = answer(&mut io, &unreadable(&e)).await;
                return;
            }
        };
        if answer_frame(&mut io, &response, &mut out).await.is_err() {
            return;
        }
        last = Instant::now();
    }
}

/// `d` after `from`; an idle timeout past what the clock can hold
/// (`Duration::MAX`, say) is a century, not a panic.
fn after(from: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(d).unwrap_or_else(|| from + FAR)
}

/// What waiting for the next request came to.
enum Waited {
    /// A frame began (`Ok(true)`), the client closed (`Ok(false)`), or the read failed.
    Began(std::io::Result<bool>),
    /// Nothing came for the idle timeout (or, once closing, the grace).
    Idle,
}

/// The caller a `Hello` names, or why it is refused. Any version from
/// [`frame::VERSION_MIN`] on is welcome: the connection speaks the lower of
/// the client's and this build's.
fn welcome(
    version: u8,
    token: Option<String>,
    cert: Option<&PeerCertificate>,
    anonymous: bool,
    shared: &Shared,
) -> Result<Caller, Box<Refusal>> {
    if version < frame::VERSION_MIN {
        return Err(Box::new(Refusal::new(
            "invalid",
            format!(
                "invalid frame: protocol version {version} is not spoken here; allowed: {} or later",
                frame::VERSION_MIN
            ),
        )));
    }
    // As on the main port: without the certificate mutual TLS asks for, nothing is served.
    if anonymous {
        let e = AuthError::Unauthenticated(leasefence_proto::CLIENT_CERTIFICATE_REQUIRED.into());
        return Err(Box::new(auth_refusal(&e)));
    }
    let header = token.map(|t| format!("Bearer {t}"));
    shared
        .access
        .identify(header.as_deref().map(str::as_bytes), cert)
        .map_err(|e| Box::new(refused(ApiError::Auth(e))))
}

/// One request, answered as the gRPC edge answers it.
async fn call(shared: &Shared, caller: &Caller, request: Request) -> Response {
    match dispatch(shared, caller, request).await {
        Ok(r) => r,
        Err(e) => Response::Refused(refused(e)),
    }
}

async fn dispatch(shared: &Shared, caller: &Caller, request: Request) -> Result<Response, ApiError> {
    let node = &shared.node;
    match request {
        Request::Hello { .. } => Err(LeaseError::Invalid(leasefence_core::Invalid::new(
            "frame",
            "Hello is sent once, as the first frame of a connection",
        ))
        .into()),
        Request::Acquire {
            resource,
            holder,
            ttl_ms,
            wait_ms,
            lock_delay_ms,
        } => {
            let mut req = wire::acquire(wire::AcquireFields {
                resource: &resource,
                ttl_ms,
                holder: Some(&holder),
                wait_ms,
                lock_delay_ms,
            })
            .map_err(LeaseError::Invalid)?;
            caller.check(Verb::Acquire, &req.resource)?;
            req.holder = caller.holder(req.holder).map_err(LeaseError::Invalid)?;
            let engine = node.engine()?;
            let grant = engine.acquire_limited(req, caller.limit()).await?;
            Ok(lease(node, &engine, &grant))
        }
        Request::Renew { resource, lease_id } => {
            let resource = wire::resource(&resource).map_err(LeaseError::Invalid)?;
            caller.check(Verb::Acquire, &resource)?;
            let engine = node.engine()?;
            let grant = engine.renew_as(&resource, &lease_id, caller.principal()).await?;
            Ok(lease(node, &engine, &grant))
        }
        Request::Release { resource, lease_id } => {
            let resource = wire::resource(&resource).map_err(LeaseError::Invalid)?;
            caller.check(Verb::Acquire, &resource)?;
            let engine = node.engine()?;
            let token = engine.release_as(&resource, &lease_id, caller.principal()).await?;
            Ok(Response::Released { token: token.get() })
        }
        Request::Status { resource } => {
            let resource = wire::resource(&resource).map_err(LeaseError::Invalid)?;
            caller.check(Verb::Read, &resource)?;
            let s = node.engine()?.status(&resource).await?;
            Ok(Response::Status {
                last_token: s.last_token.map_or(0, |t| t.get()),
                held: s.held.map(|h| HeldBy {
                    holder: h.holder.to_string(),
                    token: h.token.get(),
                    expires_in_ms: wire::millis(h.expires_in),
                }),
                waiters: u32::try_from(s.waiters).unwrap_or(u32::MAX),
            })
        }
    }
}

fn lease(node: &Node, engine: &Engine, g: &Grant) -> Response {
    Response::Lease {
        token: g.token.get(),
        lease_id: g.lease_id,
        holder: g.holder.to_string(),
        ttl_ms: wire::millis(g.ttl),
        expires_in_ms: wire::expires_in_ms(g, engine.now()),
        signature: node.signature(g).unwrap_or_default(),
    }
}

/// The refusal of `e`, with the same kinds as the gRPC edge's metadata.
fn refused(e: ApiError) -> Refusal {
    match e.counted() {
        ApiError::Lease(e) => Refusal::from_lease(&e),
        ApiError::Auth(e) => auth_refusal(&e),
        e @ ApiError::NotLeader { .. } => {
            let mut r = Refusal::new("not_leader", e.to_string());
            if let ApiError::NotLeader { leader: Some(url) } = e {
                r.leader = url;
            }
            r
        }
        e @ ApiError::Store(_) => Refusal::new("internal", e.to_string()),
        e @ ApiError::ShuttingDown => Refusal::new("unavailable", e.to_string()),
        e @ ApiError::Unavailable(_) => Refusal::new("unavailable", e.to_string()),
        e @ ApiError::OutcomeUnknown(_) => Refusal::new("outcome_unknown", e.to_string()),
    }
}

fn auth_refusal(e: &AuthError) -> Refusal {
    Refusal::new(e.kind(), e.to_string())
}

/// The refusal for a frame that could not be read in step.
fn unreadable(e: &std::io::Error) -> Refusal {
    Refusal::from_lease(&LeaseError::Invalid(leasefence_core::Invalid::new(
        "frame",
        e.to_string(),
    )))
}

/// Reads a frame whose first byte has arrived, whole, within [`FRAME_TIMEOUT`].
async fn read_whole<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let read = tokio::time::timeout(FRAME_TIMEOUT, frame::read_frame(r, buf)).await;
    match read {
        Ok(Ok(true)) => Ok(()),
        // The first byte was there: a close now cuts the frame short.
        Ok(Ok(false)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "a frame was not complete within {} s of its first byte",
                FRAME_TIMEOUT.as_secs_f64()
            ),
        )),
    }
}

async fn answer<W: AsyncWrite + Unpin>(w: &mut W, refusal: &Refusal) -> std::io::Result<()> {
    let mut buf = Vec::new();
    answer_frame(w, &Response::Refused(refusal.clone()), &mut buf).await
}

/// Writes one answer; a client that does not take it within
/// [`FRAME_TIMEOUT`] is given up on (`TimedOut`), and its connection closed.
async fn answer_frame<W: AsyncWrite + Unpin>(w: &mut W, r: &Response, buf: &mut Vec<u8>) -> std::io::Result<()> {
    frame::encode_response(r, buf);
    let write = async {
        w.write_all(buf).await?;
        w.flush().await
    };
    tokio::time::timeout(FRAME_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

#[cfg(test)]
#[path = "frames_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "frames_idle_tests.rs"]
mod idle_tests;
