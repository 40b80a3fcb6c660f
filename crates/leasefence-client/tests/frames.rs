//! The frame protocol through the real client and the real coordinator:
//! one conformance scenario that the gRPC client and the frame client pass
//! alike (same answers, same typed refusals), access control by token and by
//! client certificate, TLS and its mismatches, a standby's refusal and moving
//! on from it (or from a coordinator that is down), a pooled connection the
//! coordinator closed while idle, and the retry rules after a connection
//! broke with a request sent.

#[path = "../../leasefence-server/tests/support/certs.rs"]
mod certs;

use std::net::SocketAddr;
use std::time::Duration;

use certs::{Ca, Files};
use leasefence_client::{Client, ClientError, ClientOptions, ClientTls, FrameClient, LeaseInfo, StatusInfo};
use leasefence_core::access::{Policy, PrincipalSpec, RuleSpec, hash_token};
use leasefence_core::{BusyReason, Holder, LeaseError, LeaseId, ResourceId, Token};
use leasefence_server::tls::{Tls, TlsFiles};
use leasefence_server::{Node, Role, Server, ServerConfig};

const TTL: Duration = Duration::from_secs(10);

/// A coordinator in this process serving gRPC and frames; stops when dropped.
struct Coordinator {
    http: String,
    frames: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

impl Coordinator {
    async fn start(policy: Option<Policy>, tls: Option<Tls>) -> Coordinator {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
        config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
        config.policy = policy;
        config.tls = tls;
        let server = Server::bind(config).await.expect("bind");
        let http = format!("http://{}", server.local_addr().expect("addr"));
        let frames = server.frames_addr().expect("configured").expect("bound");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Coordinator {
            http,
            frames,
            _stop: tx,
            _dir: dir,
        }
    }

