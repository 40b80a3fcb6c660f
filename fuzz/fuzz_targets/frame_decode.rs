//! Any bytes as a frame of the frame protocol, both ways: decoding never
//! panics, whatever decodes encodes back to the same bytes, and an accepted
//! acquire is validated exactly as the frame edge validates it.
#![no_main]

use leasefence_core::RESOURCE_LEN_MAX;
use leasefence_proto::frame::{self, Request};
use leasefence_server::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut again = Vec::new();
    if let Ok(r) = frame::decode_request(data) {
        frame::encode_request(&r, &mut again);
        assert_eq!(&again[4..], data, "a request re-encodes to its bytes");
        if let Request::Acquire {
            resource,
            holder,
            ttl_ms,
            wait_ms,
            lock_delay_ms,
        } = &r
        {
            let fields = wire::AcquireFields {
                resource,
                ttl_ms: *ttl_ms,
                holder: Some(holder),
                wait_ms: *wait_ms,
                lock_delay_ms: *lock_delay_ms,
            };
            if let Ok(a) = wire::acquire(fields) {
                assert!(a.resource.as_str().len() <= RESOURCE_LEN_MAX);
                assert_eq!(a.resource.as_str(), resource);
            }
        }
    }
    if let Ok(r) = frame::decode_response(data) {
        frame::encode_response(&r, &mut again);
        assert_eq!(&again[4..], data, "a response re-encodes to its bytes");
    }
    if data.len() >= 4 {
        let _ = frame::body_len([data[0], data[1], data[2], data[3]]);
    }
});
