//! The frame edge on a real coordinator, spoken to in raw frames: a whole
//! cycle, the refusals (typed as on the other edges), bad frames and what
//! they cost the connection, the hello rules and access control.

use std::net::SocketAddr;
use std::time::Duration;

use leasefence_core::LeaseId;
use leasefence_core::access::{Policy, PrincipalSpec, RuleSpec, hash_token};
use leasefence_proto::frame::{self, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Server, ServerConfig};

/// A coordinator serving frames on a loopback port (with `policy`, if any).
async fn serve(policy: Option<Policy>) -> (SocketAddr, tempfile::TempDir) {
    serve_with(|config| config.policy = policy).await
}

/// A coordinator serving frames on a loopback port, configured by `configure`.
pub(super) async fn serve_with(configure: impl FnOnce(&mut ServerConfig)) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
    configure(&mut config);
    let server = Server::bind(config).await.expect("bind");
    let addr = server.frames_addr().expect("frames configured").expect("bound");
    tokio::spawn(server.run(std::future::pending()));
    (addr, dir)
}

pub(super) struct Conn {
    pub(super) tcp: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub(super) async fn open(addr: SocketAddr) -> Conn {
        Conn {
            tcp: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    /// Opens and says hello with `token`; the answer to the hello.
    pub(super) async fn hello(addr: SocketAddr, token: Option<&str>) -> (Conn, Response) {
        let mut c = Conn::open(addr).await;
        let answer = c
            .call(&Request::Hello {
                version: frame::VERSION,
                token: token.map(str::to_string),
            })
            .await;
        (c, answer)
    }

    pub(super) async fn welcomed(addr: SocketAddr) -> Conn {
        let (c, answer) = Conn::hello(addr, None).await;
        assert_eq!(
            answer,
            Response::Welcome {
                version: frame::VERSION
            }
        );
        c
    }

    pub(super) async fn send_raw(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.expect("write");
    }

    pub(super) async fn answer(&mut self) -> Response {
        let read = tokio::time::timeout(Duration::from_secs(5), frame::read_frame(&mut self.tcp, &mut self.buf));
        assert!(read.await.expect("answered in time").expect("readable"), "closed");
        frame::decode_response(&self.buf).expect("a valid answer")
    }

    pub(super) async fn call(&mut self, r: &Request) -> Response {
        let mut out = Vec::new();
        frame::encode_request(r, &mut out);
        self.send_raw(&out).await;
        self.answer().await
    }

    /// Whether the coordinator closed the connection (reads EOF in time).
    pub(super) async fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.tcp.read(&mut b)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

pub(super) fn acquire(resource: &str) -> Request {
    Request::Acquire {
        resource: resource.into(),
        holder: "w1".into(),
        ttl_ms: 10_000,
        wait_ms: 0,
        lock_delay_ms: 0,
    }
}

fn refusal_kind(r: &Response) -> &str {
    match r {
        Response::Refused(r) => &r.kind,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_cycle_over_frames_hands_out_increasing_tokens_and_typed_refusals() {
    let (addr, _dir) = serve(None).await;
    let mut c = Conn::welcomed(addr).await;
    let Response::Lease { token, lease_id, .. } = c.call(&acquire("jobs/1")).await else {
        panic!("granted")
    };
    assert_eq!(token, 1);
    let Response::Refused(busy) = c.call(&acquire("jobs/1")).await else {
        panic!("busy")
    };
    assert_eq!(busy.kind, "busy");
    let details = busy.busy.expect("busy details");
    assert_eq!((details.holder.as_str(), details.token), ("w1", 1));
    let Response::Status { last_token, held, .. } = c
        .call(&Request::Status {
            resource: "jobs/1".into(),
        })
        .await
    else {
        panic!("status")
    };
    assert_eq!((last_token, held.map(|h| h.token)), (1, Some(1)));
    let renewed = c
        .call(&Request::Renew {
            resource: "jobs/1".into(),
            lease_id,
        })
        .await;
    assert!(matches!(renewed, Response::Lease { token: 1, .. }), "{renewed:?}");
    let stranger = LeaseId::from_bytes([7; 16]);
    let lost = c
        .call(&Request::Release {
            resource: "jobs/1".into(),
            lease_id: stranger,
        })
        .await;
    assert_eq!(refusal_kind(&lost), "lease_lost");
    let released = c
        .call(&Request::Release {
            resource: "jobs/1".into(),
            lease_id,
        })
        .await;
    assert_eq!(released, Response::Released { token: 1 });
    let again = c.call(&acquire("jobs/1")).await;
    assert!(matches!(again, Response::Lease { token: 2, .. }), "{again:?}");
}

#[tokio::test]
async fn invalid_fields_are_refused_by_name_and_the_connection_goes_on() {
    let (addr, _dir) = serve(None).await;
    let mut c = Conn::welcomed(addr).await;
    let Response::Refused(r) = c.call(&acquire("")).await else {
        panic!("refused")
    };
    assert_eq!(r.kind, "invalid");
    assert!(r.message.starts_with("invalid resource"), "{}", r.message);
    let mut short_ttl = acquire("a");
    if let Request::Acquire { ttl_ms, .. } = &mut short_ttl {
        *ttl_ms = 1;
    }
    let Response::Refused(r) = c.call(&short_ttl).await else {
        panic!("refused")
    };
    assert!(r.message.starts_with("invalid ttl_ms"), "{}", r.message);
    // An unknown frame type, well framed: refused, and the stream is still in step.
    c.send_raw(&[0, 0, 0, 2, 0x7f, 0]).await;
    let Response::Refused(r) = c.answer().await else {
        panic!("refused")
    };
    assert_eq!(r.message, "invalid frame: unknown frame type 0x7f");
    // A second Hello is refused too.
    let again = c
        .call(&Request::Hello {
            version: frame::VERSION,
            token: None,
        })
        .await;
    assert_eq!(refusal_kind(&again), "invalid");
    assert!(matches!(c.call(&acquire("a")).await, Response::Lease { token: 1, .. }));
}

#[tokio::test]
async fn a_frame_length_out_of_bounds_is_answered_then_the_connection_closes() {
    let (addr, _dir) = serve(None).await;
    let mut c = Conn::welcomed(addr).await;
    c.send_raw(&[0x7f, 0xff, 0xff, 0xff]).await;
    let Response::Refused(r) = c.answer().await else {
        panic!("refused")
    };
    assert_eq!(r.kind, "invalid");
    assert!(r.message.contains("frame length 2147483647"), "{}", r.message);
    assert!(c.closed().await);
}

#[tokio::test]
async fn a_frame_that_stalls_after_its_first_byte_is_refused_then_the_connection_closes() {
    let (addr, _dir) = serve(None).await;
    let mut c = Conn::welcomed(addr).await;
    // A header announcing 16 bytes, and then nothing.
    c.send_raw(&[0, 0, 0, 16]).await;
    let Response::Refused(r) = c.answer().await else {
        panic!("refused")
    };
    assert_eq!(r.kind, "invalid");
    assert!(r.message.contains("not complete within"), "{}", r.message);
    assert!(c.closed().await);
    // An idle connection between frames is left alone for as long.
    let mut idle = Conn::welcomed(addr).await;
    tokio::time::sleep(super::FRAME_TIMEOUT * 2).await;
    assert!(matches!(
        idle.call(&acquire("a")).await,
        Response::Lease { token: 1, .. }
    ));
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answers_is_disconnected() {
    let (addr, _dir) = serve(None).await;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small receive buffer");
    let mut c = Conn {
        tcp: socket.connect(addr).await.expect("connect"),
        buf: Vec::new(),
    };
    let welcome = c
        .call(&Request::Hello {
            version: frame::VERSION,
            token: None,
        })
        .await;
    assert!(matches!(welcome, Response::Welcome { .. }));
    // Status requests, sent without ever reading an answer: once the
    // answers fill both sockets' buffers the coordinator's write stalls; it
    // must give up and close, which fails these writes.
    let mut request = Vec::new();
    frame::encode_request(&Request::Status { resource: "a".into() }, &mut request);
    let batch = request.repeat(256);
    let flood = async {
        loop {
            if let Err(e) = c.tcp.write_all(&batch).await {
                return e;
            }
        }
    };
    let e = tokio::time::timeout(Duration::from_secs(60), flood)
        .await
        .expect("the coordinator closed the connection of a client that does not read");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{e}"
    );
}

#[tokio::test]
async fn a_connection_must_start_with_a_hello_of_a_version_spoken_here() {
    let (addr, _dir) = serve(None).await;
    let mut c = Conn::open(addr).await;
    let first = c.call(&acquire("a")).await;
    assert_eq!(refusal_kind(&first), "invalid");
    assert!(c.closed().await);

    let mut c = Conn::open(addr).await;
    let Response::Refused(r) = c
        .call(&Request::Hello {
            version: 0,
            token: None,
        })
        .await
    else {
        panic!("refused")
    };
    assert!(r.message.contains("protocol version 0"), "{}", r.message);
    assert!(r.message.contains("allowed: 1 or later"), "{}", r.message);
    assert!(c.closed().await);

    // A newer client is answered with the version this build speaks, and
    // served in it; an older one in its own.
    for (asked, spoken) in [(9, frame::VERSION), (1, 1)] {
        let mut c = Conn::open(addr).await;
        let hello = Request::Hello {
            version: asked,
            token: None,
        };
        assert_eq!(c.call(&hello).await, Response::Welcome { version: spoken });
        let status = c.call(&Request::Status { resource: "v".into() }).await;
        assert!(matches!(status, Response::Status { .. }), "{status:?}");
    }

    // An HTTP client on the frame port gets a refusal, not a hang.
    let mut c = Conn::open(addr).await;
    c.send_raw(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(refusal_kind(&c.answer().await), "invalid");
    assert!(c.closed().await);
}

fn policy() -> Policy {
    Policy::new(&[PrincipalSpec {
        name: "alice".into(),
        token_sha256: Some(hash_token("tok-alice")),
        cert_names: vec![],
        rules: vec![RuleSpec {
            prefix: "jobs/".into(),
            verbs: vec!["acquire".into(), "read".into()],
        }],
    }])
    .expect("valid policy")
}

#[tokio::test]
async fn access_control_identifies_the_connection_by_its_hello() {
    let (addr, _dir) = serve(Some(policy())).await;
    let (mut c, answer) = Conn::hello(addr, None).await;
    assert_eq!(refusal_kind(&answer), "unauthenticated");
    assert!(c.closed().await);
    let (mut c, answer) = Conn::hello(addr, Some("tok-mallory")).await;
    assert_eq!(refusal_kind(&answer), "unauthenticated");
    assert!(c.closed().await);

    let (mut c, answer) = Conn::hello(addr, Some("tok-alice")).await;
    assert_eq!(
        answer,
        Response::Welcome {
            version: frame::VERSION
        }
    );
    let Response::Lease { holder, .. } = c.call(&acquire("jobs/1")).await else {
        panic!("alice may acquire jobs/")
    };
    // Recorded under the principal, as on the other edges.
    assert_eq!(holder, "alice/w1");
    let Response::Refused(r) = c.call(&acquire("other/1")).await else {
        panic!("refused")
    };
    assert_eq!(r.kind, "permission_denied");
    assert!(r.message.contains("other/1"), "{}", r.message);
}
