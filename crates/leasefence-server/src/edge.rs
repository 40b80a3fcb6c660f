//! The main port's connections: plain TCP, or TLS whose handshakes run
//! beside the accept loop, so that graceful shutdown and the fatal drain are
//! the same code for both; and how each is served (`serve`: the serve loop
//! and its deadlines for silent clients).
//!
//! On a TLS port the first byte of every connection is peeked at. A TLS
//! handshake starts with 0x16; anything else is a plaintext client, which is
//! refused at once with a warning (its address only) and an answer it can
//! show: `400` with a one-line body for HTTP/1, a GOAWAY carrying the same
//! line (code `INADEQUATE_SECURITY`) for an HTTP/2 preface, so a gRPC client
//! fails at once instead of waiting for a timeout.
//!
//! Each request on a connection whose client certificate was verified gets a
//! [`PeerCertificate`] extension. With a client CA (mutual TLS), a client
//! that presents no certificate is let through the handshake only to have
//! every request refused, `401` or gRPC `UNAUTHENTICATED`, with a message
//! saying a client certificate is required (a refused handshake would reach
//! a TLS 1.3 client as a bare "connection closed"); a certificate that the
//! CA did not issue fails the handshake.
//!
//! A request under the gRPC service's path goes straight to the service;
//! every other request to the HTTP router (axum), whose fallback answers
//! unknown paths in JSON or, to a gRPC client, `UNIMPLEMENTED`. Each
//! request is counted in its connection's [`Activity`] until its answer has
//! been sent, and its body has a deadline ([`activity`]), except a
//! keep-alive stream's, which goes on for as long as its client renews.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;

use crate::peer::PeerCertificate;
use crate::tls::{Tls, peer_certificate};
use activity::{Activity, Deadline, Tracked};

pub(crate) mod activity;
mod plaintext;
pub(crate) mod serve;

pub(crate) use serve::serve;

/// Longest a client may take from connecting to a finished TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most TLS handshakes in progress at once; beyond it accepting waits.
const HANDSHAKES_MAX: usize = 512;
/// The first byte of a TLS record carrying a handshake (the ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;
/// Where connections come from.
pub(crate) enum EdgeListener {
    Plain(TcpListener),
    Tls(TlsListener),
}

impl EdgeListener {
    pub(crate) fn new(tcp: TcpListener, tls: Option<Tls>) -> io::Result<EdgeListener> {
        Ok(match tls {
            None => EdgeListener::Plain(tcp),
            Some(tls) => EdgeListener::Tls(TlsListener::start(tcp, tls)?),
        })
    }
}

impl Listener for EdgeListener {
    type Io = EdgeIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (EdgeIo, SocketAddr) {
        match self {
            // axum's own accept: it retries and backs off on accept errors.
            EdgeListener::Plain(tcp) => {
                let (stream, peer) = Listener::accept(tcp).await;
                crate::tcp::accepted(&stream);
                (EdgeIo::Plain(stream), peer)
            }
            EdgeListener::Tls(tls) => tls.accept().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            EdgeListener::Plain(tcp) => tcp.local_addr(),
            EdgeListener::Tls(tls) => Ok(tls.local),
        }
    }
}

/// Hands out connections whose TLS handshake is done; a task accepts and
/// runs the handshakes, and stops when this is dropped (as `serve` does
/// when it stops accepting).
pub(crate) struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(EdgeIo, SocketAddr)>,
    task: tokio::task::AbortHandle,
}

impl TlsListener {
    fn start(tcp: TcpListener, tls: Tls) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(tcp, tls, tx)).abort_handle();
        Ok(TlsListener { local, ready, task })
    }

    async fn accept(&mut self) -> (EdgeIo, SocketAddr) {
        match self.ready.recv().await {
            Some(next) => next,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a handshake needs.
#[derive(Clone)]
struct Acceptor {
    tls: tokio_rustls::TlsAcceptor,
    /// Whether clients must present a certificate.
    client_auth: bool,
}

async fn accept_loop(mut tcp: TcpListener, tls: Tls, ready: mpsc::Sender<(EdgeIo, SocketAddr)>) {
    let acceptor = Acceptor {
        tls: tls.acceptor(),
        client_auth: tls.client_auth(),
    };
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = Listener::accept(&mut tcp).await;
        crate::tcp::accepted(&stream);
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let opened = open(stream, peer, &acceptor).await;
            drop(permit);
            if let Some(io) = opened {
                // Fails only once the server stopped accepting: the connection closes.
                let _ = ready.send((io, peer)).await;
            }
        });
    }
}

