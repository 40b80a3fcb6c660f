//! `leasefence bench --compare … --json` end to end: the real binary against
//! a real coordinator (`leasefence serve`), the machine's Redis and, when the
//! binary has the `etcd` feature and `LEASEFENCE_TEST_ETCD_URL` is set, etcd.
//! It checks the one JSON object's shape and that every target completed
//! cycles; it asserts no speed (that is BENCHMARKS.md's job).

mod common;

use common::{Coordinator, cli};
use serde_json::Value;

/// The URL in `var`, or `None` (skipped) off CI; on CI a missing one fails.
fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) => {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true needs {var}");
            eprintln!("skipped: {var} not set");
            None
        }
    }
}

/// Runs bench with `args` against a fresh coordinator; the parsed JSON.
fn bench_json(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Coordinator::start(dir.path(), &[]);
    let mut all = vec!["bench", "--server", &coordinator.url, "--json"];
    all.extend(args);
    let (code, out, err) = cli(&all);
    assert_eq!(code, 0, "bench failed: {out}\n{err}");
    assert_eq!(out.lines().count(), 1, "stdout holds one JSON object only: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Every (target, clients) pair has one run with ops > 0 and the documented
/// fields, and one ratio per peer and client count.
fn check(v: &Value, targets: &[&str], clients: &[u64]) {
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), targets.len() * clients.len(), "{v}");
    for &t in targets {
        for &c in clients {
            let r = runs
                .iter()
                .find(|r| r["target"] == t && r["clients"] == c)
                .unwrap_or_else(|| panic!("no run of {t} at {c} clients: {v}"));
            assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
            for f in ["p50_ms", "p99_ms", "p999_ms"] {
                assert!(r[f].as_f64().unwrap() > 0.0, "{f}: {r}");
            }
            assert!(r["p50_ms"].as_f64() <= r["p999_ms"].as_f64(), "{r}");
            assert_eq!(r["errors"], 0, "{r}");
        }
    }
    let ratios = v["ratios"].as_array().expect("ratios");
    assert_eq!(ratios.len(), (targets.len() - 1) * clients.len(), "{v}");
    for r in ratios {
        assert!(targets[1..].contains(&r["vs"].as_str().unwrap()), "{r}");
        assert!(r["ops_ratio"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p99_ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn compares_with_redis_and_noop_in_one_json_object() {
    let Some(redis) = service_url("LEASEFENCE_TEST_REDIS_URL") else {
        return;
    };
    let v = bench_json(&[
        "--compare",
        "redis,noop",
        "--redis",
        &redis,
        "--clients",
        "1,2",
        "--duration",
        "200ms",
        "--rounds",
        "1",
    ]);
    check(&v, &["leasefence", "redis", "noop"], &[1, 2]);
    assert_eq!(v["transport"], "grpc", "{v}");
}

#[test]
fn contended_resources_still_complete_cycles() {
    let Some(redis) = service_url("LEASEFENCE_TEST_REDIS_URL") else {
        return;
    };
    let v = bench_json(&[
        "--compare",
        "redis",
        "--redis",
        &redis,
        "--clients",
        "4",
        "--resources",
        "2",
        "--duration",
        "200ms",
        "--rounds",
        "1",
    ]);
    check(&v, &["leasefence", "redis"], &[4]);
}

#[test]
fn compares_with_etcd_when_built_with_it() {
    if !cfg!(feature = "etcd") {
        eprintln!("skipped: built without the etcd feature");
        return;
    }
    let Some(etcd) = service_url("LEASEFENCE_TEST_ETCD_URL") else {
        return;
    };
    let v = bench_json(&[
        "--compare",
        "etcd",
        "--etcd",
        &etcd,
        "--clients",
        "1,2",
        "--duration",
        "200ms",
        "--rounds",
        "2",
    ]);
    check(&v, &["leasefence", "etcd"], &[1, 2]);
}

#[test]
fn measures_leasefence_and_noop_over_the_frame_protocol() {
    // No --server: the coordinator in the bench process serves its frame port.
    let (code, out, err) = cli(&[
        "bench",
        "--transport",
        "frames",
        "--compare",
        "noop",
        "--clients",
        "1,4",
        "--duration",
        "300ms",
        "--rounds",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "bench failed: {out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert_eq!(v["transport"], "frames", "{v}");
    check(&v, &["leasefence", "noop"], &[1, 4]);
}

#[test]
fn a_peer_that_is_down_fails_before_any_round() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Coordinator::start(dir.path(), &[]);
    // Port 1 on loopback: nothing listens there.
    let (code, out, err) = cli(&[
        "bench",
        "--server",
        &coordinator.url,
        "--compare",
        "redis",
        "--redis",
        "redis://:secret@127.0.0.1:1",
        "--duration",
        "10s",
    ]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("cannot reach Redis at redis://:***@127.0.0.1:1"), "{err}");
    assert!(!err.contains("secret"), "{err}");
    assert!(!out.contains("round 1/"), "nothing measured before the check: {out}");
}

#[test]
fn bad_flags_exit_2_with_what_is_allowed() {
    for (args, want) in [
        (&["bench", "--compare", "zookeeper"][..], "possible values"),
        (&["bench", "--clients", "0"], "1..=1024"),
        (&["bench", "--redis", "redis://h:1"], "only used with --compare redis"),
    ] {
        let (code, _, err) = cli(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn without_the_etcd_feature_compare_etcd_names_it() {
    if cfg!(feature = "etcd") {
        eprintln!("skipped: built with the etcd feature");
        return;
    }
    let (code, _, err) = cli(&["bench", "--compare", "etcd"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--features etcd"), "{err}");
}

/// `bench --idle`: one row per count, each from a real server over a store of
/// that many idle resources, with a restart time, an RSS, a per-resource
/// share and latencies; the RSS grows with the resources.
#[test]
fn idle_reports_restart_memory_and_latency_per_count() {
    let (code, out, err) = cli(&[
        "bench",
        "--idle",
        "10,20000",
        "--duration",
        "200ms",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "bench --idle failed: {out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    let rows = v["idle"].as_array().expect("idle rows");
    assert_eq!(rows.len(), 2, "{v}");
    for (row, n) in rows.iter().zip([10, 20_000]) {
        assert_eq!(row["idle_resources"], n, "{row}");
        for f in ["restart_ms", "p50_ms", "p99_ms"] {
            assert!(row[f].as_f64().unwrap() > 0.0, "{f}: {row}");
        }
        // Ten resources can sit within the noise of the empty server's RSS.
        assert!(row["rss_per_idle_resource"].as_f64().is_some(), "{row}");
    }
    assert!(
        rows[1]["rss_bytes"].as_u64() > rows[0]["rss_bytes"].as_u64(),
        "20,000 resources take more memory than 10: {v}"
    );
    let (code, _, err) = cli(&["bench", "--idle", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("1..=10000000"), "{err}");
}
