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
    /// This coordinator is a standby (or was deposed): `leader` is the active
    /// one's advertised URL, when known. Nothing was done; retry there.
    #[error("not the leader; {}", match leader { Some(l) => format!("the active coordinator is {l}"), None => "no active coordinator is known yet".to_string() })]
    NotLeader { leader: Option<String> },
    /// The coordinator cannot reach its engine (or cannot confirm its
    /// leadership there), so it grants nothing from memory.
    #[error("coordinator unavailable: {0}")]
    Unavailable(String),
    /// The change was sent to the shared store and the engine was lost
    /// before it answered: it may or may not have taken effect. The
    /// coordinator steps down and reloads; a retry finds out (a release is
    /// safe to repeat; an acquire may find its own grant held).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Refused by access control or a limit.
    #[error(transparent)]
    Auth(crate::auth::AuthError),
}

impl ApiError {
    /// A store failure the client may retry elsewhere: the write did not
    /// happen because this coordinator was deposed or its engine is
    /// unreachable, or it may have happened and nobody knows yet.
    pub fn from_store(e: StoreError) -> ApiError {
        match e {
            StoreError::Deposed { .. } => ApiError::NotLeader { leader: None },
            StoreError::Unavailable(msg) => ApiError::Unavailable(msg),
            StoreError::Indeterminate(msg) => ApiError::OutcomeUnknown(msg),
            e => ApiError::Store(e),
        }
    }

    /// Counts this outcome; the edges call it once per refused request.
    pub(crate) fn counted(self) -> ApiError {
        match &self {
            ApiError::Lease(e) => crate::metrics::refusal(e),
            ApiError::Auth(e) => crate::metrics::auth_refusal(e),
            _ => {}
        }
        self
    }
}
