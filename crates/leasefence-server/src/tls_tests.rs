//! The TLS edge: loading the files (errors name the flag and the file), the
//! answers a plaintext client gets on a TLS port, and the client
//! certificate's names handed to the handlers (observed through a test
//! route behind the real listener).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "../tests/support/certs.rs"]
mod certs;

use crate::edge::{EdgeListener, EdgeService};
use crate::peer::PeerCertificate;
use crate::tls::{Tls, TlsError, TlsFile, TlsFiles};
use certs::{CLIENT_NAMES, Ca, Files, Leaf};

/// The server side of the tests: a CA, its server leaf, the files.
struct Setup {
    ca: Ca,
    files: Files,
    tls: TlsFiles,
}

fn setup(client_ca: Option<&Ca>) -> Setup {
    let ca = Ca::new("test CA");
    let files = Files::new();
    let leaf = ca.server();
    let tls = TlsFiles {
        cert: files.write("server.pem", &leaf.cert),
        key: files.write("server.key", &leaf.key),
        client_ca: client_ca.map(|c| files.write("client-ca.pem", &c.pem)),
    };
    Setup { ca, files, tls }
}

/// Serves a router whose `/peer` answers the request's client certificate
/// names (or `none`) behind the real edge listener.
async fn serve(tls: Option<Tls>) -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let app = Router::new().route(
        "/peer",
        get(|peer: Option<axum::Extension<PeerCertificate>>| async move {
            match peer {
                Some(axum::Extension(p)) => p.names.join(","),
                None => "none".to_string(),
            }
        }),
    );
    let listener = EdgeListener::new(tcp, tls).expect("listener");
    tokio::spawn(crate::edge::serve(
        listener,
        EdgeService::new(app, usize::MAX, crate::ServerConfig::DEFAULT_CONNECTION_IDLE),
        std::future::pending(),
    ));
    addr
}

fn client_config(ca_pem: &str, identity: Option<&Leaf>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            let chain = CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("cert PEM");
            let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key PEM");
            builder.with_client_auth_cert(chain, key).expect("client cert")
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// `GET path` over TLS: the whole answer, or the error that ended it.
async fn tls_get(addr: SocketAddr, config: rustls::ClientConfig, path: &str) -> Result<String, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(answer)
}

/// Writes `bytes` in plaintext and reads until the server closes.
async fn plaintext(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(bytes).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
        .await
        .expect("the server closes at once")
        .expect("read");
    answer
}

fn load_error(files: &TlsFiles) -> TlsError {
    Tls::load(files).expect_err("refused")
}

#[test]
fn file_errors_name_the_flag_and_the_file() {
    let s = setup(None);
    let other = Ca::new("other").server();
    let cases: Vec<(TlsFiles, TlsFile, &str)> = vec![
        (
            TlsFiles {
                cert: s.files.path().join("missing.pem"),
                ..s.tls.clone()
            },
            TlsFile::Cert,
            "cannot read it",
        ),
        (
            TlsFiles {
                key: s.files.path().join("missing.key"),
                ..s.tls.clone()
            },
            TlsFile::Key,
            "cannot read it",
        ),
        (
            TlsFiles {
                cert: s.files.write("junk.pem", "not a certificate\n"),
                ..s.tls.clone()
            },
            TlsFile::Cert,
            "no PEM certificate",
        ),
        (
            TlsFiles {
                cert: s.tls.key.clone(),
                ..s.tls.clone()
            },
            TlsFile::Cert,
            "no PEM certificate",
        ),
        (
            TlsFiles {
                key: s.tls.cert.clone(),
                ..s.tls.clone()
            },
            TlsFile::Key,
            "no PEM private key",
        ),
        (
            TlsFiles {
                key: s.files.write("other.key", &other.key),
                ..s.tls.clone()
            },
            TlsFile::Key,
            "does not belong to the certificate",
        ),
        (
            TlsFiles {
                client_ca: Some(s.files.write("empty-ca.pem", "")),
                ..s.tls.clone()
            },
            TlsFile::ClientCa,
            "no PEM certificate",
        ),
        (
            TlsFiles {
                client_ca: Some(s.files.path().join("missing-ca.pem")),
                ..s.tls.clone()
            },
            TlsFile::ClientCa,
            "cannot read it",
        ),
    ];
    for (files, file, says) in cases {
        let e = load_error(&files);
        let text = e.to_string();
        assert_eq!(e.file, file, "{text}");
        assert!(text.starts_with(file.flag()), "names the flag: {text}");
        assert!(text.contains(&e.path.display().to_string()), "names the file: {text}");
        assert!(text.contains(says), "says {says:?}: {text}");
    }
    assert!(Tls::load(&s.tls).is_ok(), "the matching pair loads");
}

