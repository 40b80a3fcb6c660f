//! The one conformance suite every arbiter backend passes, through
//! [`ConformanceTarget`].
//!
//! A target wraps a real backend plus a small effect model: a key-value table
//! and a per-resource history of committed tokens, both written in the same
//! atomic unit as the fence. Each scenario uses its own resources under the
//! target's namespace, so one target may serve every scenario. Scenarios panic
//! with what was expected (this is test code); [`crate::pause_kit`] is the
//! non-panicking checker for the command line.

mod racers;
mod signed;

use std::future::Future;
use std::sync::Arc;

use leasefence_core::{Fence, FenceMode, ResourceId, Token};

use crate::ArbiterError;

pub use racers::{RACERS, racers_monotonic, racers_strict};
pub use signed::{SIGNED_CASES, SuiteKeys, signed_fences};

/// How an atomic unit ends after its admit and effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Commit,
    /// The unit is abandoned after the admit and the effect: SQL backends roll
    /// back; the embedded store's effect returns an error; Redis's effect
    /// command fails. Neither the effect nor the fence may change.
    Abort,
}

/// Where [`ConformanceTarget::admit_and_write_paused`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PausePoint {
    /// Inside an open transaction that has already written its effect, before
    /// the admit (PostgreSQL: other writers are not blocked meanwhile).
    InsideTransaction,
    /// Before the unit starts, holding the token (single-writer or
    /// single-command backends, where an open unit would block the racer).
    HoldingToken,
}

/// One backend under test, with its effect model.
pub trait ConformanceTarget: Send + Sync + 'static {
    /// Backend name, as in the metrics label.
    fn backend(&self) -> &'static str;

    /// Prefix of every resource this target may touch; [`Self::cleanup`] removes them.
    fn namespace(&self) -> &str;

    /// The largest token the backend stores: every u64 unless it says less
    /// (the SQL backends store `i64::MAX` at most).
    fn token_max(&self) -> Token {
        Token::new(u64::MAX).unwrap_or(Token::FIRST)
    }

    /// Where [`Self::admit_and_write_paused`] pauses.
    fn pause_point(&self) -> PausePoint {
        PausePoint::HoldingToken
    }

    /// In one atomic unit: admit `fence` under `mode`, set `key = value` for
    /// the resource, append the token to the resource's history, then end as
    /// `outcome` says. `Ok(())` for an abort means the unit was abandoned as asked.
    fn admit_and_write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> impl Future<Output = Result<(), ArbiterError>> + Send;

    /// [`Self::admit_and_write`] with [`Outcome::Commit`], waiting for `pause` at
    /// the target's [`PausePoint`].
    fn admit_and_write_paused<P>(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        pause: P,
    ) -> impl Future<Output = Result<(), ArbiterError>> + Send
    where
        P: Future<Output = ()> + Send,
    {
        async move {
            pause.await;
            self.admit_and_write(fence, mode, key, value, Outcome::Commit).await
        }
    }

    /// The committed value of `key` for `resource`.
    fn read(
        &self,
        resource: &ResourceId,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>, ArbiterError>> + Send;

    /// The recorded `last_token` of `resource`.
    fn last_token(&self, resource: &ResourceId) -> impl Future<Output = Result<Option<Token>, ArbiterError>> + Send;

    /// Tokens of the committed effects on `resource`, in commit order.
    fn history(&self, resource: &ResourceId) -> impl Future<Output = Result<Vec<Token>, ArbiterError>> + Send;

    /// Removes everything under [`Self::namespace`] and the effect model.
    fn cleanup(&self) -> impl Future<Output = Result<(), ArbiterError>> + Send;
}

/// Runs every scenario, then cleans up.
pub async fn run_all<T: ConformanceTarget>(t: Arc<T>) {
    first_admit(&*t).await;
    strict_equal_rejected(&*t).await;
    monotonic_equal_admitted(&*t).await;
    lower_rejected(&*t).await;
    modes_are_per_call(&*t).await;
    abort_leaves_neither_effect_nor_fence(&*t).await;
    stale_error_names_resource_presented_current(&*t).await;
    limits(&*t).await;
    racers_strict(&t).await;
    racers_monotonic(&t).await;
    if let Err(e) = t.cleanup().await {
        panic!("{}: cleanup failed: {e}", t.backend());
    }
}

pub(crate) fn resource<T: ConformanceTarget>(t: &T, name: &str) -> ResourceId {
    let full = format!("{}{name}", t.namespace());
    ResourceId::new(&full).unwrap_or_else(|e| panic!("suite resource {full:?} is invalid: {e}"))
}

pub(crate) fn tok(v: u64) -> Token {
    Token::new(v).unwrap_or_else(|| panic!("suite token {v} must be non-zero"))
}

