//! The Redis settings that decide whether fences survive: read with `CONFIG
//! GET` by [`check_settings`] before `install` and `check`.
//!
//! A fence key is an ordinary key without a TTL. Two settings can make one
//! disappear, and a missing fence key admits any token:
//! - `maxmemory-policy allkeys-*` lets Redis evict any key when it reaches
//!   `maxmemory`, fence keys included. Refused: `noeviction` or a
//!   `volatile-*` policy (only keys with a TTL are evicted) is safe.
//! - Without persistence (`appendonly no`, no `save` points) a restart forgets
//!   every fence; with snapshots only or an AOF that is not fsynced on every
//!   write, a crash forgets the newest ones. Warned about: a cache-only Redis
//!   may be what the user wants, and the token is still checked while it runs.
//!
//! Managed services often rename or forbid `CONFIG`; then nothing could be
//! checked, which is a warning too.

use std::collections::HashMap;
use std::fmt;

use redis::aio::ConnectionLike;

use crate::ArbiterError;

/// The settings read, in one `CONFIG GET` (several patterns: Redis 7+).
const SETTINGS: [&str; 4] = ["maxmemory-policy", "appendonly", "appendfsync", "save"];

/// Something about the server's settings that can lose fences, but that
/// [`check_settings`] does not refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingsWarning {
    /// `CONFIG GET` was refused or answered without the settings (a managed
    /// Redis, a renamed command, an ACL): nothing was checked.
    NotChecked { reason: String },
    /// `appendonly no` and no `save` points: fences live in memory only.
    NoPersistence,
    /// RDB snapshots (`save`) without the AOF.
    SnapshotsOnly { save: String },
    /// The AOF is on but not fsynced after every write.
    AofNotAlways { appendfsync: String },
}

impl fmt::Display for SettingsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsWarning::NotChecked { reason } => write!(
                f,
                "the server's settings could not be checked ({reason}): make sure by hand that \
                 maxmemory-policy is noeviction or volatile-* (fence keys must never be evicted) \
                 and that persistence keeps the fences (appendonly yes, appendfsync always)"
            ),
            SettingsWarning::NoPersistence => f.write_str(
                "the server has no persistence (appendonly no, no save points): a restart forgets \
                 every fence, and then any token is admitted; set appendonly yes and appendfsync \
                 always for fences that survive a crash",
            ),
            SettingsWarning::SnapshotsOnly { save } => write!(
                f,
                "the server persists snapshots only (save \"{save}\", appendonly no): a crash goes \
                 back to the last snapshot and forgets newer fences; set appendonly yes and \
                 appendfsync always for fences that survive a crash"
            ),
            SettingsWarning::AofNotAlways { appendfsync } => write!(
                f,
                "the AOF is fsynced with appendfsync {appendfsync}, not always: a crash of the \
                 machine can forget the newest fences; set appendfsync always for fences that \
                 survive one"
            ),
        }
    }
}

/// Reads the server's settings: `Err(ArbiterError::UnsafeSettings)` when they
/// let fence keys be evicted, otherwise what can still lose fences. A refused
/// or renamed `CONFIG` is a [`SettingsWarning::NotChecked`]; only a broken
/// connection is an error.
pub async fn check_settings<C: ConnectionLike + Send>(conn: &mut C) -> Result<Vec<SettingsWarning>, ArbiterError> {
    let reply: Result<HashMap<String, String>, redis::RedisError> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(&SETTINGS[..])
        .query_async(conn)
        .await;
    match reply {
        Ok(settings) => judge(&settings),
        // An error reply (unknown command, NOPERM, ...): the server is there
        // but will not tell.
        Err(e) if e.code().is_some() => Ok(vec![SettingsWarning::NotChecked {
            reason: format!("CONFIG GET answered: {e}"),
        }]),
        Err(e) => Err(e.into()),
    }
}