#[tokio::test]
async fn a_plaintext_http1_request_gets_400_saying_the_port_speaks_tls() {
    let s = setup(None);
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    for request in [
        &b"GET /peer HTTP/1.1\r\nhost: x\r\n\r\n"[..],
        b"POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
        b"x",
    ] {
        let answer = String::from_utf8(plaintext(addr, request).await).expect("utf-8");
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).expect("a body");
        assert_eq!(body, format!("{}\n", leasefence_proto::TLS_REQUIRED), "one line");
    }
}

#[tokio::test]
async fn an_http2_preface_gets_settings_then_goaway_with_the_message() {
    let s = setup(None);
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    // The preface, an empty SETTINGS, then HEADERS (stream 1, 3 bytes of block).
    let mut client = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0".to_vec();
    client.extend_from_slice(&[0, 0, 3, 0x1, 0x4, 0, 0, 0, 1, 0x82, 0x86, 0x84]);
    let started = Instant::now();
    let answer = plaintext(addr, &client).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered on the request, not after a wait"
    );
    assert_eq!(
        &answer[..9],
        &[0, 0, 0, 4, 0, 0, 0, 0, 0],
        "an empty SETTINGS frame first"
    );
    let goaway = &answer[9..];
    let len = usize::from(goaway[1]) << 8 | usize::from(goaway[2]);
    assert_eq!(goaway[3], 0x7, "then GOAWAY");
    assert_eq!(goaway.len(), 9 + len, "and nothing else");
    assert_eq!(&goaway[13..17], &0xcu32.to_be_bytes(), "INADEQUATE_SECURITY");
    assert_eq!(&goaway[17..], leasefence_proto::TLS_REQUIRED.as_bytes());
}

#[tokio::test]
async fn without_a_client_ca_requests_carry_no_peer_certificate() {
    let s = setup(None);
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    let client = s.ca.client();
    for identity in [None, Some(&client)] {
        let answer = tls_get(addr, client_config(&s.ca.pem, identity), "/peer")
            .await
            .expect("served");
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(answer.ends_with("\r\n\r\nnone"), "{answer}");
    }
    let plain = serve(None).await;
    let answer =
        String::from_utf8(plaintext(plain, b"GET /peer HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await)
            .expect("utf-8");
    assert!(answer.ends_with("\r\n\r\nnone"), "plaintext: {answer}");
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_of_the_client_ca_and_hands_on_the_names() {
    let client_ca = Ca::new("client CA");
    let s = setup(Some(&client_ca));
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    let started = Instant::now();
    let answer = tls_get(addr, client_config(&s.ca.pem, None), "/peer")
        .await
        .expect("a client without a certificate is answered");
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(
        answer.contains(leasefence_proto::CLIENT_CERTIFICATE_REQUIRED),
        "says why: {answer}"
    );
    let stranger = Ca::new("another CA").client();
    match tls_get(addr, client_config(&s.ca.pem, Some(&stranger)), "/peer").await {
        Err(e) => assert!(e.contains("UnknownCA") || e.contains("alert"), "{e}"),
        Ok(answer) => assert!(answer.is_empty(), "another CA's certificate is not served: {answer:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3), "refused at once");
    let member = client_ca.client();
    let answer = tls_get(addr, client_config(&s.ca.pem, Some(&member)), "/peer")
        .await
        .expect("served");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let names = answer.split("\r\n\r\n").nth(1).expect("body");
    let expected = [&CLIENT_NAMES[..], &["10.0.0.7"]].concat().join(",");
    assert_eq!(names, expected, "every SAN, IP addresses as text");
}

#[tokio::test]
async fn silent_connections_do_not_hold_up_the_handshakes_of_others() {
    let s = setup(None);
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let started = Instant::now();
    let answer = tls_get(addr, client_config(&s.ca.pem, None), "/peer")
        .await
        .expect("served");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    drop(silent);
}

#[tokio::test]
async fn a_client_silent_after_its_handshake_is_closed() {
    let s = setup(None);
    let addr = serve(Some(Tls::load(&s.tls).expect("tls"))).await;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(&s.ca.pem, None)));
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let bound = crate::edge::serve::FIRST_BYTES_TIMEOUT + Duration::from_secs(3);
    let read = tokio::time::timeout(bound, tls.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a TLS client that sent no request is closed: {read:?} after {:?}",
        started.elapsed()
    );
}
