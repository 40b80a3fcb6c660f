//! The gRPC conversions without sockets; `tests/grpc.rs` runs them over a
//! real TCP listener.

use super::*;

fn stale(resource: &str, presented: u64, current: u64) -> Stale {
    Stale {
        resource: ResourceId::new(resource).expect("resource"),
        presented: Token::new(presented).expect("token"),
        current: Token::new(current).expect("token"),
    }
}

#[test]
fn stale_round_trips_through_a_status() {
    for s in [stale("orders/42", 4, 5), stale("tenant/ß 7", u64::MAX - 1, u64::MAX)] {
        let status = stale_to_status(&s);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().contains(&s.current.to_string()),
            "{}",
            status.message()
        );
        let md = status.metadata();
        assert_eq!(
            md.get(METADATA_PRESENTED).and_then(|v| v.to_str().ok()),
            Some(&*s.presented.to_string())
        );
        assert_eq!(
            md.get(METADATA_CURRENT).and_then(|v| v.to_str().ok()),
            Some(&*s.current.to_string())
        );
        assert_eq!(stale_from_status(&status), Some(s.clone()));
        assert_eq!(
            stale_from_status(&arbiter_status(ArbiterError::Stale(s.clone()))),
            Some(s)
        );
    }
}

#[test]
fn other_statuses_are_not_stale() {
    let mut md = MetadataMap::new();
    md.insert(METADATA_PRESENTED, MetadataValue::from(4u64));
    md.insert(METADATA_CURRENT, MetadataValue::from(5u64));
    md.insert(HEADER_RESOURCE, MetadataValue::from_static("r"));
    let aborted = Status::with_metadata(Code::Aborted, "x", md);
    assert_eq!(stale_from_status(&aborted), None);
    let missing = require_fence(&Request::new(())).unwrap_err();
    assert_eq!(missing.code(), Code::FailedPrecondition);
    assert_eq!(stale_from_status(&missing), None);
}

#[test]
fn arbiter_errors_map_to_codes_without_leaking_internals() {
    let invalid = arbiter_status(ArbiterError::Invalid(Invalid::new("token", "above the limit")));
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().contains("above the limit"));
    let internal = arbiter_status(ArbiterError::Task("password=hunter2".into()));
    assert_eq!(internal.code(), Code::Internal);
    assert!(!internal.message().contains("hunter2"), "{}", internal.message());
}

#[test]
fn the_interceptors_attach_and_require() {
    let fence = Fence::from_parts("orders/42", "17").expect("fence");
    let attached = AttachFence(fence.clone()).call(Request::new(())).expect("attach");
    assert_eq!(fence_from_request(&attached).expect("valid"), Some(fence.clone()));
    let passed = RequireFence.call(attached).expect("a fenced call passes");
    assert_eq!(passed.extensions().get::<Fence>(), Some(&fence));
    let refused = RequireFence.call(Request::new(())).unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains(HEADER_TOKEN), "{}", refused.message());
}

#[test]
fn a_refused_signature_is_permission_denied() {
    let refused = ArbiterError::BadSignature {
        resource: ResourceId::new("orders/7").expect("valid"),
        reason: leasefence_core::signing::SignatureError::Missing,
    };
    let status = arbiter_status(refused);
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(status.message().contains("orders/7"), "{}", status.message());
}
