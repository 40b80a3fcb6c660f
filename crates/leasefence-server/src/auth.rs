//! Access control and limits at the edges: who a request comes from
//! ([`Access::identify`]: a bearer token, else the names of a verified
//! client certificate), what it may do ([`Caller::check`]), and the limits
//! that keep one principal (or everyone together) from filling the
//! coordinator. The rules themselves are pure, in
//! [`leasefence_core::access`].
//!
//! Without a policy every request is an anonymous [`Caller`] that may do
//! everything (protected mode keeps such a coordinator on loopback); with
//! one, everything not granted is refused.
//!
//! Routes: every API operation needs its verb; `/metrics` needs any known
//! principal (it names no resource); `/healthz` stays open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use leasefence_core::access::{Policy, Principal, Verb, holder_for};
use leasefence_core::{Holder, Invalid, ResourceId, Token};

use crate::peer::PeerCertificate;
use crate::quota::PrincipalLimit;
use crate::{ApiError, wire};

/// The audit log's target: force-releases, with the principal, resource and token.
pub const AUDIT_TARGET: &str = "leasefence::audit";

/// Limits on what principals, and all clients together, may hold open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Leases one principal may hold (with access control on).
    pub leases_per_principal_max: usize,
    /// Acquires of one principal that may wait at once (with access control on).
    pub waiters_per_principal_max: usize,
    /// Open watch streams, all clients together.
    pub watchers_max: usize,
    /// Open watch streams of one principal (with access control on).
    pub watchers_per_principal_max: usize,
    /// Open connections, all clients together.
    pub connections_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            leases_per_principal_max: 10_000,
            waiters_per_principal_max: 1_000,
            watchers_max: 10_000,
            watchers_per_principal_max: 1_000,
            connections_max: 10_000,
        }
    }
}

/// A refusal by access control or a limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential, or one that names no principal (401, `UNAUTHENTICATED`).
    #[error("{0}")]
    Unauthenticated(String),
    /// The principal lacks the verb on the resource (403, `PERMISSION_DENIED`).
    #[error("{0}")]
    PermissionDenied(String),
    /// A renew or release of another principal's lease (403, `PERMISSION_DENIED`).
    #[error("the lease on {resource:?} is not principal {principal:?}'s; only its owner may renew or release it")]
    NotOwner { principal: String, resource: String },
    /// A limit was reached (429, `RESOURCE_EXHAUSTED`).
    #[error("limit {key} = {value} reached: {what}")]
    Limit {
        key: &'static str,
        value: usize,
        what: String,
    },
}

impl AuthError {
    pub fn limit(key: &'static str, value: usize, what: String) -> AuthError {
        AuthError::Limit { key, value, what }
    }

    /// The `error` of the JSON body and the `leasefence-error` of gRPC.
    pub fn kind(&self) -> &'static str {
        match self {
            AuthError::Unauthenticated(_) => "unauthenticated",
            AuthError::PermissionDenied(_) | AuthError::NotOwner { .. } => "permission_denied",
            AuthError::Limit { .. } => "limit_exceeded",
        }
    }

    /// The `reason` label of `leasefence_auth_refusals_total` (none for a limit).
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            AuthError::Unauthenticated(_) => Some("unauthenticated"),
            AuthError::PermissionDenied(_) => Some("permission_denied"),
            AuthError::NotOwner { .. } => Some("not_owner"),
            AuthError::Limit { .. } => None,
        }
    }
}

/// The policy and limits of one coordinator, and its open watchers.
#[derive(Debug, Default)]
pub struct Access {
    policy: Option<Policy>,
    principals: HashMap<String, Arc<Principal>>,
    limits: Limits,
    watchers: Mutex<Watchers>,
}

#[derive(Debug, Default)]
struct Watchers {
    total: usize,
    by: HashMap<Arc<str>, usize>,
}

