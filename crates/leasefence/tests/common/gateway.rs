//! Start the real `leasefence gateway` as a child process and learn its port.

use std::path::Path;
use std::process::Child;

use super::spawn_listening;

/// A running `leasefence gateway` child; killed (SIGKILL) on drop.
pub struct GatewayProc {
    pub child: Child,
    pub url: String,
    /// The first line it printed (the listening line, with what it swept).
    pub banner: String,
}

impl GatewayProc {
    /// Starts `leasefence gateway` on a free loopback port over `data_dir`.
    pub fn start(data_dir: &Path, extra: &[&str]) -> GatewayProc {
        let (child, addr, banner) = spawn_listening("gateway", data_dir, extra, "leasefence gateway listening on ");
        GatewayProc {
            child,
            url: format!("http://{addr}"),
            banner,
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
