//! The `leasefence` command line: the coordinator (`serve`), its client
//! commands, the arbiter tools, the fenced object-store gateway, the demo
//! and the benchmark.
//!
//! Exit codes: 0 ok, 1 unreachable or internal error, 2 invalid input,
//! 3 busy (held by another), 4 lease lost or unknown lease, 5 a check found
//! stale effects accepted or `arbiter put` was rejected as stale, 6 `serve`
//! stopped after a storage failure (restart it: it recovers from disk), 7
//! refused by access control or a limit (no or an unknown token, a verb
//! missing on the resource, another principal's lease). `run`
//! passes its command's code through (128+N if signal N killed it; 126/127
//! when the command cannot be started).

mod arbiter_cmd;
mod auth_cmd;
mod bench;
mod child;
mod cli;
mod client_cmds;
mod demo;
mod elect_cmd;
mod fence_key_cmd;
mod gateway_cmd;
mod observe_cmd;
mod out;
mod run_cmd;
mod serve;
mod serve_config;
mod store_url;
mod tty;
mod volatile;
mod watch_cmd;

use std::io::IsTerminal;
use std::process::ExitCode;

/// jemalloc rather than glibc's malloc. A call's decoded strings are
/// allocated on one runtime thread and often freed on another, and each call
/// allocates 1 KiB or more (its boxed handler future, tonic's codec buffers),
/// which makes glibc consolidate its fast bins: glibc's malloc and free were
/// about 15% of a busy coordinator's CPU samples. Interleaved on the
/// machine of run M (docs/performance-notes.md), jemalloc gave 1.24× the
/// cycles/s at one client, 1.20× at 16 and 1.08× at 64 (medians of six
/// pairs), at about 10 B more per idle resource and a tenth more restart
/// time at a million.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    pub const INTERNAL: u8 = 1;
    pub const INVALID: u8 = 2;
    pub const BUSY: u8 = 3;
    pub const LOST: u8 = 4;
    pub const CHECK_FAILED: u8 = 5;
    pub const FATAL: u8 = 6;
    pub const REFUSED: u8 = 7;

    pub fn new(code: u8, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code,
            error: error.into(),
        }
    }

    pub fn invalid(msg: impl std::fmt::Display) -> Failure {
        Failure::new(Failure::INVALID, anyhow::anyhow!("{msg}"))
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(Failure::INTERNAL, e)
    }
}

pub type CmdResult = Result<(), Failure>;

fn main() -> ExitCode {
    let matches = <cli::Cli as clap::CommandFactory>::command().get_matches();
    let mut args = match <cli::Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.format(&mut <cli::Cli as clap::CommandFactory>::command()).exit(),
    };
    // `serve --config FILE`: before the logs start, which it may configure.
    if let (cli::Command::Serve(a), Some(m)) = (&mut args.command, matches.subcommand_matches("serve"))
        && let Err(f) = serve_config::apply(a, m)
    {
        eprintln!("error: {}", report(&f.error));
        return ExitCode::from(f.code);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEFENCE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(args.default_log_level()));
    // Colour codes only for a terminal: in a file or a log collector they are noise.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match args.log_format() {
        cli::LogFormat::Text => logs.init(),
        cli::LogFormat::Json => logs.json().init(),
    }
    // One crypto provider for every rustls user in the process, chosen
    // before any is built (a second provider compiled in would otherwise
    // make rustls refuse to pick).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(Failure::INTERNAL);
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", report(&f.error));
            ExitCode::from(f.code)
        }
    }
}

/// An error and its causes on one line, each said once. Many errors (ours
/// with a `{0}` message over a `#[from]` field, and some of our
/// dependencies') both include their cause in their message and return it as
/// their source, so printing every link of the chain, as `{:#}` does, would
/// repeat it: a cause whose message the link before it already includes is
/// left out.
fn report(error: &anyhow::Error) -> String {
    let mut out = error.to_string();
    let mut before = out.clone();
    for cause in error.chain().skip(1) {
        let said = cause.to_string();
        if !before.contains(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        before = said;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::report;

    #[derive(Debug, thiserror::Error)]
    #[error("disk on fire")]
    struct Root;

    /// Says its cause and returns it as its source, as `#[error("…: {0}")]`
    /// over a `#[from]` field does.
    #[derive(Debug, thiserror::Error)]
    #[error("embedded store: {0}")]
    struct SaysItsCause(#[from] Root);

    /// Returns its cause without saying it.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the store")]
    struct Quiet(#[source] SaysItsCause);

    #[test]
    fn a_cause_the_message_already_says_is_said_once() {
        let e = anyhow::Error::from(SaysItsCause(Root));
        assert_eq!(format!("{e:#}"), "embedded store: disk on fire: disk on fire");
        assert_eq!(report(&e), "embedded store: disk on fire");
    }

    #[test]
    fn a_cause_the_message_does_not_say_is_added() {
        let e = anyhow::Error::from(Quiet(SaysItsCause(Root)));
        assert_eq!(report(&e), "cannot open the store: embedded store: disk on fire");
        let context = anyhow::Error::from(Root).context("starting the gateway");
        assert_eq!(report(&context), "starting the gateway: disk on fire");
    }
}
