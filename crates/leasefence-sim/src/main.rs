//! `leasefence-sim`: run seeds of the deterministic simulation, replay one, or
//! run the stateright model check.
//!
//! The last line of a seed run is always `N seeds, V violations`. With fencing
//! on, the exit status is 0 iff V == 0; with `--no-fencing` (the control, where
//! the arbiter accepts everything) it is 0 iff V > 0, because a control that
//! finds nothing proves the faults do not bite.
//!
//! `--leadership` runs 2–3 coordinators over one shared store instead, with
//! paused, partitioned and crashing leaders; `--no-epoch-fencing` is its
//! control (writes not conditional on the writer's epoch), which, like
//! `--no-fencing`, exits 0 iff the checker finds violations.

use std::process::ExitCode;
use std::time::Instant;

use clap::{ArgGroup, Parser};
use leasefence_sim::{Fencing, Options, RunReport, Violation, model, run_with};

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
    #[arg(long, conflicts_with = "leadership")]
    no_fencing: bool,
    /// Several coordinators over one shared store, one leading at a time.
    #[arg(long)]
    leadership: bool,
    /// Control of a leadership run: a deposed leader's writes land; violations are expected.
    #[arg(long, requires = "leadership")]
    no_epoch_fencing: bool,
    /// Run the stateright model (with and without fencing) instead of seeds.
    #[arg(long, conflicts_with_all = ["seeds", "seed", "no_fencing", "leadership"])]
    model: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.model {
        return run_model();
    }
    let fencing = if cli.no_fencing { Fencing::Off } else { Fencing::Strict };
    let options = if cli.leadership {
        Options::leadership(!cli.no_epoch_fencing)
    } else {
        Options::new(fencing)
    };
    let control = cli.no_fencing || cli.no_epoch_fencing;
    let (first, count, replay) = match (cli.seed, cli.seeds) {
        (Some(s), _) => (s, 1, true),
        (None, Some(n)) => (0, n, false),
        (None, None) => unreachable!("clap requires --seeds, --seed or --model"),
    };
    let started = Instant::now();
    let mut violations = 0u64;
    let mut failing = 0u64;
    // Per kind of violation: how many seeds had it.
    let mut kinds: std::collections::BTreeMap<&'static str, u64> = std::collections::BTreeMap::new();
    for seed in first..first.saturating_add(count) {
        let report = run_with(seed, options);
        if replay {
            print_replay(&report);
        }
        if !report.violations.is_empty() {
            failing += 1;
            violations += u64::try_from(report.violations.len()).unwrap_or(u64::MAX);
            let mut seen: Vec<&'static str> = report.violations.iter().map(kind).collect();
            seen.sort_unstable();
            seen.dedup();
            for k in seen {
                *kinds.entry(k).or_default() += 1;
            }
            print_failing(&report);
        }
    }
    let mode = match (cli.leadership, cli.no_epoch_fencing, fencing) {
        (true, true, _) => "leadership, epoch fencing OFF (control)",
        (true, false, _) => "leadership, epoch fencing on",
        (false, _, Fencing::Off) => "fencing OFF (control)",
        (false, _, Fencing::Strict) => "fencing on (strict)",
    };
    println!(
        "{mode}: {failing} failing seeds in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    if !kinds.is_empty() {
        let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("seeds per kind of violation: {}", list.join(", "));
    }
    if control {
        let verdict = if violations > 0 {
            "as expected"
        } else {
            "UNEXPECTED: the control found nothing"
        };
        let what = if cli.no_epoch_fencing {
            "the deposed leaders' unfenced writes"
        } else {
            "the unfenced arbiter"
        };
        println!("control: {what} must be caught; {verdict}");
    }
    println!("{count} seeds, {violations} violations");
    let ok = if control { violations > 0 } else { violations == 0 };
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// A short name for the kind of a violation, for the per-kind summary.
fn kind(v: &Violation) -> &'static str {
    match v {
        Violation::StaleEffect { .. } => "stale effect",
        Violation::TokenAdmittedTwice { .. } => "token admitted twice",
        Violation::TokenReused { .. } => "token reused",
        Violation::TokenLowered { .. } => "token lowered",
        Violation::UnknownToken { .. } => "unknown token",
        Violation::LeasesOverlap { .. } => "leases overlap",
        Violation::GrantLost { .. } => "grant lost",
        Violation::LiveLeaseEnded { .. } => "live lease ended",
        Violation::DeposedAnswered { .. } => "deposed answered",
        Violation::StoreRefused(_) => "store refused",
        Violation::NoProgress { .. } => "no progress",
    }
}

fn print_failing(r: &RunReport) {
    let first = r.violations.first().map(ToString::to_string).unwrap_or_default();
    let flags = match r.options.leadership {
        Some(l) if !l.epoch_fencing => " --leadership --no-epoch-fencing",
        Some(_) => " --leadership",
        None if r.fencing == Fencing::Off => " --no-fencing",
        None => "",
    };
    println!(
        "seed {}: {} violations (first: {first}); replay: --seed {}{flags}",
        r.seed,
        r.violations.len(),
        r.seed,
    );
}

fn print_replay(r: &RunReport) {
    let t = &r.trace;
    println!(
        "seed {}: {} clients, {} resources, ttl {} ms, heal at {} ms, end {} ms, {} scheduled faults, {} events",
        r.seed, t.clients, t.resources, t.ttl_ms, t.heal_at_ms, t.end_ms, t.faults, t.events
    );
    println!("  network: {:?}", t.net);
    if let Some(lt) = t.leader_ttl_ms {
        println!("  leader ttl {lt} ms; store: {:?}", t.store);
        for (i, p) in t.peers.iter().enumerate() {
            println!("  coordinator {i}: {p:?}");
        }
    } else {
        println!("  coordinator: {:?}", t.coordinator);
    }
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
    for (at_ms, line) in &r.history.notes {
        println!("  t={at_ms:>7} {line}");
    }
    if r.violations.is_empty() {
        return;
    }
    for v in &r.violations {
        println!("  violation: {v}");
    }
    for g in &r.history.grants {
        println!(
            "  grant  t={:>7} {}#{} -> client {} (incarnation {}, valid until {})",
            g.at_ms, g.resource, g.token, g.client, g.incarnation, g.valid_until_ms
        );
    }
    for n in &r.history.renewals {
        println!(
            "  renew  t={:>7} {}#{} -> client {} (incarnation {}, valid until {})",
            n.at_ms, n.resource, n.token, n.client, n.incarnation, n.valid_until_ms
        );
    }
    for l in &r.history.releases {
        println!(
            "  release t={:>6} {}#{} by client {}",
            l.at_ms, l.resource, l.token, l.client
        );
    }
    for l in &r.history.loads {
        let records: Vec<String> = l
            .records
            .iter()
            .map(|x| format!("{}#{}{}", x.resource, x.last_token, if x.held { " held" } else { "" }))
            .collect();
        println!(
            "  load   t={:>7} incarnation {}: {}",
            l.at_ms,
            l.incarnation,
            records.join(", ")
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
