//! How far `leasefence bench` has got: a progress bar on a terminal, one
//! plain line per finished segment otherwise (a log, a pipe, CI). With
//! `--json` it all goes to stderr, so that stdout holds the JSON alone.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Target;
use super::stats::Sample;

pub struct Progress {
    bar: Option<ProgressBar>,
    to_stderr: bool,
}

impl Progress {
    /// `segments` to run in all; `to_stderr` for `--json`.
    pub fn new(segments: u64, to_stderr: bool) -> Progress {
        let terminal = if to_stderr {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        let bar = terminal.then(|| {
            let target = if to_stderr {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::stdout()
            };
            let bar = ProgressBar::with_draw_target(Some(segments), target);
            let style = ProgressStyle::with_template("{bar:30} {pos}/{len} segments, {elapsed} of ~{duration}  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress { bar, to_stderr }
    }

    /// A line above the bar (or a plain line).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None if self.to_stderr => eprintln!("{text}"),
            // A stdout that cannot be written to fails the run's report
            // at the end; a progress line is not worth stopping for.
            None => {
                let _ = crate::out::line(format_args!("{text}"));
            }
        }
    }

    pub fn start(&self, round: u32, rounds: u32, target: Target, clients: usize) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!(
                "round {round}/{rounds}: {} at {clients} clients",
                target.name()
            ));
        }
    }

    pub fn done(&self, round: u32, rounds: u32, target: Target, clients: usize, s: &Sample) {
        self.line(&format!(
            "round {round}/{rounds} {:<10} {clients:>4} clients: {:>9.0} cycles/s  p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  errors {}",
            target.name(),
            s.ops_per_s,
            s.p50_ms,
            s.p99_ms,
            s.p999_ms,
            s.errors
        ));
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
