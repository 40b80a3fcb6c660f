//! TLS between client and coordinator, through the real server and the
//! real client: plaintext clients of either kind (HTTP/1, gRPC) refused at
//! once with a message saying to use https://, TLS clients served, a TLS
//! client on a plaintext port told so, and mutual TLS.

#[path = "../../leasefence-server/tests/support/certs.rs"]
mod certs;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use certs::{Ca, Files, Leaf};
use leasefence_client::{Client, ClientError, ClientOptions, ClientTls};
use leasefence_core::ResourceId;
use leasefence_server::tls::{Tls, TlsFiles};
use leasefence_server::{Server, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a refusal may take: far below any call timeout.
const QUICK: Duration = Duration::from_secs(2);

/// A coordinator in this process; stops when dropped.
struct Coordinator {
    addr: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn coordinator(tls: Option<Tls>) -> Coordinator {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path().to_path_buf());
    config.tls = tls;
    let server = Server::bind(config).await.expect("bind");
    let addr = server.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    Coordinator {
        addr,
        _stop: tx,
        _dir: dir,
    }
}

/// A CA, a server leaf of it, and the TLS configuration serving that leaf
/// (requiring client certificates of `client_ca` if given).
fn server_tls(files: &Files, ca: &Ca, client_ca: Option<&Ca>) -> Tls {
    let leaf = ca.server();
    Tls::load(&TlsFiles {
        cert: files.write("server.pem", &leaf.cert),
        key: files.write("server.key", &leaf.key),
        client_ca: client_ca.map(|c| files.write("client-ca.pem", &c.pem)),
    })
    .expect("load TLS")
}

fn options(ca: &Ca, identity: Option<&Leaf>) -> ClientOptions {
    let mut tls = ClientTls::new().with_ca_pem(&ca.pem).expect("CA");
    if let Some(leaf) = identity {
        tls = tls.with_identity_pem(&leaf.cert, &leaf.key).expect("identity");
    }
    ClientOptions::default()
        .with_call_timeout(Duration::from_secs(5))
        .with_tls(tls)
}

/// One gRPC operation through the client (acquire, renew, release, status
/// as `op` picks): `Ok` or the client's error.
async fn grpc_op(client: &Client, op: usize, i: usize) -> Result<(), ClientError> {
    let resource = ResourceId::new(&format!("tls/{i}")).expect("resource");
    let ttl = Duration::from_secs(10);
    match op % 4 {
        0 => client.acquire(&resource, ttl, None, Duration::ZERO).await.map(drop),
        1 => {
            let lease = client.acquire(&resource, ttl, None, Duration::ZERO).await?;
            client.renew(&resource, &lease.lease_id).await.map(drop)
        }
        2 => {
            let lease = client.acquire(&resource, ttl, None, Duration::ZERO).await?;
            client.release(&resource, &lease.lease_id).await.map(drop)
        }
        _ => client.status(&resource).await.map(drop),
    }
}

/// What a TLS client gets for [`http1_request`] `op` (`/metrics` is not
/// enabled in a coordinator served from a test).
const HTTP1_SERVED: [&str; 4] = ["HTTP/1.1 200 ", "HTTP/1.1 200 ", "HTTP/1.1 200 ", "HTTP/1.1 404 "];

/// One HTTP/1 request of the API (`op` picks which), as raw bytes.
fn http1_request(op: usize, i: usize) -> String {
    let (method, path, body) = match op % 4 {
        0 => ("GET", "/healthz".to_string(), String::new()),
        1 => ("GET", format!("/v1/status?resource=tls/h{i}"), String::new()),
        2 => (
            "POST",
            "/v1/acquire".to_string(),
            format!("{{\"resource\":\"tls/h{i}\",\"ttl_ms\":10000}}"),
        ),
        _ => ("GET", "/metrics".to_string(), String::new()),
    };
    format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn http1_plaintext(addr: SocketAddr, request: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.expect("read");
    answer
}

async fn http1_tls(addr: SocketAddr, ca: &Ca, request: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(c.expect("PEM")).expect("root");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.expect("read");
    answer
}

#[tokio::test]
async fn plaintext_clients_are_refused_at_once_and_tls_clients_are_served() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let server = coordinator(Some(server_tls(&files, &ca, None))).await;
    let plain_url = format!("http://{}", server.addr);
    let tls_url = format!("https://{}", server.addr);
    let tls_client = Client::connect_with(&tls_url, options(&ca, None))
        .await
        .expect("TLS connect");
    let mut slowest_refusal = Duration::ZERO;
    let mut counts = [0usize; 4];
    // 160 cases: each of four kinds of client × 4 operations × 10 rounds,
    // interleaved so that refusals and successes alternate on the port.
    for i in 0..160 {
        let (kind, op) = (i % 4, (i / 4) % 4);
        counts[kind] += 1;
        let started = Instant::now();
        match kind {
            0 => {
                let answer = http1_plaintext(server.addr, &http1_request(op, i)).await;
                let took = started.elapsed();
                slowest_refusal = slowest_refusal.max(took);
                assert!(answer.starts_with("HTTP/1.1 400 "), "case {i}: {answer}");
                assert!(answer.contains(leasefence_proto::TLS_REQUIRED), "case {i}: {answer}");
                assert!(took < QUICK, "case {i}: refused in {took:?}");
            }
            1 => {
                // A fresh plaintext client each time: connecting eagerly or lazily.
                let client = if op % 2 == 0 {
                    Client::connect_with(&plain_url, ClientOptions::default()).await
                } else {
                    Client::connect_any_with(&[&plain_url], ClientOptions::default()).await
                };
                let e = match client {
                    Ok(c) => grpc_op(&c, op, i).await.expect_err("plaintext gRPC refused"),
                    Err(e) => e,
                };
                let took = started.elapsed();
                slowest_refusal = slowest_refusal.max(took);
                let text = e.to_string();
                assert!(matches!(e, ClientError::Transport { .. }), "case {i}: {e:?}");
                assert!(
                    text.contains("speaks TLS") && text.contains(&tls_url),
                    "case {i}: says so and names the https:// URL: {text}"
                );
                assert!(took < QUICK, "case {i}: refused in {took:?}");
            }
            2 => {
                let answer = http1_tls(server.addr, &ca, &http1_request(op, i)).await;
                assert!(answer.starts_with(HTTP1_SERVED[op]), "case {i}: {answer}");
                assert!(!answer.contains(leasefence_proto::TLS_REQUIRED), "case {i}: {answer}");
            }
            _ => grpc_op(&tls_client, op, i)
                .await
                .unwrap_or_else(|e| panic!("case {i}: {e}")),
        }
    }
    assert_eq!(counts, [40; 4]);
    eprintln!("160 cases; slowest plaintext refusal {slowest_refusal:?}");
}

#[tokio::test]
async fn a_tls_client_on_a_plaintext_port_is_told_the_server_did_not_answer_tls() {
    let server = coordinator(None).await;
    let url = format!("https://{}", server.addr);
    let ca = Ca::new("test CA");
    let started = Instant::now();
    let eager = Client::connect_with(&url, options(&ca, None))
        .await
        .expect_err("no TLS there");
    let lazy = Client::connect_any_with(&[&url], options(&ca, None))
        .await
        .expect("lazy");
    let on_call = lazy
        .status(&ResourceId::new("r").expect("resource"))
        .await
        .expect_err("no TLS there");
    assert!(started.elapsed() < QUICK, "failed at once: {:?}", started.elapsed());
    for e in [eager, on_call] {
        let text = e.to_string();
        assert!(
            text.contains("did not answer TLS") && text.contains(&format!("http://{}", server.addr)),
            "{text}"
        );
    }
}

#[tokio::test]
async fn mutual_tls_serves_only_clients_with_a_certificate_of_the_client_ca() {
    let (ca, client_ca, files) = (Ca::new("server CA"), Ca::new("client CA"), Files::new());
    let server = coordinator(Some(server_tls(&files, &ca, Some(&client_ca)))).await;
    let url = format!("https://{}", server.addr);
    let resource = ResourceId::new("mtls").expect("resource");
    let started = Instant::now();
    let client = Client::connect_with(&url, options(&ca, None))
        .await
        .expect("handshake without a certificate");
    let e = client.status(&resource).await.expect_err("no certificate: refused");
    assert!(matches!(e, ClientError::Server(_)), "{e:?}");
    assert!(
        e.to_string().contains(leasefence_proto::CLIENT_CERTIFICATE_REQUIRED),
        "{e}"
    );
    let stranger = Ca::new("another CA").client();
    let refused = match Client::connect_with(&url, options(&ca, Some(&stranger))).await {
        Err(e) => e,
        Ok(c) => c
            .status(&resource)
            .await
            .expect_err("another CA's certificate: refused"),
    };
    assert!(matches!(refused, ClientError::Transport { .. }), "{refused:?}");
    assert!(started.elapsed() < QUICK, "refused at once: {:?}", started.elapsed());
    eprintln!("no certificate: {e}\nanother CA's: {refused}");
    let member = client_ca.client();
    let client = Client::connect_with(&url, options(&ca, Some(&member)))
        .await
        .expect("connect");
    let lease = client
        .acquire(&resource, Duration::from_secs(5), None, Duration::ZERO)
        .await
        .expect("served");
    assert_eq!(lease.resource, resource);
}

/// Two coordinators over one shared store, both on TLS: a client given only
/// the standby follows its leader hint (an `https://` URL) with the same
/// TLS settings.
#[tokio::test]
async fn a_leader_hint_to_an_https_coordinator_is_followed_over_tls() {
    let (ca, files) = (Ca::new("test CA"), Files::new());
    let shared = leasefence_store::MemoryShared::new();
    let mut urls = Vec::new();
    let mut nodes = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        let addr = port.local_addr().expect("addr");
        drop(port);
        let mut config = ServerConfig::new(addr, files.path().to_path_buf());
        config.tls = Some(server_tls(&files, &ca, None));
        let ha = leasefence_server::HaConfig {
            leader_ttl: Duration::from_millis(600),
            advertise: format!("https://{addr}"),
        };
        let server = Server::bind_shared(config, shared.clone(), ha).await.expect("bind");
        nodes.push(server.node().clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        urls.push(format!("https://{addr}"));
        stops.push(stop);
    }
    let active = |n: &Arc<leasefence_server::Node>| matches!(n.role(), leasefence_server::Role::Active { .. });
    let started = Instant::now();
    while !nodes.iter().any(active) {
        assert!(started.elapsed() < Duration::from_secs(10), "a leader within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = nodes.iter().position(active).expect("a leader");
    let standby = 1 - leader;
    let client = Client::connect_any_with(&[&urls[standby]], options(&ca, None))
        .await
        .expect("client");
    client
        .status(&ResourceId::new("ha").expect("resource"))
        .await
        .expect("answered by the active coordinator");
    assert_eq!(client.active(), urls[leader], "followed the hint");
    drop(stops);
}

#[test]
fn pem_that_is_not_what_it_should_be_is_refused_by_field() {
    let leaf = Ca::new("test CA").client();
    assert_eq!(ClientTls::new().with_ca_pem("").unwrap_err().field(), "ca");
    assert_eq!(ClientTls::new().with_ca_pem(&leaf.key).unwrap_err().field(), "ca");
    let e = ClientTls::new().with_identity_pem(&leaf.key, &leaf.key).unwrap_err();
    assert_eq!(e.field(), "cert");
    let e = ClientTls::new().with_identity_pem(&leaf.cert, &leaf.cert).unwrap_err();
    assert_eq!(e.field(), "key");
    let ok = ClientTls::new()
        .with_identity_pem(&leaf.cert, &leaf.key)
        .expect("a pair");
    assert!(!format!("{ok:?}").contains("PRIVATE"), "Debug never shows the key");
}
