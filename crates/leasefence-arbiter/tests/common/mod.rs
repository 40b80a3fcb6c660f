//! Shared test helpers: service URLs from the environment (the one place that
//! decides skip vs fail) and the macro that turns the conformance suite into
//! one test per scenario.

#![allow(dead_code, unused_macros)]

use leasefence_arbiter::{Fence, REJECTIONS_METRIC, ResourceId, Token};
use metrics_util::debugging::{DebugValue, Snapshotter};

pub const POSTGRES_URL: &str = "LEASEFENCE_TEST_POSTGRES_URL";
pub const REDIS_URL: &str = "LEASEFENCE_TEST_REDIS_URL";

/// The URL in `var`. Unset: with `CI=true` the test fails; otherwise it prints
/// a skip line to stderr and the caller returns.
pub fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{var} is not set but CI=true: this test needs the real service, and .ci/run must export {var}");
            }
            eprintln!("skipped: {var} not set");
            None
        }
    }
}

/// A schema of its own, `{prefix}_{random}`, with the arbiter installed in
/// it, so that a test may alter that install without disturbing the others':
/// its name and handle.
#[cfg(feature = "postgres")]
pub async fn own_install(
    c: &mut tokio_postgres::Client,
    prefix: &str,
) -> (String, leasefence_arbiter::postgres::Schema) {
    let name = format!("{prefix}_{:016x}", getrandom::u64().expect("os randomness"));
    c.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("schema");
    let schema = leasefence_arbiter::postgres::Schema::new(&name).expect("valid name");
    schema.install(c).await.expect("fresh install");
    (name, schema)
}

/// Creates pgcrypto in `public` under the installer's lock (two concurrent
/// `CREATE EXTENSION IF NOT EXISTS` can collide), so that a keyed schema
/// dropped after its test leaves it to other installs.
#[cfg(feature = "postgres")]
pub async fn pgcrypto_in_public(c: &mut tokio_postgres::Client) {
    let tx = c.transaction().await.expect("begin");
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(7237098112370931713); CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA public",
    )
    .await
    .expect("pgcrypto");
    tx.commit().await.expect("commit");
}

/// SplitMix64: the tests' seeded generator (they print the seed).
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A resource name no other test uses.
pub fn unique_resource(name: &str) -> ResourceId {
    let mut buf = [0u8; 8];
    getrandom::fill(&mut buf).expect("os randomness");
    ResourceId::new(&format!("test/{name}/{:016x}", u64::from_le_bytes(buf))).expect("valid resource")
}

pub fn fence(r: &ResourceId, token: u64) -> Fence {
    Fence::new(r.clone(), Token::new(token).expect("non-zero token"))
}

/// Raw header (or metadata) lines, repeats allowed: (name, value bytes).
pub type Headers = Vec<(&'static str, Vec<u8>)>;

/// Header sets that are not a usable fence for `resource`, each with why:
/// every one must be refused as malformed (HTTP 400, gRPC INVALID_ARGUMENT).
pub fn malformed_fences(resource: &str) -> Vec<(&'static str, Headers)> {
    let (res, tok) = ("leasefence-resource", "leasefence-token");
    let r = resource.as_bytes().to_vec();
    let pair = |t: &str| vec![(res, r.clone()), (tok, t.as_bytes().to_vec())];
    let with = |mut h: Headers, name, value: &[u8]| {
        h.push((name, value.to_vec()));
        h
    };
    vec![
        ("non-numeric", pair("abc")),
        ("zero", pair("0")),
        ("negative", pair("-1")),
        ("above u64::MAX", pair("18446744073709551616")),
        ("a sign", pair("+7")),
        ("hexadecimal", pair("0x7")),
        ("repeated token", with(pair("7"), tok, b"8")),
        ("repeated resource", with(pair("7"), res, &r)),
        ("only the resource", vec![(res, r.clone())]),
        ("only the token", vec![(tok, b"7".to_vec())]),
        ("empty resource", vec![(res, Vec::new()), (tok, b"7".to_vec())]),
        (
            "resource not UTF-8",
            vec![(res, b"orders/\xff".to_vec()), (tok, b"7".to_vec())],
        ),
    ]
}

/// One `#[tokio::test]` per conformance scenario; `$make` is an expression
/// evaluating to a future of `Option<(Arc<Target>, Guard)>` (`None`: skipped;
/// the guard, e.g. a temp dir, lives until the test ends).
macro_rules! conformance_tests {
    ($make:expr) => {
        conformance_tests!(@by_ref $make;
            first_admit,
            strict_equal_rejected,
            monotonic_equal_admitted,
            lower_rejected,
            modes_are_per_call,
            abort_leaves_neither_effect_nor_fence,
            stale_error_names_resource_presented_current,
            limits
        );
        conformance_tests!(@by_arc $make; racers_strict, racers_monotonic);
    };
    (@by_ref $make:expr; $($name:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            use leasefence_arbiter::ConformanceTarget;
            let Some((t, _guard)) = $make.await else { return };
            leasefence_arbiter::conformance::$name(&*t).await;
            t.cleanup().await.expect("cleanup");
        }
    )*};
    (@by_arc $make:expr; $($name:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            use leasefence_arbiter::ConformanceTarget;
            let Some((t, _guard)) = $make.await else { return };
            leasefence_arbiter::conformance::$name(&t).await;
            t.cleanup().await.expect("cleanup");
        }
    )*};
}

/// The signed-fence scenario: `$make` is a closure taking the
/// [`Verifier`](leasefence_arbiter::Verifier) the target must require and
/// returning a future of `Option<(Arc<Target>, Guard)>`.
macro_rules! signed_fences_test {
    ($name:ident, $make:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            use leasefence_arbiter::ConformanceTarget;
            let keys = leasefence_arbiter::conformance::SuiteKeys::generate();
            let Some((t, _guard)) = ($make)(keys.verifier()).await else {
                return;
            };
            leasefence_arbiter::conformance::signed_fences(&*t, &keys).await;
            t.cleanup().await.expect("cleanup");
        }
    };
}

/// A pause-kit test: `trials` trials, every stale effect rejected, nothing left over.
macro_rules! pause_kit_test {
    ($name:ident, $make:expr, $trials:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let Some((t, _guard)) = $make.await else { return };
            let report = leasefence_arbiter::pause_check(&t, $trials)
                .await
                .expect("pause check runs");
            assert_eq!(report.trials, $trials);
            assert_eq!(report.stale_accepted, 0, "{report:?}");
            assert_eq!(report.stale_rejected, $trials, "{report:?}");
            assert!(report.counterexamples.is_empty(), "{report:?}");
            assert!(report.passed());
        }
    };
}

/// The rejection counters a debugging recorder saw, as (labels, value).
pub fn rejection_counters(snapshotter: &Snapshotter) -> Vec<(Vec<(String, String)>, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == REJECTIONS_METRIC)
        .map(|(k, _, _, v)| {
            let labels = k.key().labels();
            (
                labels.map(|l| (l.key().to_string(), l.value().to_string())).collect(),
                v,
            )
        })
        .collect()
}
