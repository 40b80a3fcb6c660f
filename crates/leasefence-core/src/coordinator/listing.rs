//! Listing resources by name prefix, for read-only views (the status page,
//! `GET /v1/resources`): a bounded page in name order, resumable after the
//! last name a page returned.

use super::{Coordinator, ResourceStatus};
use crate::MonoTime;

/// The most resources one listing returns.
pub const LIST_LIMIT_MAX: usize = 1000;

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePage {
    /// In name order (byte order of UTF-8), at most the limit asked for.
    pub resources: Vec<ResourceStatus>,
    /// More resources match after the last one returned.
    pub more: bool,
}

impl Coordinator {
    /// Resources whose name starts with `prefix` and sorts after `after` (all
    /// when `None`), as seen at `now`, in name order; at most `limit`, itself
    /// capped at [`LIST_LIMIT_MAX`]. Reads only the names it returns (and
    /// one more): the machine keeps resources in name order.
    pub fn list(&self, now: MonoTime, prefix: &str, after: Option<&str>, limit: usize) -> ResourcePage {
        use std::ops::Bound;
        let limit = limit.min(LIST_LIMIT_MAX);
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let mut names = self
            .resources
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(r, _)| r)
            .take_while(|r| r.as_str().starts_with(prefix));
        let resources: Vec<_> = names.by_ref().take(limit).map(|r| self.status(now, r)).collect();
        ResourcePage {
            resources,
            more: names.next().is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{AcquireRequest, Config, Holder, LeaseId, ResourceId};

    use super::*;

    fn machine(names: &[&str]) -> Coordinator {
        let config = Config::new(Duration::from_millis(10), Duration::from_secs(3600), 8).expect("config");
        let mut c = Coordinator::new(config);
        for (i, name) in names.iter().enumerate() {
            let mut id = [1u8; 16];
            id[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let req = AcquireRequest {
                resource: ResourceId::new(name).expect("valid"),
                holder: Holder::new("h").expect("valid"),
                ttl: Duration::from_millis(100 * (i as u64 + 1)),
                lease_id: LeaseId::from_slice(&id).expect("id"),
                wait: false,
                lock_delay: Duration::ZERO,
            };
            c.acquire(MonoTime::ZERO, req).expect("granted");
        }
        c
    }

    fn names(page: &ResourcePage) -> Vec<&str> {
        page.resources.iter().map(|s| s.resource.as_str()).collect()
    }

    #[test]
    fn pages_by_prefix_in_name_order() {
        let c = machine(&["b/2", "a/1", "b/1", "b/10", "c", "b/3"]);
        let page = c.list(MonoTime::ZERO, "b/", None, 2);
        assert_eq!(names(&page), ["b/1", "b/10"]);
        assert!(page.more);
        let page = c.list(MonoTime::ZERO, "b/", Some("b/10"), 2);
        assert_eq!(names(&page), ["b/2", "b/3"]);
        assert!(!page.more, "b/3 is the last under b/");
        assert_eq!(names(&c.list(MonoTime::ZERO, "", None, 100)).len(), 6);
        assert!(c.list(MonoTime::ZERO, "z", None, 100).resources.is_empty());
        assert!(c.list(MonoTime::ZERO, "", None, 0).more, "limit 0 says there is more");
    }

    #[test]
    fn a_listing_reads_like_status() {
        let c = machine(&["x/1", "x/2"]);
        // x/1's lease (100 ms) has run out at 150 ms; x/2's (200 ms) has not.
        let now = MonoTime::from_millis(150);
        let page = c.list(now, "x/", None, 10);
        let expected: Vec<_> = ["x/1", "x/2"]
            .iter()
            .map(|n| c.status(now, &ResourceId::new(n).expect("valid")))
            .collect();
        assert_eq!(page.resources, expected);
        assert!(page.resources[0].held.is_none());
        assert_eq!(
            page.resources[1].held.as_ref().map(|h| h.expires_in),
            Some(Duration::from_millis(50))
        );
    }

    #[test]
    fn the_limit_is_capped() {
        let many: Vec<String> = (0..LIST_LIMIT_MAX + 5).map(|i| format!("r/{i:05}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let c = machine(&refs);
        let page = c.list(MonoTime::ZERO, "r/", None, usize::MAX);
        assert_eq!(page.resources.len(), LIST_LIMIT_MAX);
        assert!(page.more);
        assert_eq!(page.resources[0].resource.as_str(), "r/00000");
    }
}
