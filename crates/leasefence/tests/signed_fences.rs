//! `serve --fence-key`: every grant and renewal carries the coordinator's
//! signature over its fence, on HTTP, on gRPC (through the Rust client) and
//! into a `run` child's environment; without a key nothing is signed and no
//! stale signature leaks into a child. Key files are checked at start. End to
//! end, a `run` child's write reaches a gateway holding the key, and the same
//! write with a made-up token is refused there.

mod common;

use std::path::Path;

use common::gateway::GatewayProc;
use common::{BIN, Coordinator, cli};
use leasefence_core::signing::{FenceKey, Verifier};
use leasefence_core::{Fence, ResourceId, Token};
use serde_json::{Value, json};

fn new_key(dir: &Path, id: &str) -> (std::path::PathBuf, FenceKey) {
    let (code, out, err) = cli(&["fence-key", "new", "--id", id]);
    assert_eq!(code, 0, "{err}");
    let path = dir.join(format!("{id}.key"));
    std::fs::write(&path, &out).expect("write key");
    (path, FenceKey::parse(&out).expect("a key line"))
}

fn fence(resource: &str, token: u64) -> Fence {
    Fence::new(ResourceId::new(resource).unwrap(), Token::new(token).unwrap())
}

async fn post(url: &str, path: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .body(body.to_string())
        .send()
        .await
        .expect("http");
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.expect("json")
}

#[tokio::test]
async fn grants_and_renewals_carry_a_signature_that_verifies_only_for_their_fence() {
    let dir = tempfile::tempdir().unwrap();
    let (key_path, key) = new_key(dir.path(), "t1");
    let c = Coordinator::start(&dir.path().join("data"), &["--fence-key", key_path.to_str().unwrap()]);
    let verifier = Verifier::new(vec![key]).unwrap();

    for i in 0..20 {
        let resource = format!("signed-{}", i % 4);
        let lease = post(&c.url, "/v1/acquire", json!({"resource": resource, "ttl_ms": 5000})).await;
        let token = lease["token"].as_u64().unwrap();
        let sig = lease["signature"].as_str().expect("a signature").to_string();
        assert!(sig.starts_with("v1.t1."), "{sig}");
        let f = fence(&resource, token).with_signature(sig.clone());
        assert_eq!(verifier.verify(&f, f.signature.as_deref()), Ok(()));
        assert!(verifier.verify(&fence(&resource, token + 1), Some(&sig)).is_err());
        assert!(verifier.verify(&fence("another", token), Some(&sig)).is_err());

        let body = json!({"resource": resource, "lease_id": lease["lease_id"]});
        let renewed = post(&c.url, "/v1/renew", body.clone()).await;
        assert_eq!(
            renewed["signature"], lease["signature"],
            "a renewal keeps the token, so the signature"
        );
        post(&c.url, "/v1/release", body).await;
    }

    // gRPC, through the Rust client: the lease's fence carries the signature.
    let client = leasefence_client::Client::connect(&c.url).await.unwrap();
    let r = ResourceId::new("grpc-signed").unwrap();
    let lease = client
        .acquire(&r, std::time::Duration::from_secs(5), None, std::time::Duration::ZERO)
        .await
        .unwrap();
    let f = lease.fence();
    assert_eq!(verifier.verify(&f, f.signature.as_deref()), Ok(()));
    client.release(&r, &lease.lease_id).await.unwrap();

    // `run` hands the child the signature beside the fence.
    let script = r#"printf '%s %s\n' "$LEASEFENCE_TOKEN" "$LEASEFENCE_SIGNATURE""#;
    let (code, out, err) = cli(&[
        "run",
        "run-signed",
        "--ttl",
        "2s",
        "--server",
        &c.url,
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(code, 0, "{err}");
    let (token, sig) = out.trim().split_once(' ').expect("token and signature");
    let f = fence("run-signed", token.parse().unwrap());
    assert_eq!(verifier.verify(&f, Some(sig)), Ok(()), "{out}");
}

#[tokio::test]
async fn without_a_key_nothing_is_signed_and_no_outer_signature_reaches_a_child() {
    let dir = tempfile::tempdir().unwrap();
    let c = Coordinator::start(&dir.path().join("data"), &[]);
    let lease = post(&c.url, "/v1/acquire", json!({"resource": "plain", "ttl_ms": 5000})).await;
    assert!(lease.get("signature").is_none(), "{lease}");

    let out = std::process::Command::new(BIN)
        .args(["run", "plain-run", "--ttl", "2s", "--server", &c.url, "--"])
        .args(["sh", "-c", r#"printf '[%s]' "${LEASEFENCE_SIGNATURE-unset}""#])
        .env("LEASEFENCE_SIGNATURE", "v1.outer.0000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[unset]");
}

#[test]
fn a_missing_or_malformed_key_file_stops_serve_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "t1:not-hex\n").unwrap();
    let missing = dir.path().join("missing.key");
    for (path, says) in [(&bad, "64 hex digits"), (&missing, "cannot read it")] {
        let data = dir.path().join("data");
        let (code, _, err) = cli(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--fence-key",
            path.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--fence-key") && err.contains(says), "{err}");
    }
    let (code, _, err) = cli(&["fence-key", "new", "--id", "Not Valid"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("[a-z0-9_-]"), "{err}");
}

#[test]
fn a_signed_grant_writes_through_a_gateway_that_holds_the_key_and_a_made_up_token_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (key_path, _) = new_key(dir.path(), "e2e");
    let key_arg = key_path.to_str().unwrap();
    let c = Coordinator::start(&dir.path().join("data"), &["--fence-key", key_arg]);
    let gateway = GatewayProc::start(&dir.path().join("gw"), &["--fence-key", key_arg]);
    for i in 0..5 {
        let put = format!("{BIN} arbiter put {} e2e-object v{i}", gateway.url);
        let (code, out, err) = cli(&[
            "run", "e2e/r", "--ttl", "2s", "--server", &c.url, "--", "sh", "-c", &put,
        ]);
        assert_eq!(code, 0, "a signed grant writes: {out}{err}");
        // The same child, lying about its token: the signature no longer matches.
        let forged = format!("LEASEFENCE_TOKEN=999999999 {put}");
        let (code, out, _) = cli(&[
            "run", "e2e/r", "--ttl", "2s", "--server", &c.url, "--", "sh", "-c", &forged,
        ]);
        assert_eq!(code, 5, "a made-up token is refused by the gateway: {out}");
        assert!(out.contains("refused"), "{out}");
    }
}
