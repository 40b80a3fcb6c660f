//! A warning for a data dir that a reboot empties (tmpfs, ramfs).
//!
//! The coordinator's store holds every resource's last token, and the
//! gateway's the last token each fence key admitted. On a file system kept
//! in memory both are gone after a reboot: a coordinator then hands out
//! tokens again that it already granted, and a gateway admits any token.
//! Fine for a test, so a warning rather than a refusal.

use std::path::Path;

/// Logs a warning when `dir`, the data dir of `what`, is on a file system
/// that a reboot empties; says nothing when it cannot tell.
pub fn warn_if_volatile(what: &str, dir: &Path) {
    if let Some(fs) = volatile_fs(dir) {
        tracing::warn!(
            data_dir = %dir.display(),
            "the {what}'s data dir is on {fs}, which a reboot empties: its fencing tokens do not survive \
             one (see \"The tokens live in that store\" in the README); use a data dir on a disk"
        );
    }
}

/// The kind of file system holding `dir` when it is kept in memory.
#[cfg(target_os = "linux")]
pub fn volatile_fs(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;

    /// linux/magic.h; libc has no constant for it.
    const RAMFS_MAGIC: i128 = 0x8584_58f6;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` has room for the `statfs` it writes.
    if unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: `statfs` returned 0, so it filled `st`.
    let kind = i128::from(unsafe { st.assume_init() }.f_type);
    if kind == i128::from(libc::TMPFS_MAGIC) {
        Some("tmpfs")
    } else if kind == RAMFS_MAGIC {
        Some("ramfs")
    } else {
        None
    }
}

#[cfg(not(target_os = "linux"))]
pub fn volatile_fs(_dir: &Path) -> Option<&'static str> {
    None
}
