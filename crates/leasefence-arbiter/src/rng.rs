//! A tiny seeded generator (SplitMix64) for test scenarios and namespaces.
//!
//! Seeded from the OS once; scenarios print the seed in failures so the token
//! choices of a failing run can be reproduced.

pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// Seeded from the OS; falls back to the clock if the OS source fails.
    pub(crate) fn from_os() -> SplitMix64 {
        SplitMix64(os_seed())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough value in `lo..=hi` (modulo bias is irrelevant here).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi.saturating_sub(lo).saturating_add(1);
        if span == 0 { lo } else { lo + self.next_u64() % span }
    }
}

pub(crate) fn os_seed() -> u64 {
    match getrandom::u64() {
        Ok(v) => v,
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5EED),
    }
}

/// A random lowercase hex suffix for table names and key namespaces.
pub(crate) fn hex_suffix() -> String {
    format!("{:016x}", os_seed())
}
