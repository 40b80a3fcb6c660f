//! Active/standby over one shared engine (the in-memory reference): exactly
//! one coordinator grants, the other answers with where the active one is; a
//! takeover is a restart (held leases honoured, tokens continue above every
//! acknowledged one); a leader the engine no longer confirms stops answering.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasefence_server::{HaConfig, Role, Server, ServerConfig};
use leasefence_store::MemoryShared;
use serde_json::{Value, json};

const LEADER_TTL: Duration = Duration::from_millis(600);

struct Coordinator {
    url: String,
    node: Arc<leasefence_server::Node>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

async fn start(shared: &MemoryShared) -> Coordinator {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let url = format!("http://{addr}");
    let config = ServerConfig::new(addr, std::env::temp_dir());
    let ha = HaConfig {
        leader_ttl: LEADER_TTL,
        advertise: url.clone(),
    };
    let server = Server::bind_shared(config, shared.clone(), ha).await.expect("bind");
    let node = server.node().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let _ = server
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    });
    Coordinator {
        url,
        node,
        stop: Some(stop),
        served,
    }
}

impl Coordinator {
    fn active(&self) -> bool {
        matches!(self.node.role(), Role::Active { .. })
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.served).await;
    }
}

async fn post(url: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_coordinator_grants_the_other_points_to_it() {
    let shared = MemoryShared::new();
    let a = start(&shared).await;
    until("a to lead", Duration::from_secs(5), || a.active()).await;
    let b = start(&shared).await;
    until("b to learn who leads", Duration::from_secs(5), || {
        matches!(b.node.role(), Role::Standby { leader: Some(_) })
    })
    .await;
    let acquire = json!({ "resource": "ha/1", "ttl_ms": 60_000, "holder": "w" });
    let (code, body) = post(&a.url, "/v1/acquire", acquire.clone()).await;
    assert_eq!((code, body["token"].as_u64()), (200, Some(1)), "{body}");
    let (code, body) = post(&b.url, "/v1/acquire", acquire).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"], "not_leader");
    assert_eq!(body["leader"].as_str(), Some(a.url.as_str()));
    let mut grpc = leasefence_proto::v1::leases_client::LeasesClient::connect(b.url.clone())
        .await
        .expect("connect");
    let refused = grpc
        .get(leasefence_proto::v1::GetRequest {
            resource: "ha/1".into(),
        })
        .await
        .expect_err("a standby refuses");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let hint = refused
        .metadata()
        .get("leasefence-leader")
        .and_then(|v| v.to_str().ok());
    assert_eq!(hint, Some(a.url.as_str()));
    // A request wrong in itself is refused as wrong, on every edge alike,
    // before a standby says where the leader is: retrying it there would
    // only be refused again.
    for (path, bad) in [
        ("/v1/acquire", json!({ "resource": "", "ttl_ms": 60_000 })),
        ("/v1/renew", json!({ "resource": "ha/1", "lease_id": "zz" })),
        ("/v1/release", json!({ "resource": "ha/1", "lease_id": "zz" })),
        ("/v1/force-release", json!({ "resource": "" })),
    ] {
        let (code, body) = post(&b.url, path, bad).await;
        assert_eq!((code, body["error"].as_str()), (400, Some("invalid")), "{path}: {body}");
    }
    let refused = grpc
        .renew(leasefence_proto::v1::RenewRequest {
            resource: "ha/1".into(),
            lease_id: "zz".into(),
        })
        .await
        .expect_err("a malformed lease id");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_honours_held_leases_and_continues_the_tokens() {
    let shared = MemoryShared::new();
    let a = start(&shared).await;
    until("a to lead", Duration::from_secs(5), || a.active()).await;
    let b = start(&shared).await;
    let (code, held) = post(&a.url, "/v1/acquire", json!({ "resource": "t/1", "ttl_ms": 60_000 })).await;
    assert_eq!(code, 200, "{held}");
    for _ in 0..3 {
        let (_, g) = post(&a.url, "/v1/acquire", json!({ "resource": "t/2", "ttl_ms": 60_000 })).await;
        post(
            &a.url,
            "/v1/release",
            json!({ "resource": "t/2", "lease_id": g["lease_id"] }),
        )
        .await;
    }
    // A clean stop resigns: b need not wait out the leader TTL.
    let stopped = Instant::now();
    a.shutdown().await;
    until("b to take over", Duration::from_secs(5), || b.active()).await;
    assert!(stopped.elapsed() < LEADER_TTL * 3, "took {:?}", stopped.elapsed());
    let (code, busy) = post(&b.url, "/v1/acquire", json!({ "resource": "t/1", "ttl_ms": 60_000 })).await;
    assert_eq!(
        (code, busy["error"].as_str()),
        (409, Some("busy")),
        "the held lease survives: {busy}"
    );
    let (code, renewed) = post(
        &b.url,
        "/v1/renew",
        json!({ "resource": "t/1", "lease_id": held["lease_id"] }),
    )
    .await;
    assert_eq!(
        (code, renewed["token"].as_u64()),
        (200, Some(1)),
        "its holder renews it at b: {renewed}"
    );
    let (code, next) = post(&b.url, "/v1/acquire", json!({ "resource": "t/2", "ttl_ms": 60_000 })).await;
    assert_eq!((code, next["token"].as_u64()), (200, Some(4)), "{next}");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_engine_stops_answering_and_recovers() {
    let shared = MemoryShared::new();
    let a = start(&shared).await;
    until("a to lead", Duration::from_secs(5), || a.active()).await;
    let (code, _) = post(&a.url, "/v1/acquire", json!({ "resource": "u/1", "ttl_ms": 60_000 })).await;
    assert_eq!(code, 200);
    shared.set_unreachable(true);
    // No renewal can succeed: by the leader deadline it refuses to answer from memory.
    tokio::time::sleep(LEADER_TTL).await;
    let (code, body) = post(&a.url, "/v1/acquire", json!({ "resource": "u/2", "ttl_ms": 60_000 })).await;
    assert_eq!((code, body["error"].as_str()), (503, Some("unavailable")), "{body}");
    let health = reqwest::get(format!("{}/healthz", a.url)).await.expect("healthz");
    assert_eq!(health.status().as_u16(), 503);
    shared.set_unreachable(false);
    let start = Instant::now();
    loop {
        let (code, body) = post(&a.url, "/v1/acquire", json!({ "resource": "u/3", "ttl_ms": 60_000 })).await;
        if code == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never recovered: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.shutdown().await;
}

/// A release that reached the engine but whose answer was lost is answered
/// as of unknown outcome, never as `unavailable` (which says nothing was
/// done): here it did take effect, and the coordinator, once it has reloaded,
/// grants the resource to the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_is_answered_as_of_unknown_outcome() {
    let shared = MemoryShared::new();
    let a = start(&shared).await;
    until("a to lead", Duration::from_secs(5), || a.active()).await;
    let (code, held) = post(&a.url, "/v1/acquire", json!({ "resource": "o/1", "ttl_ms": 60_000 })).await;
    assert_eq!((code, held["token"].as_u64()), (200, Some(1)), "{held}");
    shared.set_answers_lost(true);
    let (code, body) = post(
        &a.url,
        "/v1/release",
        json!({ "resource": "o/1", "lease_id": held["lease_id"] }),
    )
    .await;
    assert_eq!((code, body["error"].as_str()), (503, Some("outcome_unknown")), "{body}");
    shared.set_answers_lost(false);
    let start = Instant::now();
    loop {
        let (code, body) = post(&a.url, "/v1/acquire", json!({ "resource": "o/1", "ttl_ms": 60_000 })).await;
        if code == 200 {
            assert_eq!(body["token"].as_u64(), Some(2), "the release had landed: {body}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the resource never came free: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.shutdown().await;
}
