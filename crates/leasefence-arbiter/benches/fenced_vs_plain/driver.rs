//! The shared driver: run N operations across C clients, time them, and keep
//! a tally per case for the side-by-side summary.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tokio::runtime::Runtime;

/// One client: its own connection and keys, moved into its task and back.
pub trait Worker: Send + 'static {
    fn op(&mut self, fenced: bool) -> impl Future<Output = ()> + Send;
}

/// Runs `iters` operations split across `workers` (one task each) and returns
/// the wall time from the first spawn to the last completion.
pub fn run<W: Worker>(rt: &Runtime, workers: &mut Vec<W>, fenced: bool, iters: u64) -> Duration {
    let clients = workers.len() as u64;
    let taken = std::mem::take(workers);
    let (elapsed, back) = rt.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = taken
            .into_iter()
            .enumerate()
            .map(|(i, mut w)| {
                let n = iters / clients + u64::from((i as u64) < iters % clients);
                tokio::spawn(async move {
                    for _ in 0..n {
                        w.op(fenced).await;
                    }
                    w
                })
            })
            .collect();
        let mut back = Vec::with_capacity(tasks.len());
        for t in tasks {
            back.push(t.await.expect("benchmark task"));
        }
        (start.elapsed(), back)
    });
    *workers = back;
    elapsed
}

/// Benchmarks plain then fenced for one backend at one client count.
pub fn compare<W: Worker>(
    c: &mut Criterion,
    rt: &Runtime,
    backend: &'static str,
    unit: &'static str,
    workers: &mut Vec<W>,
    summary: &mut Summary,
) {
    let clients = workers.len();
    let mut group = c.benchmark_group(format!("{backend}/{clients} clients"));
    group.throughput(Throughput::Elements(1));
    for fenced in [false, true] {
        let name = if fenced { "fenced" } else { "plain" };
        let mut calibration = Tally::default();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t = run(rt, workers, fenced, iters);
                calibration.ops += iters;
                calibration.time += t;
                t
            })
        });
        summary.calibration.insert((backend, clients, fenced), calibration);
    }
    group.finish();
    interleave(rt, backend, unit, workers, summary);
}

/// Alternating rounds of plain and fenced, so load that drifts during the run
/// (a shared machine) hits both sides alike; these rounds feed the summary.
fn interleave<W: Worker>(
    rt: &Runtime,
    backend: &'static str,
    unit: &'static str,
    workers: &mut Vec<W>,
    summary: &mut Summary,
) {
    let clients = workers.len();
    for _ in 0..INTERLEAVED_ROUNDS {
        let mut rates = [0.0; 2];
        for fenced in [false, true] {
            let rate = summary
                .calibration
                .get(&(backend, clients, fenced))
                .map_or(100.0, Tally::per_second);
            let ops = ((rate * INTERLEAVED_ROUND.as_secs_f64()) as u64).max(clients as u64);
            let t = run(rt, workers, fenced, ops);
            let tally = summary.rounds.entry((backend, clients, unit, fenced)).or_default();
            tally.ops += ops;
            tally.time += t;
            rates[usize::from(fenced)] = ops as f64 / t.as_secs_f64().max(f64::MIN_POSITIVE);
        }
        summary
            .pair_ratios
            .entry((backend, clients, unit))
            .or_default()
            .push(rates[1] / rates[0]);
    }
}

#[derive(Default)]
pub struct Tally {
    ops: u64,
    time: Duration,
}

impl Tally {
    fn per_second(&self) -> f64 {
        self.ops as f64 / self.time.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// The median of sorted, non-empty `v`.
fn median(v: &[f64]) -> f64 {
    let mid = v.len() / 2;
    match v.len() % 2 {
        1 => v[mid],
        _ => (v[mid - 1] + v[mid]) / 2.0,
    }
}

/// Alternating plain/fenced rounds after each criterion group.
const INTERLEAVED_ROUNDS: usize = 10;
/// Target length of one interleaved round.
const INTERLEAVED_ROUND: Duration = Duration::from_millis(400);

#[derive(Default)]
pub struct Summary {
    /// (backend, clients, fenced) -> the criterion run, to size the rounds.
    calibration: BTreeMap<(&'static str, usize, bool), Tally>,
    /// (backend, clients, unit, fenced) -> the interleaved rounds.
    rounds: BTreeMap<(&'static str, usize, &'static str, bool), Tally>,
    /// (backend, clients, unit) -> fenced/plain of each interleaved pair, to
    /// show how much the ratio moves within one run.
    pair_ratios: BTreeMap<(&'static str, usize, &'static str), Vec<f64>>,
}

impl Summary {
    pub fn print(&self) {
        println!("\nfenced vs plain ({INTERLEAVED_ROUNDS} interleaved rounds each):");
        for ((backend, clients, unit, fenced), plain) in &self.rounds {
            if *fenced {
                continue;
            }
            let Some(f) = self.rounds.get(&(*backend, *clients, *unit, true)) else {
                continue;
            };
            let (p, f) = (plain.per_second(), f.per_second());
            let mut pairs = self
                .pair_ratios
                .get(&(*backend, *clients, *unit))
                .cloned()
                .unwrap_or_default();
            pairs.sort_by(f64::total_cmp);
            // The median pair shrugs off one round that a stall outside the
            // bench (autovacuum, a checkpoint) hit; the overall ratio does not.
            let spread = match (pairs.first(), pairs.last()) {
                (Some(lo), Some(hi)) => format!(" (median pair {:.2}, pairs {lo:.2}-{hi:.2})", median(&pairs)),
                _ => String::new(),
            };
            println!(
                "{backend} {clients} clients: plain {p:.0} {unit}/s, fenced {f:.0} {unit}/s, ratio {:.2}{spread}",
                f / p
            );
        }
    }
}
