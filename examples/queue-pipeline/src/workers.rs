//! The worker processes, seen from the driver: this binary started again as
//! `queue-pipeline worker …`, its stdout read line by line, its stdin the
//! go signal, SIGSTOP and SIGCONT sent by pid. Every wait is bounded, and a
//! worker is SIGKILLed when its handle drops (stopped or not), so a failed
//! run leaves no process behind.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long a worker may take to print its next line.
const LINE_LIMIT: Duration = Duration::from_secs(30);

/// What every worker of a run is told.
pub struct Plan<'a> {
    pub coordinator: &'a str,
    pub nats: &'a str,
    pub subject: &'a str,
    pub resource: &'a str,
    pub run_id: &'a str,
    pub jobs: u32,
    pub ttl: Duration,
    pub wait: Duration,
}

pub struct Worker {
    pub name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    pub fn spawn(name: &str, plan: &Plan<'_>) -> anyhow::Result<Worker> {
        let exe = std::env::current_exe().context("cannot find this executable to start a worker")?;
        let mut child = Command::new(exe)
            .arg("worker")
            .args(["--coordinator", plan.coordinator, "--nats", plan.nats])
            .args(["--subject", plan.subject, "--resource", plan.resource])
            .args(["--holder", name, "--run-id", plan.run_id])
            .args(["--jobs", &plan.jobs.to_string()])
            .args(["--ttl-ms", &plan.ttl.as_millis().to_string()])
            .args(["--wait-ms", &plan.wait.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("{name} has no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("{name} has no stdout"))?;
        Ok(Worker {
            name: name.to_owned(),
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        })
    }

    /// The next line the worker prints, which must start with `prefix`.
    async fn line(&mut self, prefix: &str) -> anyhow::Result<String> {
        let name = &self.name;
        let line = tokio::time::timeout(LINE_LIMIT, self.stdout.next_line())
            .await
            .map_err(|_| anyhow!("{name} printed nothing for {} s", LINE_LIMIT.as_secs()))?
            .with_context(|| format!("reading {name}'s output"))?;
        match line {
            Some(line) if line.starts_with(prefix) => Ok(line),
            Some(line) => bail!("{name} printed {line:?}, expected a line starting with {prefix:?}"),
            None => {
                let status = self.child.wait().await.with_context(|| format!("waiting for {name}"))?;
                bail!("{name} exited ({status}) before printing {prefix:?}")
            }
        }
    }

    /// Waits for the grant line and returns its token.
    pub async fn granted(&mut self) -> anyhow::Result<u64> {
        let line = self.line("granted token=").await?;
        let token = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("token="))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| anyhow!("{} printed a grant without a token: {line:?}", self.name))?;
        Ok(token)
    }

    /// Tells the worker to publish.
    pub async fn go(&mut self) -> anyhow::Result<()> {
        self.stdin
            .write_all(b"go\n")
            .await
            .with_context(|| format!("sending go to {}", self.name))
    }

    /// Waits for the worker to say it published, and to exit 0.
    pub async fn published(&mut self) -> anyhow::Result<String> {
        let line = self.line("published ").await?;
        let status = tokio::time::timeout(LINE_LIMIT, self.child.wait())
            .await
            .map_err(|_| anyhow!("{} did not exit after publishing", self.name))?
            .with_context(|| format!("waiting for {}", self.name))?;
        if !status.success() {
            bail!("{} exited with {status}", self.name);
        }
        Ok(line)
    }

    /// Sends `signal` (SIGSTOP, SIGCONT) to the worker.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
            .ok_or_else(|| anyhow!("{} has already exited", self.name))?;
        kill_process(pid, signal).with_context(|| format!("sending {signal:?} to {}", self.name))
    }
}
