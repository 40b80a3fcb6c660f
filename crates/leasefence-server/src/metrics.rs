//! What the coordinator counts, in one place, so names and labels stay
//! consistent. Exposed at `GET /metrics` (Prometheus text) when the process
//! installed a recorder ([`install_prometheus`]); otherwise every call here is
//! a no-op.

use leasefence_core::{LeaseError, Mutation, ReleaseCause};
use metrics::{counter, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs a process-wide Prometheus recorder and returns the handle that
/// renders it. Call once, from the binary; `None` if one is already installed.
pub fn install_prometheus() -> Option<PrometheusHandle> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    Some(handle)
}

pub(crate) fn mutation(m: &Mutation) {
    match m {
        Mutation::Grant { .. } => counter!("leasefence_grants_total").increment(1),
        Mutation::Release {
            cause: ReleaseCause::Released,
            ..
        } => counter!("leasefence_releases_total").increment(1),
        Mutation::Release {
            cause: ReleaseCause::Expired,
            ..
        } => counter!("leasefence_expiries_total").increment(1),
    }
}

pub(crate) fn refusal(e: &LeaseError) {
    counter!("leasefence_refusals_total", "reason" => leasefence_proto::error_kind(e)).increment(1);
}

pub(crate) fn renewal() {
    counter!("leasefence_renewals_total").increment(1);
}

pub(crate) fn store_failure() {
    counter!("leasefence_store_failures_total").increment(1);
}

/// How big the machine's in-memory state is; `expiry_queue` counts the expiry
/// queue's entries (live leases, open lock-delays, and ended leases' entries not
/// yet dropped: at most about twice the live ones).
pub(crate) fn sizes(held: usize, resources: usize, waiters: usize, expiry_queue: usize) {
    gauge!("leasefence_leases_held").set(held as f64);
    gauge!("leasefence_resources").set(resources as f64);
    gauge!("leasefence_waiters").set(waiters as f64);
    gauge!("leasefence_expiry_queue_entries").set(expiry_queue as f64);
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
