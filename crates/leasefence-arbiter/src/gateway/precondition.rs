//! ETags and the conditional headers of a write (`If-Match`,
//! `If-None-Match`), as pure functions of the headers and the object's
//! current ETag (RFC 9110 §13). No I/O: the store calls [`Preconditions::check`]
//! inside the write transaction that commits the object.

use std::fmt;

use http::header::{HeaderMap, IF_MATCH, IF_NONE_MATCH};
use leasefence_core::Invalid;

/// An object's strong entity tag: the SHA-256 of its bytes, shown quoted in hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Etag([u8; 32]);

impl Etag {
    pub fn from_digest(digest: [u8; 32]) -> Etag {
        Etag(digest)
    }

    pub fn digest(&self) -> &[u8; 32] {
        &self.0
    }

    /// The hex digits without quotes.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.hex())
    }
}

impl fmt::Debug for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One conditional header's value: `*` or a list of entity tags.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Condition {
    Any,
    /// `(weak, opaque tag without quotes)`.
    Tags(Vec<(bool, String)>),
}

/// The conditions a write must meet, parsed from its headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    if_match: Option<Condition>,
    if_none_match: Option<Condition>,
}

/// A write whose condition does not hold: 412, nothing written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreconditionFailed {
    /// The header that failed: `if-match` or `if-none-match`.
    pub header: &'static str,
    /// The object's ETag when the condition was evaluated (`None`: no object).
    pub current: Option<Etag>,
}

impl fmt::Display for PreconditionFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.current {
            Some(e) => write!(f, "{} does not hold: the object's current ETag is {e}", self.header),
            None => write!(f, "{} does not hold: the object does not exist", self.header),
        }
    }
}

impl Preconditions {
    /// `If-Match` / `If-None-Match` of a request; a malformed one is an
    /// [`Invalid`] naming the header.
    pub fn from_headers(headers: &HeaderMap) -> Result<Preconditions, Invalid> {
        Ok(Preconditions {
            if_match: parse(headers, IF_MATCH.as_str())?,
            if_none_match: parse(headers, IF_NONE_MATCH.as_str())?,
        })
    }

    /// True when neither header was given.
    pub fn is_empty(&self) -> bool {
        self.if_match.is_none() && self.if_none_match.is_none()
    }

    /// Whether a write may replace (or create, `current == None`) the object.
    /// `If-Match` compares strongly (a weak tag never matches); `If-None-Match`
    /// weakly, as RFC 9110 says.
    pub fn check(&self, current: Option<Etag>) -> Result<(), PreconditionFailed> {
        let hex = current.map(|e| e.hex());
        let listed = |c: &Condition, strong: bool| match (c, &hex) {
            (_, None) => false,
            (Condition::Any, Some(_)) => true,
            (Condition::Tags(tags), Some(h)) => tags.iter().any(|(weak, t)| t == h && !(strong && *weak)),
        };
        if let Some(c) = &self.if_match
            && !listed(c, true)
        {
            return Err(PreconditionFailed {
                header: "if-match",
                current,
            });
        }
        if let Some(c) = &self.if_none_match
            && listed(c, false)
        {
            return Err(PreconditionFailed {
                header: "if-none-match",
                current,
            });
        }
        Ok(())
    }
}

fn parse(headers: &HeaderMap, name: &'static str) -> Result<Option<Condition>, Invalid> {
    let allowed = "allowed: * or a comma-separated list of quoted entity tags (\"…\" or W/\"…\")";
    let mut tags = Vec::new();
    let mut any = false;
    let mut present = false;
    for value in headers.get_all(name) {
        present = true;
        let s = value
            .to_str()
            .map_err(|_| Invalid::new("header", format!("{name} is not visible ASCII; {allowed}")))?;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "*" {
                any = true;
                continue;
            }
            let (weak, rest) = match item.strip_prefix("W/") {
                Some(r) => (true, r),
                None => (false, item),
            };
            let tag = rest
                .strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .filter(|t| !t.contains('"'))
                .ok_or_else(|| Invalid::new("header", format!("{name}: {item:?} is not an entity tag; {allowed}")))?;
            tags.push((weak, tag.to_string()));
        }
    }
    match (present, any, tags.is_empty()) {
        (false, _, _) => Ok(None),
        (true, true, true) => Ok(Some(Condition::Any)),
        (true, false, false) => Ok(Some(Condition::Tags(tags))),
        (true, true, false) => Err(Invalid::new(
            "header",
            format!("{name}: * cannot be combined with tags; {allowed}"),
        )),
        (true, false, true) => Err(Invalid::new("header", format!("{name} is empty; {allowed}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etag(b: u8) -> Etag {
        Etag::from_digest([b; 32])
    }

    fn pre(pairs: &[(&'static str, &str)]) -> Result<Preconditions, Invalid> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        Preconditions::from_headers(&h)
    }

    #[test]
    fn etag_is_quoted_hex_of_the_digest() {
        let e = etag(0xab);
        assert_eq!(e.to_string(), format!("\"{}\"", "ab".repeat(32)));
        assert_eq!(e.hex().len(), 64);
    }

    #[test]
    fn if_match_needs_the_current_tag_or_any_object() {
        let a = etag(1);
        let p = pre(&[("if-match", &a.to_string())]).expect("valid");
        assert_eq!(p.check(Some(a)), Ok(()));
        let failed = p.check(Some(etag(2))).expect_err("other tag");
        assert_eq!((failed.header, failed.current), ("if-match", Some(etag(2))));
        assert!(p.check(None).is_err(), "no object matches no tag");
        let any = pre(&[("if-match", "*")]).expect("valid");
        assert_eq!(any.check(Some(etag(9))), Ok(()));
        assert_eq!(any.check(None).expect_err("must exist").current, None);
        let list = pre(&[("if-match", &format!("\"x\", {a}"))]).expect("valid");
        assert_eq!(list.check(Some(a)), Ok(()));
        let weak = pre(&[("if-match", &format!("W/{a}"))]).expect("valid");
        assert!(weak.check(Some(a)).is_err(), "If-Match compares strongly");
    }

    #[test]
    fn if_none_match_star_creates_only() {
        let p = pre(&[("if-none-match", "*")]).expect("valid");
        assert_eq!(p.check(None), Ok(()));
        assert_eq!(p.check(Some(etag(3))).expect_err("exists").header, "if-none-match");
        let a = etag(4);
        let weak = pre(&[("if-none-match", &format!("W/{a}"))]).expect("valid");
        assert!(weak.check(Some(a)).is_err(), "If-None-Match compares weakly");
        assert_eq!(weak.check(Some(etag(5))), Ok(()));
    }

    #[test]
    fn no_headers_no_conditions() {
        let p = pre(&[]).expect("valid");
        assert!(p.is_empty());
        assert_eq!(p.check(None), Ok(()));
        assert_eq!(p.check(Some(etag(1))), Ok(()));
    }

    #[test]
    fn malformed_headers_are_invalid_and_say_what_is_allowed() {
        for (name, v) in [
            ("if-match", "abc"),
            ("if-match", ""),
            ("if-match", "*, \"a\""),
            ("if-none-match", "\"unterminated"),
            ("if-none-match", "W/abc"),
        ] {
            let e = pre(&[(name, v)]).expect_err(v);
            assert!(
                e.message().contains(name) && e.message().contains("allowed"),
                "{name}: {v:?}: {e}"
            );
        }
    }
}
