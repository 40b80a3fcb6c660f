//! Byte encoding of a stored resource record.
//!
//! Written by hand because the record is tiny and fixed (a version byte, the last
//! token, an optional lease) and a serialization crate would add a dependency and
//! a format we do not control. Decoding checks every length and field.
//!
//! Layout (big-endian): `1u8 version | last_token u64 | 0u8` (no lease) or
//! `... | 1u8 | lease_id [16] | ttl_ms u64 | holder_len u16 | holder bytes`.

use std::time::Duration;

use leasefence_core::{Holder, LeaseId, ResourceId, StoredLease, StoredResource, Token};

use crate::StoreError;

const VERSION: u8 = 1;

pub(crate) fn encode(r: &StoredResource) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(VERSION);
    out.extend_from_slice(&r.last_token.get().to_be_bytes());
    match &r.lease {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            out.extend_from_slice(l.lease_id.as_bytes());
            let ttl_ms = u64::try_from(l.ttl.as_millis()).unwrap_or(u64::MAX);
            out.extend_from_slice(&ttl_ms.to_be_bytes());
            let holder = l.holder.as_str().as_bytes();
            // Holder names are at most HOLDER_LEN_MAX (256) bytes, so they fit a u16.
            let len = u16::try_from(holder.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&holder[..usize::from(len)]);
        }
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    resource: &'a str,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, reason: &str) -> StoreError {
        StoreError::Corrupt {
            resource: self.resource.to_string(),
            reason: reason.to_string(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.bytes.len() < n {
            return Err(self.corrupt("record is truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| self.corrupt("bad u64"))?;
        Ok(u64::from_be_bytes(b))
    }
}

pub(crate) fn decode(resource: &str, bytes: &[u8]) -> Result<StoredResource, StoreError> {
    let mut r = Reader { bytes, resource };
    let corrupt = |reason: String| StoreError::Corrupt {
        resource: resource.to_string(),
        reason,
    };
    let id = ResourceId::new(resource).map_err(|e| corrupt(e.to_string()))?;
    if r.u8()? != VERSION {
        return Err(r.corrupt("unknown record version"));
    }
    let last_token = Token::new(r.u64()?).ok_or_else(|| r.corrupt("token 0"))?;
    let lease = match r.u8()? {
        0 => None,
        1 => {
            let lease_id = LeaseId::from_slice(r.take(LeaseId::LEN)?).map_err(|e| corrupt(e.to_string()))?;
            let ttl = Duration::from_millis(r.u64()?);
            let len_bytes: [u8; 2] = r.take(2)?.try_into().map_err(|_| r.corrupt("bad length"))?;
            let holder_bytes = r.take(usize::from(u16::from_be_bytes(len_bytes)))?;
            let holder_str = std::str::from_utf8(holder_bytes).map_err(|_| r.corrupt("holder is not UTF-8"))?;
            let holder = Holder::new(holder_str).map_err(|e| corrupt(e.to_string()))?;
            Some(StoredLease { lease_id, holder, ttl })
        }
        _ => return Err(r.corrupt("bad lease flag")),
    };
    if !r.bytes.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(StoredResource {
        resource: id,
        last_token,
        lease,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(lease: bool) -> StoredResource {
        StoredResource {
            resource: ResourceId::new("orders/42").expect("valid"),
            last_token: Token::new(u64::MAX).expect("non-zero"),
            lease: lease.then(|| StoredLease {
                lease_id: LeaseId::from_bytes([7; 16]),
                holder: Holder::new("wörker").expect("valid"),
                ttl: Duration::from_millis(1500),
            }),
        }
    }

    #[test]
    fn round_trips() {
        for lease in [false, true] {
            let r = sample(lease);
            assert_eq!(decode("orders/42", &encode(&r)), Ok(r));
        }
    }

    #[test]
    fn every_truncation_and_extension_is_corrupt_not_a_panic() {
        let bytes = encode(&sample(true));
        for n in 0..bytes.len() {
            assert!(
                matches!(decode("orders/42", &bytes[..n]), Err(StoreError::Corrupt { .. })),
                "len {n}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode("orders/42", &longer).is_err());
        let mut zero = bytes;
        zero[1..9].fill(0);
        assert!(decode("orders/42", &zero).is_err());
    }
}
