//! A Redis module with native fenced commands: the leasefence Redis arbiter
//! for servers that can load modules (`--loadmodule`).
//!
//! The Functions library (`leasefence-arbiter`'s `leasefence.lua`) works on
//! any Redis 7, including managed ones, but every call pays for a Lua function
//! and its nested `redis.call`s. This module does the same check-and-record in
//! native code: same calling convention, same error replies, the same fence
//! keys (the two can be used side by side on one server). See
//! [`commands`] for the commands.

pub mod args;
mod commands;
mod ffi;
pub mod signing;

use std::ffi::{CStr, c_int};

use ffi::{Ctx, RString};

/// The name the module registers (`MODULE LIST` shows it).
pub const MODULE_NAME: &CStr = c"leasefence";
pub use commands::VERSION;

/// Redis calls this when it loads the module.
///
/// # Safety
/// Called by Redis only, with its load context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnLoad(ctx: *mut Ctx, argv: *mut *mut RString, argc: c_int) -> c_int {
    // SAFETY: `ctx` is the load context.
    let api = match unsafe { ffi::init(ctx) } {
        Ok(api) => api,
        Err(_missing) => return ffi::ERR,
    };
    // SAFETY: the API functions with their documented arguments, during load.
    unsafe {
        if (api.is_module_name_busy)(MODULE_NAME.as_ptr()) != 0 {
            (api.log)(
                ctx,
                c"warning".as_ptr(),
                c"%s".as_ptr(),
                c"leasefence: a module of this name is loaded already".as_ptr(),
            );
            return ffi::ERR;
        }
        (api.set_module_attribs)(ctx, MODULE_NAME.as_ptr(), 1, ffi::APIVER_1);
        let args: Vec<&[u8]> = match usize::try_from(argc) {
            Ok(n) if !argv.is_null() => std::slice::from_raw_parts(argv, n)
                .iter()
                .map(|s| ffi::bytes(*s))
                .collect(),
            _ => Vec::new(),
        };
        if let Err(e) = load_keys(&args) {
            let message = std::ffi::CString::new(format!("leasefence: {e}")).unwrap_or_default();
            (api.log)(ctx, c"warning".as_ptr(), c"%s".as_ptr(), message.as_ptr());
            return ffi::ERR;
        }
        let commands: [(&CStr, ffi::CmdFunc, &CStr, c_int, c_int); 8] = [
            (c"leasefence.set", commands::set, c"write deny-oom", 1, 2),
            // The keys run from FENCE to the third-last argument (TOKEN MODE follow).
            (c"leasefence.del", commands::del, c"write", 1, -3),
            (c"leasefence.hset", commands::hset, c"write deny-oom", 1, 2),
            (c"leasefence.xadd", commands::xadd, c"write deny-oom", 1, 2),
            (c"leasefence.version", commands::version, c"readonly fast", 0, 0),
            // Key management: administrators only (ACL category @admin).
            (c"leasefence.key.add", commands::key_add, c"admin deny-script", 0, 0),
            (
                c"leasefence.key.remove",
                commands::key_remove,
                c"admin deny-script",
                0,
                0,
            ),
            (c"leasefence.key.list", commands::key_list, c"admin deny-script", 0, 0),
        ];
        for (name, func, flags, first, last) in commands {
            let step = c_int::from(first != 0);
            if (api.create_command)(ctx, name.as_ptr(), func, flags.as_ptr(), first, last, step) != ffi::OK {
                (api.log)(
                    ctx,
                    c"warning".as_ptr(),
                    c"leasefence: could not register %s".as_ptr(),
                    name.as_ptr(),
                );
                return ffi::ERR;
            }
        }
    }
    ffi::OK
}

/// Installs the keys of the load arguments (`fence-key-file PATH`, at most two).
fn load_keys(args: &[&[u8]]) -> Result<(), String> {
    let keys = signing::load_args(args)?;
    let mut store = signing::KEYS
        .lock()
        .map_err(|_| "the fence key store is poisoned".to_string())?;
    for key in keys {
        store
            .add(key)
            .map_err(|e| e.trim_start_matches("LFINVALID ").to_string())?;
    }
    Ok(())
}