/// The TLS connection from `peer`, or `None` when it was refused or failed.
async fn open(stream: TcpStream, peer: SocketAddr, acceptor: &Acceptor) -> Option<EdgeIo> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1..)) => {}
        // Closed before a byte, broken, or silent: nothing to answer.
        _ => return None,
    }
    if first[0] != TLS_HANDSHAKE {
        tracing::warn!(%peer, "refused a plaintext connection: this port speaks TLS (clients must use https://)");
        plaintext::refuse(stream).await;
        return None;
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.tls.accept(stream)).await {
        Ok(Ok(tls)) => {
            let names = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| peer_certificate(leaf.as_ref()));
            let anonymous = names.is_none() && acceptor.client_auth;
            if anonymous {
                tracing::warn!(%peer, "a client without a certificate connected; its requests are refused");
            }
            Some(EdgeIo::Tls {
                io: Box::new(tls),
                peer: names,
                anonymous,
            })
        }
        Ok(Err(e)) => {
            tracing::warn!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            let secs = HANDSHAKE_TIMEOUT.as_secs();
            tracing::warn!(%peer, "TLS handshake not finished within {secs} s: closed");
            None
        }
    }
}

/// One accepted connection.
pub(crate) enum EdgeIo {
    Plain(TcpStream),
    Tls {
        io: Box<TlsStream<TcpStream>>,
        /// The verified client certificate, when the client presented one.
        peer: Option<PeerCertificate>,
        /// A certificate was required and none presented: refuse every request.
        anonymous: bool,
    },
}

impl EdgeIo {
    fn peer_certificate(&self) -> Option<&PeerCertificate> {
        match self {
            EdgeIo::Plain(_) => None,
            EdgeIo::Tls { peer, .. } => peer.as_ref(),
        }
    }

    fn anonymous(&self) -> bool {
        matches!(self, EdgeIo::Tls { anonymous: true, .. })
    }
}

impl AsyncRead for EdgeIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EdgeIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            EdgeIo::Tls { io, .. } => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EdgeIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EdgeIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            EdgeIo::Tls { io, .. } => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EdgeIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            EdgeIo::Tls { io, .. } => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            EdgeIo::Plain(s) => s.is_write_vectored(),
            EdgeIo::Tls { io, .. } => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EdgeIo::Plain(s) => Pin::new(s).poll_flush(cx),
            EdgeIo::Tls { io, .. } => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EdgeIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            EdgeIo::Tls { io, .. } => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Makes the service of one connection: the router, with the connection's
/// [`PeerCertificate`] (if any) inserted into each request. Beyond
/// `connections_max` open connections, a new one is still accepted but
/// every request on it is refused with the limit (429 in JSON, gRPC
/// `RESOURCE_EXHAUSTED`, `Connection: close`), so that the client learns why
/// instead of waiting on a full accept queue.
#[derive(Clone)]
pub(crate) struct EdgeService {
    app: axum::Router,
    /// The gRPC service, called directly for its own paths (see [`WithPeer`]).
    grpc: Option<Grpc>,
    /// Serves a client that presented no certificate where one is required.
    refuse: axum::Router,
    /// Serves a connection over the limit.
    busy: axum::Router,
    connections: Arc<Semaphore>,
    /// How long a connection may have nothing in progress (see `serve`).
    pub(crate) idle: Duration,
}

impl EdgeService {
    pub(crate) fn new(app: axum::Router, connections_max: usize, idle: Duration) -> EdgeService {
        let max = connections_max.min(Semaphore::MAX_PERMITS);
        EdgeService {
            app,
            grpc: None,
            refuse: axum::Router::new().fallback(certificate_required),
            busy: axum::Router::new().fallback(move |req: Request| too_many_connections(req, max)),
            connections: Arc::new(Semaphore::new(max)),
            idle,
        }
    }

