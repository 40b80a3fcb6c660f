//! Test support: a store whose commits the test holds back or fails.
//!
//! `GatedStore` wraps the in-memory reference store. While its gate is shut,
//! `apply` blocks the writer thread, so a test can look at what the
//! coordinator reports while a mutation is submitted but not yet durable; once
//! told to fail, every `apply` fails as a broken disk would.

#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use leasefence_core::{Mutation, StoredResource};
use leasefence_server::Engine;
use leasefence_store::{Committer, LeaseStore, MemoryStore, StoreError};

#[derive(Default)]
struct GateState {
    shut: bool,
    fail: bool,
}

#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, f: impl FnOnce(&mut GateState)) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        self.changed.notify_all();
    }

    /// Holds every later commit back until [`Gate::open`].
    pub fn shut(&self) {
        self.set(|s| s.shut = true);
    }

    pub fn open(&self) {
        self.set(|s| s.shut = false);
    }

    /// Makes every commit from now on fail (and lets held ones through to fail).
    pub fn fail(&self) {
        self.set(|s| s.fail = true);
    }
}

#[derive(Clone)]
pub struct GatedStore {
    inner: MemoryStore,
    pub gate: Arc<Gate>,
}

impl GatedStore {
    pub fn new() -> GatedStore {
        GatedStore {
            inner: MemoryStore::new(),
            gate: Arc::new(Gate::default()),
        }
    }
}

impl LeaseStore for GatedStore {
    fn load(&mut self) -> Result<Vec<StoredResource>, StoreError> {
        self.inner.load()
    }

    fn apply(&mut self, batch: &[Mutation]) -> Result<(), StoreError> {
        let mut s = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
        while s.shut && !s.fail {
            s = self.gate.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.fail {
            return Err(StoreError::Io("injected write failure".into()));
        }
        drop(s);
        self.inner.apply(batch)
    }
}

/// An engine on `store` with the default lease limits and a 300 s wait limit.
pub fn engine(store: GatedStore) -> Arc<Engine> {
    Engine::start(
        leasefence_core::Config::default(),
        Duration::from_secs(300),
        Committer::start(store, 64),
        Vec::new(),
    )
}

pub fn rid(s: &str) -> leasefence_core::ResourceId {
    leasefence_core::ResourceId::new(s).expect("valid resource")
}

/// An acquire of `r` by `holder`.
pub fn acquire(r: &str, holder: &str, ttl: Duration, wait: Duration) -> leasefence_server::engine::Acquire {
    leasefence_server::engine::Acquire {
        resource: rid(r),
        holder: leasefence_core::Holder::new(holder).expect("valid holder"),
        ttl,
        wait,
        lock_delay: Duration::ZERO,
    }
}

/// A server on a [`GatedStore`], reached over HTTP/JSON.
pub struct Http {
    pub base: String,
    http: reqwest::Client,
    pub served: tokio::task::JoinHandle<Result<(), leasefence_server::ServerError>>,
}

impl Http {
    /// Serves `store` on a free loopback port, with `metrics` at `/metrics`.
    pub async fn start(store: GatedStore, metrics: Option<metrics_exporter_prometheus::PrometheusHandle>) -> Http {
        let mut config =
            leasefence_server::ServerConfig::new("127.0.0.1:0".parse().expect("addr"), std::env::temp_dir());
        config.metrics = metrics;
        let server = leasefence_server::Server::bind_with_store(config, store)
            .await
            .expect("bind");
        let base = format!("http://{}", server.local_addr().expect("addr"));
        let served = tokio::spawn(server.run(std::future::pending()));
        Http {
            base,
            http: reqwest::Client::new(),
            served,
        }
    }

    /// Acquires `resource` for a minute as holder `a`: the status and the JSON body.
    pub async fn acquire(&self, resource: &str) -> (u16, serde_json::Value) {
        let body = serde_json::json!({ "resource": resource, "ttl_ms": 60_000, "holder": "a" });
        let r = self
            .http
            .post(format!("{}/v1/acquire", self.base))
            .json(&body)
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}
