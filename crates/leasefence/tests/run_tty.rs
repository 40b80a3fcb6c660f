//! `leasefence run` on a terminal, driven through a pseudo-terminal: a child
//! that reads the terminal gets its input (it runs as the terminal's
//! foreground job, not as a background job stopped by SIGTTIN), the terminal
//! is handed back when it ends, and Ctrl-C stops the child and releases the
//! lease.
//!
//! Each test starts `sh -c '… leasefence run … ; …'` as the leader of a new
//! session whose controlling terminal is the pty, as a login shell would be.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{BIN, Coordinator, cli};

/// How long to wait for what should appear on the terminal.
const LIMIT: Duration = Duration::from_secs(15);

/// The master side of a pty with a session leader on its slave side.
struct Terminal {
    master: File,
    output: mpsc::Receiver<Vec<u8>>,
    seen: String,
    leader: Child,
}

impl Terminal {
    /// Opens a pty and starts `sh -c script` as a session leader on it.
    fn start(script: &str, envs: &[(&str, &str)]) -> Terminal {
        let (mut master_fd, mut slave_fd) = (-1, -1);
        // SAFETY: openpty writes two descriptors into the given ints; the
        // name, termios and winsize arguments may be null.
        let rc = unsafe {
            libc::openpty(
                &mut master_fd,
                &mut slave_fd,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty succeeded: both are open descriptors owned by us alone.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master_fd), OwnedFd::from_raw_fd(slave_fd)) };
        let stdio = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup the pty slave"));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script])
            .envs(envs.iter().copied())
            .env("LEASEFENCE_LOG", "warn")
            .stdin(stdio(&slave))
            .stdout(stdio(&slave))
            .stderr(stdio(&slave));
        // SAFETY: setsid and ioctl are async-signal-safe; they make the child
        // a session leader whose controlling terminal is its stdin, the slave.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let leader = cmd.spawn().expect("spawn the session leader");
        drop(slave);
        let master = File::from(master);
        let mut reader = master.try_clone().expect("dup the pty master");
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once every slave descriptor is closed: the session is over.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            master,
            output,
            seen: String::new(),
            leader,
        }
    }

    fn type_in(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("write to the pty");
    }

    /// Waits until the terminal has shown `text`; panics with what it showed.
    fn expect(&mut self, text: &str) {
        let start = Instant::now();
        while !self.seen.contains(text) {
            let left = LIMIT.saturating_sub(start.elapsed());
            match self.output.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!(
                    "the terminal did not show {text:?} within {LIMIT:?}; it showed {:?}",
                    self.seen
                ),
            }
        }
    }

    /// The terminal's foreground process group.
    fn foreground(&self) -> i32 {
        // SAFETY: tcgetpgrp only reads; on a pty master Linux reports the
        // slave's foreground group.
        unsafe { libc::tcgetpgrp(self.master.as_raw_fd()) }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.leader.kill();
        let _ = self.leader.wait();
    }
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LIMIT, "{what} did not happen within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_child_that_reads_the_terminal_gets_its_input_and_the_terminal_comes_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    // After `run`, the shell reads the terminal itself: it can only if `run`
    // gave the terminal back to the shell's process group.
    let script = r#""$LF" run tty/read --ttl 5s --server "$URL" -- sh -c 'read x; echo "got $x"'
echo "run exited $?"
read y; echo "shell got $y""#;
    let mut t = Terminal::start(script, &[("LF", BIN), ("URL", &c.url)]);
    t.type_in(b"hello\n");
    t.expect("got hello");
    t.expect("run exited 0");
    t.type_in(b"world\n");
    t.expect("shell got world");
    let (code, out, _) = cli(&["status", "tty/read", "--server", &c.url]);
    assert_eq!(code, 0);
    assert!(out.contains("not held"), "released after the child ended: {out}");
}

#[test]
fn ctrl_c_stops_a_child_waiting_on_the_terminal_and_releases_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Coordinator::start(dir.path(), &[]);
    let pidfile = dir.path().join("pid");
    let script = r#""$LF" run tty/intr --ttl 30s --server "$URL" -- sh -c 'echo $$ > "$PIDFILE.tmp"; mv "$PIDFILE.tmp" "$PIDFILE"; read x; echo "child got $x"'
echo "run exited $?""#;
    let pidfile_s = pidfile.display().to_string();
    let mut t = Terminal::start(script, &[("LF", BIN), ("URL", &c.url), ("PIDFILE", &pidfile_s)]);
    wait_until("the child's pid file", || pidfile.exists());
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    // Ctrl-C goes to the terminal's foreground group: once that is the
    // child's, it reaches the child however `run` treats it.
    wait_until("the child's group in the foreground", || t.foreground() == pid);
    let (code, _, err) = cli(&["acquire", "tty/intr", "--ttl", "1s", "--server", &c.url]);
    assert_eq!(code, 3, "held while the child runs: {err}");
    t.type_in(b"\x03");
    t.expect("run exited 130");
    assert!(
        !t.seen.contains("child got"),
        "the child was stopped, not fed: {:?}",
        t.seen
    );
    assert!(!alive(pid), "the child is gone");
    let (code, out, err) = cli(&["acquire", "tty/intr", "--ttl", "1s", "--server", &c.url]);
    assert_eq!(code, 0, "released at once after Ctrl-C: {out} {err}");
}
