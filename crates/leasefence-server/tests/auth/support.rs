//! A coordinator with a fixed policy on a loopback port, and HTTP and gRPC
//! calls to it with any `authorization` header.
//!
//! Principals: `alice` and `bob` acquire and read `jobs/` and `shared/`
//! (bob may only acquire `shared/`), `ops` reads everything and is admin on
//! `jobs/`; `svc` is known only by a certificate name.

use std::time::Duration;

use leasefence_core::access::{Policy, PrincipalSpec, RuleSpec, hash_token};
use leasefence_proto::v1::{self as pb, leases_client::LeasesClient};
use leasefence_server::auth::Limits;
use leasefence_server::{Server, ServerConfig};
use serde_json::{Value, json};
use tonic::transport::Channel;

pub const ALICE: &str = "Bearer tok-alice";
pub const BOB: &str = "Bearer tok-bob";
pub const OPS: &str = "Bearer tok-ops";

/// A principal's rules: (prefix, verbs).
type Rules = &'static [(&'static str, &'static [&'static str])];

/// The rules of the policy, for tests to compute what must be allowed.
pub const RULES: &[(&str, Rules)] = &[
    (
        "alice",
        &[("jobs/", &["acquire", "read"]), ("shared/", &["acquire", "read"])],
    ),
    ("bob", &[("jobs/", &["acquire", "read"]), ("shared/", &["acquire"])]),
    ("ops", &[("", &["read"]), ("jobs/", &["admin"])]),
];

pub fn policy() -> Policy {
    let mut specs: Vec<PrincipalSpec> = RULES
        .iter()
        .map(|(name, rules)| PrincipalSpec {
            name: (*name).into(),
            token_sha256: Some(hash_token(&format!("tok-{name}"))),
            cert_names: vec![],
            rules: rules
                .iter()
                .map(|(p, v)| RuleSpec {
                    prefix: (*p).into(),
                    verbs: v.iter().map(|s| (*s).to_string()).collect(),
                })
                .collect(),
        })
        .collect();
    specs.push(PrincipalSpec {
        name: "svc".into(),
        token_sha256: None,
        cert_names: vec!["svc.example.com".into()],
        rules: vec![RuleSpec {
            prefix: "svc/".into(),
            verbs: vec!["acquire".into()],
        }],
    });
    Policy::new(&specs).expect("valid policy")
}

/// Whether `principal` has `verb` on `resource` by [`RULES`] (any match).
pub fn allowed(principal: &str, verb: &str, resource: &str) -> bool {
    RULES
        .iter()
        .filter(|(n, _)| *n == principal)
        .flat_map(|(_, rules)| rules.iter())
        .any(|(p, verbs)| resource.starts_with(p) && verbs.contains(&verb))
}

pub struct Running {
    pub base: String,
    pub http: reqwest::Client,
    pub grpc: LeasesClient<Channel>,
    served: tokio::task::JoinHandle<Result<(), leasefence_server::ServerError>>,
    stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn start(limits: Limits) -> Running {
    let dir = std::env::temp_dir();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), dir);
    config.policy = Some(policy());
    config.limits = limits;
    config.wait_max = Duration::from_secs(30);
    let server = Server::bind_with_store(config, leasefence_store::MemoryStore::new())
        .await
        .expect("bind");
    serve(server).await
}

pub async fn serve(server: Server) -> Running {
    let base = format!("http://{}", server.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let grpc = LeasesClient::connect(base.clone()).await.expect("grpc connect");
    Running {
        base,
        http: reqwest::Client::new(),
        grpc,
        served,
        stop,
    }
}

/// A gRPC request with `auth` as its `authorization` metadata.
pub fn req<T>(msg: T, auth: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(a) = auth {
        r.metadata_mut()
            .insert("authorization", a.parse().expect("ascii header"));
    }
    r
}

impl Running {
    /// Shuts the server down and waits until it has stopped.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        drop(self.grpc);
        let stopped = self.served.await.expect("joined");
        assert!(stopped.is_ok(), "{stopped:?}");
    }

    pub async fn post(&self, auth: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        let mut r = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.expect("send");
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, auth: Option<&str>, path: &str) -> (u16, Value) {
        let mut r = self.http.get(format!("{}{path}", self.base));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.expect("send");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Acquires over HTTP, expecting a grant: (token, lease id, holder).
    pub async fn grant(&self, auth: &str, resource: &str, holder: Option<&str>) -> (u64, String, String) {
        let mut body = json!({ "resource": resource, "ttl_ms": 60_000 });
        if let Some(h) = holder {
            body["holder"] = json!(h);
        }
        let (code, v) = self.post(Some(auth), "/v1/acquire", body).await;
        assert_eq!(code, 200, "{resource}: {v}");
        (
            v["token"].as_u64().expect("token"),
            v["lease_id"].as_str().expect("lease id").to_string(),
            v["holder"].as_str().expect("holder").to_string(),
        )
    }

    /// Over gRPC, every operation with `auth`; the status of each.
    pub async fn grpc_all(
        &self,
        auth: Option<&str>,
        resource: &str,
        lease_id: &str,
    ) -> Vec<(&'static str, tonic::Status)> {
        let mut c = self.grpc.clone();
        let lease = || pb::RenewRequest {
            resource: resource.into(),
            lease_id: lease_id.into(),
        };
        let mut out = Vec::new();
        let acquire = pb::AcquireRequest {
            resource: resource.into(),
            ttl_ms: 60_000,
            ..Default::default()
        };
        out.push(("acquire", c.acquire(req(acquire, auth)).await.err()));
        out.push(("renew", c.renew(req(lease(), auth)).await.err()));
        let release = pb::ReleaseRequest {
            resource: resource.into(),
            lease_id: lease_id.into(),
        };
        out.push(("release", c.release(req(release, auth)).await.err()));
        let get = pb::GetRequest {
            resource: resource.into(),
        };
        out.push(("get", c.get(req(get, auth)).await.err()));
        let watch = pb::WatchRequest {
            resource: resource.into(),
            ..Default::default()
        };
        out.push(("watch", c.watch(req(watch, auth)).await.err()));
        let force = pb::ForceReleaseRequest {
            resource: resource.into(),
        };
        out.push(("force_release", c.force_release(req(force, auth)).await.err()));
        let stream = tokio_stream::iter(vec![lease()]);
        out.push(("keep_alive", keep_alive_error(&mut c, req(stream, auth)).await));
        out.into_iter()
            .map(|(op, e)| (op, e.unwrap_or_else(|| tonic::Status::ok(format!("{op} succeeded")))))
            .collect()
    }
}

/// The first error of a keep-alive stream: on opening it or on its first answer.
async fn keep_alive_error(
    c: &mut LeasesClient<Channel>,
    r: tonic::Request<tokio_stream::Iter<std::vec::IntoIter<pb::RenewRequest>>>,
) -> Option<tonic::Status> {
    match c.keep_alive(r).await {
        Err(e) => Some(e),
        Ok(s) => s.into_inner().message().await.err(),
    }
}

/// 32 hex digits that look like a lease id.
pub fn fake_lease_id(i: u64) -> String {
    format!(
        "{:032x}",
        u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
    )
}
