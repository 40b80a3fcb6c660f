//! With a prefix depth configured, rejections carry the resource prefix label.
//! (Its own test binary: the setting is process-wide.)

mod common;

use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_arbiter::{Fence, FenceMode, ResourceId, Token, set_rejection_prefix_segments};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn rejections_are_labelled_with_the_configured_resource_prefix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = EmbeddedArbiter::open(&dir.path().join("prefix.redb")).expect("open");
    let r = ResourceId::new("tenant/7/orders/42").expect("valid");
    let fence = |t: u64| Fence::new(r.clone(), Token::new(t).expect("non-zero"));
    set_rejection_prefix_segments(2);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        a.put(&fence(2), FenceMode::Strict, "k", b"v").expect("put");
        assert!(a.put(&fence(1), FenceMode::Strict, "k", b"v").is_err());
    });
    let counters = common::rejection_counters(&snapshotter);
    let labels = vec![
        ("backend".to_string(), "embedded".to_string()),
        ("prefix".to_string(), "tenant/7".to_string()),
    ];
    assert_eq!(counters, vec![(labels, DebugValue::Counter(1))]);
}
