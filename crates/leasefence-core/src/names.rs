//! Validated names: resources (fence keys) and holders, and how a name is
//! shown to a person ([`shown`]).

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

/// `name` as a person should see it in text output: characters that are
/// invisible or that reorder the text around them (bidi controls, zero-width
/// and other default-ignorable code points, line and paragraph separators) are
/// written as `\u{202e}`, so a name cannot pose as another one or turn the rest
/// of a line around. Everything else is shown as it is. For display only: the
/// name itself is kept and compared byte for byte, and JSON output carries it
/// exactly.
pub fn shown(name: &str) -> Shown<'_> {
    Shown(name)
}

/// A name being shown; see [`shown`].
pub struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut start = 0;
        for (at, c) in self.0.char_indices().filter(|(_, c)| hidden(*c)) {
            f.write_str(&self.0[start..at])?;
            write!(f, "\\u{{{:x}}}", c as u32)?;
            start = at + c.len_utf8();
        }
        f.write_str(&self.0[start..])
    }
}

/// Unicode's Default_Ignorable_Code_Point (what renders as nothing, bidi
/// controls among them), plus the line and paragraph separators. Kept by hand
/// because the set is short and fixed, and no crate the core uses carries it;
/// the status page's `app.js` holds the same list.
fn hidden(c: char) -> bool {
    matches!(
        c,
        '\u{AD}'
            | '\u{34F}'
            | '\u{61C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

impl ResourceId {
    /// This name as a person should see it; see [`shown`].
    pub fn shown(&self) -> Shown<'_> {
        shown(&self.0)
    }
}

impl Holder {
    /// This name as a person should see it; see [`shown`].
    pub fn shown(&self) -> Shown<'_> {
        shown(&self.0)
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

    #[test]
    fn shown_writes_out_what_would_hide_or_reorder_text() {
        assert_eq!(shown("orders/42").to_string(), "orders/42");
        assert_eq!(shown("ü/日本/שלום").to_string(), "ü/日本/שלום");
        // After a right-to-left override, "fdp.exe" reads "exe.pdf".
        assert_eq!(shown("invoice-\u{202E}fdp.exe").to_string(), "invoice-\\u{202e}fdp.exe");
        assert_eq!(
            shown("\u{200B}a\u{2066}b\u{2069}").to_string(),
            "\\u{200b}a\\u{2066}b\\u{2069}"
        );
        assert_eq!(shown("a\u{2028}b\u{FEFF}").to_string(), "a\\u{2028}b\\u{feff}");
        assert_eq!(shown("tag\u{E0041}").to_string(), "tag\\u{e0041}");
        let r = ResourceId::new("x\u{202E}y").expect("no control characters");
        assert_eq!(r.as_str(), "x\u{202E}y", "the name itself is kept");
        assert_eq!(r.shown().to_string(), "x\\u{202e}y");
        let h = Holder::new("h\u{200D}i").expect("no control characters");
        assert_eq!(h.shown().to_string(), "h\\u{200d}i");
    }
}
