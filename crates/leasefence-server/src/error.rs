//! What an API call can answer besides success.

use leasefence_core::LeaseError;
use leasefence_store::StoreError;

#[derive(Clone, Debug, thiserror::Error)]
pub enum ApiError {
    /// An expected refusal (busy, lease lost, invalid, ...).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The store could not make the change durable; nothing was granted.
    #[error("storage failure: {0}")]
    Store(#[from] StoreError),
    /// The coordinator is shutting down.
    #[error("coordinator is shutting down")]
    ShuttingDown,
}

impl ApiError {
    /// Counts this outcome; the edges call it once per refused request.
    pub(crate) fn counted(self) -> ApiError {
        if let ApiError::Lease(e) = &self {
            crate::metrics::refusal(e);
        }
        self
    }
}
