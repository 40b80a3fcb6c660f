//! The signed-fence scenario every arbiter that verifies signatures passes:
//! over [`SIGNED_CASES`] generated fences, forged, unsigned, malformed and
//! replayed ones are refused with [`ArbiterError::BadSignature`] and leave
//! nothing behind; correctly signed ones are admitted, under either key of a
//! rotation; a third key is refused.
//!
//! The target must have been configured with [`SuiteKeys::verifier`] (its
//! two keys, `current` and `next`) before [`signed_fences`] runs; it is
//! given neither the `outsider` key nor the forgers' secrets.

use leasefence_core::signing::{FenceKey, SECRET_LEN, SignatureError, Verifier};
use leasefence_core::{Fence, FenceMode, ResourceId, Token};

use super::{ConformanceTarget, Outcome, expect_state, resource, tok, unit};
use crate::ArbiterError;
use crate::rng::SplitMix64;

/// How many fences [`signed_fences`] generates (each tried 8 ways forged and
/// twice correctly signed).
pub const SIGNED_CASES: usize = 100;

/// The keys of the scenario: the target holds `current` and `next` (a
/// rotation), never `outsider`.
#[derive(Clone, Debug)]
pub struct SuiteKeys {
    pub current: FenceKey,
    pub next: FenceKey,
    pub outsider: FenceKey,
}

impl SuiteKeys {
    /// Three keys with random secrets and fixed ids.
    pub fn generate() -> SuiteKeys {
        let mut rng = SplitMix64::from_os();
        SuiteKeys {
            current: random_key("suite-current", &mut rng),
            next: random_key("suite-next", &mut rng),
            outsider: random_key("suite-outsider", &mut rng),
        }
    }

    /// What the target must verify with: `current` and `next`.
    pub fn verifier(&self) -> Verifier {
        Verifier::new(vec![self.current.clone(), self.next.clone()])
            .unwrap_or_else(|e| panic!("the suite's two keys make a verifier: {e}"))
    }
}

fn random_key(id: &str, rng: &mut SplitMix64) -> FenceKey {
    let mut secret = [0u8; SECRET_LEN];
    for chunk in secret.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    FenceKey::new(id, secret).unwrap_or_else(|e| panic!("suite key id {id}: {e}"))
}

/// The resource name of case `i`: ASCII, spaces, multi-byte UTF-8, and long
/// names (the MAC then covers several SHA-256 blocks).
fn case_name(i: usize, rng: &mut SplitMix64) -> String {
    match i % 5 {
        0 => format!("signed/{i}"),
        1 => format!("signed with spaces {i}"),
        2 => format!("signé/zählwerk/日本/{i}/🦀"),
        3 => format!("signed-long/{i}/{}", "x".repeat(rng.range(60, 300) as usize)),
        _ => format!("signed/ünïcode-long/{i}/{}", "ß".repeat(rng.range(30, 150) as usize)),
    }
}

/// A first token for case `i`, leaving room for two more.
fn case_token(i: usize, rng: &mut SplitMix64, max: u64) -> u64 {
    match i % 4 {
        0 => rng.range(1, 1000),
        1 => rng.range(1 << 32, 1 << 53),
        2 => max - 2,
        _ => rng.range(1, max - 2),
    }
}

/// Signatures that are not of the form `v1.<key id>.<64 hex digits>`.
/// `good` with one hex digit of its MAC changed, at position `i % 64`: over
/// the cases every digit, so that a comparison that skips part of the MAC
/// admits one of them.
fn one_digit_off(good: &str, i: usize) -> String {
    let at = good.len() - 64 + i % 64;
    let digit = if &good[at..=at] == "0" { "1" } else { "0" };
    format!("{}{digit}{}", &good[..at], &good[at + 1..])
}

fn malformed(i: usize, good: &str) -> String {
    let (_, rest) = good.split_once('.').unwrap_or(("", good));
    match i % 8 {
        0 => String::new(),
        1 => format!("v2.{rest}"),
        2 => good[..good.len() - 1].to_string(),
        3 => good.to_uppercase(),
        4 => "garbage".to_string(),
        5 => format!("{good}0"),
        6 => good.replacen("suite-", "Suite-", 1),
        _ => format!("v1..{}", &good[good.len() - 64..]),
    }
}