    fn frames_url(&self) -> String {
        format!("leasefence://{}", self.frames)
    }
}

/// The one-call methods both clients have.
trait Calls {
    async fn acquire(&self, r: &ResourceId, holder: Option<&Holder>, wait: Duration) -> Result<LeaseInfo, ClientError>;
    async fn renew(&self, r: &ResourceId, id: &LeaseId) -> Result<LeaseInfo, ClientError>;
    async fn release(&self, r: &ResourceId, id: &LeaseId) -> Result<Token, ClientError>;
    async fn status(&self, r: &ResourceId) -> Result<StatusInfo, ClientError>;
}

impl Calls for Client {
    async fn acquire(&self, r: &ResourceId, holder: Option<&Holder>, wait: Duration) -> Result<LeaseInfo, ClientError> {
        Client::acquire(self, r, TTL, holder, wait).await
    }
    async fn renew(&self, r: &ResourceId, id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        Client::renew(self, r, id).await
    }
    async fn release(&self, r: &ResourceId, id: &LeaseId) -> Result<Token, ClientError> {
        Client::release(self, r, id).await
    }
    async fn status(&self, r: &ResourceId) -> Result<StatusInfo, ClientError> {
        Client::status(self, r).await
    }
}

impl Calls for FrameClient {
    async fn acquire(&self, r: &ResourceId, holder: Option<&Holder>, wait: Duration) -> Result<LeaseInfo, ClientError> {
        FrameClient::acquire(self, r, TTL, holder, wait).await
    }
    async fn renew(&self, r: &ResourceId, id: &LeaseId) -> Result<LeaseInfo, ClientError> {
        FrameClient::renew(self, r, id).await
    }
    async fn release(&self, r: &ResourceId, id: &LeaseId) -> Result<Token, ClientError> {
        FrameClient::release(self, r, id).await
    }
    async fn status(&self, r: &ResourceId) -> Result<StatusInfo, ClientError> {
        FrameClient::status(self, r).await
    }
}

fn resource(s: &str) -> ResourceId {
    ResourceId::new(s).expect("valid resource")
}

/// What every edge must answer alike. `prefix` keeps the two runs' resources apart.
async fn conformance(c: &impl Calls, prefix: &str) {
    let r = resource(&format!("{prefix}/orders"));
    let w1 = Holder::new("w1").expect("holder");
    let status = c.status(&r).await.expect("status");
    assert_eq!(
        (status.last_token, status.held.clone(), status.waiters),
        (None, None, 0)
    );

    let first = c.acquire(&r, Some(&w1), Duration::ZERO).await.expect("granted");
    assert_eq!((first.token.get(), first.holder.as_str()), (1, "w1"));
    assert_eq!(first.ttl, TTL);
    assert!(first.expires_in <= TTL && first.expires_in > TTL / 2);
    assert_eq!(first.signature, None);

    match c.acquire(&r, None, Duration::ZERO).await {
        Err(ClientError::Lease(LeaseError::Busy {
            holder, token, reason, ..
        })) => assert_eq!((holder.as_str(), token.get(), reason), ("w1", 1, BusyReason::Held)),
        other => panic!("expected busy, got {other:?}"),
    }
    let status = c.status(&r).await.expect("status");
    assert_eq!(status.last_token.map(Token::get), Some(1));
    assert_eq!(status.held.as_ref().map(|h| (h.0.as_str(), h.1.get())), Some(("w1", 1)));

    let renewed = c.renew(&r, &first.lease_id).await.expect("renewed");
    assert_eq!((renewed.token, renewed.lease_id), (first.token, first.lease_id));
    let stranger = LeaseId::from_bytes([3; 16]);
    assert!(matches!(
        c.renew(&r, &stranger).await,
        Err(ClientError::Lease(LeaseError::LeaseLost { .. }))
    ));
    assert_eq!(c.release(&r, &first.lease_id).await.expect("released").get(), 1);
    assert!(matches!(
        c.release(&r, &first.lease_id).await,
        Err(ClientError::Lease(LeaseError::LeaseLost { .. }))
    ));

    let second = c.acquire(&r, None, Duration::ZERO).await.expect("granted again");
    assert_eq!(second.token.get(), 2, "tokens never repeat");
    let bad = resource(&format!("{prefix}/bad"));
    // An hour is over the coordinator's longest wait; so is "forever", which
    // the client must send as it is rather than fail on before it sends.
    for wait in [Duration::from_secs(3600), Duration::MAX] {
        match c.acquire(&bad, Some(&w1), wait).await {
            Err(ClientError::Lease(LeaseError::Invalid(e))) => assert_eq!(e.field(), "wait_ms", "{e}"),
            other => panic!("expected an invalid wait for {wait:?}, got {other:?}"),
        }
    }
    assert_eq!(c.release(&r, &second.lease_id).await.expect("released").get(), 2);
}

#[tokio::test]
async fn the_grpc_and_the_frame_client_answer_alike() {
    let coordinator = Coordinator::start(None, None).await;
    let grpc = Client::connect(&coordinator.http).await.expect("gRPC client");
    conformance(&grpc, "grpc").await;
    let frames = FrameClient::connect(&coordinator.frames_url(), ClientOptions::default())
        .await
        .expect("frame client");
    conformance(&frames, "frames").await;
    // Both edges write to one engine: a lease taken on one is busy on the other.
    let shared = resource("shared/1");
    let lease = frames
        .acquire(&shared, TTL, None, Duration::ZERO)
        .await
        .expect("granted");
    assert!(matches!(
        grpc.acquire(&shared, TTL, None, Duration::ZERO).await,
        Err(ClientError::Lease(LeaseError::Busy { .. }))
    ));
    assert_eq!(
        grpc.release(&shared, &lease.lease_id).await.expect("released"),
        lease.token
    );
}

#[tokio::test]
async fn many_callers_share_one_frame_client() {
    let coordinator = Coordinator::start(None, None).await;
    let client = FrameClient::connect(&coordinator.frames_url(), ClientOptions::default())
        .await
        .expect("frame client");
    let r = resource("contended");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (client, r) = (client.clone(), r.clone());
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..10 {
                    let lease = client
                        .acquire(&r, TTL, None, Duration::from_secs(10))
                        .await
                        .expect("granted");
                    tokens.push(lease.token.get());
                    client.release(&r, &lease.lease_id).await.expect("released");
                }
                tokens
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort_unstable();
    assert_eq!(all, (1..=80).collect::<Vec<u64>>(), "every grant its own token");
}

fn policy() -> Policy {
    Policy::new(&[PrincipalSpec {
        name: "alice".into(),
        token_sha256: Some(hash_token("tok-alice")),
        cert_names: vec![certs::CLIENT_NAMES[0].into()],
        rules: vec![RuleSpec {
            prefix: "jobs/".into(),
            verbs: vec!["acquire".into(), "read".into()],
        }],
    }])
    .expect("valid policy")
}

#[tokio::test]
async fn access_control_refuses_at_connect_and_per_resource() {
    let coordinator = Coordinator::start(Some(policy()), None).await;
    let url = coordinator.frames_url();
    match FrameClient::connect(&url, ClientOptions::default()).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, "unauthenticated");
            assert!(message.contains("no credential"), "{message}");
        }
        other => panic!("expected unauthenticated, got {other:?}"),
    }
    let wrong = ClientOptions::default().with_token("tok-mallory");
    assert!(matches!(
        FrameClient::connect(&url, wrong).await,
        Err(ClientError::Refused { kind, .. }) if kind == "unauthenticated"
    ));
    // A frame carries 8 KiB of a string: a longer token is refused before
    // anything is sent, rather than cut to a prefix the coordinator checks.
    let long = format!("tok-alice{}", "x".repeat(8 * 1024));
    match FrameClient::connect(&url, ClientOptions::default().with_token(long)).await {
        Err(ClientError::Invalid(e)) => assert_eq!(e.field(), "token", "{e}"),
        other => panic!("expected an invalid token, got {other:?}"),
    }
    let alice = FrameClient::connect(&url, ClientOptions::default().with_token("tok-alice"))
        .await
        .expect("alice");
    let lease = alice
        .acquire(&resource("jobs/1"), TTL, None, Duration::ZERO)
        .await
        .expect("granted");
    assert_eq!(lease.holder.as_str(), "alice");
    match alice.acquire(&resource("other/1"), TTL, None, Duration::ZERO).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, "permission_denied");
            assert!(message.contains("other/1"), "{message}");
        }
        other => panic!("expected permission_denied, got {other:?}"),
    }
}

