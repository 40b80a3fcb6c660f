//! The child of `run`/`elect` on a terminal, and its death with `run`.
//!
//! The child runs in its own process group (so that everything it starts can
//! be stopped together). On a terminal that group would be a background job:
//! reading the terminal would stop it with SIGTTIN, and Ctrl-C would reach
//! `run` only. So when `run` is the terminal's foreground job, the child's
//! group becomes the terminal's foreground group for as long as it runs, and
//! the terminal is handed back to `run`'s group afterwards. Ctrl-C then goes
//! to the child; when it ends, `run` releases the lease as after any exit.
//!
//! Every child also gets `PR_SET_PDEATHSIG(SIGKILL)`: if `run` itself is
//! killed (SIGKILL, OOM), the kernel kills the child rather than leave it
//! running without a lease. The signal fires when the *thread* that forked
//! the child exits. `run` spawns from the future its runtime's `block_on`
//! drives, that is on the main thread, and the runtime's worker threads also
//! live as long as the process; only the blocking pool's threads come and go,
//! and nothing spawns a child there. So the fork's thread ends with `run`.

use std::io;

use tokio::process::Command;

/// `run` holds the terminal's foreground for its child; dropping it hands
/// the terminal back and stops ignoring SIGTTOU.
pub struct Foreground {
    old_ttou: libc::sighandler_t,
}

impl Foreground {
    /// If stdin is `run`'s controlling terminal and `run`'s group is its
    /// foreground group, prepares to hand the terminal to the child's group.
    /// `None` otherwise (not a terminal, or `run` is a background job: then
    /// the child is one too, as it should be).
    pub fn claim() -> Option<Foreground> {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read process state.
        let foreground = unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() };
        if !foreground {
            return None;
        }
        // While the child's group has the terminal, `run` is in the
        // background: SIGTTOU would stop it when it writes to the terminal
        // (with `stty tostop`) or takes the terminal back. Ignored, neither
        // can stop the supervisor. The child starts with the default again.
        // SAFETY: sets a disposition; SIG_IGN runs no code in `run`.
        let old_ttou = unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
        Some(Foreground { old_ttou })
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        // SAFETY: tcsetpgrp on fd 0 (our controlling terminal, checked in
        // `claim`) to our own group; SIGTTOU is still ignored, so the call
        // cannot stop us. Then the old disposition comes back.
        unsafe {
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, self.old_ttou);
        }
    }
}

/// Makes `cmd` die with `run` (PDEATHSIG) and, with `foreground`, take the
/// terminal for its own process group before it execs.
pub fn prepare(cmd: &mut Command, foreground: Option<&Foreground>) {
    // SAFETY: getpid only reads.
    let parent = unsafe { libc::getpid() };
    let take_terminal = foreground.is_some();
    // SAFETY: the closure runs between fork and exec; `in_child` makes only
    // async-signal-safe calls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || in_child(parent, take_terminal));
    }
}

/// Runs in the forked child, after `process_group(0)` made it a group leader.
fn in_child(parent: libc::pid_t, take_terminal: bool) -> io::Result<()> {
    // SAFETY: prctl, getppid, getpid, tcsetpgrp and signal are
    // async-signal-safe; none touches memory of ours.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // `run` died between the fork and the prctl: nobody would stop us.
        if libc::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if take_terminal {
            // SIGTTOU is ignored (inherited from `run`), so a group not yet
            // in the foreground may take the terminal. A failure leaves the
            // child a background job, which still runs.
            libc::tcsetpgrp(0, libc::getpid());
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
        }
    }
    Ok(())
}
