//! Signed fences: the coordinator's HMAC-SHA256 over `(key id, resource,
//! token)`, so that an arbiter holding the key can refuse a fence no
//! coordinator issued (a forged token, or a real one replayed under another
//! resource).
//!
//! The scheme is chosen so that every arbiter can check it *inside the
//! resource*: PostgreSQL's contrib `pgcrypto` has `hmac(data, key, 'sha256')`,
//! Redis Lua can compute SHA-256 with its `bit` library, and Rust has `hmac` +
//! `sha2`. A public-key scheme (Ed25519) would keep the verifier from signing,
//! but neither pgcrypto nor Redis Lua can verify one. See ARCHITECTURE.md.
//!
//! Wire form of a signature: `v1.<key id>.<64 lowercase hex digits>`, where the
//! MAC is over the bytes
//! `leasefence-fence-v1` LF `<key id>` LF `<resource>` LF `<token in decimal>`.
//! Resource names hold no control characters, so LF cannot be smuggled in.
//!
//! A key file holds one line, `<key id>:<64 hex digits>` (a 32-byte secret);
//! the id is 1..=32 of `[a-z0-9_-]`. A verifier accepts up to
//! [`VERIFY_KEYS_MAX`] keys at once, so that keys rotate without a gap.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{Fence, Invalid};

/// Version prefix of every signature.
pub const SIGNATURE_VERSION: &str = "v1";
/// First line of the signed message.
pub const SIGNED_DOMAIN: &str = "leasefence-fence-v1";
/// Longest key id, in bytes.
pub const KEY_ID_LEN_MAX: usize = 32;
/// Length of a secret, in bytes.
pub const SECRET_LEN: usize = 32;
/// How many keys a verifier accepts at once (the current one and the next).
pub const VERIFY_KEYS_MAX: usize = 2;

type HmacSha256 = Hmac<Sha256>;

/// A named 32-byte secret. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct FenceKey {
    id: String,
    secret: [u8; SECRET_LEN],
}

impl fmt::Debug for FenceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl FenceKey {
    pub fn new(id: &str, secret: [u8; SECRET_LEN]) -> Result<FenceKey, Invalid> {
        check_key_id(id)?;
        Ok(FenceKey {
            id: id.to_string(),
            secret,
        })
    }

    /// Parses the one line of a key file: `<key id>:<64 hex digits>`.
    pub fn parse(text: &str) -> Result<FenceKey, Invalid> {
        let line = text.trim();
        let Some((id, hex)) = line.split_once(':') else {
            return Err(Invalid::new(
                "fence key",
                "must be one line `<key id>:<64 hex digits>`, found no `:`",
            ));
        };
        FenceKey::from_hex(id.trim(), hex.trim())
    }

    /// A key from its id and its secret in hex, each taken as given: the id
    /// is checked first, so that a bad one is named as the id.
    pub fn from_hex(id: &str, hex: &str) -> Result<FenceKey, Invalid> {
        check_key_id(id)?;
        let secret = decode_hex(hex).ok_or_else(|| {
            Invalid::new(
                "fence key",
                format!(
                    "the secret must be {} hex digits, lowercase ({SECRET_LEN} bytes)",
                    2 * SECRET_LEN
                ),
            )
        })?;
        FenceKey::new(id, secret)
    }

    /// The key file line for this key (holds the secret: write it to a file
    /// only the coordinator and the arbiters can read).
    pub fn to_line(&self) -> String {
        format!("{}:{}", self.id, encode_hex(&self.secret))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn secret(&self) -> &[u8; SECRET_LEN] {
        &self.secret
    }

    /// The signature of `fence` under this key, in its wire form.
    pub fn sign(&self, fence: &Fence) -> String {
        let mac = self.mac(fence).finalize().into_bytes();
        format!("{SIGNATURE_VERSION}.{}.{}", self.id, encode_hex(&mac))
    }

    fn mac(&self, fence: &Fence) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        mac.update(signed_message(&self.id, fence).as_bytes());
        mac
    }
}

/// The bytes the MAC covers (public so that other implementations can be
/// checked against it).
pub fn signed_message(key_id: &str, fence: &Fence) -> String {
    format!("{SIGNED_DOMAIN}\n{key_id}\n{}\n{}", fence.resource, fence.token.get())
}