fn tls(files: &Files, ca: &Ca, client_ca: Option<&Ca>) -> Tls {
    let leaf = ca.server();
    Tls::load(&TlsFiles {
        cert: files.write("server.pem", &leaf.cert),
        key: files.write("server.key", &leaf.key),
        client_ca: client_ca.map(|c| files.write("client-ca.pem", &c.pem)),
    })
    .expect("load TLS")
}

#[tokio::test]
async fn tls_and_mutual_tls_on_the_frame_port() {
    let (files, ca) = (Files::new(), Ca::new("frames CA"));
    let coordinator = Coordinator::start(Some(policy()), Some(tls(&files, &ca, Some(&ca)))).await;
    let tls_url = format!("leasefences://{}", coordinator.frames);
    let with_ca = ClientTls::new().with_ca_pem(&ca.pem).expect("CA");

    // Plaintext on a TLS port: told to use leasefences://, at once.
    match FrameClient::connect(&coordinator.frames_url(), ClientOptions::default()).await {
        Err(ClientError::Transport { message, .. }) => assert!(message.contains("leasefences://"), "{message}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
    // TLS without a client certificate on a mutual-TLS port: refused.
    match FrameClient::connect(&tls_url, ClientOptions::default().with_tls(with_ca.clone())).await {
        Err(ClientError::Refused { kind, message }) => {
            assert_eq!(kind, "unauthenticated");
            assert!(message.contains("client certificate"), "{message}");
        }
        other => panic!("expected unauthenticated, got {other:?}"),
    }
    // The client certificate names alice.
    let leaf = ca.client();
    let identity = with_ca.with_identity_pem(&leaf.cert, &leaf.key).expect("identity");
    let alice = FrameClient::connect(&tls_url, ClientOptions::default().with_tls(identity))
        .await
        .expect("mutual TLS");
    let lease = alice
        .acquire(&resource("jobs/tls"), TTL, None, Duration::ZERO)
        .await
        .expect("granted");
    assert_eq!(lease.holder.as_str(), "alice");
}

#[tokio::test]
async fn a_tls_client_on_a_plaintext_frame_port_is_told_so() {
    let coordinator = Coordinator::start(None, None).await;
    let ca = Ca::new("unused CA");
    let options = ClientOptions::default()
        .with_connect_timeout(Duration::from_secs(3))
        .with_tls(ClientTls::new().with_ca_pem(&ca.pem).expect("CA"));
    match FrameClient::connect(&format!("leasefences://{}", coordinator.frames), options).await {
        Err(ClientError::Transport { message, .. }) => assert!(message.contains("leasefence://"), "{message}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

/// A coordinator of a shared (in-memory) store, serving frames too.
async fn ha_member(shared: &leasefence_store::MemoryShared) -> (std::sync::Arc<Node>, SocketAddr, String) {
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let addr = http.local_addr().expect("addr");
    drop(http);
    let url = format!("http://{addr}");
    let mut config = ServerConfig::new(addr, std::env::temp_dir());
    config.frames_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let ha = leasefence_server::HaConfig {
        leader_ttl: Duration::from_millis(600),
        advertise: url.clone(),
    };
    let server = Server::bind_shared(config, shared.clone(), ha).await.expect("bind");
    let node = server.node().clone();
    let frames = server.frames_addr().expect("configured").expect("bound");
    tokio::spawn(server.run(std::future::pending()));
    (node, frames, url)
}

#[tokio::test]
async fn a_standby_refuses_with_the_active_coordinators_url() {
    let shared = leasefence_store::MemoryShared::new();
    let a = ha_member(&shared).await;
    let b = ha_member(&shared).await;
    let active = |n: &Node| matches!(n.role(), Role::Active { .. });
    let standby_known = |n: &Node| matches!(n.role(), Role::Standby { leader: Some(_) });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (leader, standby) = loop {
        if active(&a.0) && standby_known(&b.0) {
            break (a, b);
        }
        if active(&b.0) && standby_known(&a.0) {
            break (b, a);
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let standby_url = format!("leasefence://{}", standby.1);
    let leader_url = format!("leasefence://{}", leader.1);
    // Knowing the standby alone: refused, naming the active coordinator.
    let alone = FrameClient::connect(&standby_url, ClientOptions::default())
        .await
        .expect("a standby accepts the connection");
    match alone.acquire(&resource("a"), TTL, None, Duration::ZERO).await {
        Err(ClientError::Transport { message, .. }) => {
            assert!(message.contains(&leader.2), "{message} names {}", leader.2)
        }
        other => panic!("expected a not-leader transport error, got {other:?}"),
    }
    // Knowing both, standby first: the client moves on and stays with the active one.
    let both = FrameClient::connect_any(&[&standby_url, &leader_url], ClientOptions::default()).expect("client");
    let lease = both
        .acquire(&resource("a"), TTL, None, Duration::ZERO)
        .await
        .expect("granted by the active coordinator");
    assert_eq!(lease.token.get(), 1);
    assert_eq!(both.active(), leader_url);
    assert_eq!(
        both.release(&resource("a"), &lease.lease_id).await.expect("released"),
        lease.token
    );
}

#[tokio::test]
async fn a_coordinator_that_is_down_is_skipped() {
    let coordinator = Coordinator::start(None, None).await;
    let down = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
        format!("leasefence://{}", probe.local_addr().expect("addr"))
    };
    let client = FrameClient::connect_any(&[down.as_str(), &coordinator.frames_url()], ClientOptions::default())
        .expect("client");
    // Nothing was sent to the one that is down, so even an acquire moves on.
    let lease = client
        .acquire(&resource("skip"), TTL, None, Duration::ZERO)
        .await
        .expect("granted by the one that is up");
    assert_eq!(lease.token.get(), 1);
    assert_eq!(client.active(), coordinator.frames_url());
    for bad in [&[][..], &["http://127.0.0.1:1"][..]] {
        match FrameClient::connect_any(bad, ClientOptions::default()) {
            Err(ClientError::Invalid(e)) => assert_eq!(e.field(), "server"),
            other => panic!("{bad:?}: expected an invalid server, got {other:?}"),
        }
    }
}

/// Serves frames on `frames` over a fresh store until the sender is used;
/// binding is retried while the last coordinator's port is still closing.
async fn serve_on(
    frames: SocketAddr,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let server = loop {
        let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
        config.frames_listen = Some(frames);
        match Server::bind(config).await {
            Ok(s) => break s,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("bind {frames}: {e}"),
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        let _ = server
            .run(async {
                let _ = rx.await;
            })
            .await;
    });
    (tx, done, dir)
}

#[tokio::test]
async fn a_connection_the_coordinator_closed_while_idle_is_not_used() {
    let frames: SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
        probe.local_addr().expect("addr")
    };
    let (stop, done, _first) = serve_on(frames).await;
    let client = FrameClient::connect(&format!("leasefence://{frames}"), ClientOptions::default())
        .await
        .expect("client");
    let r = resource("restarted");
    let lease = client.acquire(&r, TTL, None, Duration::ZERO).await.expect("granted");
    assert_eq!(lease.token.get(), 1);
    // Stopping closes the idle connection the client keeps; another
    // coordinator takes the port.
    let _ = stop.send(());
    let _ = done.await;
    let (stop, done, _second) = serve_on(frames).await;
    let status = client.status(&r).await.expect("status goes on a new connection");
    assert_eq!(status.last_token, None, "answered by the new coordinator's fresh store");
    let _ = stop.send(());
    let _ = done.await;
    // An acquire is not safe to send twice, but this one was never sent:
    // the connection had closed before it, so it goes on a new one.
    let (_stop, _done, _third) = serve_on(frames).await;
    let again = client
        .acquire(&r, TTL, None, Duration::ZERO)
        .await
        .expect("an acquire after a restart is granted, not left in doubt");
    assert_eq!(again.token.get(), 1);
}

/// A frame port that welcomes every connection, answers its first request
/// with a status, then reads the second and closes without an answer: a
/// connection that breaks after the request left. The count of requests
/// it read is kept in `seen`.
async fn breaks_after_the_second_request(seen: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> SocketAddr {
    use leasefence_proto::frame::{self, Request, Response};
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut out = Vec::new();
                for answer in [
                    Some(Response::Welcome {
                        version: frame::VERSION,
                    }),
                    Some(Response::Status {
                        last_token: 7,
                        held: None,
                        waiters: 0,
                    }),
                    None,
                ] {
                    if !matches!(frame::read_frame(&mut s, &mut buf).await, Ok(true)) {
                        return;
                    }
                    if !matches!(frame::decode_request(&buf), Ok(Request::Hello { .. })) {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    let Some(answer) = answer else { return };
                    out.clear();
                    frame::encode_response(&answer, &mut out);
                    if s.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn after_a_connection_breaks_with_the_request_sent_only_safe_calls_are_retried() {
    use std::sync::atomic::Ordering;
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addr = breaks_after_the_second_request(seen.clone()).await;
    let client = FrameClient::connect(&format!("leasefence://{addr}"), ClientOptions::default())
        .await
        .expect("client");
    let r = resource("broken");
    assert_eq!(
        client.status(&r).await.expect("answered").last_token.map(Token::get),
        Some(7)
    );
    // The pooled connection breaks after this status left: it is asked
    // again on a new connection.
    let status = client.status(&r).await.expect("status is retried on a new connection");
    assert_eq!(status.last_token.map(Token::get), Some(7));
    assert_eq!(seen.load(Ordering::SeqCst), 3, "the second status was sent twice");
    // The new connection breaks after this acquire left: the grant may
    // have happened, so it is not sent again.
    match client.acquire(&r, TTL, None, Duration::ZERO).await {
        Err(ClientError::Transport { message, .. }) => assert!(message.contains("outcome unknown"), "{message}"),
        other => panic!("an acquire whose connection broke after it left is not retried, got {other:?}"),
    }
    assert_eq!(seen.load(Ordering::SeqCst), 4, "the acquire was sent once");
}
