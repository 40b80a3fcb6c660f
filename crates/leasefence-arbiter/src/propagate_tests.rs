//! Unit tests of the propagation helpers: round trips through each carrier,
//! and every half-propagated or malformed fence rejected with a clear reason.

use std::collections::HashMap;

use http::HeaderMap;
use leasefence_core::{
    ENV_RESOURCE, ENV_SIGNATURE, ENV_TOKEN, Fence, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, ResourceId, Token,
};

use super::*;

fn fence(r: &str, t: u64) -> Fence {
    Fence::new(ResourceId::new(r).expect("valid"), Token::new(t).expect("non-zero"))
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<Result<String, ()>> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| map.get(name).cloned().map(Ok)
}

#[test]
fn headers_round_trip_including_utf8_and_spaces() {
    for f in [fence("orders/42", 17), fence("tenant 7/ü", u64::MAX)] {
        let mut h = HeaderMap::new();
        h.insert("content-type", "text/plain".parse().expect("value"));
        fence_to_headers(&f, &mut h).expect("attach");
        assert_eq!(
            h.get(HEADER_TOKEN).map(|v| v.as_bytes()),
            Some(f.token.to_string().as_bytes())
        );
        assert_eq!(fence_from_headers(&h), Ok(Some(f)));
    }
}

#[test]
fn headers_attach_replaces_a_previous_fence() {
    let mut h = HeaderMap::new();
    fence_to_headers(&fence("r", 1), &mut h).expect("attach");
    fence_to_headers(&fence("r", 2), &mut h).expect("attach again");
    assert_eq!(h.get_all(HEADER_TOKEN).iter().count(), 1);
    assert_eq!(fence_from_headers(&h), Ok(Some(fence("r", 2))));
}

#[test]
fn headers_none_half_repeated_and_malformed() {
    assert_eq!(fence_from_headers(&HeaderMap::new()), Ok(None));
    let mut only_resource = HeaderMap::new();
    only_resource.insert(HEADER_RESOURCE, "r".parse().expect("value"));
    let e = fence_from_headers(&only_resource).unwrap_err();
    assert_eq!(e.field(), "fence");
    assert!(
        e.message().contains(HEADER_TOKEN) && e.message().contains("missing"),
        "{e}"
    );
    let mut only_token = HeaderMap::new();
    only_token.insert(HEADER_TOKEN, "3".parse().expect("value"));
    assert!(
        fence_from_headers(&only_token)
            .unwrap_err()
            .message()
            .contains(HEADER_RESOURCE)
    );
    let mut repeated = HeaderMap::new();
    fence_to_headers(&fence("r", 3), &mut repeated).expect("attach");
    repeated.append(HEADER_TOKEN, "4".parse().expect("value"));
    assert!(
        fence_from_headers(&repeated)
            .unwrap_err()
            .message()
            .contains("more than once")
    );
    let mut zero = HeaderMap::new();
    zero.insert(HEADER_RESOURCE, "r".parse().expect("value"));
    zero.insert(HEADER_TOKEN, "0".parse().expect("value"));
    assert_eq!(fence_from_headers(&zero).unwrap_err().field(), "token");
    let mut bad_utf8 = HeaderMap::new();
    bad_utf8.insert(
        HEADER_RESOURCE,
        http::HeaderValue::from_bytes(b"\xff").expect("obs-text"),
    );
    bad_utf8.insert(HEADER_TOKEN, "1".parse().expect("value"));
    assert!(fence_from_headers(&bad_utf8).unwrap_err().message().contains("UTF-8"));
}

#[test]
fn pairs_round_trip_case_insensitively_among_other_headers() {
    let f = fence("jobs/9", 12);
    let mut msg: Vec<(String, String)> = vec![("trace-id".into(), "abc".into())];
    msg.extend(fence_to_pairs(&f).into_iter().map(|(k, v)| (k.to_string(), v)));
    assert_eq!(fence_from_pairs(msg.iter().map(|(k, v)| (k, v))), Ok(Some(f.clone())));
    let shouted = [("LeaseFence-Resource", "jobs/9"), ("LEASEFENCE-TOKEN", "12")];
    assert_eq!(fence_from_pairs(shouted), Ok(Some(f)));
}

#[test]
fn pairs_none_half_repeated_and_malformed() {
    assert_eq!(fence_from_pairs([("other", "x")]), Ok(None));
    let half = fence_from_pairs([(HEADER_TOKEN, "5")]).unwrap_err();
    assert!(half.message().contains(HEADER_RESOURCE), "{half}");
    let twice = [
        (HEADER_RESOURCE, "a"),
        (HEADER_TOKEN, "5"),
        ("leasefence-resource", "b"),
    ];
    assert!(
        fence_from_pairs(twice)
            .unwrap_err()
            .message()
            .contains("more than once")
    );
    let bad = fence_from_pairs([(HEADER_RESOURCE, "a"), (HEADER_TOKEN, "five")]).unwrap_err();
    assert_eq!(bad.field(), "token");
    assert!(bad.message().contains("five"), "{bad}");
    let empty = fence_from_pairs([(HEADER_RESOURCE, ""), (HEADER_TOKEN, "1")]).unwrap_err();
    assert_eq!(empty.field(), "resource");
}