/// The scenario. Panics with the case, the seed and what was expected.
pub async fn signed_fences<T: ConformanceTarget>(t: &T, keys: &SuiteKeys) {
    let seed = crate::rng::os_seed();
    let mut rng = SplitMix64::new(seed);
    let b = t.backend();
    let max = t.token_max().get();
    let forger = random_key(keys.current.id(), &mut rng);
    for i in 0..SIGNED_CASES {
        let r = resource(t, &case_name(i, &mut rng));
        let other = resource(t, &format!("{}-other", case_name(i, &mut rng)));
        let mode = if i % 3 == 0 {
            FenceMode::Monotonic
        } else {
            FenceMode::Strict
        };
        let (first, second) = if i % 2 == 0 {
            (&keys.current, &keys.next)
        } else {
            (&keys.next, &keys.current)
        };
        let t0 = case_token(i, &mut rng, max);
        let ctx = format!("{b}: case {i} (seed {seed}) on {r:?} at {t0}");

        let signed = |k: &FenceKey, r: &ResourceId, v: u64| {
            let f = Fence::new(r.clone(), tok(v));
            let sig = k.sign(&f);
            f.with_signature(sig)
        };
        let admitted = unit(t, &signed(first, &r, t0), mode, "v0", Outcome::Commit).await;
        assert!(
            admitted.is_ok(),
            "{ctx}: a fence signed with {} must be admitted: {admitted:?}",
            first.id()
        );
        expect_state(t, &r, Some("v0"), Some(t0), &[t0]).await;

        let t1 = t0 + 1;
        let plain = Fence::new(r.clone(), tok(t1));
        let good = first.sign(&plain);
        let with = |sig: String| plain.clone().with_signature(sig);
        let forged: [(&str, Fence, SignatureError); 8] = [
            ("unsigned", plain.clone(), SignatureError::Missing),
            (
                "the right MAC with one digit changed",
                with(one_digit_off(&good, i)),
                SignatureError::Mismatch,
            ),
            (
                "forged with a wrong secret",
                with(forger.sign(&plain)),
                SignatureError::Mismatch,
            ),
            (
                "signed with a key the arbiter does not hold",
                with(keys.outsider.sign(&plain)),
                SignatureError::UnknownKey(keys.outsider.id().to_string()),
            ),
            ("malformed", with(malformed(i, &good)), SignatureError::Malformed("")),
            (
                "replayed from another resource",
                with(first.sign(&Fence::new(other.clone(), tok(t1)))),
                SignatureError::Mismatch,
            ),
            (
                "replayed from another token",
                with(first.sign(&Fence::new(r.clone(), tok(t0)))),
                SignatureError::Mismatch,
            ),
            (
                "replayed from a later token",
                with(first.sign(&Fence::new(r.clone(), Token::new(t1 + 1).unwrap_or(tok(t1))))),
                SignatureError::Mismatch,
            ),
        ];
        for (how, fence, want) in forged {
            let res = unit(t, &fence, mode, "forged", Outcome::Commit).await;
            expect_refused(&ctx, how, &r, res, &want);
        }
        expect_state(t, &r, Some("v0"), Some(t0), &[t0]).await;

        let admitted = unit(t, &signed(second, &r, t1), mode, "v1", Outcome::Commit).await;
        assert!(
            admitted.is_ok(),
            "{ctx}: a fence signed with {} (rotation) must be admitted: {admitted:?}",
            second.id()
        );
        expect_state(t, &r, Some("v1"), Some(t1), &[t0, t1]).await;
        expect_state(t, &other, None, None, &[]).await;
    }
}

fn expect_refused(ctx: &str, how: &str, r: &ResourceId, res: Result<(), ArbiterError>, want: &SignatureError) {
    match res {
        Err(ArbiterError::BadSignature { resource, reason }) => {
            assert_eq!(&resource, r, "{ctx}: {how}: BadSignature.resource");
            assert_eq!(reason.reason(), want.reason(), "{ctx}: {how}: {reason}");
            if let SignatureError::UnknownKey(id) = want {
                assert_eq!(reason, SignatureError::UnknownKey(id.clone()), "{ctx}: {how}");
            }
        }
        other => panic!("{ctx}: a fence {how} must be refused as BadSignature ({want}), got {other:?}"),
    }
}
