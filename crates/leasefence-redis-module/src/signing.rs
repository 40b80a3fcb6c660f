//! Signed fences in the module: the verifying keys, held in the module's
//! memory, and the check every fenced command makes before it reads the
//! fence.
//!
//! Keys come from the load arguments (`--loadmodule libleasefence_redis.so
//! fence-key-file PATH [fence-key-file PATH]`, a key file as
//! `leasefence_core::signing` reads it) and from `LEASEFENCE.KEY.ADD ID HEX` /
//! `LEASEFENCE.KEY.REMOVE ID` at run time. They are neither persisted nor
//! replicated: give every server its key files at load, and after a rotation
//! by command, update the files too. With no key, fences are not checked.
//! The refusal is the Functions library's:
//! `-BADSIG <missing|malformed|unknown_key|mismatch> <key id or -> <resource>`
//! (the resource left out when it holds a NUL byte, which a reply cannot).

use std::sync::Mutex;

use leasefence_core::signing::{FenceKey, SignatureError, VERIFY_KEYS_MAX, Verifier};
use leasefence_core::{Fence, ResourceId, Token};

/// The keys a fence must be signed with; empty: no check.
#[derive(Default)]
pub struct Keys {
    keys: Vec<FenceKey>,
    /// `keys` as a verifier, rebuilt on each change (`None` when empty).
    verifier: Option<Verifier>,
}

impl Keys {
    /// Installs `key`, replacing a key of the same id; at most two.
    pub fn add(&mut self, key: FenceKey) -> Result<(), String> {
        if let Some(old) = self.keys.iter_mut().find(|k| k.id() == key.id()) {
            *old = key;
        } else if self.keys.len() >= VERIFY_KEYS_MAX {
            let ids: Vec<&str> = self.keys.iter().map(FenceKey::id).collect();
            return Err(format!(
                "LFINVALID two keys are installed ({}); remove one before adding {}",
                ids.join(", "),
                key.id()
            ));
        } else {
            self.keys.push(key);
            self.keys.sort_by(|a, b| a.id().cmp(b.id()));
        }
        self.rebuild();
        Ok(())
    }

    /// Removes the key `id`; whether it was installed.
    pub fn remove(&mut self, id: &[u8]) -> bool {
        let before = self.keys.len();
        self.keys.retain(|k| k.id().as_bytes() != id);
        self.rebuild();
        self.keys.len() != before
    }

    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id().to_string()).collect()
    }

    fn rebuild(&mut self) {
        self.verifier = Verifier::new(self.keys.clone()).ok();
    }

    /// `Ok` when no key is installed or `signature` signs `(resource,
    /// token)`; otherwise the `-BADSIG` reply text.
    pub fn check(&self, resource: &[u8], token: Token, signature: Option<&[u8]>) -> Result<(), String> {
        let Some(verifier) = &self.verifier else {
            return Ok(());
        };
        let shown = String::from_utf8_lossy(resource);
        let refuse = |e: SignatureError| {
            let key = match &e {
                SignatureError::UnknownKey(id) => id.as_str(),
                _ => "-",
            };
            // A reply cannot carry a NUL byte: such a resource is left out,
            // and the client names its own (as for `-STALE`).
            if shown.contains('\0') {
                format!("BADSIG {} {key}", e.reason())
            } else {
                format!("BADSIG {} {key} {shown}", e.reason())
            }
        };
        // A resource that is no valid name was never signed by a coordinator.
        let Some(resource) = std::str::from_utf8(resource).ok().and_then(|r| ResourceId::new(r).ok()) else {
            return Err(refuse(SignatureError::Mismatch));
        };
        let signature = match signature.map(std::str::from_utf8) {
            None => None,
            Some(Ok(s)) => Some(s),
            Some(Err(_)) => return Err(refuse(SignatureError::Malformed("not UTF-8"))),
        };
        verifier.verify(&Fence::new(resource, token), signature).map_err(refuse)
    }
}

/// The module's keys. Redis runs commands on one thread; the lock is only
/// there to make the static sound.
pub static KEYS: Mutex<Keys> = Mutex::new(Keys {
    keys: Vec::new(),
    verifier: None,
});

/// Splits the mode argument into the mode and the signature after its first
/// space, if any (the library's convention: `strict v1.<key id>.<hex>`).
pub fn split_mode(arg: &[u8]) -> (&[u8], Option<&[u8]>) {
    match arg.iter().position(|&b| b == b' ') {
        Some(i) => (&arg[..i], Some(&arg[i + 1..])),
        None => (arg, None),
    }
}

/// Parses `LEASEFENCE.KEY.ADD ID HEX`'s arguments into a key, each as given
/// (not trimmed: the id installed is the one `KEY.REMOVE` must name).
pub fn parse_key(id: &[u8], hex: &[u8]) -> Result<FenceKey, String> {
    FenceKey::from_hex(&String::from_utf8_lossy(id), &String::from_utf8_lossy(hex))
        .map_err(|e| format!("LFINVALID {e}"))
}

