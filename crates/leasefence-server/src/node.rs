//! What this coordinator is right now: the active one (with its engine), a
//! standby that knows (or not) who is active, or cut off from its engine.
//!
//! The edges ask the node for the engine on every call; a standby answers
//! "not the leader" with the active coordinator's URL, so that clients go
//! there. With the embedded store a node is active for its whole life.

use std::sync::{Arc, OnceLock, RwLock};

use leasefence_core::signing::FenceKey;
use leasefence_core::{Fence, Grant};
use leasefence_store::Epoch;

use crate::{ApiError, Engine};

/// The role of this coordinator.
#[derive(Clone)]
pub enum Role {
    /// Grants. `epoch` is its leadership term on a shared store (`None`: embedded).
    Active { engine: Arc<Engine>, epoch: Option<Epoch> },
    /// Another coordinator leads (`leader`: its advertised URL, when known).
    Standby { leader: Option<String> },
    /// The engine cannot be reached: nothing is granted until it can.
    Unavailable { reason: String },
}

pub struct Node {
    role: RwLock<Role>,
    /// The key every grant's fence is signed with, when fences are signed.
    fence_key: OnceLock<FenceKey>,
}

impl Node {
    pub fn new(role: Role) -> Arc<Node> {
        Arc::new(Node {
            role: RwLock::new(role),
            fence_key: OnceLock::new(),
        })
    }

    /// Signs the fence of every grant and renewal answered from now on with
    /// `key` (set once, at start).
    pub fn sign_fences_with(&self, key: FenceKey) {
        let _ = self.fence_key.set(key);
    }

    /// The signature of `grant`'s fence, when this coordinator signs fences.
    pub fn signature(&self, grant: &Grant) -> Option<String> {
        let key = self.fence_key.get()?;
        Some(key.sign(&Fence::new(grant.resource.clone(), grant.token)))
    }

    pub fn role(&self) -> Role {
        self.role.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, role: Role) {
        let was_active = matches!(self.role(), Role::Active { .. });
        let active = matches!(role, Role::Active { .. });
        *self.role.write().unwrap_or_else(|e| e.into_inner()) = role;
        if was_active != active {
            crate::metrics::leader(active);
        }
    }

    /// The engine to serve a call with, or why there is none here.
    pub fn engine(&self) -> Result<Arc<Engine>, ApiError> {
        match self.role() {
            Role::Active { engine, .. } => Ok(engine),
            Role::Standby { leader } => Err(ApiError::NotLeader { leader }),
            Role::Unavailable { reason } => Err(ApiError::Unavailable(reason)),
        }
    }

    /// What `/healthz` says: `Ok` with a word on the role, or why this
    /// coordinator cannot serve (its engine failed or is unreachable).
    pub fn health(&self) -> Result<String, ApiError> {
        match self.role() {
            Role::Active { engine, epoch } => {
                engine.health()?;
                Ok(match epoch {
                    Some(e) => format!("ok: active, epoch {e}"),
                    None => "ok".to_string(),
                })
            }
            Role::Standby { leader: Some(l) } => Ok(format!("ok: standby, the active coordinator is {l}")),
            Role::Standby { leader: None } => Ok("ok: standby, no active coordinator known yet".to_string()),
            Role::Unavailable { reason } => Err(ApiError::Unavailable(reason)),
        }
    }
}
