//! A tmpfs of a given size, for tests of a full disk. Mounting needs root:
//! without it a test says it skipped, and under `CI=true` it fails instead.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for a test, unmounted on drop.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// [`Tmpfs::mount`], or `None` after printing why the test skips
    /// (a panic under `CI=true`).
    pub fn mount_or_skip(dir: &Path, size: &str) -> Option<Tmpfs> {
        match Tmpfs::mount(dir, size) {
            Ok(fs) => Some(fs),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("cannot mount a tmpfs under CI: {e}"),
            Err(e) => {
                eprintln!("skipped: cannot mount a tmpfs (needs root): {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