    /// Calls `grpc` for the paths of its methods on connections that
    /// are served (not those refused for a certificate or the limit), instead
    /// of through `app`'s router: the same service, a few layers fewer per
    /// call. `app` still answers every other path.
    pub(crate) fn with_grpc(mut self, grpc: Grpc) -> EdgeService {
        self.grpc = Some(grpc);
        self
    }

    /// The service of a connection just accepted. It holds the
    /// connection's place under the limit (or, over it, refuses every
    /// request) until the connection closes.
    pub(crate) fn connection(&self, io: &EdgeIo) -> WithPeer {
        // Held by this connection's service (and its per-request clones):
        // freed when the connection closes.
        let permit = self.connections.clone().try_acquire_owned().ok().map(Arc::new);
        let (app, grpc) = match (&permit, io.anonymous()) {
            (None, _) => (&self.busy, None),
            (Some(_), true) => (&self.refuse, None),
            (Some(_), false) => (&self.app, self.grpc.as_ref()),
        };
        WithPeer {
            app: app.clone(),
            grpc: grpc.cloned(),
            peer: io.peer_certificate().cloned(),
            activity: Activity::new(),
            _permit: permit,
        }
    }
}

/// The gRPC service of the coordinator.
pub(crate) type Grpc = leasefence_proto::v1::leases_server::LeasesServer<crate::grpc::GrpcLeases>;

/// Whether `path` names a method of the gRPC service: `/<service name>/<method>`.
fn is_grpc_path(path: &str) -> bool {
    use tonic::server::NamedService;
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(Grpc::NAME))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `path` is the gRPC keep-alive method, whose request body is a
/// stream of renewals with no end in sight.
fn is_keep_alive_path(path: &str) -> bool {
    use tonic::server::NamedService;
    path.strip_prefix('/').and_then(|p| p.strip_prefix(Grpc::NAME)) == Some("/KeepAlive")
}

/// The service of one connection.
#[derive(Clone)]
pub(crate) struct WithPeer {
    app: axum::Router,
    grpc: Option<Grpc>,
    peer: Option<PeerCertificate>,
    /// What the connection has in progress, shared with its serve loop.
    activity: Arc<Activity>,
    _permit: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl WithPeer {
    pub(crate) fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

impl tower::Service<hyper::Request<hyper::body::Incoming>> for WithPeer {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Either may take the next request; both are always ready today.
        if let Some(grpc) = &mut self.grpc
            && tower::Service::<Request>::poll_ready(grpc, cx).is_pending()
        {
            return Poll::Pending;
        }
        tower::Service::<Request>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let busy = self.activity.begin();
        let mut req = if is_keep_alive_path(req.uri().path()) {
            req.map(axum::body::Body::new)
        } else {
            req.map(|body| axum::body::Body::new(Deadline::new(body)))
        };
        if let Some(p) = &self.peer {
            req.extensions_mut().insert(p.clone());
        }
        if let Some(grpc) = &mut self.grpc
            && is_grpc_path(req.uri().path())
        {
            let answer = tower::Service::call(grpc, req);
            return Box::pin(async move {
                let Ok(response) = answer.await;
                Ok(response.map(|body| axum::body::Body::new(Tracked::new(body, busy))))
            });
        }
        let answer = tower::Service::<Request>::call(&mut self.app, req);
        Box::pin(async move {
            let Ok(response) = answer.await;
            Ok(response.map(|body| axum::body::Body::new(Tracked::new(body, busy))))
        })
    }
}

/// The refusal of every request on a connection over `--connections-max`.
async fn too_many_connections(req: Request, max: usize) -> Response {
    let e = crate::auth::AuthError::limit(
        "connections-max",
        max,
        format!("{max} connections are open; retry later or on another connection"),
    );
    crate::metrics::auth_refusal(&e);
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return crate::grpc::auth_status(&e).into_http::<axum::body::Body>();
    }
    let mut response = crate::http::Failure::from(e).into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// The refusal of a request from a client that presented no certificate
/// where one is required: gRPC `UNAUTHENTICATED` for a gRPC call, else
/// `401` in JSON like the API's other refusals.
async fn certificate_required(req: Request) -> Response {
    let message = leasefence_proto::CLIENT_CERTIFICATE_REQUIRED;
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return tonic::Status::unauthenticated(message).into_http::<axum::body::Body>();
    }
    let body = serde_json::json!({ "error": "client_certificate_required", "message": message });
    (axum::http::StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
}
