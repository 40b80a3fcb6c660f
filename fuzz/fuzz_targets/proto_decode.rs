//! Any bytes as a protobuf request: decoding and validation never panic, and an
//! accepted acquire satisfies the same limits as over HTTP.
#![no_main]

use leasefence_core::{LeaseId, RESOURCE_LEN_MAX, ResourceId};
use leasefence_proto::v1 as pb;
use leasefence_server::wire;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = pb::AcquireRequest::decode(data) {
        if let Ok(a) = wire::acquire_proto(&r) {
            assert!(a.resource.as_str().len() <= RESOURCE_LEN_MAX);
            assert_eq!(a.resource.as_str(), r.resource);
        }
    }
    if let Ok(r) = pb::RenewRequest::decode(data) {
        let _ = wire::resource(&r.resource);
        if let Ok(id) = wire::lease_id(&r.lease_id) {
            assert_eq!(LeaseId::parse_hex(&id.to_hex()), Ok(id));
        }
    }
    if let Ok(r) = pb::WatchRequest::decode(data) {
        let _ = ResourceId::new(&r.resource);
    }
});
