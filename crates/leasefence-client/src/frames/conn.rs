//! One coordinator's frame port as the client sees it: its URL, how to reach
//! it (TCP, or TLS), the protocol version it speaks, its pool of idle
//! connections, and one exchange of a request and its answer on a
//! connection.
//!
//! The client says `Hello` with the newest version it speaks; a coordinator
//! of an earlier release refuses any version but 1 (as `invalid`), and is
//! then spoken to in version 1 from there on. From version 2 a coordinator
//! tells a connection it is about to close for being idle (`Closing`): the
//! answer to a request that crossed that notice still comes, after it, and
//! the connection is not used again.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use leasefence_core::Invalid;
use leasefence_proto::frame::{self, Request, Response};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::{ClientError, ClientOptions};

/// Idle connections kept for reuse per coordinator; more are closed when given back.
const IDLE_MAX: usize = 64;

/// How long a connection is silent before the first keepalive probe (the
/// coordinator's settings).
#[cfg(not(test))]
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Shorter under test, so that a vanished coordinator is seen within seconds.
#[cfg(test)]
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(1);
/// Between probes.
#[cfg(not(test))]
pub(super) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(test)]
pub(super) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes before the connection is ended.
pub(super) const KEEPALIVE_PROBES: u32 = if cfg!(test) { 2 } else { 3 };

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One open connection, past its `Hello`.
pub(super) struct Conn {
    io: BufReader<Box<dyn Io>>,
    buf: Vec<u8>,
    /// The coordinator said it is closing this connection: it takes no more requests.
    closing: bool,
}

type TlsTarget = (tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>);

impl Conn {
    /// Whether this idle connection can no longer carry a request: the
    /// coordinator closed it, it failed, or it holds bytes no request asked
    /// for (the stream is out of step). Looks without waiting; a close the
    /// runtime has not yet seen shows as open, and is then found by the
    /// exchange, as before this look.
    fn closed_while_idle(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(&mut self.io).poll_fill_buf(&mut cx).is_ready()
    }
}

/// A coordinator's frame port.
pub(super) struct Endpoint {
    pub url: String,
    /// `host:port`.
    addr: String,
    tls: Option<TlsTarget>,
    idle: Mutex<Vec<Conn>>,
    /// The version to say `Hello` with: [`frame::VERSION`] until the
    /// coordinator is found to speak only [`frame::VERSION_MIN`].
    version: AtomicU8,
}

impl Endpoint {
    /// Checks `url` and prepares its TLS settings (nothing is connected).
    pub fn new(url: &str, options: &ClientOptions) -> Result<Endpoint, Invalid> {
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
        Ok(Endpoint {
            url: url.to_string(),
            addr,
            tls,
            idle: Mutex::new(Vec::new()),
            version: AtomicU8::new(frame::VERSION),
        })
    }

