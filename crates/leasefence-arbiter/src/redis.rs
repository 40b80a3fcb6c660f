//! The Redis arbiter: a Redis Functions library (`leasefence`, Redis 7+) with
//! fenced `SET` (optionally with an expiry), `DEL`, `HSET` and `XADD`, and
//! Rust helpers for each ([`Via::set`] and so on). The same commands also exist
//! natively in a Redis module (crate `leasefence-redis-module`): [`Via`] picks
//! one per call.
//!
//! A fenced call checks the fence key `leasefence:fence:{RESOURCE}`, applies
//! the command and records the token in one atomic function call. A stale call
//! changes nothing and fails with `-STALE <presented> <current> <resource>`,
//! mapped here to [`ArbiterError::Stale`]. The library, with its calling
//! conventions, is `src/lua/leasefence.lua`. Tokens cover the full `u64` range.
//! In a cluster, give your data keys the hash tag `{RESOURCE}` so they share the
//! fence key's slot. No data key may start with `leasefence:fence:` (refused
//! as [`ArbiterError::Invalid`]): a fenced call never writes a fence key, its
//! own or another resource's. A command that writes nothing records no token.
//!
//! The fence is as durable as the server's persistence settings make it (use
//! `appendonly yes` and `appendfsync always` for crash-safe fences);
//! [`install`] refuses a server that may evict fence keys
//! ([`check_settings`]). Replication is asynchronous: [`Via::wait_for`] waits
//! for replicas after each write ([`WaitFor`]).

use leasefence_core::signing::{FenceKey, SignatureError, VERIFY_KEYS_MAX};
use leasefence_core::{Fence, FenceMode, ResourceId, Stale, Token};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, FromRedisValue, ToRedisArgs};

use crate::ArbiterError;
use crate::reject::observe;

mod settings;
mod wait;
mod writer;

pub use settings::{SettingsWarning, check_settings};
pub use wait::{WAIT_REPLICAS_MAX, WAIT_TIMEOUT_MAX, WaitFor};
pub use writer::Writer;

const BACKEND: &str = "redis";

/// The library source loaded by [`install`].
pub const LIBRARY: &str = include_str!("lua/leasefence.lua");
/// The library version [`install`] loads and checks.
pub const LIBRARY_VERSION: &str = "5";
/// The module version ([`module_loaded`]) this crate's calls are written for:
/// 2 refuses every data key under the fence-key prefix and records no fence
/// for a command that wrote nothing; 3 checks signed fences.
pub const MODULE_VERSION: &str = "3";
/// Error code of a stale call.
pub const ERROR_STALE: &str = "STALE";
/// Error code of a call refused for its fence's signature:
/// `-BADSIG <reason> <key id or -> <resource>`.
pub const ERROR_BAD_SIGNATURE: &str = "BADSIG";
/// The library's line that holds its verifying keys, as [`LIBRARY`] has it.
const KEYS_LINE: &str = "local FENCE_KEYS = {} -- leasefence:fence-keys";
/// The end of that line, whatever keys it holds.
const KEYS_LINE_MARK: &str = "} -- leasefence:fence-keys";

/// The fence key of `resource`: `leasefence:fence:{RESOURCE}`.
pub fn fence_key(resource: &ResourceId) -> String {
    format!("leasefence:fence:{{{resource}}}")
}

/// Opens a multiplexed connection (cheap to clone, safe to share).
pub async fn connect(url: &str) -> Result<MultiplexedConnection, ArbiterError> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Loads (or replaces) the `leasefence` library and checks its version,
/// keeping the verifying keys of the library it replaces (signed fences).
/// First reads the server's settings ([`check_settings`]): a server that can
/// evict fence keys is refused before anything is loaded; what else can lose
/// fences is returned.
pub async fn install<C: ConnectionLike + Send>(conn: &mut C) -> Result<Vec<SettingsWarning>, ArbiterError> {
    let warnings = check_settings(conn).await?;
    let keys = loaded_keys(conn).await?.unwrap_or_default();
    load_library(conn, &keys).await?;
    Ok(warnings)
}

/// The library source with `keys` written into it.
pub fn library_with_keys(keys: &[FenceKey]) -> String {
    let entries: Vec<String> = keys
        .iter()
        .map(|k| {
            let (id, hex) = key_parts(k);
            format!("['{id}'] = '{hex}'")
        })
        .collect();
    let line = format!("local FENCE_KEYS = {{ {} {KEYS_LINE_MARK}", entries.join(", "));
    LIBRARY.replacen(KEYS_LINE, &line, 1)
}

