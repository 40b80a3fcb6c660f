//! Byte encoding of a stored resource record.
//!
//! Written by hand because the record is tiny and fixed (a version byte, the last
//! token, an optional lease, an optional lock-delay) and a serialization crate
//! would add a dependency and a format we do not control. Decoding checks every
//! length and field.
//!
//! Layout (big-endian), version 2 (written since lock-delays):
//! `2u8 | last_token u64 | lease | lock-delay`, where `lease` is `0u8` or
//! `1u8 | lease_id [16] | ttl_ms u64 | lock_delay_ms u64 | holder`, `lock-delay`
//! is `0u8` or `1u8 | delay_ms u64 | holder`, and `holder` is
//! `len u16 | UTF-8 bytes`.
//!
//! Version 1 (read, never written): `1u8 | last_token u64 | 0u8` or
//! `... | 1u8 | lease_id [16] | ttl_ms u64 | holder` — no lock-delays. A data
//! directory written before lock-delays opens unchanged; its records are
//! rewritten as version 2 when they next change.

use std::time::Duration;

use leasefence_core::{Holder, LeaseId, ResourceId, StoredLease, StoredLockDelay, StoredResource, Token};

use crate::StoreError;

const VERSION_1: u8 = 1;
const VERSION: u8 = 2;

fn put_u64(out: &mut Vec<u8>, d: Duration) {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    out.extend_from_slice(&ms.to_be_bytes());
}

fn put_holder(out: &mut Vec<u8>, holder: &Holder) {
    let holder = holder.as_str().as_bytes();
    // Holder names are at most HOLDER_LEN_MAX (256) bytes, so they fit a u16.
    let len = u16::try_from(holder.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&holder[..usize::from(len)]);
}

pub(crate) fn encode(r: &StoredResource) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(VERSION);
    out.extend_from_slice(&r.last_token.get().to_be_bytes());
    match &r.lease {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            out.extend_from_slice(l.lease_id.as_bytes());
            put_u64(&mut out, l.ttl);
            put_u64(&mut out, l.lock_delay);
            put_holder(&mut out, &l.holder);
        }
    }
    match &r.lock_delay {
        None => out.push(0),
        Some(d) => {
            out.push(1);
            put_u64(&mut out, d.delay);
            put_holder(&mut out, &d.holder);
        }
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    resource: &'a str,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            resource: self.resource.to_string(),
            reason: reason.into(),
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

    fn millis(&mut self) -> Result<Duration, StoreError> {
        Ok(Duration::from_millis(self.u64()?))
    }

    fn holder(&mut self) -> Result<Holder, StoreError> {
        let len_bytes: [u8; 2] = self.take(2)?.try_into().map_err(|_| self.corrupt("bad length"))?;
        let holder_bytes = self.take(usize::from(u16::from_be_bytes(len_bytes)))?;
        let holder = std::str::from_utf8(holder_bytes).map_err(|_| self.corrupt("holder is not UTF-8"))?;
        Holder::new(holder).map_err(|e| self.corrupt(e.to_string()))
    }

    /// A presence flag: `0u8` absent, `1u8` present.
    fn flag(&mut self, what: &str) -> Result<bool, StoreError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.corrupt(format!("bad {what} flag"))),
        }
    }

    fn lease(&mut self, version: u8) -> Result<StoredLease, StoreError> {
        let lease_id = LeaseId::from_slice(self.take(LeaseId::LEN)?).map_err(|e| self.corrupt(e.to_string()))?;
        let ttl = self.millis()?;
        let lock_delay = if version == VERSION_1 {
            Duration::ZERO
        } else {
            self.millis()?
        };
        let holder = self.holder()?;
        Ok(StoredLease {
            lease_id,
            holder,
            ttl,
            lock_delay,
        })
    }
}

pub(crate) fn decode(resource: &str, bytes: &[u8]) -> Result<StoredResource, StoreError> {
    let mut r = Reader { bytes, resource };
    let id = ResourceId::new(resource).map_err(|e| r.corrupt(e.to_string()))?;
    let version = r.u8()?;
    if version != VERSION && version != VERSION_1 {
        return Err(r.corrupt(format!(
            "unknown record version {version}; this build reads versions {VERSION_1} and {VERSION}"
        )));
    }
    let last_token = Token::new(r.u64()?).ok_or_else(|| r.corrupt("token 0"))?;
    let lease = if r.flag("lease")? {
        Some(r.lease(version)?)
    } else {
        None
    };
    let lock_delay = if version != VERSION_1 && r.flag("lock-delay")? {
        Some(StoredLockDelay {
            delay: r.millis()?,
            holder: r.holder()?,
        })
    } else {
        None
    };
    if !r.bytes.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(StoredResource {
        resource: id,
        last_token,
        lease,
        lock_delay,
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
                lock_delay: Duration::ZERO,
            }),
            lock_delay: None,
        }
    }

    /// Every field set: a lease with a lock-delay, and a recorded lock-delay
    /// (never both in a real store, but the codec does not care).
    fn full() -> StoredResource {
        let mut r = sample(true);
        if let Some(l) = r.lease.as_mut() {
            l.lock_delay = Duration::from_millis(60_000);
        }
        r.lock_delay = Some(StoredLockDelay {
            holder: Holder::new("gone").expect("valid"),
            delay: Duration::from_millis(2500),
        });
        r
    }

    #[test]
    fn round_trips() {
        let mut delayed = sample(false);
        delayed.lock_delay = full().lock_delay;
        for r in [sample(false), sample(true), delayed, full()] {
            assert_eq!(decode("orders/42", &encode(&r)), Ok(r.clone()));
            assert_eq!(encode(&r)[0], VERSION);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_corrupt_not_a_panic() {
        let bytes = encode(&full());
        for n in 0..bytes.len() {
            assert!(
                matches!(decode("orders/42", &bytes[..n]), Err(StoreError::Corrupt { .. })),
                "len {n}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode("orders/42", &longer).is_err());
        let mut zero = bytes.clone();
        zero[1..9].fill(0);
        assert!(decode("orders/42", &zero).is_err());
        let mut future = bytes;
        future[0] = 3;
        assert!(matches!(
            decode("orders/42", &future),
            Err(StoreError::Corrupt { reason, .. }) if reason.contains("version 3")
        ));
    }

    /// Records as this store wrote them before lock-delays (version 1): a data
    /// directory from then must still open and mean the same.
    #[test]
    fn version_1_records_still_decode() {
        let held: &[u8] = &[
            1, 0, 0, 0, 0, 0, 0, 0, 42, 1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 5, 220, 0,
            7, 119, 195, 182, 114, 107, 101, 114,
        ];
        let mut want = sample(true);
        want.last_token = Token::new(42).expect("non-zero");
        assert_eq!(decode("orders/42", held), Ok(want));
        let free: &[u8] = &[1, 0, 0, 0, 0, 0, 0, 0, 9, 0];
        let mut want = sample(false);
        want.last_token = Token::new(9).expect("non-zero");
        assert_eq!(decode("orders/42", free), Ok(want));
    }
}
