//! Child processes: finding and starting the real `leasefence serve`, sending
//! signals, and reading `/proc` to see whether a child has stopped. Every
//! wait here is bounded, and every child is killed when its handle drops
//! (`kill_on_drop`), on success and on failure alike.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// How long `serve` may take to print its listening line.
const START_LIMIT: Duration = Duration::from_secs(10);

/// The `leasefence` binary: `--bin`, else the one next to this executable.
pub fn coordinator_bin(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match explicit {
        Some(p) => p,
        None => std::env::current_exe()
            .context("cannot find the current executable")?
            .with_file_name("leasefence"),
    };
    if !bin.is_file() {
        bail!(
            "the leasefence binary is missing at {} (build it with `cargo build --release -p leasefence`, or pass --bin PATH)",
            bin.display()
        );
    }
    Ok(bin)
}

/// Lines a coordinator wrote to stderr.
pub type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A running `leasefence serve` on a loopback port; SIGKILLed on drop.
pub struct Coordinator {
    child: Child,
    /// Kept open: closing it would make a later write by `serve` fail.
    _stdout: BufReader<ChildStdout>,
    pub url: String,
}

impl Coordinator {
    /// Starts `serve --listen 127.0.0.1:0 --data-dir DIR` and reads its port
    /// from the line `leasefence listening on ADDR …`.
    pub async fn start(bin: &Path, data_dir: &Path) -> anyhow::Result<Coordinator> {
        let mut args = vec!["--listen".into(), "127.0.0.1:0".into(), "--data-dir".into()];
        args.push(data_dir.as_os_str().to_owned());
        Coordinator::start_with(bin, &args, None).await
    }

    /// Starts `serve ARGS…` and reads its address from its first line. Its
    /// error log goes to `log` when given (to stderr otherwise).
    pub async fn start_with(bin: &Path, args: &[std::ffi::OsString], log: Option<Log>) -> anyhow::Result<Coordinator> {
        let mut child = Command::new(bin)
            .arg("serve")
            .args(args)
            .env("LEASEFENCE_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if log.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} serve", bin.display()))?;
        if let (Some(log), Some(stderr)) = (log.clone(), child.stderr.take()) {
            // Ends at EOF, when the child is gone.
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        let mut stdout = BufReader::new(child.stdout.take().context("serve's stdout is not piped")?);
        let mut line = String::new();
        tokio::time::timeout(START_LIMIT, stdout.read_line(&mut line))
            .await
            .context("serve did not print its listening line within 10 s")?
            .context("cannot read serve's stdout")?;
        let Some(addr) = line
            .strip_prefix("leasefence listening on ")
            .and_then(|rest| rest.split_whitespace().next())
        else {
            let status = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            let said = match (&log, status) {
                (Some(log), Ok(Ok(status))) => {
                    // Its stderr ends with it: give the reader a moment.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let lines = log.lock().unwrap_or_else(|p| p.into_inner());
                    let tail = lines.iter().rev().take(5).rev().cloned().collect::<Vec<_>>();
                    format!("; it exited ({status}) after writing {tail:?}")
                }
                (None, Ok(Ok(status))) => format!("; it exited ({status})"),
                _ => String::new(),
            };
            bail!("unexpected first line from serve: {line:?}{said}");
        };
        let url = format!("http://{addr}");
        Ok(Coordinator {
            child,
            _stdout: stdout,
            url,
        })
    }

    /// The process id, while the child has not been reaped.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("the coordinator has already been reaped")
    }

    /// SIGKILL, and reap: no shutdown path of the coordinator runs.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.start_kill().context("cannot SIGKILL the coordinator")?;
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .context("the coordinator did not die within 10 s of SIGKILL")?
            .context("cannot reap the coordinator")?;
        Ok(())
    }
}

/// Sends `sig` to the child `pid` (one this program spawned).
pub fn signal(pid: u32, sig: libc::c_int) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
    if pid <= 1 {
        bail!("refusing to signal pid {pid}");
    }
    // SAFETY: kill(2) with a pid of a child we spawned and have not reaped.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`, `Z`, …).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: split after the last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.chars().next()
}

/// Waits (bounded) until `pid` is stopped by a signal (state `T`).
pub async fn wait_stopped(pid: u32, limit: Duration) -> anyhow::Result<()> {
    let poll = async {
        loop {
            match proc_state(pid) {
                Some('T') => return Ok(()),
                Some('Z') | None => bail!("process {pid} exited instead of stopping"),
                Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    };
    tokio::time::timeout(limit, poll)
        .await
        .with_context(|| format!("process {pid} did not stop within {limit:?}"))?
}

/// A small seeded PRNG (xorshift64*) for kill moments and names; the seed
/// comes from the OS.
pub struct Rng(u64);

impl Rng {
    pub fn from_os() -> anyhow::Result<Rng> {
        let seed = getrandom::u64().map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
        Ok(Rng(seed | 1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `lo..=hi` for picking moments.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_not_stopped() {
        let state = proc_state(std::process::id()).expect("own /proc entry");
        assert!(state == 'R' || state == 'S', "state {state}");
    }

    #[test]
    fn between_stays_in_bounds() {
        let mut rng = Rng(42);
        for _ in 0..1000 {
            let x = rng.between(100, 400);
            assert!((100..=400).contains(&x));
        }
    }
}
