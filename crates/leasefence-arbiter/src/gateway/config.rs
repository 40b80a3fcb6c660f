//! The gateway's settings, with their limits, and the size syntax of
//! `--object-size-max` (`64MiB`, `512KiB`, `1048576`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use leasefence_core::Invalid;
use leasefence_core::signing::Verifier;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;

/// Where the gateway listens, where it keeps its data, how large an object
/// may be, and the keys a fence must be signed with (if any).
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    listen: SocketAddr,
    data_dir: PathBuf,
    object_size_max: u64,
    connections_max: usize,
    fence_keys: Option<Verifier>,
}

impl GatewayConfig {
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:7741";
    /// Default largest object: 64 MiB.
    pub const OBJECT_SIZE_MAX_DEFAULT: u64 = 64 * MIB;
    /// The largest `object_size_max` accepted: 1 TiB.
    pub const OBJECT_SIZE_MAX_LIMIT: u64 = TIB;
    /// Default most open connections.
    pub const CONNECTIONS_MAX_DEFAULT: usize = 1000;
    /// The largest `connections_max` accepted.
    pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;

    pub fn new(listen: SocketAddr, data_dir: impl Into<PathBuf>) -> GatewayConfig {
        GatewayConfig {
            listen,
            data_dir: data_dir.into(),
            object_size_max: Self::OBJECT_SIZE_MAX_DEFAULT,
            connections_max: Self::CONNECTIONS_MAX_DEFAULT,
            fence_keys: None,
        }
    }

    /// Refuses every write whose fence is not signed with one of `keys`
    /// (403 `bad_signature`): unsigned, malformed, under another key, or
    /// signed for another resource or token.
    pub fn with_fence_keys(mut self, keys: Verifier) -> GatewayConfig {
        self.fence_keys = Some(keys);
        self
    }

    pub fn fence_keys(&self) -> Option<&Verifier> {
        self.fence_keys.as_ref()
    }

    /// Objects larger than `bytes` are refused with 413; 1..=1 TiB.
    pub fn with_object_size_max(mut self, bytes: u64) -> Result<GatewayConfig, Invalid> {
        if bytes == 0 || bytes > Self::OBJECT_SIZE_MAX_LIMIT {
            return Err(Invalid::new(
                "object_size_max",
                format!(
                    "must be 1 byte ..= 1TiB ({} bytes), got {bytes}",
                    Self::OBJECT_SIZE_MAX_LIMIT
                ),
            ));
        }
        self.object_size_max = bytes;
        Ok(self)
    }

    /// Beyond `n` open connections, a new one is answered 429
    /// (`limit_exceeded`, `connections-max`) and closed; 1..=1,000,000.
    pub fn with_connections_max(mut self, n: usize) -> Result<GatewayConfig, Invalid> {
        if n == 0 || n > Self::CONNECTIONS_MAX_LIMIT {
            return Err(Invalid::new(
                "connections_max",
                format!("must be 1..={}, got {n}", Self::CONNECTIONS_MAX_LIMIT),
            ));
        }
        self.connections_max = n;
        Ok(self)
    }

    pub fn connections_max(&self) -> usize {
        self.connections_max
    }

    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn object_size_max(&self) -> u64 {
        self.object_size_max
    }
}

/// A byte count: digits, optionally followed by `B`, `KiB`, `MiB`, `GiB` or `TiB`.
pub fn parse_size(s: &str) -> Result<u64, Invalid> {
    let bad = || {
        Invalid::new(
            "size",
            format!(
                "must be a whole number of bytes with an optional unit B, KiB, MiB, GiB or TiB (e.g. 64MiB), got {s:?}"
            ),
        )
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|e: std::num::ParseIntError| match e.kind() {
        std::num::IntErrorKind::PosOverflow => Invalid::new("size", format!("{s:?} is more than {} bytes", u64::MAX)),
        _ => bad(),
    })?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        "TiB" => TIB,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .ok_or_else(|| Invalid::new("size", format!("{s:?} is more than {} bytes", u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 * MIB));
        assert_eq!(parse_size("1 KiB"), Ok(KIB));
        assert_eq!(parse_size("1048576"), Ok(MIB));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("2TiB"), Ok(2 * TIB));
        for bad in [
            "",
            "MiB",
            "-1",
            "1.5MiB",
            "64MB",
            "64mib",
            "1 KiB extra",
            "99999999999999999999",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert_eq!(e.field(), "size", "{bad}");
        }
        assert!(parse_size("64mb").unwrap_err().message().contains("KiB, MiB"));
        assert!(parse_size("20000000TiB").unwrap_err().message().contains("more than"));
        let e = parse_size("99999999999999999999").unwrap_err();
        assert!(e.message().contains("more than"), "too large, not malformed: {e}");
    }

    #[test]
    fn object_size_max_is_bounded() {
        let c = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), "d");
        assert_eq!(c.object_size_max(), 64 * MIB);
        assert_eq!(c.clone().with_object_size_max(1).map(|c| c.object_size_max()), Ok(1));
        assert!(c.clone().with_object_size_max(0).is_err());
        assert!(c.with_object_size_max(TIB + 1).is_err());
    }

    #[test]
    fn connections_max_is_bounded() {
        let c = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), "d");
        assert_eq!(c.connections_max(), 1000);
        assert_eq!(c.clone().with_connections_max(1).map(|c| c.connections_max()), Ok(1));
        let zero = c.clone().with_connections_max(0).expect_err("0");
        assert!(zero.message().contains("1..=1000000"), "{zero}");
        assert!(c.with_connections_max(1_000_001).is_err());
    }
}
