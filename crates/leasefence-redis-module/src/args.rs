//! Argument parsing for the fenced commands: pure, no Redis API, unit-tested.
//!
//! The rules are the ones the Functions library (`leasefence.lua`) applies, so
//! the two arbiters accept and refuse the same calls and share fence keys: a
//! fence key is `leasefence:fence:{RESOURCE}`, a token a canonical decimal
//! `u64` (no sign, no leading zero, not 0), a mode `strict` or `monotonic`.

use leasefence_core::{FenceMode, Token};

/// The prefix of every fence key; the resource follows, then `}`.
pub const FENCE_PREFIX: &[u8] = b"leasefence:fence:{";

/// The prefix no fenced command may write as data (the fence key's, without
/// the brace): not its own fence key, not another resource's (a holder of `a`
/// could reset the fence of `b`; in a cluster the fence key of `b}x` shares
/// the slot of `b`'s), not anything else that looks like one. Every fence key
/// starts with it, so a key that contains it only later is an ordinary key.
pub const RESERVED_PREFIX: &[u8] = b"leasefence:fence:";

/// Whether a fenced command may write `key` as data.
pub fn writable(key: &[u8]) -> bool {
    !key.starts_with(RESERVED_PREFIX)
}

/// The resource inside a fence key, or `None` when `key` is not one.
pub fn resource_of(key: &[u8]) -> Option<&[u8]> {
    let rest = key.strip_prefix(FENCE_PREFIX)?.strip_suffix(b"}")?;
    (!rest.is_empty()).then_some(rest)
}

/// A token written as a canonical decimal: `1..=18446744073709551615`, no sign,
/// no leading zero (so equal tokens are equal strings, as the library assumes).
pub fn token(text: &[u8]) -> Option<Token> {
    if text.is_empty() || text.len() > 20 || text[0] == b'0' || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse::<u64>().ok().and_then(Token::new)
}

pub fn mode(text: &[u8]) -> Option<FenceMode> {
    match text {
        b"strict" => Some(FenceMode::Strict),
        b"monotonic" => Some(FenceMode::Monotonic),
        _ => None,
    }
}

/// What a fenced SET does to the value's time to live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Like a plain SET: any old TTL is gone.
    None,
    /// `KEEPTTL`: the key keeps the TTL it had.
    Keep,
    /// Expires at this Unix time in milliseconds (EX and PX are made absolute,
    /// as Redis itself does before it propagates a SET).
    At(i64),
}

/// Parses the optional expiry of a fenced SET: nothing, `KEEPTTL`, or one of
/// `EX s`, `PX ms`, `EXAT s`, `PXAT ms` with a positive integer. NX, XX and
/// GET are refused: they make SET conditional or change its reply, and the
/// fence would be recorded for a write that did not happen. `now_ms` is the
/// server's clock. The error is the reply text.
pub fn expiry(options: &[&[u8]], now_ms: i64) -> Result<Expiry, &'static str> {
    let (name, value) = match options {
        [] => return Ok(Expiry::None),
        [name] if name.eq_ignore_ascii_case(b"KEEPTTL") => return Ok(Expiry::Keep),
        [name, value] => (*name, *value),
        _ => return Err(SET_USAGE),
    };
    let (scale, relative) = if name.eq_ignore_ascii_case(b"EX") {
        (1000, true)
    } else if name.eq_ignore_ascii_case(b"PX") {
        (1, true)
    } else if name.eq_ignore_ascii_case(b"EXAT") {
        (1000, false)
    } else if name.eq_ignore_ascii_case(b"PXAT") {
        (1, false)
    } else {
        return Err(SET_USAGE);
    };
    let n = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .ok_or(BAD_EXPIRE)?;
    let ms = n.checked_mul(scale).ok_or(BAD_EXPIRE)?;
    let at = if relative {
        ms.checked_add(now_ms).ok_or(BAD_EXPIRE)?
    } else {
        ms
    };
    Ok(Expiry::At(at))
}

pub const SET_USAGE: &str =
    "LFINVALID usage: LEASEFENCE.SET FENCE KEY TOKEN MODE VALUE [EX s | PX ms | EXAT t | PXAT t | KEEPTTL]";
pub const BAD_EXPIRE: &str = "ERR invalid expire time in 'leasefence.set' command";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_keys() {
        assert_eq!(resource_of(b"leasefence:fence:{orders/7}"), Some(&b"orders/7"[..]));
        assert_eq!(resource_of(b"leasefence:fence:{a}b}"), Some(&b"a}b"[..]));
        for bad in [&b"leasefence:fence:{}"[..], b"leasefence:fence:{x", b"fence:{x}", b""] {
            assert_eq!(resource_of(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn fence_prefixed_keys_are_not_writable() {
        for reserved in [
            &b"leasefence:fence:{orders/7}"[..],
            b"leasefence:fence:",
            b"leasefence:fence:{x",
            b"leasefence:fence:x",
        ] {
            assert!(!writable(reserved), "{:?}", String::from_utf8_lossy(reserved));
        }
        for ordinary in [
            &b"{x}leasefence:fence:{y}"[..],
            b"leasefence:fenc",
            b"LEASEFENCE:FENCE:{y}",
            b"",
        ] {
            assert!(writable(ordinary), "{:?}", String::from_utf8_lossy(ordinary));
        }
    }

    #[test]
    fn tokens_are_canonical_u64() {
        assert_eq!(token(b"1").map(Token::get), Some(1));
        assert_eq!(token(b"18446744073709551615").map(Token::get), Some(u64::MAX));
        for bad in [
            &b"0"[..],
            b"",
            b"01",
            b"+1",
            b"-1",
            b"1.0",
            b" 1",
            b"18446744073709551616",
            b"100000000000000000000",
        ] {
            assert_eq!(token(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn modes() {
        assert_eq!(mode(b"strict"), Some(FenceMode::Strict));
        assert_eq!(mode(b"monotonic"), Some(FenceMode::Monotonic));
        assert_eq!(mode(b"STRICT"), None);
    }

    #[test]
    fn expiries() {
        let now = 1_000_000;
        assert_eq!(expiry(&[], now), Ok(Expiry::None));
        assert_eq!(expiry(&[b"keepttl"], now), Ok(Expiry::Keep));
        assert_eq!(expiry(&[b"EX", b"2"], now), Ok(Expiry::At(now + 2000)));
        assert_eq!(expiry(&[b"px", b"5"], now), Ok(Expiry::At(now + 5)));
        assert_eq!(expiry(&[b"EXAT", b"7"], now), Ok(Expiry::At(7000)));
        assert_eq!(expiry(&[b"PXAT", b"7"], now), Ok(Expiry::At(7)));
        for bad in [
            &[&b"EX"[..], b"0"][..],
            &[b"EX", b"-1"],
            &[b"PX", b"x"],
            &[b"EX", b"9223372036854775807"],
        ] {
            assert_eq!(expiry(bad, now), Err(BAD_EXPIRE));
        }
        for bad in [
            &[&b"NX"[..]][..],
            &[b"GET"],
            &[b"EX"],
            &[b"KEEPTTL", b"1"],
            &[b"EX", b"1", b"NX"],
        ] {
            assert_eq!(expiry(bad, now), Err(SET_USAGE));
        }
    }
}