fn key_parts(key: &FenceKey) -> (&str, String) {
    let line = key.to_line();
    let hex = line.split_once(':').map(|(_, h)| h.to_string()).unwrap_or_default();
    (key.id(), hex)
}

/// The keys written into the loaded library; `None` when no `leasefence`
/// library is loaded.
async fn loaded_keys<C: ConnectionLike + Send>(conn: &mut C) -> Result<Option<Vec<FenceKey>>, ArbiterError> {
    let listing: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("leasefence")
        .arg("WITHCODE")
        .query_async(conn)
        .await?;
    let Some(code) = library_code(&listing) else {
        return Ok(None);
    };
    parse_keys_line(&code).map(Some)
}

/// The code of the `leasefence` library in a `FUNCTION LIST WITHCODE` reply.
fn library_code(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) if b.starts_with(b"#!lua name=leasefence\n") => String::from_utf8(b.clone()).ok(),
        redis::Value::Array(items) | redis::Value::Set(items) => items.iter().find_map(library_code),
        redis::Value::Map(pairs) => pairs
            .iter()
            .find_map(|(k, v)| library_code(k).or_else(|| library_code(v))),
        _ => None,
    }
}

/// The keys on the library's keys line (none for a library without one).
fn parse_keys_line(code: &str) -> Result<Vec<FenceKey>, ArbiterError> {
    let Some(line) = code.lines().find(|l| l.trim_end().ends_with(KEYS_LINE_MARK)) else {
        return Ok(Vec::new());
    };
    let mut keys = Vec::new();
    for entry in line.split("['").skip(1) {
        let parsed = entry
            .split_once("'] = '")
            .and_then(|(id, rest)| Some((id, rest.split_once('\'')?.0)))
            .map(|(id, hex)| FenceKey::parse(&format!("{id}:{hex}")));
        match parsed {
            Some(Ok(k)) => keys.push(k),
            _ => {
                return Err(ArbiterError::Protocol {
                    backend: BACKEND,
                    message: "the loaded library's key line is not one this client wrote".to_string(),
                });
            }
        }
    }
    Ok(keys)
}

/// `FUNCTION LOAD REPLACE` of the library with `keys`, then the version check.
async fn load_library<C: ConnectionLike + Send>(conn: &mut C, keys: &[FenceKey]) -> Result<(), ArbiterError> {
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library_with_keys(keys))
        .query_async(conn)
        .await?;
    match installed_version(conn).await? {
        Some(v) if v == LIBRARY_VERSION => Ok(()),
        other => Err(ArbiterError::Protocol {
            backend: BACKEND,
            message: format!("after FUNCTION LOAD the library reports version {other:?}, expected {LIBRARY_VERSION}"),
        }),
    }
}

/// Connects to `url` and [`install`]s.
pub async fn install_url(url: &str) -> Result<Vec<SettingsWarning>, ArbiterError> {
    let mut conn = connect(url).await?;
    install(&mut conn).await
}

/// The loaded library version, `None` when the library is not loaded.
pub async fn installed_version<C: ConnectionLike + Send>(conn: &mut C) -> Result<Option<String>, ArbiterError> {
    Via::Functions.installed_version(conn).await
}

/// The module's version (`LEASEFENCE.VERSION`) when it is loaded and is
/// [`MODULE_VERSION`]; otherwise [`ArbiterError::ModuleNotLoaded`], or
/// [`ArbiterError::Protocol`] naming both versions for an older or newer
/// module. Modules cannot be loaded over a connection (Redis 7 refuses
/// `MODULE LOAD` unless `enable-module-command` is set), so this only checks.
pub async fn module_loaded<C: ConnectionLike + Send>(conn: &mut C) -> Result<String, ArbiterError> {
    let version = Via::Module
        .installed_version(conn)
        .await?
        .ok_or(ArbiterError::ModuleNotLoaded)?;
    if version != MODULE_VERSION {
        return Err(ArbiterError::Protocol {
            backend: BACKEND,
            message: format!(
                "the server loaded leasefence module version {version}, this client needs version \
                 {MODULE_VERSION}: build the module from this release and restart the server with it"
            ),
        });
    }
    Ok(version)
}

/// Which server-side code runs a fenced call. Both check and record the same
/// fence keys with the same rule and answer with the same errors, so they can
/// be mixed on one server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Via {
    /// The Functions library loaded by [`install`] (`FCALL leasefence_set ...`):
    /// works on any Redis 7+, managed ones included.
    #[default]
    Functions,
    /// The native module from the `leasefence-redis-module` crate
    /// (`LEASEFENCE.SET ...`), for servers started with `--loadmodule`: no Lua
    /// call per write, so fenced writes cost about what plain ones do.
    Module,
}

