//! Identification, holders and watch slots of [`super::Access`].

use leasefence_core::access::{PrincipalSpec, RuleSpec, hash_token};

use super::*;

fn access(limits: Limits) -> Arc<Access> {
    let spec = |name: &str, token: Option<&str>, cert: Option<&str>| PrincipalSpec {
        name: name.into(),
        token_sha256: token.map(hash_token),
        cert_names: cert.map(|c| vec![c.to_string()]).unwrap_or_default(),
        rules: vec![RuleSpec {
            prefix: format!("{name}/"),
            verbs: vec!["acquire".into()],
        }],
    };
    let policy = Policy::new(&[
        spec("a", Some("tok-a"), None),
        spec("svc", None, Some("svc.example.com")),
    ]);
    Arc::new(Access::new(Some(policy.expect("valid")), limits))
}

fn cert(names: &[&str]) -> PeerCertificate {
    PeerCertificate {
        names: names.iter().map(|n| (*n).to_string()).collect(),
    }
}

#[test]
fn a_certificate_names_its_principal_and_a_token_decides_alone() {
    let a = access(Limits::default());
    let svc = cert(&["other.example.com", "svc.example.com"]);
    let by_cert = a.identify(None, Some(&svc)).expect("by certificate");
    assert_eq!(by_cert.principal(), Some("svc"));
    let by_token = a.identify(Some(b"Bearer tok-a"), Some(&svc)).expect("by token");
    assert_eq!(by_token.principal(), Some("a"), "the token wins over the certificate");
    let wrong = a.identify(Some(b"Bearer nope"), Some(&svc));
    assert!(
        matches!(wrong, Err(AuthError::Unauthenticated(_))),
        "a wrong token is not rescued by a certificate"
    );
    let unknown = a.identify(None, Some(&cert(&["x.example.com"])));
    assert!(matches!(unknown, Err(AuthError::Unauthenticated(m)) if m.contains("certificate")));
    for header in [&b"bearer tok-a"[..], b"BEARER  tok-a "] {
        assert_eq!(
            a.identify(Some(header), None).expect("scheme in any case").principal(),
            Some("a")
        );
    }
    assert!(a.identify(Some(&[0xff, 0xfe]), None).is_err(), "not UTF-8");
}

#[test]
fn without_a_policy_anyone_may_do_anything_under_their_own_name() {
    let a = Access::new(None, Limits::default());
    let c = a.identify(None, None).expect("anyone");
    assert_eq!(c.principal(), None);
    let r = ResourceId::new("x").expect("resource");
    assert!(c.check(Verb::Admin, &r).is_ok());
    let h = Holder::new("host:1").expect("holder");
    assert_eq!(c.holder(h.clone()).expect("kept"), h);
    assert!(c.limit().is_none());
}

#[test]
fn the_recorded_holder_names_the_principal_within_the_holder_limit() {
    let a = access(Limits::default());
    let c = a.identify(Some(b"Bearer tok-a"), None).expect("a");
    let anonymous = Holder::new(wire::ANONYMOUS).expect("holder");
    assert_eq!(c.holder(anonymous).expect("ok").as_str(), "a");
    assert_eq!(c.holder(Holder::new("w1").expect("h")).expect("ok").as_str(), "a/w1");
    let long = Holder::new(&"h".repeat(leasefence_core::HOLDER_LEN_MAX)).expect("h");
    let e = c.holder(long).expect_err("too long with the prefix");
    assert_eq!(e.field(), "holder");
    assert!(e.to_string().contains("\"a\"/<holder>"), "{e}");
}

#[test]
fn watch_slots_are_limited_in_all_and_per_principal_and_given_back() {
    let a = access(Limits {
        watchers_max: 3,
        watchers_per_principal_max: 2,
        ..Limits::default()
    });
    let alice = a.identify(Some(b"Bearer tok-a"), None).expect("a");
    let svc = a.identify(None, Some(&cert(&["svc.example.com"]))).expect("svc");
    let first = a.watching(&alice).expect("1");
    let _second = a.watching(&alice).expect("2");
    let e = a.watching(&alice).expect_err("3rd of alice");
    assert!(e.to_string().contains("watchers-per-principal-max = 2"), "{e}");
    let _third = a.watching(&svc).expect("svc");
    let e = a.watching(&svc).expect_err("4th in all");
    assert!(e.to_string().contains("watchers-max = 3"), "{e}");
    drop(first);
    a.watching(&alice).expect("a slot was given back");
}
