//! `leasefence arbiter put URL KEY VALUE`: the fence from the environment,
//! `accepted` / exit 0, a stale token rejected with exit 5 and nothing
//! written, missing fence → exit 2. SQLite and the gateway always; PostgreSQL, Redis (the
//! Functions library) and the Redis module when `LEASEFENCE_TEST_POSTGRES_URL`,
//! `LEASEFENCE_TEST_REDIS_URL` and `LEASEFENCE_TEST_REDIS_MODULE_URL` are set
//! (required under `CI=true`).

mod common;

use std::process::Command;

use common::{BIN, cli};

/// Runs `arbiter put` with the fence `(resource, token)` in the environment.
fn put(url: &str, fence: Option<(&str, &str)>, key: &str, value: &str) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["arbiter", "put", url, key, value])
        .env_remove("LEASEFENCE_RESOURCE")
        .env_remove("LEASEFENCE_TOKEN");
    if let Some((resource, token)) = fence {
        cmd.env("LEASEFENCE_RESOURCE", resource).env("LEASEFENCE_TOKEN", token);
    }
    let out = cmd.output().expect("run leasefence");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The shared story: token 2 writes, token 1 is rejected, token 3 writes.
fn story(url: &str, resource: &str) {
    let (code, out, err) = cli(&["arbiter", "install", url]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("installed the leasefence arbiter: ") && out.contains(" version "),
        "install names what it installed: {out}"
    );
    let (code, out, err) = put(url, Some((resource, "2")), resource, "by-2");
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("accepted"), "{out}");
    let (code, out, err) = put(url, Some((resource, "1")), resource, "by-1");
    assert_eq!(code, 5, "stale: {err}");
    assert!(
        out.starts_with(&format!(
            "rejected: stale fencing token for {resource}: presented 1, current 2"
        )),
        "{out}"
    );
    let (code, _, err) = put(url, Some((resource, "3")), resource, "by-3");
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = put(url, None, resource, "no-fence");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("LEASEFENCE_RESOURCE"), "{err}");
    let (code, _, _) = put(url, Some((resource, "zero")), resource, "bad");
    assert_eq!(code, 2);
}

#[tokio::test]
async fn gateway_put_accepts_newer_tokens_and_rejects_stale_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = common::gateway::GatewayProc::start(dir.path(), &[]);
    story(&gateway.url, "cli/put object");
    let resp = reqwest::get(format!("{}/objects/cli/put%20object", gateway.url))
        .await
        .expect("get");
    assert_eq!(resp.headers()["leasefence-token"], "3");
    assert_eq!(resp.text().await.expect("body"), "by-3");
}

#[test]
fn sqlite_put_accepts_newer_tokens_and_rejects_stale_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kv.db");
    story(&format!("sqlite://{}", path.display()), "kv/sqlite");
    let conn = rusqlite::Connection::open(&path).expect("open");
    let history: Vec<(String, i64)> = conn
        .prepare("SELECT value, token FROM leasefence_kv_history WHERE key = 'kv/sqlite' ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(history, vec![("by-2".to_string(), 2), ("by-3".to_string(), 3)]);
    let value: String = conn
        .query_row("SELECT value FROM leasefence_kv WHERE key = 'kv/sqlite'", [], |r| {
            r.get(0)
        })
        .expect("value");
    assert_eq!(value, "by-3");
}

/// The URL in `var`; unset, skip (or fail under `CI=true`).
fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true needs {var}");
            eprintln!("skipped: {var} not set");
            None
        }
    }
}

/// A resource no earlier run used.
fn fresh(backend: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    format!("kv/{backend}/{}/{nanos}", std::process::id())
}

#[test]
fn postgres_put_accepts_newer_tokens_and_rejects_stale_ones() {
    let Some(url) = service_url("LEASEFENCE_TEST_POSTGRES_URL") else {
        return;
    };
    story(&url, &fresh("postgres"));
}

/// On Redis, `put` is a fenced `SET`: the value of the last admitted write
/// stays, under the last admitted token.
fn redis_story(put_url: &str, redis_url: &str, backend: &str) {
    let resource = fresh(backend);
    story(put_url, &resource);
    let mut conn = redis::Client::open(redis_url)
        .and_then(|c| c.get_connection())
        .expect("connect");
    let fence_key = format!("leasefence:fence:{{{resource}}}");
    let (value, token): (Option<String>, Option<String>) = redis::pipe()
        .get(&resource)
        .get(&fence_key)
        .query(&mut conn)
        .expect("read back");
    assert_eq!((value.as_deref(), token.as_deref()), (Some("by-3"), Some("3")));
    let _: u64 = redis::cmd("DEL")
        .arg(&resource)
        .arg(&fence_key)
        .query(&mut conn)
        .expect("cleanup");
}

#[test]
fn redis_put_is_a_fenced_set() {
    let Some(url) = service_url("LEASEFENCE_TEST_REDIS_URL") else {
        return;
    };
    redis_story(&url, &url, "redis");
}

#[test]
fn redis_module_put_is_a_fenced_set() {
    let Some(url) = service_url("LEASEFENCE_TEST_REDIS_MODULE_URL") else {
        return;
    };
    let module_url = url.replacen("redis://", "redis+module://", 1);
    redis_story(&module_url, &url, "redis-module");
}