#[test]
fn env_round_trip_and_errors() {
    let f = fence("batch/nightly", 99);
    let vars = fence_to_env(&f);
    assert_eq!(vars[0].0, ENV_RESOURCE);
    assert_eq!(vars[1], (ENV_TOKEN, "99".to_string()));
    let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(fence_from_env_with(env(&pairs)), Ok(Some(f)));
    assert_eq!(fence_from_env_with(env(&[])), Ok(None));
    let half = fence_from_env_with(env(&[(ENV_RESOURCE, "r")])).unwrap_err();
    assert!(
        half.message().contains(ENV_TOKEN) && half.message().contains("missing"),
        "{half}"
    );
    let bad = fence_from_env_with(env(&[(ENV_RESOURCE, "r"), (ENV_TOKEN, "-1")])).unwrap_err();
    assert_eq!(bad.field(), "token");
    let not_utf8 = |name: &str| (name == ENV_RESOURCE).then_some(Err::<String, _>(()));
    assert!(fence_from_env_with(not_utf8).unwrap_err().message().contains("UTF-8"));
}

#[test]
fn env_vars_reach_a_child_process_and_parse_back() {
    // A real child (`env`) shows that fence_to_env is what Command::envs takes
    // and that the values arrive intact; setting this process's own
    // environment would race the other tests.
    let f = fence("child/1", 7);
    let out = std::process::Command::new("/usr/bin/env")
        .env_clear()
        .envs(fence_to_env(&f))
        .output()
        .expect("run env");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let pairs: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let lookup = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| Ok::<_, ()>(v.clone()))
    };
    assert_eq!(fence_from_env_with(lookup), Ok(Some(f)));
}

const SIG: &str = "v1.k1.e9d6d246fc1171046eaf57e3e2be6ba3066beda8fbddea47947ee6f5b6603414";

#[test]
fn signatures_travel_through_every_carrier() {
    let signed = fence("orders/ü", 7).with_signature(SIG);
    let mut h = HeaderMap::new();
    fence_to_headers(&signed, &mut h).expect("attach");
    assert_eq!(h.get(HEADER_SIGNATURE).map(|v| v.as_bytes()), Some(SIG.as_bytes()));
    assert_eq!(fence_from_headers(&h), Ok(Some(signed.clone())));
    // An unsigned fence attached over a signed one takes the old signature away.
    fence_to_headers(&fence("orders/ü", 8), &mut h).expect("attach unsigned");
    assert_eq!(h.get(HEADER_SIGNATURE), None);
    assert_eq!(fence_from_headers(&h), Ok(Some(fence("orders/ü", 8))));

    let pairs = fence_to_pairs(&signed);
    assert_eq!(pairs.len(), 3);
    let upper: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_uppercase(), v.clone())).collect();
    assert_eq!(fence_from_pairs(upper), Ok(Some(signed.clone())));
    assert_eq!(fence_to_pairs(&fence("r", 1)).len(), 2);

    let vars = fence_to_env(&signed);
    assert!(vars.iter().any(|(k, v)| *k == ENV_SIGNATURE && v == SIG));
    let lookup: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(fence_from_env_with(env(&lookup)), Ok(Some(signed)));
}

#[test]
fn a_signature_without_a_fence_or_unprintable_is_refused() {
    let e = fence_from_pairs([(HEADER_SIGNATURE, SIG)]).expect_err("signature alone");
    assert!(e.to_string().contains("a signature belongs to a fence"), "{e}");
    let e = fence_from_env_with(env(&[(ENV_SIGNATURE, SIG)])).expect_err("signature alone");
    assert!(e.to_string().contains(ENV_SIGNATURE), "{e}");
    let long = "v".repeat(300);
    for bad in ["v1 k1", "v1.k1.\u{e9}", &long[..]] {
        let pairs = [(HEADER_RESOURCE, "r"), (HEADER_TOKEN, "1"), (HEADER_SIGNATURE, bad)];
        let e = fence_from_pairs(pairs).expect_err(bad);
        assert_eq!(e.field(), "signature", "{bad:?}: {e}");
    }
    let pairs = [
        (HEADER_RESOURCE, "r"),
        (HEADER_TOKEN, "1"),
        (HEADER_SIGNATURE, SIG),
        (HEADER_SIGNATURE, SIG),
    ];
    assert!(
        fence_from_pairs(pairs)
            .expect_err("repeated")
            .to_string()
            .contains("more than once")
    );
    let mut h = HeaderMap::new();
    fence_to_headers(&fence("r", 1), &mut h).expect("attach");
    h.append(HEADER_SIGNATURE, SIG.parse().expect("value"));
    h.append(HEADER_SIGNATURE, SIG.parse().expect("value"));
    assert!(fence_from_headers(&h).is_err());
}
