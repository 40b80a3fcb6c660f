//! Access control by client certificate, end to end: a coordinator with
//! mutual TLS and a policy maps a verified certificate's name to its
//! principal; that principal gets exactly its verbs on its prefixes, a
//! certificate naming no principal is refused 401, and a bearer token sent on
//! the same connection decides alone.

#[path = "../../leasefence-server/tests/support/certs.rs"]
mod certs;

use std::time::Duration;

use certs::{CLIENT_NAMES, Ca, Files, Leaf};
use leasefence_client::{Client, ClientError, ClientOptions, ClientTls};
use leasefence_core::ResourceId;
use leasefence_core::access::{Policy, PrincipalSpec, RuleSpec, hash_token};
use leasefence_server::tls::{Tls, TlsFiles};
use leasefence_server::{Server, ServerConfig};

fn policy() -> Policy {
    let rule = |prefix: &str, verbs: &[&str]| RuleSpec {
        prefix: prefix.into(),
        verbs: verbs.iter().map(|v| (*v).to_string()).collect(),
    };
    Policy::new(&[
        PrincipalSpec {
            name: "worker".into(),
            token_sha256: None,
            cert_names: vec![CLIENT_NAMES[0].into()],
            rules: vec![rule("jobs/", &["acquire", "read"])],
        },
        PrincipalSpec {
            name: "reader".into(),
            token_sha256: Some(hash_token("tok-reader")),
            cert_names: vec![],
            rules: vec![rule("", &["read"])],
        },
    ])
    .expect("policy")
}

fn options(ca: &Ca, leaf: &Leaf) -> ClientOptions {
    let tls = ClientTls::new()
        .with_ca_pem(&ca.pem)
        .expect("CA")
        .with_identity_pem(&leaf.cert, &leaf.key)
        .expect("identity");
    ClientOptions::default()
        .with_call_timeout(Duration::from_secs(5))
        .with_tls(tls)
}

fn kind(e: &ClientError) -> &str {
    match e {
        ClientError::Refused { kind, .. } => kind,
        _ => "other",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_name_is_a_principal_with_exactly_its_rules() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (files, ca) = (Files::new(), Ca::new("mtls-access CA"));
    let leaf = ca.server();
    let tls = Tls::load(&TlsFiles {
        cert: files.write("server.pem", &leaf.cert),
        key: files.write("server.key", &leaf.key),
        client_ca: Some(files.write("client-ca.pem", &ca.pem)),
    })
    .expect("TLS");
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), files.path().join("data"));
    config.tls = Some(tls);
    config.policy = Some(policy());
    let server = Server::bind(config).await.expect("bind");
    let url = format!("https://{}", server.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let worker = Client::connect_with(&url, options(&ca, &ca.client()))
        .await
        .expect("connect");
    let stranger = Client::connect_with(&url, options(&ca, &ca.client_named("stranger.example")))
        .await
        .expect("connect");
    let with_token = Client::connect_with(&url, options(&ca, &ca.client()).with_token("tok-reader"))
        .await
        .expect("connect");
    let (ttl, now) = (Duration::from_secs(10), Duration::ZERO);
    let mut checked = 0;
    for i in 0..25 {
        let job = ResourceId::new(&format!("jobs/{i}")).expect("name");
        let other = ResourceId::new(&format!("db/{i}")).expect("name");
        // The certificate's principal: acquire and read on jobs/, nothing else.
        let lease = worker
            .acquire(&job, ttl, None, now)
            .await
            .expect("worker acquires jobs/");
        assert_eq!(
            lease.holder.as_str(),
            "worker",
            "the holder is the certificate's principal"
        );
        let e = worker
            .acquire(&other, ttl, None, now)
            .await
            .expect_err("db/ is not the worker's");
        assert_eq!(kind(&e), "permission_denied", "{e}");
        // A verified certificate that names no principal.
        let e = stranger.status(&job).await.expect_err("no principal");
        assert_eq!(kind(&e), "unauthenticated", "{e}");
        // The token decides alone: the reader may read, not release the worker's lease.
        with_token.status(&job).await.expect("the token's principal reads");
        let e = with_token
            .release(&job, &lease.lease_id)
            .await
            .expect_err("not the reader's lease");
        assert_eq!(kind(&e), "permission_denied", "{e}");
        worker
            .release(&job, &lease.lease_id)
            .await
            .expect("the worker releases its own");
        checked += 6;
    }
    assert!(checked >= 100);
    let _ = stop.send(());
}
