//! The engine's read-only listing of resources by prefix (for
//! `GET /v1/resources` and the status page): like a status, it persists the
//! expiries due first and answers only once what it reflects is durable.

use std::sync::Arc;

use leasefence_core::ResourcePage;

use super::Engine;
use crate::ApiError;

impl Engine {
    /// Up to `limit` resources under `prefix` after `after`, in name order
    /// (see [`leasefence_core::Coordinator::list`]).
    pub async fn list(
        self: &Arc<Self>,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ResourcePage, ApiError> {
        let (page, barrier) = {
            let mut inner = self.lock();
            self.live(&inner)?;
            let now = self.now();
            inner.machine.advance(now);
            let page = inner.machine.list(now, prefix, after, limit);
            (page, self.settle(&mut inner))
        };
        self.durable(barrier).await?;
        Ok(page)
    }
}
