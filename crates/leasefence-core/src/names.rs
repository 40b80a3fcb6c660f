//! Validated names: resources (fence keys) and holders.

use std::fmt;
use std::sync::Arc;

use crate::Invalid;

/// Longest resource name, in bytes of UTF-8.
pub const RESOURCE_LEN_MAX: usize = 512;
/// Longest holder name, in bytes of UTF-8.
pub const HOLDER_LEN_MAX: usize = 256;

fn check(field: &'static str, s: &str, max: usize) -> Result<(), Invalid> {
    if s.is_empty() {
        return Err(Invalid::new(
            field,
            format!("must be 1..={max} bytes of UTF-8, got an empty string"),
        ));
    }
    if s.len() > max {
        return Err(Invalid::new(
            field,
            format!("must be 1..={max} bytes of UTF-8, got {} bytes", s.len()),
        ));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(Invalid::new(
            field,
            format!("must not contain control characters, found U+{:04X}", c as u32),
        ));
    }
    Ok(())
}

/// The name of a fenced resource (the contention domain): 1..=512 bytes of UTF-8
/// without control characters. Cheap to clone.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceId(Arc<str>);

impl ResourceId {
    pub fn new(s: &str) -> Result<ResourceId, Invalid> {
        check("resource", s, RESOURCE_LEN_MAX)?;
        Ok(ResourceId(Arc::from(s)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Names order as their strings do (the derived `Ord` compares the text), so a
/// map keyed by names can be searched by `&str`.
impl std::borrow::Borrow<str> for ResourceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Who holds a lease, for humans and status output: 1..=256 bytes of UTF-8
/// without control characters. Not a secret and not a proof of anything.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Holder(Arc<str>);

impl Holder {
    pub fn new(s: &str) -> Result<Holder, Invalid> {
        check("holder", s, HOLDER_LEN_MAX)?;
        Ok(Holder(Arc::from(s)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_bounds_and_control_characters() {
        assert!(ResourceId::new("orders/42").is_ok());
        assert!(ResourceId::new("ü").is_ok());
        assert_eq!(ResourceId::new("").unwrap_err().field(), "resource");
        assert!(ResourceId::new(&"a".repeat(RESOURCE_LEN_MAX)).is_ok());
        let long = ResourceId::new(&"a".repeat(RESOURCE_LEN_MAX + 1)).unwrap_err();
        assert!(long.message().contains("513 bytes"), "{long}");
        let ctl = ResourceId::new("a\nb").unwrap_err();
        assert!(ctl.message().contains("U+000A"), "{ctl}");
    }

    #[test]
    fn holder_bounds() {
        assert!(Holder::new("worker-a").is_ok());
        assert!(Holder::new("").is_err());
        assert!(Holder::new(&"h".repeat(HOLDER_LEN_MAX + 1)).is_err());
        assert!(Holder::new("tab\there").is_err());
    }
}
