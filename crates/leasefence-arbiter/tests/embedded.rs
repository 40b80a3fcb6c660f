//! Embedded (redb) arbiter on real files in a temp directory.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{fence, unique_resource};
use leasefence_arbiter::conformance::SuiteKeys;
use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_arbiter::targets::EmbeddedTarget;
use leasefence_arbiter::{ArbiterError, FenceMode, REJECTIONS_METRIC, SIGNATURE_REFUSALS_METRIC, Verifier};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

async fn target() -> Option<(Arc<EmbeddedTarget>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = EmbeddedArbiter::open(&dir.path().join("arbiter.redb")).expect("open");
    Some((Arc::new(EmbeddedTarget::new(Arc::new(arbiter))), dir))
}

async fn signed_target(verifier: Verifier) -> Option<(Arc<EmbeddedTarget>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = EmbeddedArbiter::open(&dir.path().join("signed.redb")).expect("open");
    let arbiter = arbiter.require_signatures(verifier);
    Some((Arc::new(EmbeddedTarget::new(Arc::new(arbiter))), dir))
}

mod suite {
    use super::*;
    conformance_tests!(target());
    pause_kit_test!(pause_kit, target(), 25);
    signed_fences_test!(signed_fences, signed_target);
}

#[test]
fn signature_refusals_are_counted_by_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = SuiteKeys::generate();
    let a = EmbeddedArbiter::open(&dir.path().join("refusals.redb"))
        .expect("open")
        .require_signatures(keys.verifier());
    let r = unique_resource("embedded-refusals");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let f = fence(&r, 3);
        let sig = keys.current.sign(&f);
        assert!(a.put(&f, FenceMode::Strict, "k", b"unsigned").is_err());
        assert!(
            a.put(&f.clone().with_signature("v1.x"), FenceMode::Strict, "k", b"bad")
                .is_err()
        );
        assert!(
            a.put(
                &fence(&r, 4).with_signature(sig.clone()),
                FenceMode::Strict,
                "k",
                b"replayed"
            )
            .is_err()
        );
        a.put(&f.with_signature(sig), FenceMode::Strict, "k", b"signed")
            .expect("signed");
    });
    let mut counters: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == SIGNATURE_REFUSALS_METRIC)
        .map(|(k, _, _, v)| (k.key().labels().map(|l| l.value().to_string()).collect::<Vec<_>>(), v))
        .collect();
    counters.sort_by(|a, b| a.0.cmp(&b.0));
    let one = |reason: &str| (vec!["embedded".to_string(), reason.to_string()], DebugValue::Counter(1));
    assert_eq!(counters, vec![one("malformed"), one("mismatch"), one("missing")]);
    assert_eq!(a.get("k").expect("get").as_deref(), Some(&b"signed"[..]));
}

#[test]
fn put_delete_get_are_fenced_and_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kv.redb");
    let r = unique_resource("embedded-kv");
    {
        let a = EmbeddedArbiter::open(&path).expect("open");
        a.put(&fence(&r, 7), FenceMode::Strict, "k", b"seven").expect("put 7");
        let stale = a.put(&fence(&r, 6), FenceMode::Strict, "k", b"six");
        assert!(
            matches!(stale, Err(ArbiterError::Stale(ref s)) if s.current.get() == 7),
            "{stale:?}"
        );
        assert!(matches!(
            a.delete(&fence(&r, 7), FenceMode::Strict, "k"),
            Err(ArbiterError::Stale(_))
        ));
        assert_eq!(a.get("k").expect("get").as_deref(), Some(&b"seven"[..]));
    }
    let a = EmbeddedArbiter::open(&path).expect("reopen");
    assert_eq!(
        a.last_token(&r).expect("last").map(|t| t.get()),
        Some(7),
        "the fence is durable"
    );
    assert_eq!(a.get("k").expect("get").as_deref(), Some(&b"seven"[..]));
    assert!(matches!(
        a.put(&fence(&r, 7), FenceMode::Strict, "k", b"again"),
        Err(ArbiterError::Stale(_))
    ));
    assert!(a.delete(&fence(&r, 8), FenceMode::Strict, "k").expect("delete 8"));
    assert_eq!(a.get("k").expect("get"), None);
    assert!(
        !a.delete(&fence(&r, 8), FenceMode::Monotonic, "k")
            .expect("delete again")
    );
}

#[test]
fn failed_effect_aborts_the_token_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = EmbeddedArbiter::open(&dir.path().join("abort.redb")).expect("open");
    let r = unique_resource("embedded-abort");
    let res: Result<(), ArbiterError> = a.write(&fence(&r, 1), FenceMode::Strict, |tx| {
        let mut kv = tx.open_table(leasefence_arbiter::embedded::KV).expect("table");
        kv.insert("k", &b"v"[..]).expect("insert");
        Err(ArbiterError::Task("effect failed on purpose".into()))
    });
    assert!(matches!(res, Err(ArbiterError::Task(_))));
    assert_eq!(a.last_token(&r).expect("last"), None);
    assert_eq!(a.get("k").expect("get"), None);
}

#[test]
fn rejections_are_counted_with_the_backend_label() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = EmbeddedArbiter::open(&dir.path().join("metrics.redb")).expect("open");
    let r = unique_resource("embedded-metrics");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        a.put(&fence(&r, 2), FenceMode::Strict, "k", b"v").expect("put");
        assert!(a.put(&fence(&r, 1), FenceMode::Monotonic, "k", b"v").is_err());
    });
    let counters: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == REJECTIONS_METRIC)
        .map(|(k, _, _, v)| (k.key().labels().map(|l| l.value().to_string()).collect::<Vec<_>>(), v))
        .collect();
    assert_eq!(counters, vec![(vec!["embedded".to_string()], DebugValue::Counter(1))]);
}
