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

/// The 3-member cluster's members, as `.ci/etcd.sh` lays them out under
/// `LEASEFENCE_TEST_ETCD_CLUSTER_DIR`: `members` (the names, in URL order) and,
/// per member, `client` (host:port), `pid` and `start`.
pub struct Cluster {
    dir: std::path::PathBuf,
    pub names: Vec<String>,
}

impl Cluster {
    pub fn open(dir: &str) -> Cluster {
        let dir = std::path::PathBuf::from(dir);
        let members = std::fs::read_to_string(dir.join("members")).expect("the cluster's members file");
        let names = members.lines().map(str::to_string).collect();
        Cluster { dir, names }
    }

    fn read(&self, name: &str, file: &str) -> String {
        let path = self.dir.join(name).join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_string()
    }

    pub fn is_up(&self, name: &str) -> bool {
        let addr = self.read(name, "client");
        std::net::TcpStream::connect(addr.as_str()).is_ok()
    }

    fn wait(&self, name: &str, up: bool) {
        let start = std::time::Instant::now();
        while self.is_up(name) != up {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "etcd member {name} is not {} after 20 s",
                if up { "up" } else { "down" }
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the member and waits until its client port refuses.
    pub fn kill(&self, name: &str) {
        let pid = self.read(name, "pid");
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL {pid} ({name})");
        self.wait(name, false);
    }

    /// Starts the member again on its data dir and waits until it listens.
    pub fn start(&self, name: &str) {
        let script = self.dir.join(name).join("start");
        let status = std::process::Command::new("sh")
            .arg(&script)
            .status()
            .expect("run the member's start script");
        assert!(status.success(), "{}", script.display());
        self.wait(name, true);
    }
}

/// Starts every member that is down when dropped, so that a failing test
/// leaves the cluster whole for the next one.
pub struct Restore<'a>(pub &'a Cluster);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        // No panics here: this may run while a failed test unwinds.
        for name in &self.0.names {
            if !self.0.is_up(name) {
                let _ = std::process::Command::new("sh")
                    .arg(self.0.dir.join(name).join("start"))
                    .status();
            }
        }
    }
}
