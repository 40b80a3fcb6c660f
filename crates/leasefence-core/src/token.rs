//! Fencing tokens: per-resource, strictly increasing, never reused, never zero.

use std::fmt;
use std::num::NonZeroU64;

/// A fencing token. The first grant of a resource gets 1; each later grant gets
/// exactly one more. Tokens are not secrets. Overflow is an error, never a wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(NonZeroU64);

impl Token {
    pub const FIRST: Token = Token(NonZeroU64::MIN);

    /// `None` for 0, which is never a valid token.
    pub const fn new(value: u64) -> Option<Token> {
        match NonZeroU64::new(value) {
            Some(v) => Some(Token(v)),
            None => None,
        }
    }

    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The token after `self`, or `None` when `u64::MAX` has been handed out.
    pub fn next(self) -> Option<Token> {
        self.0.checked_add(1).map(Token)
    }

    /// The first token after `last` (`None` = never granted).
    pub fn after(last: Option<Token>) -> Option<Token> {
        match last {
            None => Some(Token::FIRST),
            Some(t) => t.next(),
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_is_one_and_zero_is_not_a_token() {
        assert_eq!(Token::FIRST.get(), 1);
        assert_eq!(Token::new(0), None);
        assert_eq!(Token::after(None), Some(Token::FIRST));
        assert_eq!(Token::after(Token::new(41)), Token::new(42));
    }

    #[test]
    fn overflow_is_none_not_wrap() {
        let max = Token::new(u64::MAX).expect("non-zero");
        assert_eq!(max.next(), None);
        assert_eq!(Token::after(Some(max)), None);
    }
}
