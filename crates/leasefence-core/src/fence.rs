//! The fence that travels with a request: `(resource, token)`, and the one
//! convention for carrying it through HTTP headers, gRPC metadata, message
//! headers and a child process's environment.

use std::fmt;

use crate::{Invalid, ResourceId, Token};

/// Header (HTTP, gRPC metadata, message headers) carrying the resource name.
pub const HEADER_RESOURCE: &str = "leasefence-resource";
/// Header carrying the token, in decimal.
pub const HEADER_TOKEN: &str = "leasefence-token";
/// Environment variable carrying the resource name to a child process.
pub const ENV_RESOURCE: &str = "LEASEFENCE_RESOURCE";
/// Environment variable carrying the token, in decimal.
pub const ENV_TOKEN: &str = "LEASEFENCE_TOKEN";
/// Header carrying the coordinator's signature over the fence (signed fences,
/// see [`crate::signing`]); absent when the coordinator does not sign.
pub const HEADER_SIGNATURE: &str = "leasefence-signature";
/// Environment variable carrying the signature to a child process.
pub const ENV_SIGNATURE: &str = "LEASEFENCE_SIGNATURE";

/// A resource and the token that authorizes an effect on it, with the
/// coordinator's signature over both when the coordinator signs fences (see
/// [`crate::signing`]). An arbiter without a key ignores the signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    pub resource: ResourceId,
    pub token: Token,
    /// The signature in its wire form (`v1.<key id>.<hex>`), as received:
    /// checked only by an arbiter that holds a key.
    pub signature: Option<String>,
}

impl Fence {
    pub fn new(resource: ResourceId, token: Token) -> Fence {
        Fence {
            resource,
            token,
            signature: None,
        }
    }

    /// The same fence carrying `signature`.
    pub fn with_signature(mut self, signature: impl Into<String>) -> Fence {
        self.signature = Some(signature.into());
        self
    }

    /// Parses the two propagated strings (header values or environment values).
    pub fn from_parts(resource: &str, token: &str) -> Result<Fence, Invalid> {
        let resource = ResourceId::new(resource)?;
        let token = parse_token(token)?;
        Ok(Fence::new(resource, token))
    }
}

/// Parses a decimal token, 1..=u64::MAX: ASCII digits only (surrounding
/// whitespace aside), so no sign, no hex, no exponent.
/// Digits of the largest token, `u64::MAX`.
const TOKEN_DIGITS_MAX: usize = 20;

pub(crate) fn parse_token(s: &str) -> Result<Token, Invalid> {
    let digits = s.trim();
    let decimal = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let token = if decimal {
        digits.parse::<u64>().ok().and_then(Token::new)
    } else {
        None
    };
    token.ok_or_else(|| {
        // A longer value than any token is not echoed whole: it may be as
        // long as the header it came in.
        let got = if s.len() <= 2 * TOKEN_DIGITS_MAX {
            format!("{s:?}")
        } else {
            format!("{} bytes", s.len())
        };
        Invalid::new(
            "token",
            format!("must be a decimal integer in 1..={}, got {got}", u64::MAX),
        )
    })
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.resource, self.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_reject() {
        let f = Fence::from_parts("orders/42", "43").expect("valid");
        assert_eq!(f.resource.as_str(), "orders/42");
        assert_eq!(f.token.get(), 43);
        assert_eq!(f.to_string(), "orders/42@43");
        assert_eq!(Fence::from_parts("r", "0").unwrap_err().field(), "token");
        assert!(Fence::from_parts("r", "-1").is_err());
        assert!(Fence::from_parts("r", "18446744073709551616").is_err());
        assert!(Fence::from_parts("", "1").is_err());
        assert_eq!(Fence::from_parts("r", " 7 ").expect("trimmed").token.get(), 7);
        assert_eq!(
            Fence::from_parts("r", "18446744073709551615").expect("max").token.get(),
            u64::MAX
        );
        for bad in ["+5", "0x10", "1e3", "", " ", "5 5", "٣"] {
            assert_eq!(Fence::from_parts("r", bad).unwrap_err().field(), "token", "{bad:?}");
        }
        // A short value is shown; a long one only by its length.
        let e = Fence::from_parts("r", "x7").unwrap_err();
        assert!(e.message().ends_with(r#"got "x7""#), "{e}");
        let long = "9".repeat(10_000);
        let e = Fence::from_parts("r", &long).unwrap_err();
        assert!(e.message().ends_with("got 10000 bytes"), "{e}");
    }
}
