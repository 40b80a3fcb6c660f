//! Runs every trial kind through the real binaries: this crate's
//! `leasefence-trials` (`CARGO_BIN_EXE_leasefence-trials`) and the
//! `leasefence` coordinator next to it.
//!
//! Cargo builds only this package's binaries for its integration tests, and
//! a bin crate cannot be a dev-dependency, so the `leasefence` binary is
//! looked up in the same target directory (`target/<profile>/leasefence`);
//! when it is missing, the test runs `cargo build -p leasefence` (with
//! `--release` for a release test build) once and looks again.
//!
//! The pause and failover trials need PostgreSQL: `LEASEFENCE_TEST_POSTGRES_URL`.
//! Unset, the test fails under `CI=true` and is skipped otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const TRIALS_BIN: &str = env!("CARGO_BIN_EXE_leasefence-trials");

/// The `leasefence` binary next to `leasefence-trials`, built if missing.
fn coordinator_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(TRIALS_BIN).parent().expect("the bin has a directory");
        let bin = dir.join("leasefence");
        if !bin.is_file() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = Command::new(cargo);
            build
                .args(["build", "-p", "leasefence"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().is_some_and(|n| n == "release") {
                build.arg("--release");
            }
            let status = build.status().expect("run cargo build -p leasefence");
            assert!(status.success(), "cargo build -p leasefence failed: {status}");
        }
        assert!(bin.is_file(), "{} is still missing after building it", bin.display());
        bin
    })
}

/// Runs `leasefence-trials ARGS…`; returns (exit code, stdout).
fn trials(args: &[&str]) -> (i32, String) {
    let out = Command::new(TRIALS_BIN)
        .args(args)
        .arg("--bin")
        .arg(coordinator_bin())
        .output()
        .expect("run leasefence-trials");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), stdout)
}

fn last_line(stdout: &str) -> &str {
    stdout.lines().last().unwrap_or_default()
}

/// The PostgreSQL URL, or `None` (skipped, said why) off CI.
fn postgres_url() -> Option<String> {
    match std::env::var("LEASEFENCE_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true needs LEASEFENCE_TEST_POSTGRES_URL for the pause and failover trials"
            );
            eprintln!("skipped: LEASEFENCE_TEST_POSTGRES_URL not set");
            None
        }
    }
}

#[test]
fn pause_trials_reject_every_resumed_writer() {
    let Some(url) = postgres_url() else { return };
    let (code, stdout) = trials(&["pause", "--postgres", &url, "--trials", "10", "--parallel", "4"]);
    assert_eq!(
        last_line(&stdout),
        "10 trials, 0 stale effects, 0 token reuse, 0 acknowledged grants lost"
    );
    assert!(
        stdout.contains("paused writer A: 10 rejected by the arbiter, 0 committed, 0 never attempted"),
        "{stdout}"
    );
    assert_eq!(code, 0);
}

/// The control: without the arbiter every resumed writer's old token lands
/// after the newer one, and the checker must say so.
#[test]
fn pause_control_without_fencing_is_caught() {
    let Some(url) = postgres_url() else { return };
    let (code, stdout) = trials(&["pause", "--postgres", &url, "--trials", "4", "--no-fencing"]);
    assert!(
        stdout.contains("4 trials, 4 stale effects, 0 token reuse, 0 acknowledged grants lost"),
        "{stdout}"
    );
    assert!(
        stdout.contains("paused writer A: 0 rejected by the arbiter, 4 committed, 0 never attempted"),
        "{stdout}"
    );
    assert_eq!(
        last_line(&stdout),
        "control (no fencing): the checker caught 4 stale effects"
    );
    assert_eq!(code, 0);
}

#[test]
fn crash_trials_neither_reuse_nor_lose_tokens() {
    let (code, stdout) = trials(&["crash", "--trials", "5"]);
    assert_eq!(
        last_line(&stdout),
        "5 trials, 0 stale effects, 0 token reuse, 0 acknowledged grants lost"
    );
    assert_eq!(code, 0);
}

