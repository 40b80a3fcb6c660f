//! Lease ids: the 128-bit secret that proves holdership.

use std::fmt;

use crate::Invalid;

/// A random 128-bit secret naming one lease. Only it renews or releases the lease.
///
/// `Debug` is redacted so that a lease id never lands in a log by accident;
/// [`LeaseId::to_hex`] is the one deliberate way to print it (to its holder).
/// The caller generates it (core has no randomness) with a CSPRNG.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId([u8; 16]);

impl LeaseId {
    pub const LEN: usize = 16;

    pub const fn from_bytes(bytes: [u8; 16]) -> LeaseId {
        LeaseId(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// 32 lowercase hex digits: the wire form.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(DIGITS[usize::from(b >> 4)] as char);
            s.push(DIGITS[usize::from(b & 0xf)] as char);
        }
        s
    }

    /// Parses the wire form (32 hex digits, either case).
    pub fn parse_hex(s: &str) -> Result<LeaseId, Invalid> {
        let bad = || Invalid::new("lease_id", "must be 32 hex digits, as returned by acquire");
        let bytes = s.as_bytes();
        if bytes.len() != 32 {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16).ok_or_else(bad)?;
            let lo = (pair[1] as char).to_digit(16).ok_or_else(bad)?;
            out[i] = u8::try_from(hi * 16 + lo).map_err(|_| bad())?;
        }
        Ok(LeaseId(out))
    }

    /// Parses the binary form (exactly 16 bytes).
    pub fn from_slice(b: &[u8]) -> Result<LeaseId, Invalid> {
        let arr: [u8; 16] = b
            .try_into()
            .map_err(|_| Invalid::new("lease_id", format!("must be 16 bytes, got {}", b.len())))?;
        Ok(LeaseId(arr))
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseId(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects() {
        let id = LeaseId::from_bytes([0xab; 16]);
        let hex = id.to_hex();
        assert_eq!(hex, "ab".repeat(16));
        assert_eq!(LeaseId::parse_hex(&hex), Ok(id));
        assert_eq!(LeaseId::parse_hex(&hex.to_uppercase()), Ok(id));
        assert!(LeaseId::parse_hex("abc").is_err());
        assert!(LeaseId::parse_hex(&"zz".repeat(16)).is_err());
        assert!(LeaseId::parse_hex(&"é".repeat(16)).is_err());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let id = LeaseId::from_bytes([0x5a; 16]);
        assert!(!format!("{id:?}").contains("5a"));
    }
}
