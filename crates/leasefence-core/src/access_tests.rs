//! Unit tests of the access policy: token and certificate look-up, which
//! rules grant what, the refusals' wording, bad policy files and the holder a
//! grant records.

use super::*;

fn spec(name: &str, token: &str, rules: &[(&str, &[&str])]) -> PrincipalSpec {
    PrincipalSpec {
        name: name.into(),
        token_sha256: Some(hash_token(token)),
        cert_names: vec![],
        rules: rules
            .iter()
            .map(|(p, v)| RuleSpec {
                prefix: (*p).into(),
                verbs: v.iter().map(|s| (*s).to_string()).collect(),
            })
            .collect(),
    }
}

#[test]
fn the_token_hash_is_sha256_hex() {
    // printf abc | sha256sum
    assert_eq!(
        hash_token("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_token_finds_its_principal_and_only_that_token_does() {
    let p = Policy::new(&[spec("a", "tok-a", &[]), spec("b", "tok-b", &[])]).expect("valid");
    assert_eq!(p.by_token("tok-a").map(Principal::name), Some("a"));
    assert_eq!(p.by_token("tok-b").map(Principal::name), Some("b"));
    for wrong in ["", "tok-", "tok-a ", "TOK-A", &hash_token("tok-a")] {
        assert!(p.by_token(wrong).is_none(), "{wrong:?}");
    }
}

#[test]
fn certificate_names_find_their_principal() {
    let mut s = spec("svc", "t", &[]);
    s.token_sha256 = None;
    s.cert_names = vec!["svc.example.com".into()];
    let p = Policy::new(&[s]).expect("valid");
    assert_eq!(
        p.by_cert_names(&["other", "svc.example.com"]).map(Principal::name),
        Some("svc")
    );
    assert!(p.by_cert_names(&["svc.example.org"]).is_none());
}

/// Every verb against every resource of a grid: allowed exactly when some
/// rule's prefix starts the name and lists the verb.
#[test]
fn any_matching_rule_grants_and_nothing_else_does() {
    let rules: &[(&str, &[&str])] = &[
        ("jobs/", &["acquire", "read"]),
        ("jobs/secret/", &["read"]),
        ("ops/", &["admin"]),
    ];
    let policy = Policy::new(&[spec("w", "t", rules)]).expect("valid");
    let w = &policy.principals()[0];
    let mut checked = 0;
    for resource in [
        "jobs/1",
        "jobs/secret/x",
        "jobs",
        "job/1",
        "ops/db",
        "ops",
        "x",
        "jobs/",
        "JOBS/1",
    ] {
        for verb in Verb::ALL {
            let expected = rules
                .iter()
                .any(|(p, vs)| resource.starts_with(p) && vs.contains(&verb.as_str()));
            assert_eq!(w.allows(verb, resource), expected, "{verb} on {resource}");
            checked += 1;
        }
    }
    assert_eq!(checked, 27);
    // A longer prefix does not narrow a shorter one.
    assert!(w.allows(Verb::Acquire, "jobs/secret/x"));
}

#[test]
fn a_watched_prefix_needs_a_rule_covering_all_of_it() {
    let policy = Policy::new(&[spec("w", "t", &[("jobs/", &["read"])])]).expect("valid");
    let w = &policy.principals()[0];
    assert!(w.allows_all_under(Verb::Read, "jobs/"));
    assert!(w.allows_all_under(Verb::Read, "jobs/a"));
    assert!(!w.allows_all_under(Verb::Read, "jobs"));
    assert!(!w.allows_all_under(Verb::Read, ""));
}

#[test]
fn a_refusal_names_the_verb_the_resource_and_what_is_granted() {
    let policy = Policy::new(&[spec("w", "t", &[("jobs/", &["acquire"])])]).expect("valid");
    let msg = policy.principals()[0].denied(Verb::Acquire, "db/1", false).to_string();
    assert!(
        msg.contains("`acquire`") && msg.contains("\"db/1\"") && msg.contains("\"jobs/\""),
        "{msg}"
    );
    let msg = policy.principals()[0].denied(Verb::Admin, "db/", true).to_string();
    assert!(msg.contains("prefix \"db/\"") && msg.contains("on no prefix"), "{msg}");
}

#[test]
fn bad_configs_are_errors_naming_the_key() {
    let ok = || spec("a", "t", &[("", &["read"])]);
    let cases: Vec<(Vec<PrincipalSpec>, &str, &str)> = vec![
        (
            vec![spec("a", "t", &[("x/", &["write"])])],
            "principal[0] (\"a\").rules[0].verbs",
            "\"write\" is not a verb; allowed: \"acquire\", \"read\", \"admin\"",
        ),
        (vec![spec("a", "t", &[("x/", &[])])], "rules[0].verbs", "is empty"),
        (
            vec![ok(), spec("a", "u", &[])],
            "principal[1] (\"a\").name",
            "also principal[0]",
        ),
        (
            vec![ok(), spec("b", "t", &[])],
            "principal[1] (\"b\").token-sha256",
            "same hash as principal[0]",
        ),
        (
            vec![PrincipalSpec {
                token_sha256: Some(String::new()),
                ..ok()
            }],
            "token-sha256",
            "is empty",
        ),
        (
            vec![PrincipalSpec {
                token_sha256: Some("z".repeat(64)),
                ..ok()
            }],
            "token-sha256",
            "not hex at character 1",
        ),
        (
            vec![PrincipalSpec {
                token_sha256: Some("ab".into()),
                ..ok()
            }],
            "token-sha256",
            "has 2 characters",
        ),
        (
            // Characters, not bytes: the é is the second.
            vec![PrincipalSpec {
                token_sha256: Some("aé".into()),
                ..ok()
            }],
            "token-sha256",
            "not hex at character 2",
        ),
        (
            vec![PrincipalSpec {
                token_sha256: None,
                ..ok()
            }],
            "token-sha256",
            "give token-sha256",
        ),
        (
            vec![PrincipalSpec {
                name: "a/b".into(),
                ..ok()
            }],
            "principal[0].name",
            "no `/`",
        ),
        (
            vec![PrincipalSpec {
                name: String::new(),
                ..ok()
            }],
            "principal[0].name",
            "1..=64",
        ),
    ];
    for (specs, key, says) in cases {
        let e = Policy::new(&specs).expect_err(key);
        assert!(e.key.contains(key), "{e}: the key is {key}");
        assert!(e.message.contains(says), "{e}: says {says}");
    }
}

#[test]
fn the_recorded_holder_carries_the_principal() {
    assert_eq!(holder_for("w", None), "w");
    assert_eq!(holder_for("w", Some("")), "w");
    assert_eq!(holder_for("w", Some("host:1")), "w/host:1");
    assert_eq!(owner_of("w/host:1/x"), "w");
    assert_eq!(owner_of("w"), "w");
}
