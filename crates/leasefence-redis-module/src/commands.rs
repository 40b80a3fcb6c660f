//! The fenced commands. Each one checks the fence, applies its effect and
//! records the token inside one command execution, which Redis runs
//! atomically; a refused call writes nothing.
//!
//! Calling convention (the Functions library's, without `FCALL name numkeys`):
//!
//! ```text
//! LEASEFENCE.SET  FENCE KEY TOKEN MODE VALUE [EX s | PX ms | EXAT t | PXAT t | KEEPTTL]  -> OK
//! LEASEFENCE.DEL  FENCE KEY [KEY ...] TOKEN MODE                                        -> keys removed
//! LEASEFENCE.HSET FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE ...]                    -> fields added
//! LEASEFENCE.XADD FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE ...]    -> entry id or nil
//! LEASEFENCE.VERSION                                                                    -> "3"
//! LEASEFENCE.KEY.ADD ID HEX     -> OK          (signed fences, see crate::signing)
//! LEASEFENCE.KEY.REMOVE ID      -> 1 or 0
//! LEASEFENCE.KEY.LIST           -> the key ids
//! ```
//!
//! MODE may be followed by one space and the fence's signature (`strict
//! v1.<key id>.<hex>`); once a key is installed, a call without a valid one
//! fails with `-BADSIG <reason> <key id or -> <resource>` and writes nothing.
//!
//! A stale call fails with `-STALE <presented> <current> <resource>`, bad
//! arguments with `-LFINVALID <reason>`, a fence key holding something other
//! than a token with `-LFCORRUPT`. No data key may start with the fence-key
//! prefix `leasefence:fence:` (`-LFINVALID`): a fenced call must not write
//! its own fence key or another resource's. A command that writes nothing
//! records no fence: `XADD ... NOMKSTREAM` on a missing stream replies nil
//! and leaves the token unused (SET's NX, XX and GET are refused instead).
//!
//! SET is done with the key API (no nested command call: that is where the
//! speed comes from) and propagated to replicas and the AOF as one `MSET key
//! value fence token`, or with an expiry as `SET key value PXAT t|KEEPTTL`
//! plus `SET fence token` in MULTI/EXEC, so replicas need no module. DEL,
//! HSET and XADD run the real command through `RedisModule_Call`, which
//! checks types and arguments exactly as Redis does and propagates itself; if
//! it fails, its error is the reply and the fence is not written.

use std::ffi::{CStr, CString, c_int};

use leasefence_core::Token;

use crate::args::{self, Expiry};
use crate::ffi::{self, Ctx, RString, api, bytes};
use crate::signing::{self, KEYS};

/// The module's calling-convention version, reported by `LEASEFENCE.VERSION`.
pub const VERSION: &CStr = c"3";

const BAD_FENCE: &CStr = c"LFINVALID FENCE must be the fence key leasefence:fence:{RESOURCE}";
const BAD_TOKEN: &CStr = c"LFINVALID token must be a decimal integer in 1..18446744073709551615";
const BAD_MODE: &CStr = c"LFINVALID mode must be 'strict' or 'monotonic'";
const RESERVED_KEY: &CStr = c"LFINVALID data keys must not start with leasefence:fence: (the prefix of fence keys)";
const DEL_USAGE: &CStr = c"LFINVALID usage: LEASEFENCE.DEL FENCE KEY [KEY ...] TOKEN MODE";
const HSET_USAGE: &CStr = c"LFINVALID usage: LEASEFENCE.HSET FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE ...]";
const XADD_USAGE: &CStr =
    c"LFINVALID usage: LEASEFENCE.XADD FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE ...]";

fn reply_error(ctx: *mut Ctx, message: &CStr) -> c_int {
    // SAFETY: ctx is the live command context; the message is NUL-terminated.
    unsafe { (api().reply_with_error)(ctx, message.as_ptr()) }
}

