//! Scenarios for the edges of the fenced commands, shared by both flavours:
//! fence keys as data keys, and commands that write nothing.

use leasefence_arbiter::redis::{Via, fence_key};
use leasefence_arbiter::{ArbiterError, FenceMode};
use redis::aio::MultiplexedConnection;

use super::{expect_stale, forget, get, last, raw};
use crate::common::{fence, unique_resource};

/// No fenced command writes a key under the fence-key prefix: a holder of
/// `a` can neither overwrite, delete nor retype the fence key of `b` (which
/// would let `b`'s stale writers through), nor any other key that starts
/// with `leasefence:fence:`. A key that merely contains the prefix later on
/// is no fence key (every fence key starts with it) and is written as usual.
pub async fn fence_keys_are_off_limits(mut c: MultiplexedConnection, via: Via) {
    let (a, b) = (
        unique_resource("fence off limits a"),
        unique_resource("fence off limits b"),
    );
    let fb = fence_key(&b);
    via.set(
        &mut c,
        &fence(&b, 10),
        FenceMode::Strict,
        &format!("test:{{{b}}}:v"),
        "b10",
    )
    .await
    .expect("b at 10");
    let own = format!("test:{{{a}}}:v");
    let prefixed = [
        fb.clone(),
        "leasefence:fence:".to_string(),
        format!("leasefence:fence:{{{b}"),
        format!("leasefence:fence:{b}"),
    ];
    for target in &prefixed {
        let f = fence(&a, 1);
        let ttl = std::time::Duration::from_secs(60);
        let results = [
            (
                "set",
                via.set(&mut c, &f, FenceMode::Strict, target, "1").await.map(|_| ()),
            ),
            (
                "set_with_ttl",
                via.set_with_ttl(&mut c, &f, FenceMode::Strict, target, "1", ttl)
                    .await
                    .map(|_| ()),
            ),
            (
                "del",
                via.del(&mut c, &f, FenceMode::Strict, &[target]).await.map(|_| ()),
            ),
            (
                "del among others",
                via.del(&mut c, &f, FenceMode::Strict, &[&own, target])
                    .await
                    .map(|_| ()),
            ),
            (
                "hset",
                via.hset(&mut c, &f, FenceMode::Strict, target, &[("f", "v")])
                    .await
                    .map(|_| ()),
            ),
            (
                "xadd",
                via.xadd(&mut c, &f, FenceMode::Strict, target, "*", &[("f", "v")])
                    .await
                    .map(|_| ()),
            ),
        ];
        for (op, res) in results {
            match res {
                Err(ArbiterError::Invalid(i)) => {
                    assert!(i.to_string().contains("leasefence:fence:"), "{op} {target}: {i}")
                }
                other => panic!("{via:?} {op} of {target:?} must be refused as Invalid, got {other:?}"),
            }
        }
    }
    assert_eq!(last(&mut c, &b).await, Some(10), "b's fence is untouched");
    assert_eq!(last(&mut c, &a).await, None, "a refused call records no fence");
    for k in &prefixed[1..] {
        assert_eq!(get::<i64>(&mut c, &["EXISTS", k]).await, 0, "{k} was written");
    }
    expect_stale(
        via.set(
            &mut c,
            &fence(&b, 9),
            FenceMode::Strict,
            &format!("test:{{{b}}}:v"),
            "stale",
        )
        .await,
        &b,
        9,
        10,
    );
    let inner = format!("test:{{{a}}}:{fb}");
    via.set(&mut c, &fence(&a, 1), FenceMode::Strict, &inner, "ordinary")
        .await
        .expect("a key that only contains the prefix is an ordinary key");
    assert_eq!(last(&mut c, &a).await, Some(1));
    forget(&mut c, &a, &[&own, &inner]).await;
    forget(&mut c, &b, &[&format!("test:{{{b}}}:v")]).await;
}

/// An `XADD ... NOMKSTREAM` on a missing stream writes nothing, so it records
/// no fence either: the reply is nil and the token is still unused (a strict
/// holder can still make its one write). On an existing stream it appends
/// and records the token as usual; a stale one is refused whatever happens.
pub async fn xadd_nomkstream_on_a_missing_stream_records_no_fence(mut c: MultiplexedConnection, via: Via) {
    let r = unique_resource("nomkstream");
    let (fk, stream) = (fence_key(&r), format!("test:{{{r}}}:stream"));
    // Options go before the ID, as in XADD itself.
    let missing: redis::Value = raw(
        via,
        "xadd",
        &[&fk, &stream],
        &["5", "strict", "MAXLEN", "~", "10", "NOMKSTREAM", "*", "f", "v"],
    )
    .query_async(&mut c)
    .await
    .expect("NOMKSTREAM after MAXLEN");
    assert_eq!(missing, redis::Value::Nil, "nothing was added");
    assert_eq!(get::<i64>(&mut c, &["EXISTS", &stream]).await, 0);
    assert_eq!(last(&mut c, &r).await, None, "no fence for a write that did not happen");
    let missing: redis::Value = raw(
        via,
        "xadd",
        &[&fk, &stream],
        &["5", "strict", "NOMKSTREAM", "*", "f", "v"],
    )
    .query_async(&mut c)
    .await
    .expect("NOMKSTREAM on a missing stream");
    assert_eq!(missing, redis::Value::Nil);
    assert_eq!(last(&mut c, &r).await, None);
    // The token is still good for a real write.
    via.xadd(
        &mut c,
        &fence(&r, 5),
        FenceMode::Strict,
        &stream,
        "*",
        &[("f", "first")],
    )
    .await
    .expect("the unused token 5 still writes");
    let id: String = raw(
        via,
        "xadd",
        &[&fk, &stream],
        &["6", "strict", "NOMKSTREAM", "*", "f", "v"],
    )
    .query_async(&mut c)
    .await
    .expect("NOMKSTREAM on an existing stream appends");
    assert!(id.contains('-'), "{id}");
    assert_eq!(last(&mut c, &r).await, Some(6));
    let stale = raw(
        via,
        "xadd",
        &[&fk, &stream],
        &["6", "strict", "NOMKSTREAM", "*", "f", "v"],
    )
    .query_async::<redis::Value>(&mut c)
    .await
    .expect_err("stale");
    assert_eq!(stale.code(), Some("STALE"));
    assert_eq!(get::<u64>(&mut c, &["XLEN", &stream]).await, 2);
    forget(&mut c, &r, &[&stream]).await;
}