/// The verdict on settings read by `CONFIG GET`.
fn judge(settings: &HashMap<String, String>) -> Result<Vec<SettingsWarning>, ArbiterError> {
    let get = |name: &str| settings.get(name).map(|v| v.trim());
    let Some(policy) = get("maxmemory-policy") else {
        return Ok(vec![SettingsWarning::NotChecked {
            reason: "CONFIG GET did not report maxmemory-policy".to_string(),
        }]);
    };
    if policy.to_ascii_lowercase().starts_with("allkeys-") {
        return Err(ArbiterError::UnsafeSettings {
            backend: "redis",
            message: format!(
                "maxmemory-policy is {policy}: when the server reaches maxmemory it may evict any \
                 key, fence keys included, and a fence key that is gone admits any token (even \
                 with maxmemory 0 today, a later CONFIG SET maxmemory starts evicting). Set \
                 maxmemory-policy noeviction, or a volatile-* policy (only keys with a TTL are \
                 evicted, and fence keys have none): CONFIG SET maxmemory-policy noeviction, and \
                 the same in redis.conf"
            ),
        });
    }
    let (Some(aof), Some(save)) = (get("appendonly"), get("save")) else {
        return Ok(vec![SettingsWarning::NotChecked {
            reason: "CONFIG GET did not report appendonly and save".to_string(),
        }]);
    };
    let warning = if aof.eq_ignore_ascii_case("yes") {
        match get("appendfsync") {
            Some(fsync) if fsync.eq_ignore_ascii_case("always") => None,
            Some(fsync) => Some(SettingsWarning::AofNotAlways {
                appendfsync: fsync.to_string(),
            }),
            None => Some(SettingsWarning::NotChecked {
                reason: "CONFIG GET did not report appendfsync".to_string(),
            }),
        }
    } else if save.is_empty() {
        Some(SettingsWarning::NoPersistence)
    } else {
        Some(SettingsWarning::SnapshotsOnly { save: save.to_string() })
    };
    Ok(warning.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn with(policy: &str, aof: &str, fsync: &str, save: &str) -> Result<Vec<SettingsWarning>, ArbiterError> {
        judge(&settings(&[
            ("maxmemory-policy", policy),
            ("appendonly", aof),
            ("appendfsync", fsync),
            ("save", save),
        ]))
    }

    #[test]
    fn allkeys_policies_are_refused_with_what_to_set() {
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random", "ALLKEYS-LRU"] {
            match with(policy, "yes", "always", "") {
                Err(e @ ArbiterError::UnsafeSettings { .. }) => {
                    let text = e.to_string();
                    assert!(
                        text.contains(policy) && text.contains("noeviction") && text.contains("volatile-"),
                        "{text}"
                    );
                }
                other => panic!("{policy} must be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn safe_policies_and_persistence_levels() {
        for policy in ["noeviction", "volatile-lru", "volatile-ttl"] {
            assert_eq!(with(policy, "yes", "always", "").expect("safe"), vec![]);
        }
        assert_eq!(
            with("noeviction", "no", "everysec", "").expect("ok"),
            vec![SettingsWarning::NoPersistence]
        );
        assert_eq!(
            with("noeviction", "no", "everysec", "3600 1").expect("ok"),
            vec![SettingsWarning::SnapshotsOnly { save: "3600 1".into() }]
        );
        assert_eq!(
            with("noeviction", "yes", "everysec", "3600 1").expect("ok"),
            vec![SettingsWarning::AofNotAlways {
                appendfsync: "everysec".into()
            }]
        );
    }

    #[test]
    fn missing_settings_are_not_checked() {
        let w = judge(&settings(&[])).expect("a warning, not an error");
        assert!(matches!(&w[..], [SettingsWarning::NotChecked { .. }]), "{w:?}");
        let w = judge(&settings(&[("maxmemory-policy", "noeviction")])).expect("warning");
        assert!(matches!(&w[..], [SettingsWarning::NotChecked { .. }]), "{w:?}");
        assert!(w[0].to_string().contains("could not be checked"), "{}", w[0]);
    }
}
