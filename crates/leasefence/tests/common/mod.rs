//! Helpers shared by the integration tests: start the real `leasefence`
//! binary as a child process and learn its port.

#![allow(dead_code)]

pub mod gateway;
pub mod ha;
pub mod prom;
pub mod schema;
pub mod scratch;
pub mod tmpfs;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_leasefence");

/// A running `leasefence serve` child; killed (SIGKILL) on drop.
pub struct Coordinator {
    pub child: Child,
    pub url: String,
}

impl Coordinator {
    /// Starts `leasefence serve` on a free loopback port over `data_dir`.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Coordinator {
        let (child, addr, _) = spawn_listening("serve", data_dir, extra, "leasefence listening on ");
        Coordinator {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `leasefence COMMAND --listen 127.0.0.1:0 --data-dir DIR EXTRA…` and
/// reads its first line, `PREFIX ADDR …`; returns the child, ADDR and the line.
pub fn spawn_listening(command: &str, data_dir: &Path, extra: &[&str], prefix: &str) -> (Child, String, String) {
    spawn_listening_to(command, data_dir, extra, prefix, Stdio::inherit())
}

/// Like [`spawn_listening`], with the child's warnings piped for the test to
/// read with [`Logged::logs`].
pub fn spawn_listening_logged(command: &str, data_dir: &Path, extra: &[&str], prefix: &str) -> (Logged, String) {
    let (child, addr, _) = spawn_listening_to(command, data_dir, extra, prefix, Stdio::piped());
    (Logged(child), addr)
}

/// A child whose logs a test reads; killed (SIGKILL) on drop, so a failed
/// assertion does not leave it running.
pub struct Logged(Child);

impl Logged {
    /// Kills the child and returns all it logged.
    pub fn logs(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut logs = String::new();
        if let Some(mut stderr) = self.0.stderr.take() {
            std::io::Read::read_to_string(&mut stderr, &mut logs).expect("read the child's logs");
        }
        logs
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_listening_to(
    command: &str,
    data_dir: &Path,
    extra: &[&str],
    prefix: &str,
    stderr: Stdio,
) -> (Child, String, String) {
    let mut child = Command::new(BIN)
        .args([command, "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("LEASEFENCE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn leasefence {command}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .strip_prefix(prefix)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line from {command}: {line:?}"))
        .to_string();
    (child, addr, line)
}

/// Runs the CLI with `args`; returns (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run leasefence");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends SIGTERM to `child`, a process this test started and still owns.
pub fn sigterm(child: &Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: signals a child of this test that it has not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill(SIGTERM)");
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A coordinator served from this test process (real sockets, temp store);
/// it stops when dropped.
pub struct InProcess {
    pub url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// Starts a coordinator in this process on a free loopback port.
pub async fn in_process() -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = "127.0.0.1:0".parse().expect("addr");
    let config = leasefence_server::ServerConfig::new(addr, dir.path().to_path_buf());
    let server = leasefence_server::Server::bind(config).await.expect("bind");
    let url = format!("http://{}", server.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    InProcess {
        url,
        _stop: tx,
        _dir: dir,
    }
}
