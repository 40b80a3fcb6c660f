//! The figures of `leasefence bench`: one segment's measurement, the medians
//! over rounds per target and client count, the ratios of leasefence to each
//! peer, and how they print (a table, or one JSON object).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::Target;

/// One segment: one target at one client count for one round.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub errors: u64,
}

impl Sample {
    /// `cycles` completed in `secs` seconds, latencies in µs in `hist`.
    pub fn new(cycles: u64, secs: f64, hist: &Histogram<u64>, errors: u64) -> Sample {
        let ms = |q: f64| {
            if hist.is_empty() {
                0.0
            } else {
                hist.value_at_quantile(q) as f64 / 1000.0
            }
        };
        Sample {
            ops_per_s: if secs > 0.0 { cycles as f64 / secs } else { 0.0 },
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            errors,
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// `ours / theirs`, or `None` when `theirs` is not positive (no ratio to show).
pub fn ratio(ours: f64, theirs: f64) -> Option<f64> {
    (theirs > 0.0 && ours.is_finite() && theirs.is_finite()).then(|| ours / theirs)
}

/// One row of the result: medians over rounds of one target at one client count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Run {
    pub target: &'static str,
    pub clients: usize,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Failed cycles over all rounds (a sum, so that no round's failures hide).
    pub errors: u64,
}

/// leasefence against one peer at one client count: ops/s ratio (higher is
/// better for leasefence) and p99 ratio (lower is better).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratio {
    pub clients: usize,
    pub vs: &'static str,
    pub ops_ratio: Option<f64>,
    pub p99_ratio: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub runs: Vec<Run>,
    pub ratios: Vec<Ratio>,
}

/// Every segment's sample, keyed by client count and target.
#[derive(Default)]
pub struct Samples(BTreeMap<(usize, Target), Vec<Sample>>);

impl Samples {
    pub fn add(&mut self, clients: usize, target: Target, s: Sample) {
        self.0.entry((clients, target)).or_default().push(s);
    }

    /// Medians per target and client count, then leasefence's ratio to each peer.
    pub fn report(&self) -> Report {
        let runs: Vec<Run> = self
            .0
            .iter()
            .map(|(&(clients, target), ss)| {
                let med = |f: fn(&Sample) -> f64| median(&ss.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0);
                Run {
                    target: target.name(),
                    clients,
                    ops_per_s: med(|s| s.ops_per_s),
                    p50_ms: med(|s| s.p50_ms),
                    p99_ms: med(|s| s.p99_ms),
                    p999_ms: med(|s| s.p999_ms),
                    errors: ss.iter().map(|s| s.errors).sum(),
                }
            })
            .collect();
        let ratios = runs
            .iter()
            .filter(|r| r.target != Target::Leasefence.name())
            .filter_map(|peer| {
                let ours = runs
                    .iter()
                    .find(|r| r.target == Target::Leasefence.name() && r.clients == peer.clients)?;
                Some(Ratio {
                    clients: peer.clients,
                    vs: peer.target,
                    ops_ratio: ratio(ours.ops_per_s, peer.ops_per_s),
                    p99_ratio: ratio(ours.p99_ms, peer.p99_ms),
                })
            })
            .collect();
        Report { runs, ratios }
    }
}

impl Report {
    /// The human-readable table: medians, then ratios (if any peer ran).
    pub fn table(&self, rounds: u32) -> String {
        let mut out = format!(
            "medians of {rounds} round(s); errors summed over rounds\n{:<11} {:>7} {:>11} {:>8} {:>8} {:>8} {:>7}\n",
            "target", "clients", "cycles/s", "p50 ms", "p99 ms", "p999 ms", "errors"
        );
        for r in &self.runs {
            out += &format!(
                "{:<11} {:>7} {:>11.0} {:>8.3} {:>8.3} {:>8.3} {:>7}\n",
                r.target, r.clients, r.ops_per_s, r.p50_ms, r.p99_ms, r.p999_ms, r.errors
            );
        }
        if !self.ratios.is_empty() {
            out += &format!(
                "\nleasefence / peer\n{:<11} {:>7} {:>11} {:>9}\n",
                "vs", "clients", "cycles/s ×", "p99 ×"
            );
            let show = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{x:.2}"));
            for r in &self.ratios {
                out += &format!(
                    "{:<11} {:>7} {:>11} {:>9}\n",
                    r.vs,
                    r.clients,
                    show(r.ops_ratio),
                    show(r.p99_ratio)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ops: f64, p99: f64, errors: u64) -> Sample {
        Sample {
            ops_per_s: ops,
            p50_ms: p99 / 2.0,
            p99_ms: p99,
            p999_ms: p99 * 2.0,
            errors,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts_and_of_nothing() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn ratio_needs_a_positive_denominator() {
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(ratio(f64::INFINITY, 1.0), None);
    }

    #[test]
    fn a_sample_of_no_cycles_has_zero_latencies() {
        let h = Histogram::<u64>::new(3).unwrap();
        assert_eq!(Sample::new(0, 1.0, &h, 2), sample(0.0, 0.0, 2));
        let mut h = Histogram::<u64>::new(3).unwrap();
        h.record(1500).unwrap();
        let s = Sample::new(10, 2.0, &h, 0);
        assert_eq!(s.ops_per_s, 5.0);
        assert!((s.p99_ms - 1.5).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn report_takes_medians_sums_errors_and_divides_by_each_peer() {
        let mut ss = Samples::default();
        for (ops, p99, err) in [(100.0, 2.0, 0), (300.0, 4.0, 1), (200.0, 3.0, 0)] {
            ss.add(16, Target::Leasefence, sample(ops, p99, err));
        }
        for (ops, p99) in [(50.0, 6.0), (40.0, 9.0), (60.0, 3.0)] {
            ss.add(16, Target::Etcd, sample(ops, p99, 0));
        }
        ss.add(16, Target::Noop, sample(0.0, 0.0, 5));
        let r = ss.report();
        let lf = r.runs.iter().find(|r| r.target == "leasefence").unwrap();
        assert_eq!((lf.ops_per_s, lf.p99_ms, lf.p50_ms, lf.errors), (200.0, 3.0, 1.5, 1));
        let etcd = r.ratios.iter().find(|r| r.vs == "etcd").unwrap();
        assert_eq!(
            (etcd.clients, etcd.ops_ratio, etcd.p99_ratio),
            (16, Some(4.0), Some(0.5))
        );
        let noop = r.ratios.iter().find(|r| r.vs == "noop").unwrap();
        assert_eq!((noop.ops_ratio, noop.p99_ratio), (None, None));
        assert_eq!(r.ratios.len(), 2, "no ratio of leasefence to itself");
    }

    #[test]
    fn json_has_the_documented_shape() {
        let mut ss = Samples::default();
        ss.add(64, Target::Leasefence, sample(10.0, 1.0, 0));
        ss.add(64, Target::Redis, sample(20.0, 0.5, 0));
        let v = serde_json::to_value(ss.report()).unwrap();
        let keys = |o: &serde_json::Value| {
            let mut k: Vec<String> = o.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&v), ["ratios", "runs"]);
        assert_eq!(
            keys(&v["runs"][0]),
            [
                "clients",
                "errors",
                "ops_per_s",
                "p50_ms",
                "p999_ms",
                "p99_ms",
                "target"
            ]
        );
        assert_eq!(keys(&v["ratios"][0]), ["clients", "ops_ratio", "p99_ratio", "vs"]);
        assert_eq!(v["ratios"][0]["vs"], "redis");
        assert_eq!(v["ratios"][0]["ops_ratio"], 0.5);
        assert_eq!(v["ratios"][0]["p99_ratio"], 2.0);
        assert_eq!(v["runs"][0]["target"], "leasefence");
    }
}
