//! `leasefence arbiter key add|list|remove URL`: with a key installed, `arbiter
//! put` is refused (exit 5, nothing written) unless `LEASEFENCE_SIGNATURE`
//! signs its fence; with the key removed, unsigned fences pass again. On a
//! `redis-server` of the test's own (its keys bind no other test).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, cli};
use leasefence_core::signing::FenceKey;
use leasefence_core::{Fence, ResourceId, Token};

struct Redis(Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A throwaway server; `None` (skipped, or failing under `CI=true`) without `redis-server`.
fn redis(dir: &std::path::Path) -> Option<Redis> {
    if Command::new("redis-server").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "redis-server is needed under CI=true"
        );
        eprintln!("skipped: no redis-server");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Redis(child, port))
}

fn put(url: &str, token: &str, signature: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["arbiter", "put", url, "k", token])
        .env("LEASEFENCE_RESOURCE", "keys/cli")
        .env("LEASEFENCE_TOKEN", token)
        .env_remove("LEASEFENCE_SIGNATURE");
    if let Some(s) = signature {
        cmd.env("LEASEFENCE_SIGNATURE", s);
    }
    let out = cmd.output().expect("run leasefence");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn keys_added_and_removed_from_the_command_line_decide_what_put_may_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(server) = redis(dir.path()) else { return };
    let url = format!("redis://127.0.0.1:{}", server.1);
    let key = FenceKey::new("cli-key", [9; 32]).expect("key");
    let file = dir.path().join("fence.key");
    std::fs::write(&file, format!("{}\n", key.to_line())).expect("key file");
    let file = file.to_str().expect("utf-8");

    let (code, _, err) = cli(&["arbiter", "install", &url]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["arbiter", "key", "add", &url, "--key-file", file]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("installed fence key cli-key") && out.contains("fence keys: cli-key"),
        "{out}"
    );
    assert!(
        !out.contains(&key.to_line()[8..]) && !err.contains(&key.to_line()[8..]),
        "no secret shown"
    );

    let (code, text) = put(&url, "3", None);
    assert_eq!(code, 5, "unsigned: {text}");
    assert!(text.contains("refused") && text.contains("no signature"), "{text}");
    let signed = |t: u64| {
        key.sign(&Fence::new(
            ResourceId::new("keys/cli").expect("r"),
            Token::new(t).expect("t"),
        ))
    };
    let (code, text) = put(&url, "3", Some(&signed(4)));
    assert_eq!(code, 5, "signed for another token: {text}");
    let (code, text) = put(&url, "3", Some(&signed(3)));
    assert_eq!(code, 0, "signed: {text}");

    let (code, out, err) = cli(&["arbiter", "key", "list", &url]);
    assert_eq!((code, out.trim()), (0, "fence keys: cli-key"), "{err}");
    let (code, out, err) = cli(&["arbiter", "key", "remove", &url, "cli-key"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("removed fence key cli-key") && out.contains("no fence keys"),
        "{out}"
    );
    let (code, text) = put(&url, "4", None);
    assert_eq!(code, 0, "no key, no check: {text}");

    let (code, _, err) = cli(&["arbiter", "key", "add", &url, "--key-file", "/nonexistent/k"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--key-file") && err.contains("cannot read"), "{err}");
    let (code, _, err) = cli(&["arbiter", "key", "list", "sqlite:///tmp/x.db"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("does not check fence signatures"), "{err}");
}