    /// An idle connection of the pool that is still open, if any; those the
    /// coordinator closed meanwhile (a restart, a failover) are dropped, so
    /// that a call which must not be sent twice is not lost in doubt on a
    /// connection known to be dead before it was sent.
    pub fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut conn) = idle.pop() {
            if !conn.closed_while_idle() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next call, unless the coordinator is closing it.
    pub fn put_back(&self, conn: Conn) {
        if conn.closing {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_MAX {
            idle.push(conn);
        }
    }

    pub fn transport(&self, message: String) -> ClientError {
        ClientError::Transport {
            url: self.url.clone(),
            message,
        }
    }

    /// A new connection, through its `Hello`, within the connect timeout.
    /// Every error means nothing was sent but the hello.
    pub async fn open(&self, options: &ClientOptions) -> Result<Conn, ClientError> {
        let limit = options.connect_timeout();
        let opened = async {
            loop {
                let version = self.version.load(Ordering::Relaxed);
                match self.handshake(options, version).await {
                    Err(Handshake::Older) => self.version.store(frame::VERSION_MIN, Ordering::Relaxed),
                    Err(Handshake::Failed(e)) => return Err(e),
                    Ok(conn) => return Ok(conn),
                }
            }
        };
        match tokio::time::timeout(limit, opened).await {
            Ok(opened) => opened,
            Err(_) => Err(self.transport(format!("not connected within {} ms", limit.as_millis()))),
        }
    }

    async fn handshake(&self, options: &ClientOptions, version: u8) -> Result<Conn, Handshake> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        // Each request is one small write its caller waits on.
        let _ = tcp.set_nodelay(true);
        // A coordinator whose host vanished without closing the connection
        // (powered off, cut off) is then found dead while the connection
        // idles in the pool, which drops it (`take_idle`) before a call is
        // sent into the void. Failing to set it only loses that early drop.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
        let io: Box<dyn Io> = match &self.tls {
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
            closing: false,
        };
        let hello = Request::Hello {
            version,
            token: options.credentials().token().map(str::to_string),
        };
        let limit = options.connect_timeout();
        match exchange(&mut conn, &hello, limit).await {
            Ok(Response::Welcome { version: spoken }) if (frame::VERSION_MIN..=version).contains(&spoken) => Ok(conn),
            Ok(Response::Welcome { version: spoken }) => Err(Handshake::Failed(ClientError::Server(format!(
                "the coordinator answered Hello version {version} with version {spoken}"
            )))),
            Ok(Response::Refused(r)) if r.kind == "invalid" && version > frame::VERSION_MIN => Err(Handshake::Older),
            Ok(Response::Refused(r)) => Err(Handshake::Failed(match r.kind.as_str() {
                "unauthenticated" | "permission_denied" | "limit_exceeded" => ClientError::Refused {
                    kind: r.kind,
                    message: r.message,
                },
                "tls_required" => self.transport(r.message),
                _ => self.transport(format!("refused the connection ({}): {}", r.kind, r.message)),
            })),
            Ok(other) => Err(Handshake::Failed(ClientError::Server(format!(
                "unexpected answer to Hello: {other:?}"
            )))),
            Err(e) => Err(Handshake::Failed(self.transport(e.describe(limit)))),
        }
    }
}

/// Why a handshake failed.
enum Handshake {
    /// A `Hello` above version 1 was refused as `invalid`: by a coordinator
    /// of an earlier release, which speaks version 1 alone.
    Older,
    Failed(ClientError),
}

impl From<ClientError> for Handshake {
    fn from(e: ClientError) -> Handshake {
        Handshake::Failed(e)
    }
}

/// Why an exchange failed.
pub(super) enum Exchange {
    Io(std::io::Error),
    Malformed(frame::FrameError),
    Closed,
    Timeout,
}

impl Exchange {
    pub fn describe(self, limit: Duration) -> String {
        match self {
            Exchange::Io(e) => e.to_string(),
            Exchange::Malformed(e) => format!("malformed answer: {e}"),
            Exchange::Closed => "the coordinator closed the connection".to_string(),
            Exchange::Timeout => format!("no answer within {} ms (the call timeout)", limit.as_millis()),
        }
    }
}

/// Writes `req` and reads one answer on `conn`, within `limit`. A
/// `Closing` notice that crossed the request is noted and read past.
pub(super) async fn exchange(conn: &mut Conn, req: &Request, limit: Duration) -> Result<Response, Exchange> {
    let round = async {
        frame::encode_request(req, &mut conn.buf);
        conn.io.write_all(&conn.buf).await.map_err(Exchange::Io)?;
        conn.io.flush().await.map_err(Exchange::Io)?;
        loop {
            let answer = match frame::read_frame(&mut conn.io, &mut conn.buf).await {
                Ok(true) => frame::decode_response(&conn.buf).map_err(Exchange::Malformed)?,
                Ok(false) => return Err(Exchange::Closed),
                Err(e) => return Err(Exchange::Io(e)),
            };
            match answer {
                Response::Closing if !conn.closing => conn.closing = true,
                answer => return Ok(answer),
            }
        }
    };
    match tokio::time::timeout(limit, round).await {
        Ok(answer) => answer,
        Err(_) => Err(Exchange::Timeout),
    }
}

/// `(tls, "host:port")` of a `leasefence(s)://HOST:PORT` URL.
pub(super) fn parse_url(url: &str) -> Result<(bool, String), Invalid> {
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