fn fence(r: &ResourceId, v: u64) -> Fence {
    Fence::new(r.clone(), tok(v))
}

/// Retries of a unit that failed with a retryable error before the error is
/// reported.
const RETRIES: u32 = 20;

/// One unit on key `k`, retried as a user would on [`ArbiterError::is_retryable`]
/// (PostgreSQL may abort a SERIALIZABLE transaction that merely ran beside an
/// unrelated one; SQLite may be busy). The retry is checked against the fence
/// like any other attempt. The racers call the target directly: they count
/// such failures themselves.
async fn unit<T: ConformanceTarget>(
    t: &T,
    fence: &Fence,
    mode: FenceMode,
    value: &str,
    outcome: Outcome,
) -> Result<(), ArbiterError> {
    let mut attempts = 0;
    loop {
        match t.admit_and_write(fence, mode, "k", value, outcome).await {
            Err(e) if e.is_retryable() && attempts < RETRIES => attempts += 1,
            other => return other,
        }
    }
}

async fn commit<T: ConformanceTarget>(t: &T, r: &ResourceId, v: u64, mode: FenceMode, value: &str) {
    let res = unit(t, &fence(r, v), mode, value, Outcome::Commit).await;
    if let Err(e) = res {
        panic!("{}: {r}@{v} ({mode:?}) must be admitted, got {e}", t.backend());
    }
}

async fn expect_stale<T: ConformanceTarget>(t: &T, r: &ResourceId, v: u64, mode: FenceMode, current: u64) {
    let res = unit(t, &fence(r, v), mode, "stale-write", Outcome::Commit).await;
    match res {
        Err(ArbiterError::Stale(s)) => {
            assert_eq!(&s.resource, r, "{}: Stale.resource", t.backend());
            assert_eq!(s.presented, tok(v), "{}: Stale.presented", t.backend());
            assert_eq!(s.current, tok(current), "{}: Stale.current", t.backend());
        }
        other => panic!(
            "{}: {r}@{v} ({mode:?}) over {current} must be Stale, got {other:?}",
            t.backend()
        ),
    }
}

/// Reads back value, last_token and history and compares them with what is expected.
async fn expect_state<T: ConformanceTarget>(
    t: &T,
    r: &ResourceId,
    value: Option<&str>,
    last: Option<u64>,
    hist: &[u64],
) {
    let b = t.backend();
    let got_value = t.read(r, "k").await.unwrap_or_else(|e| panic!("{b}: read {r}: {e}"));
    assert_eq!(got_value.as_deref(), value, "{b}: value of {r}");
    let got_last = t
        .last_token(r)
        .await
        .unwrap_or_else(|e| panic!("{b}: last_token {r}: {e}"));
    assert_eq!(got_last.map(Token::get), last, "{b}: last_token of {r}");
    let got_hist = t.history(r).await.unwrap_or_else(|e| panic!("{b}: history {r}: {e}"));
    assert_eq!(
        got_hist.iter().map(|t| t.get()).collect::<Vec<_>>(),
        hist,
        "{b}: history of {r}"
    );
}

/// A never-seen resource admits any token and records it with the effect.
pub async fn first_admit<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "first-admit");
    expect_state(t, &r, None, None, &[]).await;
    commit(t, &r, 42, FenceMode::Strict, "v42").await;
    expect_state(t, &r, Some("v42"), Some(42), &[42]).await;
}

/// Strict: the same token a second time is rejected, and nothing changes.
pub async fn strict_equal_rejected<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "strict-equal");
    commit(t, &r, 5, FenceMode::Strict, "v5").await;
    expect_stale(t, &r, 5, FenceMode::Strict, 5).await;
    expect_state(t, &r, Some("v5"), Some(5), &[5]).await;
    commit(t, &r, 6, FenceMode::Strict, "v6").await;
    expect_state(t, &r, Some("v6"), Some(6), &[5, 6]).await;
}

/// Monotonic: the same token again is admitted (many effects, one grant).
pub async fn monotonic_equal_admitted<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "monotonic-equal");
    commit(t, &r, 5, FenceMode::Monotonic, "a").await;
    commit(t, &r, 5, FenceMode::Monotonic, "b").await;
    expect_state(t, &r, Some("b"), Some(5), &[5, 5]).await;
    expect_stale(t, &r, 4, FenceMode::Monotonic, 5).await;
    expect_state(t, &r, Some("b"), Some(5), &[5, 5]).await;
}