fn reply_owned_error(ctx: *mut Ctx, message: String) -> c_int {
    match CString::new(message) {
        Ok(m) => reply_error(ctx, &m),
        Err(_) => reply_error(ctx, c"LFCORRUPT a fence reply held a NUL byte"),
    }
}

/// Checks the fence `FENCE TOKEN MODE` against the recorded token. `Err` is
/// the error reply already sent.
fn check(ctx: *mut Ctx, fence: *mut RString, token: *mut RString, mode: *mut RString) -> Result<(), c_int> {
    // SAFETY: all three are argv strings of the running command.
    let (fence_key, token_text, mode_text) = unsafe { (bytes(fence), bytes(token), bytes(mode)) };
    let Some(resource) = args::resource_of(fence_key) else {
        return Err(reply_error(ctx, BAD_FENCE));
    };
    let Some(presented) = args::token(token_text) else {
        return Err(reply_error(ctx, BAD_TOKEN));
    };
    let (mode_text, signature) = signing::split_mode(mode_text);
    let Some(mode) = args::mode(mode_text) else {
        return Err(reply_error(ctx, BAD_MODE));
    };
    let checked = match KEYS.lock() {
        Ok(keys) => keys.check(resource, presented, signature),
        Err(_) => Err("ERR the fence key store is poisoned; restart the server".to_string()),
    };
    if let Err(reply) = checked {
        return Err(reply_owned_error(ctx, reply));
    }
    let current = match recorded(ctx, fence) {
        Ok(c) => c,
        Err(()) => {
            let key = String::from_utf8_lossy(fence_key);
            return Err(reply_owned_error(
                ctx,
                format!("LFCORRUPT fence key {key} holds a non-token value"),
            ));
        }
    };
    match current {
        Some(current) if !mode.admits(current, presented) => {
            let resource = String::from_utf8_lossy(resource);
            // The client parses `presented current resource`; a resource with
            // a NUL byte is left out and the client falls back to its own.
            let full = format!("STALE {presented} {current} {resource}");
            Err(match CString::new(full) {
                Ok(m) => reply_error(ctx, &m),
                Err(_) => reply_owned_error(ctx, format!("STALE {presented} {current}")),
            })
        }
        _ => Ok(()),
    }
}

/// Refuses a call whose effect would write a key under the fence-key prefix
/// ([`args::writable`]): its own fence key (the effect would overwrite the
/// token, or the token the effect) or any other resource's.
fn no_fence_keys(ctx: *mut Ctx, keys: &[*mut RString]) -> Result<(), c_int> {
    // SAFETY: argv strings of the running command.
    if keys.iter().any(|k| !args::writable(unsafe { bytes(*k) })) {
        return Err(reply_error(ctx, RESERVED_KEY));
    }
    Ok(())
}

/// The token recorded under `fence`: `Ok(None)` when there is none, `Err`
/// when the key holds something that is not a canonical token.
fn recorded(ctx: *mut Ctx, fence: *mut RString) -> Result<Option<Token>, ()> {
    let api = api();
    // SAFETY: OpenKey/KeyType/StringDMA/CloseKey on a key handle opened here
    // and closed before returning; the DMA bytes are copied out (parsed)
    // before the handle closes.
    unsafe {
        let key = (api.open_key)(ctx, fence, ffi::READ);
        if key.is_null() {
            return Ok(None);
        }
        let result = match (api.key_type)(key) {
            ffi::KEYTYPE_EMPTY => Ok(None),
            ffi::KEYTYPE_STRING => {
                let mut len = 0usize;
                let ptr = (api.string_dma)(key, &mut len, ffi::READ);
                if ptr.is_null() {
                    Err(())
                } else {
                    args::token(std::slice::from_raw_parts(ptr.cast(), len))
                        .map(Some)
                        .ok_or(())
                }
            }
            _ => Err(()),
        };
        (api.close_key)(key);
        result
    }
}