/// Why a signature was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the fence carries no signature, and this arbiter requires one")]
    Missing,
    #[error("the signature is malformed: {0}")]
    Malformed(&'static str),
    #[error("the signature names key `{0}`, which this arbiter does not hold")]
    UnknownKey(String),
    #[error("the signature does not match the fence (forged, or issued for another resource or token)")]
    Mismatch,
}

impl SignatureError {
    /// A short, stable name of the reason, for metric labels and for the
    /// refusals of arbiters that live in another process (the PostgreSQL
    /// function, the Redis library and module): `missing`, `malformed`,
    /// `unknown_key`, `mismatch`.
    pub fn reason(&self) -> &'static str {
        match self {
            SignatureError::Missing => "missing",
            SignatureError::Malformed(_) => "malformed",
            SignatureError::UnknownKey(_) => "unknown_key",
            SignatureError::Mismatch => "mismatch",
        }
    }

    /// The error [`reason`](Self::reason) names, as an arbiter in another
    /// process reports it (`key_id` for `unknown_key`); `None` for a name
    /// that is not a reason.
    pub fn from_reason(reason: &str, key_id: &str) -> Option<SignatureError> {
        Some(match reason {
            "missing" => SignatureError::Missing,
            "malformed" => SignatureError::Malformed("expected `v1.<key id>.<64 lowercase hex digits>`"),
            "unknown_key" => SignatureError::UnknownKey(key_id.to_string()),
            "mismatch" => SignatureError::Mismatch,
            _ => return None,
        })
    }
}

/// The keys an arbiter accepts: one, or two during a rotation.
#[derive(Clone, Debug)]
pub struct Verifier {
    keys: Vec<FenceKey>,
}

impl Verifier {
    pub fn new(keys: Vec<FenceKey>) -> Result<Verifier, Invalid> {
        if keys.is_empty() || keys.len() > VERIFY_KEYS_MAX {
            return Err(Invalid::new(
                "fence keys",
                format!("a verifier takes 1..={VERIFY_KEYS_MAX} keys, got {}", keys.len()),
            ));
        }
        if keys.len() == 2 && keys[0].id == keys[1].id {
            return Err(Invalid::new(
                "fence keys",
                format!("two keys with the same id `{}`", keys[0].id),
            ));
        }
        Ok(Verifier { keys })
    }

    pub fn keys(&self) -> &[FenceKey] {
        &self.keys
    }

    /// Checks `signature` (its wire form, or `None` when the fence came
    /// without one) against `fence`, in constant time.
    pub fn verify(&self, fence: &Fence, signature: Option<&str>) -> Result<(), SignatureError> {
        let signature = signature.ok_or(SignatureError::Missing)?;
        let (key_id, mac) = split_signature(signature)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or_else(|| SignatureError::UnknownKey(key_id.to_string()))?;
        key.mac(fence).verify_slice(&mac).map_err(|_| SignatureError::Mismatch)
    }
}

/// Splits a wire signature into its key id and MAC bytes.
pub fn split_signature(signature: &str) -> Result<(&str, [u8; 32]), SignatureError> {
    let mut parts = signature.trim().splitn(3, '.');
    let (Some(version), Some(key_id), Some(hex)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SignatureError::Malformed("expected `v1.<key id>.<64 hex digits>`"));
    };
    if version != SIGNATURE_VERSION {
        return Err(SignatureError::Malformed("unknown version (expected `v1.`)"));
    }
    if check_key_id(key_id).is_err() {
        return Err(SignatureError::Malformed("the key id must be 1..=32 of [a-z0-9_-]"));
    }
    let mac = decode_hex(hex).ok_or(SignatureError::Malformed("the MAC must be 64 lowercase hex digits"))?;
    Ok((key_id, mac))
}

fn check_key_id(id: &str) -> Result<(), Invalid> {
    let ok = !id.is_empty()
        && id.len() <= KEY_ID_LEN_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "fence key id",
            format!("must be 1..={KEY_ID_LEN_MAX} of [a-z0-9_-], got {id:?}"),
        ))
    }
}

fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Exactly 64 lowercase hex digits into 32 bytes.
fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let digits = hex.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ResourceId, Token};

    fn fence(resource: &str, token: u64) -> Fence {
        Fence::new(ResourceId::new(resource).unwrap(), Token::new(token).unwrap())
    }

    fn key(id: &str, byte: u8) -> FenceKey {
        FenceKey::new(id, [byte; 32]).unwrap()
    }

    #[test]
    fn a_signature_matches_an_independent_hmac_sha256() {
        // The reference value from OpenSSL:
        // printf 'leasefence-fence-v1\nk1\norders\n7' | openssl dgst -sha256 -mac HMAC \
        //   -macopt hexkey:0101…01 (32 bytes of 0x01)
        let k = FenceKey::parse("k1:0101010101010101010101010101010101010101010101010101010101010101").unwrap();
        assert_eq!(
            k.sign(&fence("orders", 7)),
            "v1.k1.e9d6d246fc1171046eaf57e3e2be6ba3066beda8fbddea47947ee6f5b6603414"
        );
        assert_eq!(
            signed_message("k1", &fence("orders", 7)),
            "leasefence-fence-v1\nk1\norders\n7"
        );
    }

    #[test]
    fn forged_unsigned_and_replayed_fences_are_refused() {
        let k = key("k1", 7);
        let v = Verifier::new(vec![k.clone()]).unwrap();
        let f = fence("orders", 7);
        let sig = k.sign(&f);
        assert_eq!(v.verify(&f, Some(&sig)), Ok(()));
        assert_eq!(v.verify(&f, None), Err(SignatureError::Missing));
        assert_eq!(v.verify(&fence("orders", 8), Some(&sig)), Err(SignatureError::Mismatch));
        assert_eq!(
            v.verify(&fence("payments", 7), Some(&sig)),
            Err(SignatureError::Mismatch)
        );
        let forged = key("k1", 8).sign(&f);
        assert_eq!(v.verify(&f, Some(&forged)), Err(SignatureError::Mismatch));
        let other = key("k2", 7).sign(&f);
        assert_eq!(v.verify(&f, Some(&other)), Err(SignatureError::UnknownKey("k2".into())));
        for bad in [
            "",
            "v1",
            "v1.k1",
            "v2.k1.00",
            "v1.K1.00",
            &sig.to_uppercase(),
            &sig[..sig.len() - 1],
        ] {
            assert!(
                matches!(v.verify(&f, Some(bad)), Err(SignatureError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn reasons_round_trip() {
        for e in [
            SignatureError::Missing,
            SignatureError::UnknownKey("k9".into()),
            SignatureError::Mismatch,
        ] {
            assert_eq!(SignatureError::from_reason(e.reason(), "k9"), Some(e));
        }
        let m = SignatureError::from_reason("malformed", "").expect("a reason");
        assert_eq!(m.reason(), "malformed");
        assert_eq!(SignatureError::from_reason("stale", ""), None);
    }

    #[test]
    fn two_keys_are_accepted_during_a_rotation() {
        let (old, new) = (key("old", 1), key("new", 2));
        let v = Verifier::new(vec![old.clone(), new.clone()]).unwrap();
        let f = fence("r", 1);
        assert_eq!(v.verify(&f, Some(&old.sign(&f))), Ok(()));
        assert_eq!(v.verify(&f, Some(&new.sign(&f))), Ok(()));
        assert!(Verifier::new(vec![]).is_err());
        assert!(Verifier::new(vec![old.clone(), old.clone()]).is_err());
        assert!(Verifier::new(vec![old.clone(), new.clone(), key("third", 3)]).is_err());
    }

    #[test]
    fn key_files_parse_strictly_and_never_show_the_secret() {
        let k = key("k1", 0xab);
        assert_eq!(FenceKey::parse(&format!("{}\n", k.to_line())).unwrap(), k);
        assert!(!format!("{k:?}").contains("abab"));
        for bad in [
            "",
            "k1",
            "k1:abab",
            "K1:ab",
            &format!("k1:{}", "g".repeat(64)),
            &format!(":{}", "0".repeat(64)),
        ] {
            assert!(FenceKey::parse(bad).is_err(), "{bad:?}");
        }
        let hex = "ab".repeat(32);
        assert_eq!(FenceKey::from_hex("k1", &hex), Ok(k));
        // Each part is judged on its own: a bad id is named as the id, not
        // taken for a bad secret.
        let e = FenceKey::from_hex("a:b", &hex).unwrap_err();
        assert_eq!(e.field(), "fence key id", "{e}");
        assert!(e.message().contains(r#""a:b""#), "{e}");
        let e = FenceKey::from_hex("k1", &hex.to_uppercase()).unwrap_err();
        assert!(e.message().contains("64 hex digits, lowercase"), "{e}");
        assert!(!e.message().contains("AB"), "never the secret: {e}");
        assert!(FenceKey::from_hex(" k1", &hex).is_err(), "no trimming");
    }
}
