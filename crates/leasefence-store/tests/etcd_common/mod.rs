//! Helpers of the etcd store's tests: the members' URLs from the environment
//! (the one place that decides skip vs fail), stores under a prefix no other
//! test uses, and grants to write.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasefence_core::{Holder, LeaseId, Mutation, ResourceId, Token};
use leasefence_store::{EtcdConfig, EtcdShared};

pub const ETCD_URL: &str = "LEASEFENCE_TEST_ETCD_URL";
pub const ETCD_CLUSTER_URLS: &str = "LEASEFENCE_TEST_ETCD_CLUSTER_URLS";
pub const ETCD_CLUSTER_DIR: &str = "LEASEFENCE_TEST_ETCD_CLUSTER_DIR";

/// The value of `var`. Unset: with `CI=true` the test fails; otherwise it
/// prints a skip line to stderr and the caller returns.
pub fn service_env(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{var} is not set but CI=true: this test needs real etcd, and .ci/run must export {var}");
            }
            eprintln!("skipped: {var} not set (.ci/etcd.sh starts etcd members and sets it)");
            None
        }
    }
}

/// A key prefix no other test (nor an earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!(
        "/leasefence-test/{test}-{}-{nanos}-{}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn config(url: &str, prefix: &str) -> EtcdConfig {
    EtcdConfig::from_url(url)
        .expect("the test URL parses")
        .with_prefix(prefix)
        .expect("valid prefix")
}

/// A store on `url` under `prefix`: one coordinator's handle.
pub fn store(url: &str, prefix: &str) -> EtcdShared {
    EtcdShared::connect(config(url, prefix)).expect("connect")
}

pub fn grant(resource: &str, token: u64) -> Mutation {
    Mutation::Grant {
        resource: ResourceId::new(resource).expect("valid"),
        token: Token::new(token).expect("non-zero"),
        lease_id: LeaseId::from_bytes([token as u8; 16]),
        holder: Holder::new("etcd-test").expect("valid"),
        ttl: Duration::from_secs(10),
        lock_delay: Duration::ZERO,
    }
}