/// Records `token` under `fence` and announces the write; the caller
/// propagates it. An existing token is overwritten in place (no new object,
/// no delete and re-add of the key): this is on every fenced write's path.
fn write_fence(ctx: *mut Ctx, fence: *mut RString, token: *mut RString) -> Result<(), c_int> {
    let api = api();
    // SAFETY: a write handle opened and closed here; argv strings are live;
    // the DMA pointer is valid for `len` bytes until the next call on the
    // handle, and is written only within that length.
    unsafe {
        let key = (api.open_key)(ctx, fence, ffi::WRITE);
        if key.is_null() {
            return Err(reply_error(ctx, c"ERR could not open the fence key"));
        }
        let digits = bytes(token);
        let written = if (api.key_type)(key) == ffi::KEYTYPE_STRING {
            let mut len = 0usize;
            let mut ptr = (api.string_dma)(key, &mut len, ffi::WRITE);
            if !ptr.is_null() && len != digits.len() && (api.string_truncate)(key, digits.len()) == ffi::OK {
                ptr = (api.string_dma)(key, &mut len, ffi::WRITE);
            }
            if !ptr.is_null() && len == digits.len() {
                std::ptr::copy_nonoverlapping(digits.as_ptr(), ptr.cast(), len);
                true
            } else {
                false
            }
        } else {
            false
        };
        if !written && (api.string_set)(key, token) != ffi::OK {
            (api.close_key)(key);
            return Err(reply_error(ctx, c"ERR could not write the fence key"));
        }
        (api.close_key)(key);
        (api.notify_keyspace_event)(ctx, ffi::NOTIFY_STRING, c"set".as_ptr(), fence);
    }
    Ok(())
}

/// [`write_fence`], propagated as `SET fence token`.
fn record(ctx: *mut Ctx, fence: *mut RString, token: *mut RString) -> Result<(), c_int> {
    write_fence(ctx, fence, token)?;
    // SAFETY: "ss": two live RedisModuleStrings.
    unsafe { (api().replicate)(ctx, c"SET".as_ptr(), c"ss".as_ptr(), fence, token) };
    Ok(())
}