/// A lower token is rejected in both modes.
pub async fn lower_rejected<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "lower");
    commit(t, &r, 7, FenceMode::Strict, "v7").await;
    expect_stale(t, &r, 6, FenceMode::Strict, 7).await;
    expect_stale(t, &r, 6, FenceMode::Monotonic, 7).await;
    expect_stale(t, &r, 1, FenceMode::Strict, 7).await;
    expect_state(t, &r, Some("v7"), Some(7), &[7]).await;
}

/// The mode belongs to each call, not to the fence key.
pub async fn modes_are_per_call<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "modes-per-call");
    commit(t, &r, 10, FenceMode::Strict, "s10").await;
    commit(t, &r, 10, FenceMode::Monotonic, "m10").await;
    expect_stale(t, &r, 10, FenceMode::Strict, 10).await;
    commit(t, &r, 11, FenceMode::Strict, "s11").await;
    expect_state(t, &r, Some("s11"), Some(11), &[10, 10, 11]).await;
}

/// An abandoned unit leaves neither its effect nor its token behind, so the
/// same token is still admissible afterwards.
pub async fn abort_leaves_neither_effect_nor_fence<T: ConformanceTarget>(t: &T) {
    let b = t.backend();
    let r = resource(t, "abort");
    let aborted = unit(t, &fence(&r, 1), FenceMode::Strict, "x", Outcome::Abort).await;
    assert!(aborted.is_ok(), "{b}: abort on a fresh resource: {aborted:?}");
    expect_state(t, &r, None, None, &[]).await;
    commit(t, &r, 3, FenceMode::Strict, "v3").await;
    let aborted = unit(t, &fence(&r, 4), FenceMode::Strict, "v4", Outcome::Abort).await;
    assert!(aborted.is_ok(), "{b}: abort of 4 over 3: {aborted:?}");
    expect_state(t, &r, Some("v3"), Some(3), &[3]).await;
    commit(t, &r, 4, FenceMode::Strict, "v4").await;
    expect_state(t, &r, Some("v4"), Some(4), &[3, 4]).await;
}

/// The rejection is typed and names resource, presented and current, also in
/// its message.
pub async fn stale_error_names_resource_presented_current<T: ConformanceTarget>(t: &T) {
    let r = resource(t, "error fields with spaces");
    commit(t, &r, 900, FenceMode::Strict, "v").await;
    let err = unit(t, &fence(&r, 899), FenceMode::Strict, "late", Outcome::Commit)
        .await
        .err()
        .unwrap_or_else(|| panic!("{}: 899 over 900 must be rejected", t.backend()));
    let stale = err
        .as_stale()
        .unwrap_or_else(|| panic!("{}: expected Stale, got {err:?}", t.backend()));
    assert_eq!(
        (&stale.resource, stale.presented, stale.current),
        (&r, tok(899), tok(900))
    );
    let msg = err.to_string();
    assert!(
        msg.contains("899") && msg.contains("900") && msg.contains(r.as_str()),
        "{msg}"
    );
}

/// Large tokens compare exactly (no floating point, no wrap); tokens above the
/// backend's limit are refused as invalid and change nothing.
pub async fn limits<T: ConformanceTarget>(t: &T) {
    let b = t.backend();
    let r = resource(t, "limits");
    let two53 = 1u64 << 53;
    commit(t, &r, two53, FenceMode::Strict, "2^53").await;
    commit(t, &r, two53 + 1, FenceMode::Strict, "2^53+1").await;
    expect_stale(t, &r, two53, FenceMode::Monotonic, two53 + 1).await;
    let max = t.token_max().get();
    commit(t, &r, max - 1, FenceMode::Strict, "max-1").await;
    commit(t, &r, max, FenceMode::Strict, "max").await;
    expect_stale(t, &r, max, FenceMode::Strict, max).await;
    expect_stale(t, &r, max - 1, FenceMode::Monotonic, max).await;
    commit(t, &r, max, FenceMode::Monotonic, "max again").await;
    if max < u64::MAX {
        for over in [max + 1, u64::MAX] {
            let res = unit(t, &fence(&r, over), FenceMode::Strict, "over", Outcome::Commit).await;
            match res {
                Err(ArbiterError::Invalid(i)) => assert_eq!(i.field(), "token", "{b}: {i}"),
                other => panic!("{b}: token {over} above the limit {max} must be Invalid, got {other:?}"),
            }
        }
        let fresh = resource(t, "limits-fresh");
        let res = unit(t, &fence(&fresh, u64::MAX), FenceMode::Strict, "x", Outcome::Commit).await;
        assert!(matches!(res, Err(ArbiterError::Invalid(_))), "{b}: {res:?}");
        expect_state(t, &fresh, None, None, &[]).await;
    }
    let hist = [two53, two53 + 1, max - 1, max, max];
    expect_state(t, &r, Some("max again"), Some(max), &hist).await;
}
