//! `leasefence-sim`: run seeds of the deterministic simulation, replay one, or
//! run the stateright model check.
//!
//! The last line of a seed run is always `N seeds, V violations`. With fencing
//! on, the exit status is 0 iff V == 0; with `--no-fencing` (the control, where
//! the arbiter accepts everything) it is 0 iff V > 0, because a control that
//! finds nothing proves the faults do not bite.

use std::process::ExitCode;
use std::time::Instant;

use clap::{ArgGroup, Parser};
use leasefence_sim::{Fencing, RunReport, model, run};

/// Deterministic simulation of leasefence (real core machine and arbiter rule).
#[derive(Debug, Parser)]
#[command(name = "leasefence-sim", version)]
#[command(group(ArgGroup::new("what").required(true).args(["seeds", "seed", "model"])))]
struct Cli {
    /// Run seeds 0..N and print one line per failing seed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    seeds: Option<u64>,
    /// Replay seed S exactly, printing its trace summary (and history on failure).
    #[arg(long, value_name = "S", conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Control run: the arbiter accepts every effect; violations are expected.
    #[arg(long)]
    no_fencing: bool,
    /// Run the stateright model (with and without fencing) instead of seeds.
    #[arg(long, conflicts_with_all = ["seeds", "seed", "no_fencing"])]
    model: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.model {
        return run_model();
    }
    let fencing = if cli.no_fencing { Fencing::Off } else { Fencing::Strict };
    let (first, count, replay) = match (cli.seed, cli.seeds) {
        (Some(s), _) => (s, 1, true),
        (None, Some(n)) => (0, n, false),
        (None, None) => unreachable!("clap requires --seeds, --seed or --model"),
    };
    let started = Instant::now();
    let mut violations = 0u64;
    let mut failing = 0u64;
    for seed in first..first.saturating_add(count) {
        let report = run(seed, fencing);
        if replay {
            print_replay(&report);
        }
        if !report.violations.is_empty() {
            failing += 1;
            violations += u64::try_from(report.violations.len()).unwrap_or(u64::MAX);
            print_failing(&report);
        }
    }
    let mode = if fencing == Fencing::Off {
        "fencing OFF (control)"
    } else {
        "fencing on (strict)"
    };
    println!(
        "{mode}: {failing} failing seeds in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    if fencing == Fencing::Off {
        let verdict = if violations > 0 {
            "as expected"
        } else {
            "UNEXPECTED: the control found nothing"
        };
        println!("control: the unfenced arbiter must be caught; {verdict}");
    }
    println!("{count} seeds, {violations} violations");
    let ok = match fencing {
        Fencing::Strict => violations == 0,
        Fencing::Off => violations > 0,
    };
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn print_failing(r: &RunReport) {
    let first = r.violations.first().map(ToString::to_string).unwrap_or_default();
    println!(
        "seed {}: {} violations (first: {first}); replay: --seed {}{}",
        r.seed,
        r.violations.len(),
        r.seed,
        if r.fencing == Fencing::Off { " --no-fencing" } else { "" }
    );
}

fn print_replay(r: &RunReport) {
    let t = &r.trace;
    println!(
        "seed {}: {} clients, {} resources, ttl {} ms, heal at {} ms, end {} ms, {} scheduled faults, {} events",
        r.seed, t.clients, t.resources, t.ttl_ms, t.heal_at_ms, t.end_ms, t.faults, t.events
    );
    println!("  network: {:?}", t.net);
    println!("  coordinator: {:?}", t.coordinator);
    println!("  arbiter rejected {} stale effects", t.arbiter_rejected);
    for (i, c) in t.client_stats.iter().enumerate() {
        println!("  client {i}: {c:?}");
    }
    println!(
        "  history: {} answered grants, {} admitted effects, digest {:016x}",
        r.history.grants.len(),
        r.history.admitted.len(),
        r.digest
    );
    if r.violations.is_empty() {
        return;
    }
    for v in &r.violations {
        println!("  violation: {v}");
    }
    for g in &r.history.grants {
        println!(
            "  grant  t={:>7} {}#{} -> client {} (incarnation {})",
            g.at_ms, g.resource, g.token, g.client, g.incarnation
        );
    }
    for e in &r.history.admitted {
        println!(
            "  effect t={:>7} {}#{} from client {}",
            e.at_ms, e.resource, e.token, e.client
        );
    }
}

fn run_model() -> ExitCode {
    let started = Instant::now();
    let fenced = model::check(true);
    println!(
        "model with fencing: {} states explored, {} unique; violations: {}",
        fenced.states,
        fenced.unique_states,
        fenced.describe_failures()
    );
    let unfenced = model::check(false);
    println!(
        "model without fencing: {} states explored, {} unique; counter-examples: {}",
        unfenced.states,
        unfenced.unique_states,
        unfenced.describe_failures()
    );
    println!("model check took {:.2} s", started.elapsed().as_secs_f64());
    let ok = fenced.passed() && unfenced.stale_effect_found;
    println!("model: {}", if ok { "ok" } else { "FAILED" });
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