/// The command's arguments as a slice.
///
/// # Safety
/// `argv` and `argc` as Redis passed them to a command function.
unsafe fn argv<'a>(argv: *mut *mut RString, argc: c_int) -> &'a [*mut RString] {
    match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` valid pointers.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    }
}

/// `LEASEFENCE.SET FENCE KEY TOKEN MODE VALUE [expiry]`.
pub unsafe extern "C" fn set(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    if !(6..=8).contains(&a.len()) {
        return reply_owned_error(ctx, args::SET_USAGE.to_string());
    }
    if let Err(reply) = check(ctx, a[1], a[3], a[4]).and_then(|()| no_fence_keys(ctx, &a[2..3])) {
        return reply;
    }
    let api = api();
    // SAFETY: the option arguments are live argv strings; Milliseconds has no
    // preconditions.
    let (options, now) = unsafe {
        let options: Vec<&[u8]> = a[6..].iter().map(|s| bytes(*s)).collect();
        (options, (api.milliseconds)())
    };
    let expiry = match args::expiry(&options, now) {
        Ok(e) => e,
        Err(message) => return reply_owned_error(ctx, message.to_string()),
    };
    let (fence, key, token, value) = (a[1], a[2], a[3], a[5]);
    // The fence first: if that could fail, nothing would have happened yet.
    if let Err(reply) = write_fence(ctx, fence, token) {
        return reply;
    }
    // SAFETY: a write handle opened and closed here; argv strings are live.
    unsafe {
        let handle = (api.open_key)(ctx, key, ffi::WRITE);
        if handle.is_null() {
            // Never seen (a write handle is always granted); if it were, the
            // fence is recorded already, so replicas must get it too.
            (api.replicate)(ctx, c"SET".as_ptr(), c"ss".as_ptr(), fence, token);
            return reply_error(ctx, c"ERR could not open the key for writing");
        }
        let kept = match expiry {
            Expiry::Keep => (api.get_abs_expire)(handle),
            _ => ffi::NO_EXPIRE,
        };
        if (api.string_set)(handle, value) != ffi::OK {
            (api.close_key)(handle);
            (api.replicate)(ctx, c"SET".as_ptr(), c"ss".as_ptr(), fence, token);
            return reply_error(ctx, c"ERR could not write the key");
        }
        match expiry {
            Expiry::At(at) => {
                (api.set_abs_expire)(handle, at);
            }
            Expiry::Keep if kept != ffi::NO_EXPIRE => {
                (api.set_abs_expire)(handle, kept);
            }
            _ => {}
        }
        (api.close_key)(handle);
        (api.notify_keyspace_event)(ctx, ffi::NOTIFY_STRING, c"set".as_ptr(), key);
        if matches!(expiry, Expiry::At(_)) {
            (api.notify_keyspace_event)(ctx, ffi::NOTIFY_GENERIC, c"expire".as_ptr(), key);
        }
    }
    // SAFETY: the formats match the arguments; all strings are live.
    unsafe {
        match expiry {
            // One command, so nothing wraps it in MULTI/EXEC: propagating
            // costs the primary about what a plain SET's does.
            Expiry::None => (api.replicate)(ctx, c"MSET".as_ptr(), c"ssss".as_ptr(), key, value, fence, token),
            Expiry::Keep => {
                (api.replicate)(ctx, c"SET".as_ptr(), c"ssc".as_ptr(), key, value, c"KEEPTTL".as_ptr());
                (api.replicate)(ctx, c"SET".as_ptr(), c"ss".as_ptr(), fence, token)
            }
            Expiry::At(at) => {
                (api.replicate)(ctx, c"SET".as_ptr(), c"sscl".as_ptr(), key, value, c"PXAT".as_ptr(), at);
                (api.replicate)(ctx, c"SET".as_ptr(), c"ss".as_ptr(), fence, token)
            }
        };
    }
    // SAFETY: live context.
    unsafe { (api.reply_with_simple_string)(ctx, c"OK".as_ptr()) }
}

/// Checks the fence, runs `command` with `effect` as its arguments through
/// `RedisModule_Call` (replicated), and records the token only if it wrote
/// something: not after an error, not after a nil reply.
/// The first `keys` arguments of `effect` are the keys it writes.
fn fenced_call(ctx: *mut Ctx, fence: [*mut RString; 3], command: &CStr, effect: &[*mut RString], keys: usize) -> c_int {
    let [fence_key, token, mode] = fence;
    if let Err(reply) = check(ctx, fence_key, token, mode).and_then(|()| no_fence_keys(ctx, &effect[..keys])) {
        return reply;
    }
    let api = api();
    // SAFETY: "!v" takes a pointer to `len` RedisModuleString pointers and a
    // size_t; the reply is freed on every path.
    unsafe {
        let reply = (api.call)(ctx, command.as_ptr(), c"!v".as_ptr(), effect.as_ptr(), effect.len());
        if reply.is_null() {
            return reply_error(
                ctx,
                c"ERR the fenced command could not run (arity, cluster slot or memory)",
            );
        }
        // An error: the command changed nothing. Nil: it wrote nothing
        // (XADD NOMKSTREAM without a stream), so the token stays unused.
        if matches!((api.call_reply_type)(reply), ffi::REPLY_ERROR | ffi::REPLY_NULL) {
            let rc = (api.reply_with_call_reply)(ctx, reply);
            (api.free_call_reply)(reply);
            return rc;
        }
        if let Err(rc) = record(ctx, fence_key, token) {
            (api.free_call_reply)(reply);
            return rc;
        }
        let rc = (api.reply_with_call_reply)(ctx, reply);
        (api.free_call_reply)(reply);
        rc
    }
}

/// `LEASEFENCE.DEL FENCE KEY [KEY ...] TOKEN MODE`.
pub unsafe extern "C" fn del(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    let n = a.len();
    if n < 5 {
        return reply_error(ctx, DEL_USAGE);
    }
    fenced_call(ctx, [a[1], a[n - 2], a[n - 1]], c"DEL", &a[2..n - 2], n - 4)
}

/// HSET and XADD: `FENCE KEY TOKEN MODE REST...` runs `COMMAND KEY REST...`.
/// The caller has checked that `a` has at least six arguments.
fn one_key_call(ctx: *mut Ctx, a: &[*mut RString], command: &CStr) -> c_int {
    let mut effect = Vec::with_capacity(a.len() - 4);
    effect.push(a[2]);
    effect.extend_from_slice(&a[5..]);
    fenced_call(ctx, [a[1], a[3], a[4]], command, &effect, 1)
}

/// `LEASEFENCE.HSET FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE ...]`.
pub unsafe extern "C" fn hset(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    if a.len() < 7 || a.len() % 2 == 0 {
        return reply_error(ctx, HSET_USAGE);
    }
    one_key_call(ctx, a, c"HSET")
}

/// `LEASEFENCE.XADD FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD
/// VALUE ...]`; XADD itself checks the options and the field count.
pub unsafe extern "C" fn xadd(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    if a.len() < 8 {
        return reply_error(ctx, XADD_USAGE);
    }
    one_key_call(ctx, a, c"XADD")
}

