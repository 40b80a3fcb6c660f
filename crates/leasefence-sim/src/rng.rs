//! The simulation's only source of randomness: a seeded xoshiro256** generator.
//!
//! Hand-written rather than taken from `rand` so that a seed means the same run
//! forever: a dependency upgrade can never silently change which schedule a
//! recorded failing seed replays.

/// A small, fast, seedable PRNG (xoshiro256**, seeded through SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // SplitMix64 spreads nearby seeds (0, 1, 2, …) into unrelated states.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1;
        // Modulo bias is below 2^-40 for the spans used here; determinism matters more.
        lo + self.next_u64() % span
    }

    /// `true` with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.range(0, 999) < u64::from(per_mille)
    }

    /// Uniform index into a collection of `len` items (`len` must be non-zero).
    pub fn index(&mut self, len: usize) -> usize {
        assert!(len > 0, "index into an empty collection");
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        usize::try_from(self.range(0, len - 1)).unwrap_or(0)
    }

    pub fn bytes16(&mut self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        out[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let c = Rng::new(8).next_u64();
        assert_eq!(a, b);
        assert_ne!(a[0], c);
    }

    #[test]
    fn range_stays_in_bounds() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let v = r.range(3, 9);
            assert!((3..=9).contains(&v), "{v}");
        }
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.range(6, 2), 6);
    }
}
