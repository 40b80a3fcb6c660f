//! The store's keys in etcd, and the values of the two that are not records.
//!
//! Under `{prefix}shard/{shard}/`:
//! - `epoch`: the shard's last epoch, in decimal. Written only by a campaign
//!   that wins; never deleted, so epochs keep increasing across leaders.
//! - `leader`: `{epoch}\n{advertised URL}`, bound to the leader's etcd lease,
//!   so etcd deletes it when the lease lapses or is revoked.
//! - `r/{resource}`: the resource's record: the tag byte `E`, the epoch of the
//!   leader that wrote it (8 bytes, big-endian), then the record in the
//!   store's record codec. The epoch lets an operator (and the failover
//!   trials) see from etcd alone which term wrote a record, as the PostgreSQL
//!   store's `epoch` column does. Values written before the epoch was kept
//!   are the bare record codec (its version byte, 1 or 2, is never `E`) and
//!   still load, with no epoch.

use leasefence_core::StoredResource;

use crate::shared::{Epoch, LeaderInfo};
use crate::{StoreError, codec};

/// The first byte of a record value that carries its writer's epoch.
const RECORD_WITH_EPOCH: u8 = b'E';

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

/// A record's value as the leader of `epoch` writes it.
pub(super) fn encode_record(epoch: Epoch, record: &StoredResource) -> Vec<u8> {
    let body = codec::encode(record);
    let mut out = Vec::with_capacity(9 + body.len());
    out.push(RECORD_WITH_EPOCH);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A record value: the epoch that wrote it (`None` for a value from before
/// epochs were kept) and the record.
pub(super) fn decode_record(resource: &str, value: &[u8]) -> Result<(Option<Epoch>, StoredResource), StoreError> {
    match value.split_first() {
        Some((&RECORD_WITH_EPOCH, rest)) => {
            let (epoch, body) = rest
                .split_first_chunk::<8>()
                .ok_or_else(|| corrupt(resource, "the record value is shorter than its epoch"))?;
            Ok((Some(Epoch::from_be_bytes(*epoch)), codec::decode(resource, body)?))
        }
        _ => Ok((None, codec::decode(resource, value)?)),
    }
}

#[cfg(test)]
mod tests {
    use leasefence_core::Token;

    use super::*;

    fn record(token: u64) -> StoredResource {
        StoredResource {
            resource: leasefence_core::ResourceId::new("orders/1").expect("valid"),
            last_token: Token::new(token).expect("non-zero"),
            lease: None,
            lock_delay: None,
        }
    }

    #[test]
    fn a_record_value_carries_the_epoch_that_wrote_it() {
        let r = record(9);
        let value = encode_record(12, &r);
        assert_eq!(value[0], b'E');
        assert_eq!(decode_record("orders/1", &value), Ok((Some(12), r.clone())));
        // A value from before the epoch was kept: the bare codec.
        assert_eq!(decode_record("orders/1", &codec::encode(&r)), Ok((None, r)));
        for cut in 1..9 {
            assert!(
                matches!(
                    decode_record("orders/1", &value[..cut]),
                    Err(StoreError::Corrupt { .. })
                ),
                "cut at {cut}"
            );
        }
        assert!(decode_record("orders/1", &[]).is_err());
    }

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
