//! The arbiter rule: which presented tokens a resource admits.
//!
//! An arbiter keeps `last_token` per fence key durably and admits a request only
//! if the rule holds, setting `last_token = presented` in the same atomic
//! transaction as the effect. This module is the rule alone; the storage and the
//! atomicity belong to each arbiter backend.

use crate::{ResourceId, Token};

/// How many effects one grant may authorize.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FenceMode {
    /// `last_token < presented`: each grant authorizes one committed effect.
    #[default]
    Strict,
    /// `last_token <= presented`: many effects under one grant.
    Monotonic,
}

impl FenceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FenceMode::Strict => "strict",
            FenceMode::Monotonic => "monotonic",
        }
    }

    /// The rule alone: does a fence key holding `current` admit `presented`?
    pub fn admits(self, current: Token, presented: Token) -> bool {
        match self {
            FenceMode::Strict => current < presented,
            FenceMode::Monotonic => current <= presented,
        }
    }

    pub fn parse(s: &str) -> Result<FenceMode, crate::Invalid> {
        match s {
            "strict" => Ok(FenceMode::Strict),
            "monotonic" => Ok(FenceMode::Monotonic),
            other => Err(crate::Invalid::new(
                "mode",
                format!("must be \"strict\" or \"monotonic\", got {other:?}"),
            )),
        }
    }
}

/// A rejected effect: the token presented is not newer than the one recorded.
/// A normal outcome, upon which a worker re-reads state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token for {}: presented {presented}, current {current}", resource.shown())]
pub struct Stale {
    pub resource: ResourceId,
    pub presented: Token,
    pub current: Token,
}

/// Applies the rule. `current` is the recorded `last_token` (`None`: never seen).
/// On `Ok`, the caller records `presented` atomically with the effect.
pub fn admit(mode: FenceMode, resource: &ResourceId, current: Option<Token>, presented: Token) -> Result<(), Stale> {
    let Some(current) = current else {
        return Ok(());
    };
    if mode.admits(current, presented) {
        Ok(())
    } else {
        Err(Stale {
            resource: resource.clone(),
            presented,
            current,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: u64) -> Token {
        Token::new(v).expect("non-zero")
    }

    #[test]
    fn strict_and_monotonic() {
        let r = ResourceId::new("r").expect("valid");
        assert_eq!(admit(FenceMode::Strict, &r, None, t(1)), Ok(()));
        assert_eq!(admit(FenceMode::Strict, &r, Some(t(4)), t(5)), Ok(()));
        let equal = admit(FenceMode::Strict, &r, Some(t(5)), t(5)).unwrap_err();
        assert_eq!((equal.presented, equal.current), (t(5), t(5)));
        assert_eq!(admit(FenceMode::Monotonic, &r, Some(t(5)), t(5)), Ok(()));
        assert!(admit(FenceMode::Monotonic, &r, Some(t(5)), t(4)).is_err());
        assert!(admit(FenceMode::Strict, &r, Some(t(u64::MAX)), t(u64::MAX)).is_err());
    }

    #[test]
    fn mode_parse() {
        assert_eq!(FenceMode::parse("strict"), Ok(FenceMode::Strict));
        assert_eq!(FenceMode::parse("monotonic"), Ok(FenceMode::Monotonic));
        assert!(FenceMode::parse("loose").unwrap_err().message().contains("strict"));
    }
}
