//! The Prometheus recorder keeps every histogram sample until it is drained,
//! and nothing drains it but a scrape or its upkeep. A coordinator nobody
//! scrapes must still not grow with the number of calls it answered.
//!
//! Its own test binary: the recorder is process-wide, and the figure is this
//! process's resident memory.

use std::time::Duration;

/// This process's resident memory in bytes, from `/proc/self/statm`.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field is the resident page count");
    pages * 4096
}

#[test]
fn histogram_samples_do_not_pile_up_without_a_scrape() {
    let upkeep = Duration::from_millis(20);
    let _handle = leasefence_server::metrics::install_prometheus_every(upkeep).expect("the first recorder installs");
    let request = metrics::histogram!("leasefence_request_seconds", "op" => "acquire", "outcome" => "ok");
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 100_000;
    // One round first, so that the allocator's first arenas are counted out.
    for _ in 0..PER_ROUND {
        request.record(0.0003);
    }
    std::thread::sleep(upkeep * 5);
    let before = rss();
    for _ in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            request.record(0.0003);
        }
        std::thread::sleep(upkeep * 5);
    }
    let grown = rss().saturating_sub(before);
    // Kept, these 2,000,000 samples take over 30 MB (at least 16 bytes each:
    // the value and when it came); drained, one round's memory is reused.
    let limit = 8 << 20;
    eprintln!("resident memory grew by {grown} bytes");
    assert!(
        grown < limit,
        "resident memory grew by {grown} bytes over {} samples nobody scraped (allowed: {limit})",
        ROUNDS * PER_ROUND
    );
}
