//! Applying a message once (`postgres::claim_message`, `with_fence_once`,
//! `prune_consumed`) against the real server in `LEASEFENCE_TEST_POSTGRES_URL`.

mod common;

use std::time::Duration;

use common::{POSTGRES_URL, fence, own_install, service_url, unique_resource};
use leasefence_arbiter::postgres::{self, Once};
use leasefence_arbiter::{ArbiterError, Fence, FenceMode};
use tokio_postgres::Client;

async fn client() -> Option<Client> {
    let url = service_url(POSTGRES_URL)?;
    let mut c = postgres::connect(&url).await.expect("connect");
    postgres::install(&mut c).await.expect("install");
    Some(c)
}

fn consumer() -> String {
    format!("test-dedup-{:016x}", getrandom::u64().expect("os randomness"))
}

/// Applies `fence` once for message `id`, adding a row to `effects`.
async fn apply(c: &mut Client, consumer: &str, id: &str, f: &Fence, table: &str) -> Result<Once<()>, ArbiterError> {
    let insert = format!("INSERT INTO {table} (id) VALUES ($1)");
    let owned = id.to_owned();
    postgres::with_fence_once(c, consumer, id, f, FenceMode::Monotonic, |tx| {
        Box::pin(async move {
            tx.execute(&insert, &[&owned]).await?;
            Ok::<_, ArbiterError>(())
        })
    })
    .await
}

async fn table(c: &Client) -> String {
    let name = format!("lf_dedup_{:016x}", getrandom::u64().expect("os randomness"));
    c.batch_execute(&format!("CREATE TABLE {name} (id text NOT NULL)"))
        .await
        .expect("effects table");
    name
}

async fn rows(c: &Client, table: &str) -> i64 {
    c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count")
        .get(0)
}

async fn cleanup(c: &Client, table: &str, consumer: &str) {
    c.batch_execute(&format!("DROP TABLE {table}")).await.expect("drop");
    c.execute("DELETE FROM leasefence_consumed WHERE consumer = $1", &[&consumer])
        .await
        .expect("claims");
}

#[tokio::test]
async fn a_message_applies_once_and_a_stale_one_leaves_no_claim() {
    let Some(mut c) = client().await else { return };
    let (t, who, r) = (table(&c).await, consumer(), unique_resource("dedup"));
    assert_eq!(
        apply(&mut c, &who, "m1", &fence(&r, 2), &t).await.expect("first"),
        Once::Applied(())
    );
    assert_eq!(
        apply(&mut c, &who, "m1", &fence(&r, 2), &t).await.expect("again"),
        Once::Duplicate
    );
    assert_eq!(
        apply(&mut c, &who, "m2", &fence(&r, 2), &t).await.expect("same grant"),
        Once::Applied(())
    );
    assert_eq!(rows(&c, &t).await, 2);

    let stale = apply(&mut c, &who, "m3", &fence(&r, 1), &t).await;
    assert!(matches!(stale, Err(ArbiterError::Stale(_))), "{stale:?}");
    let claimed: i64 = c
        .query_one(
            "SELECT count(*) FROM leasefence_consumed WHERE consumer = $1 AND message_id = 'm3'",
            &[&who],
        )
        .await
        .expect("claims")
        .get(0);
    assert_eq!(claimed, 0, "a rejected message's claim rolled back with it");
    // Another consumer keeps its own claims.
    let other = consumer();
    assert_eq!(
        apply(&mut c, &other, "m1", &fence(&r, 2), &t).await.expect("other"),
        Once::Applied(())
    );
    assert_eq!(rows(&c, &t).await, 3);
    cleanup(&c, &t, &who).await;
    cleanup_claims(&c, &other).await;
}

async fn cleanup_claims(c: &Client, consumer: &str) {
    c.execute("DELETE FROM leasefence_consumed WHERE consumer = $1", &[&consumer])
        .await
        .expect("claims");
}

/// Two deliveries of one message in flight at once (a redelivery after the
/// ack wait while the first still works): the second waits on the claim
/// and finds a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_in_flight_at_once_apply_once() {
    let Some(mut first) = client().await else { return };
    let Some(mut second) = client().await else { return };
    let (t, who, r) = (table(&first).await, consumer(), unique_resource("dedup-race"));
    let f = fence(&r, 1);
    let tx = first.transaction().await.expect("begin");
    assert!(postgres::claim_message(&tx, &who, "m").await.expect("claim"));
    let racer = {
        let (who, t, f) = (who.clone(), t.clone(), f.clone());
        tokio::spawn(async move { apply(&mut second, &who, "m", &f, &t).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!racer.is_finished(), "the second delivery waits for the first's claim");
    tx.execute(&format!("INSERT INTO {t} (id) VALUES ('m')"), &[])
        .await
        .expect("effect");
    tx.commit().await.expect("commit");
    assert_eq!(racer.await.expect("joined").expect("second"), Once::Duplicate);
    assert_eq!(rows(&first, &t).await, 1);
    cleanup(&first, &t, &who).await;
}

#[tokio::test]
async fn keys_out_of_bounds_are_refused_and_old_claims_can_be_pruned() {
    let Some(mut c) = client().await else { return };
    let who = consumer();
    let tx = c.transaction().await.expect("begin");
    for (consumer, id, field) in [("", "m", "consumer"), (who.as_str(), "", "message_id")] {
        let e = postgres::claim_message(&tx, consumer, id).await.expect_err("empty");
        assert!(matches!(&e, ArbiterError::Invalid(i) if i.field() == field), "{e}");
    }
    let long = "x".repeat(513);
    assert!(postgres::claim_message(&tx, &who, &long).await.is_err());
    assert!(
        postgres::claim_message(&tx, &who, &"x".repeat(512))
            .await
            .expect("512 bytes")
    );
    assert!(postgres::claim_message(&tx, &who, "old").await.expect("claim"));
    tx.commit().await.expect("commit");
    c.execute(
        "UPDATE leasefence_consumed SET consumed_at = now() - interval '2 hours' WHERE consumer = $1 AND message_id = 'old'",
        &[&who],
    )
    .await
    .expect("age a claim");
    let pruned = postgres::prune_consumed(&c, &who, Duration::from_secs(3600))
        .await
        .expect("prune");
    assert_eq!(pruned, 1);
    let left: i64 = c
        .query_one("SELECT count(*) FROM leasefence_consumed WHERE consumer = $1", &[&who])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 1, "the recent claim stays");
    cleanup_claims(&c, &who).await;
}

/// An install of version 3 (no `leasefence_consumed`) upgrades to 4.
#[tokio::test]
async fn installing_over_version_3_adds_the_consumed_table() {
    let Some(mut c) = client().await else { return };
    let (schema, s) = own_install(&mut c, "lf_dedup_install").await;
    c.batch_execute(&format!(
        "DROP TABLE {schema}.leasefence_consumed;
         UPDATE {schema}.leasefence_schema_version SET version = 3 WHERE component = 'arbiter'"
    ))
    .await
    .expect("simulate version 3");
    let tx = c.transaction().await.expect("begin");
    let missing = s.claim_message(&tx, "c", "m").await;
    assert!(matches!(missing, Err(ArbiterError::NotInstalled { .. })), "{missing:?}");
    drop(tx);
    s.install(&mut c).await.expect("upgrade");
    assert_eq!(
        s.installed_version(&c).await.expect("version"),
        Some(postgres::SCHEMA_VERSION)
    );
    let tx = c.transaction().await.expect("begin");
    assert!(s.claim_message(&tx, "c", "m").await.expect("claim after upgrade"));
    drop(tx);
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop schema");
}
