//! The store's keys in etcd, and the values of the two that are not records.
//!
//! Under `{prefix}shard/{shard}/`:
//! - `epoch`: the shard's last epoch, in decimal. Written only by a campaign
//!   that wins; never deleted, so epochs keep increasing across leaders.
//! - `leader`: `{epoch}\n{advertised URL}`, bound to the leader's etcd lease,
//!   so etcd deletes it when the lease lapses or is revoked.
//! - `r/{resource}`: the resource's record, in the store's record codec.

use crate::StoreError;
use crate::shared::{Epoch, LeaderInfo};

#[derive(Clone, Debug)]
pub(super) struct Keys {
    shard: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, shard: u32) -> Keys {
        Keys {
            shard: format!("{prefix}shard/{shard}/"),
        }
    }

    pub(super) fn epoch(&self) -> String {
        format!("{}epoch", self.shard)
    }

    pub(super) fn leader(&self) -> String {
        format!("{}leader", self.shard)
    }

    /// Every record's key starts with this.
    pub(super) fn records(&self) -> String {
        format!("{}r/", self.shard)
    }

    pub(super) fn record(&self, resource: &str) -> String {
        format!("{}r/{resource}", self.shard)
    }
}

fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        resource: key.to_string(),
        reason: reason.into(),
    }
}

/// The epoch key's value; an absent key is epoch 0 (no term yet).
pub(super) fn decode_epoch(key: &str, value: Option<&[u8]>) -> Result<Epoch, StoreError> {
    let Some(value) = value else { return Ok(0) };
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<Epoch>().ok())
        .ok_or_else(|| corrupt(key, "the epoch is not a decimal number"))
}

pub(super) fn encode_leader(epoch: Epoch, advertise: &str) -> String {
    format!("{epoch}\n{advertise}")
}

pub(super) fn decode_leader(key: &str, value: &[u8]) -> Result<LeaderInfo, StoreError> {
    let text = std::str::from_utf8(value).map_err(|_| corrupt(key, "the leader is not UTF-8"))?;
    let (epoch, advertise) = text
        .split_once('\n')
        .ok_or_else(|| corrupt(key, "the leader has no epoch line"))?;
    let epoch = epoch
        .parse::<Epoch>()
        .map_err(|_| corrupt(key, "the leader's epoch is not a decimal number"))?;
    Ok(LeaderInfo {
        epoch,
        advertise: advertise.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_carries_the_shard() {
        let k = Keys::new("/lf/", 3);
        assert_eq!(k.epoch(), "/lf/shard/3/epoch");
        assert_eq!(k.leader(), "/lf/shard/3/leader");
        assert_eq!(k.record("orders/1"), "/lf/shard/3/r/orders/1");
        assert!(k.record("x").starts_with(&k.records()));
    }

    #[test]
    fn values_round_trip_and_garbage_is_corrupt() {
        let v = encode_leader(7, "http://a:1\nodd");
        assert_eq!(
            decode_leader("k", v.as_bytes()),
            Ok(LeaderInfo {
                epoch: 7,
                advertise: "http://a:1\nodd".into()
            })
        );
        assert!(matches!(decode_leader("k", b"7"), Err(StoreError::Corrupt { .. })));
        assert!(matches!(decode_leader("k", b"x\nu"), Err(StoreError::Corrupt { .. })));
        assert_eq!(decode_epoch("k", None), Ok(0));
        assert_eq!(decode_epoch("k", Some(b"42")), Ok(42));
        assert!(decode_epoch("k", Some(b"-1")).is_err());
    }
}
