//! The read-only HTTP views (`GET /v1/resources`, the NDJSON `GET /v1/watch`)
//! under access control: 401 without a known principal, 403 unless the
//! principal has `read` on the whole prefix (or the resource), and the page's
//! own files (no data) stay reachable so that a browser can load it.

use leasefence_server::auth::Limits;

use crate::support::{ALICE, BOB, OPS, RULES, start};

/// Whether `principal` may read everything under `prefix` by the rules: some
/// rule with `read` covers the prefix.
fn reads_all_under(principal: &str, prefix: &str) -> bool {
    RULES
        .iter()
        .filter(|(n, _)| *n == principal)
        .flat_map(|(_, rules)| rules.iter())
        .any(|(p, verbs)| prefix.starts_with(p) && verbs.contains(&"read"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_watch_need_read_on_the_whole_prefix() {
    let s = start(Limits::default()).await;
    let principals = [
        ("alice", Some(ALICE)),
        ("bob", Some(BOB)),
        ("ops", Some(OPS)),
        ("nobody", None),
    ];
    let prefixes = ["", "jobs/", "jobs/7", "shared/", "shared/x/", "svc/", "other/", "j"];
    let mut checked = 0;
    for (name, auth) in principals {
        for prefix in prefixes {
            let want = match auth {
                None => 401,
                Some(_) if reads_all_under(name, prefix) => 200,
                Some(_) => 403,
            };
            let (code, body) = s.get(auth, &format!("/v1/resources?prefix={prefix}")).await;
            assert_eq!(code, want, "{name} lists {prefix:?}: {body}");
            if code == 403 {
                let message = body["message"].as_str().unwrap_or_default();
                assert!(message.contains("read") && message.contains(prefix), "{message}");
            }
            // A watch that is allowed streams until dropped: read its status only.
            for query in [format!("prefix={prefix}"), format!("resource={prefix}x")] {
                let mut r = reqwest::Client::new().get(format!("{}/v1/watch?{query}", s.base));
                if let Some(a) = auth {
                    r = r.header("authorization", a);
                }
                let resp = r.send().await.expect("watch");
                let resource_want = match auth {
                    None => 401,
                    Some(_) if query.starts_with("prefix") => want,
                    Some(_) if crate::support::allowed(name, "read", &format!("{prefix}x")) => 200,
                    Some(_) => 403,
                };
                assert_eq!(resp.status().as_u16(), resource_want, "{name} watches {query}");
                checked += 2;
            }
            checked += 1;
        }
    }
    for path in ["/", "/ui", "/ui/app.js", "/ui/style.css", "/openapi.json", "/healthz"] {
        let (code, _) = s.get(None, path).await;
        assert_eq!(code, 200, "{path} carries no data and stays open");
    }
    assert!(checked >= 100, "{checked} requests");
    s.stop().await;
}
