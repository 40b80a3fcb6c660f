//! The part of the Redis module API this module calls, declared by hand.
//!
//! Why by hand: the `redis-module` crate generates its bindings with bindgen,
//! which needs libclang at build time, and it links a C shim. This module
//! needs about twenty functions of a stable C ABI, looked up by name at load
//! time exactly as `redismodule.h`'s `RedisModule_Init` does: the first field
//! of the load context is `RedisModule_GetApi`, and every other function is
//! fetched through it. A Redis without one of them refuses to load the module
//! (with the name in its log) instead of crashing later.

use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::sync::OnceLock;

/// Opaque Redis types.
#[repr(C)]
pub struct Ctx {
    _private: [u8; 0],
}
#[repr(C)]
pub struct RString {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Key {
    _private: [u8; 0],
}
#[repr(C)]
pub struct CallReply {
    _private: [u8; 0],
}

pub const OK: c_int = 0;
pub const ERR: c_int = 1;
pub const APIVER_1: c_int = 1;
pub const READ: c_int = 1;
pub const WRITE: c_int = 1 << 1;
pub const KEYTYPE_EMPTY: c_int = 0;
pub const KEYTYPE_STRING: c_int = 1;
pub const REPLY_ERROR: c_int = 1;
pub const REPLY_NULL: c_int = 4;
pub const NO_EXPIRE: c_longlong = -1;
pub const NOTIFY_GENERIC: c_int = 1 << 2;
pub const NOTIFY_STRING: c_int = 1 << 3;

pub type CmdFunc = unsafe extern "C" fn(*mut Ctx, *mut *mut RString, c_int) -> c_int;
type GetApi = unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int;
pub type LogFn = unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...);

/// The functions, fetched once at load time.
pub struct Api {
    pub set_module_attribs: unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, c_int),
    pub is_module_name_busy: unsafe extern "C" fn(*const c_char) -> c_int,
    pub create_command:
        unsafe extern "C" fn(*mut Ctx, *const c_char, CmdFunc, *const c_char, c_int, c_int, c_int) -> c_int,
    pub log: LogFn,
    pub reply_with_error: unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int,
    pub reply_with_simple_string: unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int,
    pub reply_with_call_reply: unsafe extern "C" fn(*mut Ctx, *mut CallReply) -> c_int,
    pub reply_with_long_long: unsafe extern "C" fn(*mut Ctx, c_longlong) -> c_int,
    pub reply_with_array: unsafe extern "C" fn(*mut Ctx, std::ffi::c_long) -> c_int,
    pub reply_with_string_buffer: unsafe extern "C" fn(*mut Ctx, *const c_char, usize) -> c_int,
    pub string_ptr_len: unsafe extern "C" fn(*const RString, *mut usize) -> *const c_char,
    pub open_key: unsafe extern "C" fn(*mut Ctx, *mut RString, c_int) -> *mut Key,
    pub close_key: unsafe extern "C" fn(*mut Key),
    pub key_type: unsafe extern "C" fn(*mut Key) -> c_int,
    pub string_dma: unsafe extern "C" fn(*mut Key, *mut usize, c_int) -> *mut c_char,
    pub string_set: unsafe extern "C" fn(*mut Key, *mut RString) -> c_int,
    pub string_truncate: unsafe extern "C" fn(*mut Key, usize) -> c_int,
    pub get_abs_expire: unsafe extern "C" fn(*mut Key) -> c_longlong,
    pub set_abs_expire: unsafe extern "C" fn(*mut Key, c_longlong) -> c_int,
    pub milliseconds: unsafe extern "C" fn() -> c_longlong,
    pub replicate: unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...) -> c_int,
    pub call: unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...) -> *mut CallReply,
    pub call_reply_type: unsafe extern "C" fn(*mut CallReply) -> c_int,
    pub free_call_reply: unsafe extern "C" fn(*mut CallReply),
    pub notify_keyspace_event: unsafe extern "C" fn(*mut Ctx, c_int, *const c_char, *mut RString) -> c_int,
}

static API: OnceLock<Api> = OnceLock::new();

