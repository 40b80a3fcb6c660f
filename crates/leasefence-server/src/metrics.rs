//! What the coordinator counts, in one place, so names and labels stay
//! consistent. Exposed at `GET /metrics` (Prometheus text) when the process
//! installed a recorder ([`install_prometheus`]); otherwise every call here is
//! a no-op.
//!
//! Like every answer, a metric shows only what is durable: the store's writer
//! counts grants, releases and expiries after their commit and before anyone
//! is told (`leasefence_store::GRANTS_TOTAL` and its neighbours), and the
//! size gauges are read when `/metrics` is, from a state on disk by then.

use std::time::Duration;

use leasefence_core::LeaseError;
use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Bucket bounds of every `*_seconds` histogram: 100 µs to 10 s.
const SECONDS_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];
/// Bucket bounds of the mutations per commit.
const BATCH_BUCKETS: [f64; 11] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// How often the recorder's histogram samples are folded into its buckets
/// when nobody scrapes (the exporter's own default).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs a process-wide Prometheus recorder and returns the handle that
/// renders it. Call once, from the binary; `None` if one is already installed.
/// Histograms render as Prometheus histograms (`_bucket`, `_sum`, `_count`).
pub fn install_prometheus() -> Option<PrometheusHandle> {
    install_prometheus_every(UPKEEP_EVERY)
}

/// [`install_prometheus`], with its upkeep every `upkeep`.
///
/// The recorder keeps each histogram sample until a scrape or its upkeep
/// folds it into the buckets, and a recorder that is built rather than
/// installed with an exporter has no upkeep of its own: without this thread
/// a coordinator nobody scrapes would grow by every call it answers.
pub fn install_prometheus_every(upkeep: Duration) -> Option<PrometheusHandle> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(leasefence_store::BATCH_MUTATIONS.into()), &BATCH_BUCKETS))
        .ok()?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    let kept = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("leasefence-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(upkeep);
                kept.run_upkeep();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the metrics upkeep thread; histograms are folded only when scraped");
    }
    Some(handle)
}

pub(crate) fn refusal(e: &LeaseError) {
    counter!("leasefence_refusals_total", "reason" => leasefence_proto::error_kind(e)).increment(1);
}

/// A refusal by access control (`leasefence_auth_refusals_total{reason}`) or
/// a limit (`leasefence_limit_refusals_total{limit}`).
pub(crate) fn auth_refusal(e: &crate::auth::AuthError) {
    match (e.reason(), e) {
        (Some(reason), _) => counter!("leasefence_auth_refusals_total", "reason" => reason).increment(1),
        (None, crate::auth::AuthError::Limit { key, .. }) => {
            counter!("leasefence_limit_refusals_total", "limit" => *key).increment(1);
        }
        (None, _) => {}
    }
}

/// The calls whose answer time is recorded, by `op` label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Acquire,
    Renew,
    Release,
}

/// The handles of the series every call moves, looked up once: a look-up
/// builds and hashes the series' key and searches the recorder's registry,
/// about 2% of a call's instructions (docs/performance-notes.md). Taken when an
/// engine starts, from the recorder installed then (`serve` installs it
/// first); an engine started before any recorder records nothing.
pub(crate) struct Handles {
    /// `leasefence_request_seconds{op, outcome}`: how long an acquire (waiting
    /// in the queue included), renew or release took to answer; by [`Op`],
    /// then ok / error.
    latency: [[Histogram; 2]; 3],
    renewals: Counter,
}

impl Handles {
    pub(crate) fn new() -> Handles {
        let by_outcome = |op: &'static str| {
            ["ok", "error"].map(|outcome| histogram!("leasefence_request_seconds", "op" => op, "outcome" => outcome))
        };
        Handles {
            latency: [by_outcome("acquire"), by_outcome("renew"), by_outcome("release")],
            renewals: counter!("leasefence_renewals_total"),
        }
    }

    pub(crate) fn latency(&self, op: Op, ok: bool, took: Duration) {
        self.latency[op as usize][usize::from(!ok)].record(took.as_secs_f64());
    }

    pub(crate) fn renewal(&self) {
        self.renewals.increment(1);
    }
}

/// Counts an open watch stream in `leasefence_watchers` while it lives.
pub(crate) struct Watching(());

impl Watching {
    pub(crate) fn new() -> Watching {
        gauge!("leasefence_watchers").increment(1.0);
        Watching(())
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        gauge!("leasefence_watchers").decrement(1.0);
    }
}

pub(crate) fn store_failure() {
    counter!("leasefence_store_failures_total").increment(1);
}

/// How big the machine's in-memory state is; `expiry_queue` counts the expiry
/// queue's entries (live leases, open lock-delays, and ended leases' entries not
/// yet dropped: at most about twice the live ones). Set when `/metrics` is
/// read, from a state that is durable by then (see `Engine::record_sizes`).
pub(crate) struct Sizes {
    pub held: usize,
    pub resources: usize,
    pub waiters: usize,
    pub expiry_queue: usize,
}

pub(crate) fn sizes(s: &Sizes) {
    gauge!("leasefence_leases_held").set(s.held as f64);
    gauge!("leasefence_resources").set(s.resources as f64);
    gauge!("leasefence_waiters").set(s.waiters as f64);
    gauge!("leasefence_expiry_queue_entries").set(s.expiry_queue as f64);
}

/// 1 while this coordinator is the active one, 0 as a standby.
pub(crate) fn leader(active: bool) {
    gauge!("leasefence_leader").set(if active { 1.0 } else { 0.0 });
}

/// A leadership term won (`epoch`) or lost.
pub(crate) fn term(epoch: u64, won: bool) {
    gauge!("leasefence_leader_epoch").set(epoch as f64);
    let event = if won { "won" } else { "lost" };
    counter!("leasefence_leadership_changes_total", "event" => event).increment(1);
}