/// The fenced commands, named per [`Via`].
#[derive(Clone, Copy)]
enum Op {
    Set,
    Del,
    HSet,
    XAdd,
}

impl Via {
    /// `FCALL function numkeys FENCE KEYS... TOKEN MODE` or `LEASEFENCE.OP
    /// FENCE KEYS... TOKEN MODE`; the caller appends the rest.
    fn command(self, op: Op, fence: &Fence, mode: FenceMode, keys: &[&str]) -> Cmd {
        let mut cmd = match self {
            Via::Functions => {
                let function = match op {
                    Op::Set => "leasefence_set",
                    Op::Del => "leasefence_del",
                    Op::HSet => "leasefence_hset",
                    Op::XAdd => "leasefence_xadd",
                };
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(function).arg(keys.len() + 1);
                cmd
            }
            Via::Module => redis::cmd(match op {
                Op::Set => "LEASEFENCE.SET",
                Op::Del => "LEASEFENCE.DEL",
                Op::HSet => "LEASEFENCE.HSET",
                Op::XAdd => "LEASEFENCE.XADD",
            }),
        };
        cmd.arg(fence_key(&fence.resource));
        for k in keys {
            cmd.arg(*k);
        }
        cmd.arg(fence.token.get().to_string());
        // The signature rides in the mode argument, after one space, so that
        // every command keeps its argument positions.
        match &fence.signature {
            Some(signature) => cmd.arg(format!("{} {signature}", mode.as_str())),
            None => cmd.arg(mode.as_str()),
        };
        cmd
    }

    /// Installs `key` (or replaces the secret of a key of the same id): from
    /// then on every fenced call must carry a signature under an installed
    /// key, or fails with [`ArbiterError::BadSignature`] and changes nothing.
    /// At most two keys (a rotation). The Functions library holds them in its
    /// code (reloaded with them; persisted and replicated with it, and kept
    /// by [`install`]); the module in its memory (give them again at load
    /// with `fence-key-file PATH`). Not safe against a concurrent change of
    /// the library's keys: change keys from one place.
    pub async fn add_fence_key<C: ConnectionLike + Send>(
        self,
        conn: &mut C,
        key: &FenceKey,
    ) -> Result<(), ArbiterError> {
        match self {
            Via::Functions => {
                let mut keys = loaded_keys(conn)
                    .await?
                    .ok_or(ArbiterError::NotInstalled { backend: BACKEND })?;
                if let Some(old) = keys.iter_mut().find(|k| k.id() == key.id()) {
                    *old = key.clone();
                } else if keys.len() >= VERIFY_KEYS_MAX {
                    let ids: Vec<&str> = keys.iter().map(|k| k.id()).collect();
                    let message = format!(
                        "two keys are installed ({}); remove one before adding {}",
                        ids.join(", "),
                        key.id()
                    );
                    return Err(leasefence_core::Invalid::new("fence key", message).into());
                } else {
                    keys.push(key.clone());
                }
                load_library(conn, &keys).await
            }
            Via::Module => {
                let (id, hex) = key_parts(key);
                let _: String = redis::cmd("LEASEFENCE.KEY.ADD")
                    .arg(id)
                    .arg(hex)
                    .query_async(conn)
                    .await
                    .map_err(|e| classify(e, None))?;
                Ok(())
            }
        }
    }

    /// Removes the key `key_id`; `true` if it was installed. With no key
    /// left, fences are not checked.
    pub async fn remove_fence_key<C: ConnectionLike + Send>(
        self,
        conn: &mut C,
        key_id: &str,
    ) -> Result<bool, ArbiterError> {
        match self {
            Via::Functions => {
                let mut keys = loaded_keys(conn)
                    .await?
                    .ok_or(ArbiterError::NotInstalled { backend: BACKEND })?;
                let before = keys.len();
                keys.retain(|k| k.id() != key_id);
                if keys.len() == before {
                    return Ok(false);
                }
                load_library(conn, &keys).await.map(|()| true)
            }
            Via::Module => {
                let removed: i64 = redis::cmd("LEASEFENCE.KEY.REMOVE")
                    .arg(key_id)
                    .query_async(conn)
                    .await
                    .map_err(|e| classify(e, None))?;
                Ok(removed == 1)
            }
        }
    }