/// The load arguments: pairs of `fence-key-file PATH`. The error names what
/// is wrong (without the secret).
pub fn load_args(args: &[&[u8]]) -> Result<Vec<FenceKey>, String> {
    if !args.len().is_multiple_of(2) {
        return Err("the module takes pairs of arguments: fence-key-file PATH".into());
    }
    let mut keys = Vec::new();
    for pair in args.chunks_exact(2) {
        if !pair[0].eq_ignore_ascii_case(b"fence-key-file") {
            return Err(format!(
                "unknown module argument {:?} (the only one is fence-key-file PATH)",
                String::from_utf8_lossy(pair[0])
            ));
        }
        let path = String::from_utf8_lossy(pair[1]).into_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read fence key file {path}: {e}"))?;
        keys.push(FenceKey::parse(&text).map_err(|e| format!("fence key file {path}: {e}"))?);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, b: u8) -> FenceKey {
        FenceKey::new(id, [b; 32]).expect("key")
    }

    #[test]
    fn checks_follow_the_installed_keys() {
        let mut keys = Keys::default();
        let t = Token::new(7).expect("token");
        assert_eq!(keys.check(b"r", t, None), Ok(()), "no key, no check");
        keys.add(key("a", 1)).expect("a");
        let sig = key("a", 1).sign(&Fence::new(ResourceId::new("r").expect("r"), t));
        assert_eq!(keys.check(b"r", t, Some(sig.as_bytes())), Ok(()));
        assert_eq!(keys.check(b"r", t, None), Err("BADSIG missing - r".into()));
        assert_eq!(
            keys.check(b"s", t, Some(sig.as_bytes())),
            Err("BADSIG mismatch - s".into())
        );
        assert_eq!(keys.check(b"r", t, Some(b"v1.x")), Err("BADSIG malformed - r".into()));
        // A reply cannot carry a NUL byte: such a resource is left out (the
        // client falls back to its own), as in a STALE reply.
        assert_eq!(
            keys.check(b"a\0b", t, Some(sig.as_bytes())),
            Err("BADSIG mismatch -".into())
        );
        let other = key("b", 2).sign(&Fence::new(ResourceId::new("r").expect("r"), t));
        assert_eq!(
            keys.check(b"r", t, Some(other.as_bytes())),
            Err("BADSIG unknown_key b r".into())
        );
        keys.add(key("b", 2)).expect("b");
        assert_eq!(keys.check(b"r", t, Some(other.as_bytes())), Ok(()));
        assert!(
            keys.add(key("c", 3))
                .unwrap_err()
                .contains("two keys are installed (a, b)")
        );
        assert_eq!(keys.ids(), ["a", "b"]);
        assert!(keys.remove(b"a") && keys.remove(b"b") && !keys.remove(b"b"));
        assert_eq!(keys.check(b"r", t, None), Ok(()));
    }

    #[test]
    fn key_add_takes_its_arguments_as_given_and_names_what_is_wrong() {
        let hex = "05".repeat(32);
        assert_eq!(parse_key(b"k1", hex.as_bytes()), Ok(key("k1", 5)));
        let e = parse_key(b"a:b", hex.as_bytes()).unwrap_err();
        assert!(e.starts_with("LFINVALID invalid fence key id: "), "{e}");
        // Not trimmed: what KEY.ADD installs is what KEY.REMOVE must name.
        let e = parse_key(b" k1", hex.as_bytes()).unwrap_err();
        assert!(e.contains("fence key id"), "{e}");
        let e = parse_key(b"k1", b"05").unwrap_err();
        assert!(e.contains("64 hex digits, lowercase"), "{e}");
    }

    #[test]
    fn the_mode_argument_carries_the_signature_after_a_space() {
        assert_eq!(split_mode(b"strict"), (&b"strict"[..], None));
        assert_eq!(split_mode(b"strict v1.a.00"), (&b"strict"[..], Some(&b"v1.a.00"[..])));
        assert_eq!(split_mode(b"monotonic "), (&b"monotonic"[..], Some(&b""[..])));
    }

    #[test]
    fn load_args_are_pairs_of_key_files() {
        let dir = std::env::temp_dir().join(format!("lf-module-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("k");
        std::fs::write(&file, format!("{}\n", key("k1", 5).to_line())).expect("write");
        let path = file.to_string_lossy().into_owned();
        let keys = load_args(&[b"fence-key-file", path.as_bytes()]).expect("loads");
        assert_eq!(keys, [key("k1", 5)]);
        assert!(load_args(&[b"fence-key-file"]).is_err());
        assert!(
            load_args(&[b"other", b"x"])
                .unwrap_err()
                .contains("unknown module argument")
        );
        assert!(
            load_args(&[b"fence-key-file", b"/nonexistent/k"])
                .unwrap_err()
                .contains("cannot read")
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