/// The API table; only called from commands, which Redis runs after a
/// successful load.
pub fn api() -> &'static Api {
    API.get()
        .expect("the module API is fetched in RedisModule_OnLoad before any command is registered")
}

/// Fetches every function through `RedisModule_GetApi`; on a missing one
/// logs and returns its name.
///
/// # Safety
/// `ctx` must be the context Redis passed to `RedisModule_OnLoad`.
pub unsafe fn init(ctx: *mut Ctx) -> Result<&'static Api, &'static str> {
    if let Some(api) = API.get() {
        return Ok(api);
    }
    // SAFETY: redismodule.h: `void *getapifuncptr = ((void**)ctx)[0];`.
    let get_api: GetApi = unsafe { std::mem::transmute::<*mut c_void, GetApi>(*(ctx as *mut *mut c_void)) };
    // `Option<extern fn>` is a nullable function pointer, the very slot
    // `REDISMODULE_GET_API` hands to GetApi.
    let mut log_slot: Option<LogFn> = None;
    // SAFETY: GetApi writes the named function's address (or nothing) into a
    // pointer-sized slot.
    let rc = unsafe { get_api(c"RedisModule_Log".as_ptr(), (&raw mut log_slot).cast()) };
    let log = match log_slot {
        Some(f) if rc == OK => f,
        _ => return Err("RedisModule_Log"),
    };
    macro_rules! fetch {
        ($name:literal) => {{
            // The field the result is assigned to fixes the slot's type.
            let mut slot = None;
            let name = concat!("RedisModule_", $name, "\0");
            // SAFETY: as for Log above.
            let rc = unsafe { get_api(name.as_ptr().cast(), (&raw mut slot).cast()) };
            match slot {
                Some(f) if rc == OK => f,
                _ => {
                    // SAFETY: Log with a printf format and one C string.
                    unsafe {
                        log(
                            ctx,
                            c"warning".as_ptr(),
                            c"leasefence: this Redis has no %s; the module needs Redis 7.0 or later".as_ptr(),
                            name.as_ptr(),
                        )
                    };
                    return Err(concat!("RedisModule_", $name));
                }
            }
        }};
    }
    let api = Api {
        set_module_attribs: fetch!("SetModuleAttribs"),
        is_module_name_busy: fetch!("IsModuleNameBusy"),
        create_command: fetch!("CreateCommand"),
        log,
        reply_with_error: fetch!("ReplyWithError"),
        reply_with_simple_string: fetch!("ReplyWithSimpleString"),
        reply_with_call_reply: fetch!("ReplyWithCallReply"),
        reply_with_long_long: fetch!("ReplyWithLongLong"),
        reply_with_array: fetch!("ReplyWithArray"),
        reply_with_string_buffer: fetch!("ReplyWithStringBuffer"),
        string_ptr_len: fetch!("StringPtrLen"),
        open_key: fetch!("OpenKey"),
        close_key: fetch!("CloseKey"),
        key_type: fetch!("KeyType"),
        string_dma: fetch!("StringDMA"),
        string_set: fetch!("StringSet"),
        string_truncate: fetch!("StringTruncate"),
        get_abs_expire: fetch!("GetAbsExpire"),
        set_abs_expire: fetch!("SetAbsExpire"),
        milliseconds: fetch!("Milliseconds"),
        replicate: fetch!("Replicate"),
        call: fetch!("Call"),
        call_reply_type: fetch!("CallReplyType"),
        free_call_reply: fetch!("FreeCallReply"),
        notify_keyspace_event: fetch!("NotifyKeyspaceEvent"),
    };
    Ok(API.get_or_init(|| api))
}

/// The bytes of a Redis string argument.
///
/// # Safety
/// `s` must be a live string from the command's `argv`.
pub unsafe fn bytes<'a>(s: *mut RString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: StringPtrLen returns a pointer to `len` bytes owned by `s`.
    unsafe {
        let ptr = (api().string_ptr_len)(s, &mut len);
        if ptr.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(ptr.cast(), len)
        }
    }
}