    /// The ids of the installed keys, sorted (never the secrets).
    pub async fn fence_key_ids<C: ConnectionLike + Send>(self, conn: &mut C) -> Result<Vec<String>, ArbiterError> {
        let cmd = match self {
            Via::Functions => {
                let mut cmd = redis::cmd("FCALL_RO");
                cmd.arg("leasefence_key_ids").arg(0);
                cmd
            }
            Via::Module => redis::cmd("LEASEFENCE.KEY.LIST"),
        };
        cmd.query_async(conn).await.map_err(|e| classify(e, None))
    }

    /// The library version ([`Via::Functions`]) or the module's calling
    /// convention version ([`Via::Module`]); `None` when neither is there.
    pub async fn installed_version<C: ConnectionLike + Send>(
        self,
        conn: &mut C,
    ) -> Result<Option<String>, ArbiterError> {
        let query = match self {
            Via::Functions => {
                redis::cmd("FCALL_RO")
                    .arg("leasefence_version")
                    .arg(0)
                    .query_async(conn)
                    .await
            }
            Via::Module => redis::cmd("LEASEFENCE.VERSION").query_async(conn).await,
        };
        match query {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_missing_function(&e) || is_missing_module(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
    /// This flavour, waiting after every admitted write as `wait` says (see
    /// [`WaitFor`]).
    pub fn wait_for(self, wait: WaitFor) -> Writer {
        Writer::new(self, Some(wait))
    }

    /// Fenced `SET key value`.
    pub async fn set<C, V>(
        self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: V,
    ) -> Result<(), ArbiterError>
    where
        C: ConnectionLike + Send,
        V: ToRedisArgs,
    {
        Writer::new(self, None).set(conn, fence, mode, key, value).await
    }

    /// Fenced `SET key value PX ttl`: the value expires after `ttl` (at least
    /// 1 ms, whole milliseconds); the fence itself never expires.
    pub async fn set_with_ttl<C, V>(
        self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: V,
        ttl: std::time::Duration,
    ) -> Result<(), ArbiterError>
    where
        C: ConnectionLike + Send,
        V: ToRedisArgs,
    {
        Writer::new(self, None)
            .set_with_ttl(conn, fence, mode, key, value, ttl)
            .await
    }

    /// Fenced `DEL keys...`; returns how many keys were removed. The token is
    /// recorded even if none existed.
    pub async fn del<C: ConnectionLike + Send>(
        self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        keys: &[&str],
    ) -> Result<u64, ArbiterError> {
        Writer::new(self, None).del(conn, fence, mode, keys).await
    }

    /// Fenced `HSET key field value [field value ...]`; returns how many fields were added.
    pub async fn hset<C, F, V>(
        self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        fields: &[(F, V)],
    ) -> Result<u64, ArbiterError>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        Writer::new(self, None).hset(conn, fence, mode, key, fields).await
    }

    /// Fenced `XADD stream id field value [field value ...]` (`id` is usually
    /// `*`); returns the entry id. (Raw callers may put XADD's options before
    /// the ID; `NOMKSTREAM` on a missing stream then replies nil and records
    /// no token.)
    pub async fn xadd<C, F, V>(
        self,
        conn: &mut C,
        fence: &Fence,
        mode: FenceMode,
        stream: &str,
        id: &str,
        fields: &[(F, V)],
    ) -> Result<String, ArbiterError>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        Writer::new(self, None)
            .xadd(conn, fence, mode, stream, id, fields)
            .await
    }
}

/// The recorded `last_token` of `resource`, `None` if it was never admitted.
pub async fn last_token<C: ConnectionLike + Send>(
    conn: &mut C,
    resource: &ResourceId,
) -> Result<Option<Token>, ArbiterError> {
    let v: Option<String> = redis::cmd("GET").arg(fence_key(resource)).query_async(conn).await?;
    v.map(|s| {
        s.parse::<u64>()
            .ok()
            .and_then(Token::new)
            .ok_or_else(|| ArbiterError::Protocol {
                backend: BACKEND,
                message: format!("fence key of {resource} holds {s:?}, not a token"),
            })
    })
    .transpose()
}

async fn call<C: ConnectionLike + Send, T: FromRedisValue>(
    conn: &mut C,
    cmd: &Cmd,
    fence: &Fence,
) -> Result<T, ArbiterError> {
    cmd.query_async(conn)
        .await
        .map_err(|e| observe(BACKEND, classify(e, Some(&fence.resource))))
}

fn is_missing_function(e: &redis::RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// `ERR unknown command 'leasefence.set', ...`: the module is not loaded.
fn is_missing_module(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command") && text.contains("'leasefence.")
}

/// Maps `-STALE presented current resource` to [`ArbiterError::Stale`],
/// `-LFINVALID` to [`ArbiterError::Invalid`] and a missing library to
/// [`ArbiterError::NotInstalled`]. `expected` is the resource of the call, used
/// when the reply's resource cannot be parsed.
pub(crate) fn classify(e: redis::RedisError, expected: Option<&ResourceId>) -> ArbiterError {
    match e.code() {
        Some(ERROR_STALE) => match parse_stale(e.detail().unwrap_or_default(), expected) {
            Some(stale) => ArbiterError::Stale(stale),
            None => ArbiterError::Protocol {
                backend: BACKEND,
                message: format!("unparseable STALE reply: {e}"),
            },
        },
        Some(ERROR_BAD_SIGNATURE) => match parse_bad_signature(e.detail().unwrap_or_default(), expected) {
            Some((resource, reason)) => ArbiterError::BadSignature { resource, reason },
            None => ArbiterError::Protocol {
                backend: BACKEND,
                message: format!("unparseable BADSIG reply: {e}"),
            },
        },
        Some("LFINVALID") => ArbiterError::Invalid(leasefence_core::Invalid::new(
            "argument",
            e.detail().unwrap_or_default(),
        )),
        _ if is_missing_function(&e) => ArbiterError::NotInstalled { backend: BACKEND },
        _ if is_missing_module(&e) => ArbiterError::ModuleNotLoaded,
        _ => ArbiterError::Redis(e),
    }
}

/// Parses `reason key-id resource` (`-` for no key id; the resource last: it
/// may contain spaces).
fn parse_bad_signature(detail: &str, expected: Option<&ResourceId>) -> Option<(ResourceId, SignatureError)> {
    let mut parts = detail.splitn(3, ' ');
    let (reason, key_id) = (parts.next()?, parts.next()?);
    let resource = match parts.next().and_then(|r| ResourceId::new(r).ok()) {
        Some(r) => r,
        None => expected?.clone(),
    };
    Some((resource, SignatureError::from_reason(reason, key_id)?))
}

/// Parses `presented current resource` (resource last: it may contain spaces).
fn parse_stale(detail: &str, expected: Option<&ResourceId>) -> Option<Stale> {
    let mut parts = detail.splitn(3, ' ');
    let presented = Token::new(parts.next()?.parse().ok()?)?;
    let current = Token::new(parts.next()?.parse().ok()?)?;
    let resource = match parts.next().and_then(|r| ResourceId::new(r).ok()) {
        Some(r) => r,
        None => expected?.clone(),
    };
    Some(Stale {
        resource,
        presented,
        current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_reply_parses_with_and_without_resource() {
        let s = parse_stale("18446744073709551615 18446744073709551615 a b", None).expect("parses");
        assert_eq!((s.resource.as_str(), s.presented.get()), ("a b", u64::MAX));
        let r = ResourceId::new("fallback").expect("valid");
        let s = parse_stale("3 4", Some(&r)).expect("parses");
        assert_eq!((s.resource, s.current.get()), (r, 4));
        assert!(parse_stale("3 4", None).is_none());
        assert!(parse_stale("0 4 r", None).is_none());
    }

    #[test]
    fn bad_signature_reply_parses_every_reason() {
        let (r, e) = parse_bad_signature("unknown_key k9 a b", None).expect("parses");
        assert_eq!((r.as_str(), e), ("a b", SignatureError::UnknownKey("k9".into())));
        let (_, e) = parse_bad_signature("missing - r", None).expect("parses");
        assert_eq!(e, SignatureError::Missing);
        assert!(parse_bad_signature("nonsense - r", None).is_none());
        assert!(parse_bad_signature("mismatch k", None).is_none());
    }

    #[test]
    fn keys_are_written_into_the_library_and_read_back() {
        assert!(LIBRARY.contains(KEYS_LINE), "the library has its keys line");
        let keys = [
            FenceKey::new("a", [1; 32]).expect("key"),
            FenceKey::new("b-2", [0xfe; 32]).expect("key"),
        ];
        let code = library_with_keys(&keys);
        assert!(!code.contains(KEYS_LINE));
        assert_eq!(parse_keys_line(&code).expect("parses"), keys);
        assert_eq!(parse_keys_line(&library_with_keys(&[])).expect("parses"), []);
        assert_eq!(parse_keys_line(LIBRARY).expect("parses"), []);
        let tampered = code.replace("['a'] = '01", "['a'] = 'zz");
        assert!(parse_keys_line(&tampered).is_err());
    }

    #[test]
    fn fence_key_is_a_hash_tag() {
        let r = ResourceId::new("orders/7").expect("valid");
        assert_eq!(fence_key(&r), "leasefence:fence:{orders/7}");
    }
}
