//! The log's recovery rule on crafted bytes: what stops it, and what it keeps.

use super::*;

fn entry(key: &str, value: &[u8]) -> Entry {
    (key.to_string(), value.to_vec())
}

fn record(generation: u64, index: u64, entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_record(&mut out, generation, index, entries).expect("encodes");
    out
}

/// A log of `gen`'s records 0..n, each one entry `k<i>`, then `tail`.
fn log_of(generation: u64, n: u64, tail: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend(record(generation, i, &[entry(&format!("k{i}"), &[i as u8; 10])]));
    }
    bytes.extend_from_slice(tail);
    bytes
}

fn keys(batches: &[Vec<Entry>]) -> Vec<String> {
    batches.iter().flatten().map(|(k, _)| k.clone()).collect()
}

#[test]
fn records_of_the_generation_come_back_in_order_with_their_values() {
    let bytes = log_of(7, 3, &[0; 4096]);
    let got = recover(&bytes, 7).expect("recovers");
    assert_eq!(keys(&got), ["k0", "k1", "k2"]);
    assert_eq!(got[2][0].1, vec![2u8; 10]);
    let many = record(7, 0, &[entry("a", b"1"), entry("b", b""), entry("c", &[9; 300])]);
    let got = recover(&many, 7).expect("recovers");
    assert_eq!(
        got,
        vec![vec![entry("a", b"1"), entry("b", b""), entry("c", &[9; 300])]]
    );
}

#[test]
fn an_empty_or_zeroed_log_holds_nothing() {
    assert_eq!(recover(&[], 1).expect("empty"), Vec::<Vec<Entry>>::new());
    assert_eq!(recover(&[0; 8192], 0).expect("zeros"), Vec::<Vec<Entry>>::new());
}

#[test]
fn an_older_generation_after_the_tail_is_not_replayed() {
    // Generation 8 overwrote the front of a log that generation 7 had filled further.
    let old = log_of(7, 6, &[]);
    let mut bytes = log_of(8, 2, &[]);
    let cut = bytes.len();
    bytes.extend_from_slice(&old[cut..]);
    assert_eq!(keys(&recover(&bytes, 8).expect("recovers")), ["k0", "k1"]);
    // And a log of generation 7 alone means nothing to a tree at 8.
    assert!(recover(&old, 8).expect("recovers").is_empty());
}

#[test]
fn a_torn_or_flipped_record_ends_the_log_there() {
    let whole = log_of(3, 4, &[]);
    let third = record(3, 0, &[entry("k0", &[0; 10])]).len() * 2;
    // Torn: the last record cut anywhere inside it.
    let fourth = third + third / 2;
    for (cut, kept) in [
        (whole.len() - 1, 3),
        (fourth + 30, 3),
        (fourth + 1, 3),
        (third + 30, 2),
        (third + 5, 2),
    ] {
        let got = recover(&whole[..cut], 3).expect("recovers");
        assert_eq!(keys(&got), ["k0", "k1", "k2"][..kept].to_vec(), "cut at {cut}");
    }
    // Flipped: any byte of the third record, header or payload.
    let len = whole.len() / 4;
    for at in third..third + len {
        let mut bad = whole.clone();
        bad[at] ^= 0x40;
        assert_eq!(keys(&recover(&bad, 3).expect("recovers")), ["k0", "k1"], "flip at {at}");
    }
}

#[test]
fn a_gap_in_the_numbering_ends_the_log() {
    let mut bytes = log_of(5, 2, &[]);
    bytes.extend(record(5, 3, &[entry("k3", b"x")]));
    assert_eq!(keys(&recover(&bytes, 5).expect("recovers")), ["k0", "k1"]);
}

#[test]
fn a_whole_record_whose_payload_does_not_parse_is_corruption() {
    // A checksum over a payload that claims two entries and holds one.
    let mut bytes = record(2, 0, &[entry("a", b"1")]);
    bytes[HEADER] = 2;
    let crc = crc32fast::hash(&bytes[8..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    let err = recover(&bytes, 2).expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

#[test]
fn the_log_file_is_created_zeroed_and_appends_survive_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.log");
    let (mut log, none) = Log::open(&path, 4).expect("creates");
    assert!(none.is_empty());
    assert_eq!(std::fs::metadata(&path).expect("exists").len(), LOG_BYTES);
    log.restart(5);
    log.append(&[entry("a", b"1")]).expect("append");
    log.append(&[entry("b", b"2"), entry("c", b"3")]).expect("append");
    let used = Log::record_len(&[entry("a", b"1")]) + Log::record_len(&[entry("b", b"2"), entry("c", b"3")]);
    assert_eq!(log.used(), used);
    drop(log);
    let (_, batches) = Log::open(&path, 5).expect("opens");
    assert_eq!(
        batches,
        vec![vec![entry("a", b"1")], vec![entry("b", b"2"), entry("c", b"3")]]
    );
    let (_, stale) = Log::open(&path, 6).expect("opens");
    assert!(stale.is_empty(), "records of generation 5 are not generation 6's");
}