/// `LEASEFENCE.KEY.ADD ID HEX`.
pub unsafe extern "C" fn key_add(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    if a.len() != 3 {
        return reply_error(ctx, c"LFINVALID usage: LEASEFENCE.KEY.ADD ID HEX");
    }
    // SAFETY: live argv strings.
    let key = match signing::parse_key(unsafe { bytes(a[1]) }, unsafe { bytes(a[2]) }) {
        Ok(k) => k,
        Err(e) => return reply_owned_error(ctx, e),
    };
    let added = match KEYS.lock() {
        Ok(mut keys) => keys.add(key),
        Err(_) => Err("ERR the fence key store is poisoned; restart the server".to_string()),
    };
    match added {
        // SAFETY: live context.
        Ok(()) => unsafe { (api().reply_with_simple_string)(ctx, c"OK".as_ptr()) },
        Err(e) => reply_owned_error(ctx, e),
    }
}

/// `LEASEFENCE.KEY.REMOVE ID`.
pub unsafe extern "C" fn key_remove(ctx: *mut Ctx, argv_ptr: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: called by Redis as a command function.
    let a = unsafe { argv(argv_ptr, argc) };
    if a.len() != 2 {
        return reply_error(ctx, c"LFINVALID usage: LEASEFENCE.KEY.REMOVE ID");
    }
    // SAFETY: a live argv string.
    let id = unsafe { bytes(a[1]) };
    let removed = KEYS.lock().map(|mut keys| keys.remove(id)).unwrap_or(false);
    // SAFETY: live context.
    unsafe { (api().reply_with_long_long)(ctx, i64::from(removed)) }
}

/// `LEASEFENCE.KEY.LIST`.
pub unsafe extern "C" fn key_list(ctx: *mut Ctx, _argv: *mut *mut RString, _argc: c_int) -> c_int {
    let ids = KEYS.lock().map(|keys| keys.ids()).unwrap_or_default();
    let api = api();
    // SAFETY: live context; each buffer is valid for its length.
    unsafe {
        (api.reply_with_array)(ctx, ids.len() as std::ffi::c_long);
        for id in &ids {
            (api.reply_with_string_buffer)(ctx, id.as_ptr().cast(), id.len());
        }
    }
    ffi::OK
}

/// `LEASEFENCE.VERSION`.
pub unsafe extern "C" fn version(ctx: *mut Ctx, _argv: *mut *mut RString, _argc: c_int) -> c_int {
    // SAFETY: live context.
    unsafe { (api().reply_with_simple_string)(ctx, VERSION.as_ptr()) }
}
