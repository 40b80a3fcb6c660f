//! Unit tests of the fenced consumer's pure parts: each verdict's settlement
//! and counter, what a poison or stale message keeps, and that the handler
//! runs only for a message whose fence is admitted.

use std::sync::Mutex;
use std::time::Duration;

use leasefence_core::signing::SignatureError;
use leasefence_core::{ResourceId, Token};

use super::*;

fn stale() -> Stale {
    Stale {
        resource: ResourceId::new("orders/42").expect("valid"),
        presented: Token::new(3).expect("non-zero"),
        current: Token::new(4).expect("non-zero"),
    }
}

fn bad_signature(reason: SignatureError) -> Result<Handled, HandleError> {
    Err(ArbiterError::BadSignature {
        resource: ResourceId::new("orders/42").expect("valid"),
        reason,
    }
    .into())
}

fn settings() -> Settings {
    Settings::new("jobs")
        .with_retry_delay(Duration::from_millis(7))
        .with_failure_delay(Duration::from_secs(9))
}

#[test]
fn every_handler_result_has_its_settlement_and_counter() {
    #[allow(unused_mut)] // without the sqlite feature nothing is added below
    let mut cases: Vec<(Result<Handled, HandleError>, Settle, &str)> = vec![
        (Ok(Handled::Applied), Settle::Ack, APPLIED_METRIC),
        (Ok(Handled::Duplicate), Settle::Ack, DUPLICATE_METRIC),
        (Err(ArbiterError::Stale(stale()).into()), Settle::Ack, STALE_METRIC),
        (
            Err(HandleError::Retry("lock held".into())),
            Settle::Retry(Duration::from_millis(7)),
            RETRIED_METRIC,
        ),
        (
            Err(ArbiterError::NotInstalled { backend: "postgres" }.into()),
            Settle::Retry(Duration::from_secs(9)),
            FAILED_METRIC,
        ),
        (
            Err(ArbiterError::Invalid(Invalid::new("token", "too large")).into()),
            Settle::Drop,
            POISON_METRIC,
        ),
        (Err(HandleError::Poison("bad json".into())), Settle::Drop, POISON_METRIC),
        // The same on every delivery: a stripped, malformed or forged signature.
        (bad_signature(SignatureError::Missing), Settle::Drop, POISON_METRIC),
        (
            bad_signature(SignatureError::Malformed("not hex")),
            Settle::Drop,
            POISON_METRIC,
        ),
        (bad_signature(SignatureError::Mismatch), Settle::Drop, POISON_METRIC),
        // Heals once the key is installed (a rotation installs it on the
        // arbiters first): retried after the failure delay.
        (
            bad_signature(SignatureError::UnknownKey("k2".into())),
            Settle::Retry(Duration::from_secs(9)),
            FAILED_METRIC,
        ),
    ];
    // A retryable backend error: SQLite's BUSY.
    #[cfg(feature = "sqlite")]
    cases.push((
        Err(ArbiterError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".into()),
        ))
        .into()),
        Settle::Retry(Duration::from_millis(7)),
        RETRIED_METRIC,
    ));
    for (result, settle, metric) in cases {
        let verdict = Verdict::of_result(&result);
        assert_eq!(verdict.settle(&settings()), settle, "{result:?}");
        assert_eq!(verdict.metric(), metric, "{result:?}");
    }
}

#[test]
fn a_poison_signature_verdict_names_the_resource_and_the_reason() {
    let verdict = Verdict::of_result(&bad_signature(SignatureError::Mismatch));
    let Verdict::Poison(why) = verdict else {
        panic!("not poison: {verdict:?}")
    };
    assert!(why.contains("orders/42") && why.contains("signature"), "{why}");
}

#[test]
fn a_stale_verdict_keeps_resource_presented_and_current() {
    let verdict = Verdict::of_result(&Err(ArbiterError::Stale(stale()).into()));
    assert_eq!(verdict, Verdict::Stale(stale()));
}