impl Access {
    /// `None`: no access control (anyone may do anything).
    pub fn new(policy: Option<Policy>, limits: Limits) -> Access {
        let principals = policy
            .iter()
            .flat_map(Policy::principals)
            .map(|p| (p.name().to_string(), Arc::new(p.clone())))
            .collect();
        Access {
            policy,
            principals,
            limits,
            watchers: Mutex::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.policy.is_some()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The caller of a request with this `authorization` header (or gRPC
    /// metadata) and client certificate. A token, when sent, decides alone.
    pub fn identify(&self, authorization: Option<&[u8]>, peer: Option<&PeerCertificate>) -> Result<Caller, AuthError> {
        let Some(policy) = &self.policy else {
            return Ok(Caller {
                principal: None,
                limits: self.limits.clone(),
            });
        };
        let found = match (authorization, peer) {
            (Some(header), _) => policy.by_token(bearer(header)?),
            (None, Some(cert)) => policy.by_cert_names(&cert.names),
            (None, None) => {
                return Err(AuthError::Unauthenticated(
                    "no credential: send `authorization: Bearer <token>` (leasefence --token or \
                     LEASEFENCE_AUTH_TOKEN) or a client certificate"
                        .into(),
                ));
            }
        };
        let principal = found.and_then(|p| self.principals.get(p.name()).cloned());
        match (principal, authorization) {
            (Some(p), _) => Ok(Caller {
                principal: Some(p),
                limits: self.limits.clone(),
            }),
            (None, Some(_)) => Err(AuthError::Unauthenticated("the bearer token names no principal".into())),
            (None, None) => Err(AuthError::Unauthenticated(
                "the client certificate's names match no principal".into(),
            )),
        }
    }

    /// Takes a watcher slot for `caller`, freed when the slot is dropped.
    pub fn watching(self: &Arc<Self>, caller: &Caller) -> Result<WatchSlot, AuthError> {
        let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if w.total >= self.limits.watchers_max {
            let what = format!("{} watch streams are open", w.total);
            return Err(AuthError::limit("watchers-max", self.limits.watchers_max, what));
        }
        let name: Option<Arc<str>> = caller.principal.as_ref().map(|p| Arc::from(p.name()));
        if let Some(n) = &name {
            let open = w.by.get(n).copied().unwrap_or(0);
            if open >= self.limits.watchers_per_principal_max {
                let what = format!("principal {n:?} has {open} watch streams open");
                return Err(AuthError::limit(
                    "watchers-per-principal-max",
                    self.limits.watchers_per_principal_max,
                    what,
                ));
            }
            *w.by.entry(n.clone()).or_default() += 1;
        }
        w.total += 1;
        Ok(WatchSlot {
            access: self.clone(),
            principal: name,
        })
    }
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(header: &[u8]) -> Result<&str, AuthError> {
    let bad = || AuthError::Unauthenticated("the authorization header must be `Bearer <token>`".into());
    let text = std::str::from_utf8(header).map_err(|_| bad())?;
    let (scheme, token) = text.split_once(' ').ok_or_else(bad)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(bad());
    }
    Ok(token.trim())
}

/// One open watch stream, counted until dropped.
#[derive(Debug)]
pub struct WatchSlot {
    access: Arc<Access>,
    principal: Option<Arc<str>>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut w = self.access.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.total = w.total.saturating_sub(1);
        if let Some(n) = &self.principal
            && let Some(open) = w.by.get_mut(n)
        {
            *open -= 1;
            if *open == 0 {
                w.by.remove(n);
            }
        }
    }
}

/// Who a request comes from: a principal, or anyone (access control off).
#[derive(Clone, Debug)]
pub struct Caller {
    principal: Option<Arc<Principal>>,
    limits: Limits,
}

impl Caller {
    /// The principal's name; `None` without access control.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref().map(Principal::name)
    }

    /// Refuses unless the caller may use `verb` on `resource`.
    pub fn check(&self, verb: Verb, resource: &ResourceId) -> Result<(), AuthError> {
        match &self.principal {
            Some(p) if !p.allows(verb, resource.as_str()) => Err(AuthError::PermissionDenied(
                p.denied(verb, resource.as_str(), false).to_string(),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses unless the caller may use `verb` on every resource under `prefix`.
    pub fn check_prefix(&self, verb: Verb, prefix: &str) -> Result<(), AuthError> {
        match &self.principal {
            Some(p) if !p.allows_all_under(verb, prefix) => {
                Err(AuthError::PermissionDenied(p.denied(verb, prefix, true).to_string()))
            }
            _ => Ok(()),
        }
    }

    /// The holder to record for an acquire that named `holder`:
    /// `<principal>` or `<principal>/<holder>` with access control on.
    pub fn holder(&self, holder: Holder) -> Result<Holder, Invalid> {
        let Some(p) = &self.principal else { return Ok(holder) };
        let given = Some(holder.as_str()).filter(|h| *h != wire::ANONYMOUS);
        let recorded = holder_for(p.name(), given);
        Holder::new(&recorded).map_err(|e| {
            Invalid::new(
                "holder",
                format!(
                    "recorded as {:?}/<holder>: {}",
                    p.name(),
                    e.to_string().trim_start_matches("invalid holder: ")
                ),
            )
        })
    }

    /// The limits an acquire of this caller is checked against.
    pub fn limit(&self) -> Option<PrincipalLimit> {
        self.principal.as_ref().map(|p| PrincipalLimit {
            principal: Arc::from(p.name()),
            leases_max: self.limits.leases_per_principal_max,
            waiters_max: self.limits.waiters_per_principal_max,
        })
    }

    /// Logs a force-release to the audit target: principal, resource and
    /// the ended token (never a lease id).
    pub fn audit_force_release(&self, resource: &ResourceId, ended: Option<Token>) {
        let principal = self.principal().unwrap_or("(access control off)");
        match ended {
            Some(token) => tracing::warn!(
                target: AUDIT_TARGET,
                principal,
                resource = resource.as_str(),
                token = token.get(),
                "force-release ended a lease"
            ),
            None => tracing::info!(
                target: AUDIT_TARGET,
                principal,
                resource = resource.as_str(),
                "force-release found no lease"
            ),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        ApiError::Auth(e)
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
