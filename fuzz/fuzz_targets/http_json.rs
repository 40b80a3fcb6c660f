//! Any bytes as an HTTP acquire, renew, release or force-release body, and as a `GET`
//! route's query string: decoding never panics, and whatever it accepts satisfies the
//! documented limits.
#![no_main]

use leasefence_core::{HOLDER_LEN_MAX, RESOURCE_LEN_MAX};
use leasefence_server::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = wire::acquire_json(data) {
        let r = a.resource.as_str();
        assert!(!r.is_empty() && r.len() <= RESOURCE_LEN_MAX && !r.chars().any(char::is_control));
        let h = a.holder.as_str();
        assert!(!h.is_empty() && h.len() <= HOLDER_LEN_MAX && !h.chars().any(char::is_control));
    }
    if let Ok((resource, lease_id)) = wire::lease_json(data) {
        assert!(resource.as_str().len() <= RESOURCE_LEN_MAX);
        assert_eq!(leasefence_core::LeaseId::parse_hex(&lease_id.to_hex()), Ok(lease_id));
    }
    if let Ok(resource) = wire::resource_json(data) {
        let r = resource.as_str();
        assert!(!r.is_empty() && r.len() <= RESOURCE_LEN_MAX && !r.chars().any(char::is_control));
    }
    if let Ok(raw) = std::str::from_utf8(data) {
        // Reading never panics (what it keeps is typed to the names allowed).
        let _ = wire::query(Some(raw), &["prefix", "resource", "after", "limit"]);
    }
});