#[test]
fn missing_or_malformed_fences_are_dropped_without_the_handler() {
    let missing = require_fence(Ok(None)).expect_err("no fence");
    let malformed =
        require_fence(crate::propagate::fence_from_pairs([("leasefence-token", "7")])).expect_err("half a fence");
    for verdict in [&missing, &malformed] {
        assert!(matches!(verdict, Verdict::Unfenced(_)), "{verdict:?}");
        assert_eq!(verdict.settle(&settings()), Settle::Drop);
        assert_eq!(verdict.metric(), UNFENCED_METRIC);
    }
    let Verdict::Unfenced(why) = malformed else {
        unreachable!()
    };
    assert!(why.contains("leasefence-resource"), "{why}");
    let fence = Fence::new(ResourceId::new("r").expect("valid"), Token::new(1).expect("non-zero"));
    assert_eq!(require_fence(Ok(Some(fence.clone()))), Ok(fence));
}

#[tokio::test]
async fn the_handler_runs_only_for_a_fenced_message_and_stale_goes_to_the_callback() {
    let message = Message {
        id: Some("m1".into()),
        payload: b"x".to_vec(),
        deliveries: Some(1),
        redelivered: false,
    };
    let calls = Mutex::new(Vec::new());
    let handler = |fence: Fence, m: Message| {
        calls.lock().expect("lock").push((fence.token.get(), m.id.clone()));
        async { Err::<Handled, _>(HandleError::from(ArbiterError::Stale(stale()))) }
    };
    let unfenced = run_handler(Ok(None), message.clone(), &handler).await;
    assert!(matches!(unfenced, Verdict::Unfenced(_)));
    assert!(
        calls.lock().expect("lock").is_empty(),
        "no handler call without a fence"
    );

    let fence = crate::propagate::fence_from_pairs(crate::propagate::fence_to_pairs(&Fence::new(
        ResourceId::new("orders/42").expect("valid"),
        Token::new(3).expect("non-zero"),
    )));
    let verdict = run_handler(fence, message, &handler).await;
    assert_eq!(verdict, Verdict::Stale(stale()));
    assert_eq!(*calls.lock().expect("lock"), vec![(3, Some("m1".to_string()))]);

    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let settings = settings().on_stale(move |s| sink.lock().expect("lock").push(s.clone()));
    observe(&settings, Some("m1"), &verdict);
    observe(&settings, Some("m2"), &Verdict::Applied);
    assert_eq!(
        *seen.lock().expect("lock"),
        vec![stale()],
        "only the stale verdict is handed over"
    );
}

#[test]
fn a_tally_counts_each_verdict_once() {
    let mut tally = Tally::default();
    for v in [
        Verdict::Applied,
        Verdict::Applied,
        Verdict::Duplicate,
        Verdict::Stale(stale()),
        Verdict::Unfenced("x".into()),
        Verdict::Poison("x".into()),
        Verdict::Retry("x".into()),
        Verdict::Failed("x".into()),
    ] {
        tally.add(&v);
    }
    let expected = Tally {
        applied: 2,
        duplicate: 1,
        stale: 1,
        unfenced: 1,
        poison: 1,
        retried: 1,
        failed: 1,
    };
    assert_eq!(tally, expected);
    assert_eq!(tally.total(), 8);
}

#[test]
fn observe_counts_each_verdict_under_its_metric_and_queue_label() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        observe(&settings(), Some("m1"), &Verdict::Stale(stale()));
        observe(&settings(), Some("m2"), &Verdict::Stale(stale()));
        observe(&Settings::new("other"), None, &Verdict::Unfenced("none".into()));
    });
    let mut counters: Vec<(String, String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let labels: Vec<_> = k.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let DebugValue::Counter(n) = v else {
                panic!("not a counter")
            };
            (k.key().name().to_owned(), labels.join(","), n)
        })
        .collect();
    counters.sort();
    let label = |q: &str| format!("queue={q}");
    assert_eq!(
        counters,
        vec![
            (STALE_METRIC.to_string(), label("jobs"), 2),
            (UNFENCED_METRIC.to_string(), label("other"), 1),
        ]
    );
}