#[test]
fn out_of_range_trial_counts_are_refused() {
    for bad in ["0", "100001", "many"] {
        let out = Command::new(TRIALS_BIN)
            .args(["crash", "--trials", bad])
            .output()
            .expect("run leasefence-trials");
        assert_eq!(out.status.code(), Some(2), "--trials {bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--trials"),
            "--trials {bad}"
        );
    }
}

#[test]
fn a_missing_coordinator_binary_is_a_clear_error() {
    let out = Command::new(TRIALS_BIN)
        .args(["crash", "--trials", "1", "--bin", "/nonexistent/leasefence"])
        .output()
        .expect("run leasefence-trials");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the leasefence binary is missing at /nonexistent/leasefence"),
        "{stderr}"
    );
}

/// The number in `line` right before `what` (`"12 rows"` → 12).
fn count_before(stdout: &str, what: &str) -> u64 {
    let at = stdout.find(what).unwrap_or_else(|| panic!("no {what:?} in {stdout}"));
    let digits: String = stdout[..at]
        .trim_end()
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().expect("a count")
}

#[test]
fn failover_trials_kill_the_leader_and_lose_nothing() {
    let Some(url) = postgres_url() else { return };
    let (code, stdout) = trials(&["failover", "--store", &url, "--trials", "3"]);
    assert_eq!(
        last_line(&stdout),
        "3 trials, 0 stale effects, 0 token reuse, 0 acknowledged grants lost"
    );
    assert!(stdout.contains("takeovers: 3, slowest "), "{stdout}");
    assert!(stdout.contains("(bound 3000 ms, 0 slower)"), "{stdout}");
    assert!(stdout.contains("0 trials failed to complete"), "{stdout}");
    // Every coordinator was asked: standbys answered with hints.
    assert!(count_before(&stdout, "not-leader hints followed") > 0, "{stdout}");
    assert!(count_before(&stdout, "acknowledged grants (") > 0, "{stdout}");
    assert_eq!(code, 0);
}

#[test]
fn failover_trials_pause_the_leader_and_it_writes_nothing_after() {
    let Some(url) = postgres_url() else { return };
    let (code, stdout) = trials(&["failover", "--store", &url, "--trials", "3", "--pause"]);
    assert_eq!(
        last_line(&stdout),
        "3 trials, 0 stale effects, 0 token reuse, 0 acknowledged grants lost"
    );
    assert!(stdout.contains("paused leaders: 3 woke and stepped down"), "{stdout}");
    // The woken leaders were sent requests while stopped, and granted none.
    assert!(
        stdout.contains("requests in flight when they woke: 0 granted"),
        "{stdout}"
    );
    assert!(
        count_before(&stdout, "under a paused leader's epoch at its stop") > 0,
        "{stdout}"
    );
    assert!(
        stdout.contains(" 0 written under that epoch after it was deposed"),
        "{stdout}"
    );
    assert_eq!(code, 0);
}

#[test]
fn failover_arguments_are_checked_before_anything_starts() {
    let cases: [(&[&str], &str); 4] = [
        (&["--store", "redis://127.0.0.1:6379"], "--store must be postgres://"),
        (
            &["--store", "postgres://127.0.0.1:1/x", "--coordinators", "1"],
            "--coordinators",
        ),
        (
            &["--store", "postgres://127.0.0.1:1/x", "--leader-ttl", "10ms"],
            "allowed: 300ms..=60s",
        ),
        (
            &["--store", "postgres://127.0.0.1:1/x", "--store-prefix", "a;b"],
            "is not a PostgreSQL store schema name",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(TRIALS_BIN)
            .arg("failover")
            .args(args)
            .args(["--bin", "/bin/true"])
            .output()
            .expect("run leasefence-trials");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
