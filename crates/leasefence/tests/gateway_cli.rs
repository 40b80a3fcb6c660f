//! `leasefence gateway` from the command line: `arbiter check http://…` runs
//! the pause kit against the real gateway process (0 stale accepted),
//! `arbiter install http://…` only checks that a gateway answers, bad flags
//! are refused at start with a message and exit 2, and a data directory in
//! use by another gateway is refused (its temp files are not swept from under it),
//! and a start that fails says why once.

mod common;

use common::cli;
use common::gateway::GatewayProc;

/// Trials of the check here; CI runs `leasefence arbiter check URL --trials 1000` besides.
const TRIALS: &str = "100";

#[test]
fn arbiter_check_against_a_running_gateway_accepts_no_stale_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = GatewayProc::start(dir.path(), &[]);
    let (code, out, err) = cli(&["arbiter", "check", &gateway.url, "--trials", TRIALS]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("{TRIALS} trials, 0 stale accepted, {TRIALS} stale rejected")),
        "{out}"
    );
    let (code, out, err) = cli(&["arbiter", "install", &gateway.url]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("leasefence gateway version") && out.contains("nothing was written"),
        "{out}"
    );
}

#[test]
fn a_second_gateway_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = GatewayProc::start(dir.path(), &[]);
    let d = dir.path().to_str().expect("utf-8 path");
    let (code, _, err) = cli(&["gateway", "--data-dir", d, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("in use by another gateway"), "{err}");
    let addr = first.url.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(addr).is_ok(),
        "the first gateway still serves"
    );
}

#[test]
fn arbiter_commands_refuse_an_http_url_that_is_no_gateway() {
    let coordinator_dir = tempfile::tempdir().expect("tempdir");
    let coordinator = common::Coordinator::start(coordinator_dir.path(), &[]);
    let (code, _, err) = cli(&["arbiter", "check", &coordinator.url, "--trials", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is not a leasefence gateway"), "{err}");
    let port = common::ha::free_port();
    let (code, _, err) = cli(&["arbiter", "install", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gateway: http://127.0.0.1:"), "{err}");
}

#[test]
fn bad_flags_are_refused_with_what_is_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let cases: &[(&[&str], &str)] = &[
        (&["gateway", "--data-dir", d, "--listen", "0.0.0.0:0"], "--insecure"),
        (&["gateway", "--data-dir", d, "--object-size-max", "64MB"], "KiB, MiB"),
        (&["gateway", "--data-dir", d, "--object-size-max", "0"], "1B..=1TiB"),
        (&["gateway", "--data-dir", d, "--object-size-max", "2TiB"], "1B..=1TiB"),
        (&["gateway", "--data-dir", d, "--listen", "localhost"], "--listen"),
        (&["gateway", "--data-dir", d, "--connections-max", "0"], "1..=1000000"),
        (
            &["gateway", "--data-dir", d, "--connections-max", "many"],
            "--connections-max",
        ),
        (&["gateway"], "--data-dir"),
    ];
    for (args, says) in cases {
        let (code, _, err) = cli(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err:?} must mention {says:?}");
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let (code, _, err) = cli(&[
        "gateway",
        "--data-dir",
        file.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot create the directory"), "{err}");
}

/// `--fence-key`: a write through `arbiter put` needs the signature in
/// `LEASEFENCE_SIGNATURE` (refused with exit 5 and nothing written without
/// it), and bad key files are refused at start naming the flag.
#[test]
fn a_gateway_with_a_fence_key_refuses_unsigned_writes() {
    use leasefence_core::signing::FenceKey;
    use leasefence_core::{Fence, ResourceId, Token};
    let dir = tempfile::tempdir().expect("tempdir");
    let key = FenceKey::new("cli", [7; 32]).expect("key");
    let key_file = dir.path().join("fence.key");
    std::fs::write(&key_file, format!("{}\n", key.to_line())).expect("key file");
    let data = dir.path().join("data");
    let gateway = GatewayProc::start(&data, &["--fence-key", key_file.to_str().expect("utf-8")]);
    let put = |signature: Option<&str>, token: &str| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["arbiter", "put", &gateway.url, "signed-key", "v"])
            .env("LEASEFENCE_RESOURCE", "signed/cli")
            .env("LEASEFENCE_TOKEN", token)
            .env_remove("LEASEFENCE_SIGNATURE");
        if let Some(s) = signature {
            cmd.env("LEASEFENCE_SIGNATURE", s);
        }
        let out = cmd.output().expect("run leasefence");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let fence = Fence::new(ResourceId::new("signed/cli").expect("r"), Token::new(3).expect("t"));
    let (code, out) = put(None, "3");
    assert_eq!(code, 5, "{out}");
    assert!(out.contains("refused") && out.contains("no signature"), "{out}");
    let (code, out) = put(Some(&key.sign(&fence)), "4");
    assert_eq!(code, 5, "a signature for token 3 does not sign token 4: {out}");
    let (code, out) = put(Some(&key.sign(&fence)), "3");
    assert_eq!(code, 0, "{out}");

    let d = dir.path().join("other");
    let d = d.to_str().expect("utf-8");
    let k = key_file.to_str().expect("utf-8");
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "cli:abcd\n").expect("bad key file");
    let cases: &[(&[&str], &str)] = &[
        (
            &["gateway", "--data-dir", d, "--fence-key", "/nonexistent/k"],
            "cannot read it",
        ),
        (
            &["gateway", "--data-dir", d, "--fence-key", bad.to_str().expect("utf-8")],
            "64 hex digits",
        ),
        (
            &[
                "gateway",
                "--data-dir",
                d,
                "--fence-key",
                k,
                "--fence-key",
                k,
                "--fence-key",
                k,
            ],
            "1..=2 keys",
        ),
        (
            &["gateway", "--data-dir", d, "--fence-key", k, "--fence-key", k],
            "same id",
        ),
    ];
    for (args, says) in cases {
        let (code, _, err) = cli(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(says) && err.contains("--fence-key"),
            "{args:?}: {err:?} must mention {says:?}"
        );
        assert!(!err.contains(&key.to_line()[4..]), "the secret is never shown: {err}");
    }
}

#[test]
fn a_gateway_on_a_port_in_use_says_which_and_why_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let (code, out, err) = cli(&["gateway", "--data-dir", d, "--listen", &addr]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("cannot listen on {addr}: ")), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "the cause once: {err}");
}

#[test]
fn a_gateway_on_a_store_that_is_no_database_says_why_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gateway.redb"), vec![0x5a_u8; 8192]).expect("write");
    let d = dir.path().to_str().expect("utf-8 path");
    let (code, out, err) = cli(&["gateway", "--data-dir", d, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 1, "{out}{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.starts_with("error: embedded store: "), "{err}");
    // Every part of the line once: the cause is not repeated after the message
    // that already says it.
    let parts: Vec<&str> = line.trim_start_matches("error: embedded store: ").split(": ").collect();
    let mut seen = std::collections::HashSet::new();
    assert!(parts.iter().all(|p| seen.insert(*p)), "a cause said twice: {err}");
}
