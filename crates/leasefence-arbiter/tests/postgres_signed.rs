//! Signed fences in PostgreSQL, against the real server in
//! `LEASEFENCE_TEST_POSTGRES_URL`: the signature is checked inside the
//! database by a trigger on the fence table, whichever path writes it. Each
//! test installs into a schema of its own, so its keys bind no other test.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{POSTGRES_URL, fence, service_url, unique_resource};
use leasefence_arbiter::postgres::{self, Schema};
use leasefence_arbiter::targets::PostgresTarget;
use leasefence_arbiter::{ArbiterError, FenceKey, FenceMode, SignatureError, Verifier};
use tokio_postgres::IsolationLevel;

/// A fresh schema with the arbiter installed (pgcrypto is created in
/// `public` first, so that dropping the schema leaves it to other installs).
async fn fresh_schema(url: &str) -> (tokio_postgres::Client, Schema) {
    let mut c = postgres::connect(url).await.expect("connect");
    let name = format!("lf_signed_{:016x}", getrandom::u64().expect("os randomness"));
    common::pgcrypto_in_public(&mut c).await;
    c.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("schema");
    let s = Schema::new(&name).expect("valid name");
    s.install(&mut c).await.expect("install");
    (c, s)
}

/// Drops the schema when the test ends.
struct DropSchema(String, String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let (url, name) = (self.0.clone(), self.1.clone());
        // A runtime of its own: the test's is shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(c) = postgres::connect(&url).await {
                        let _ = c.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await;
                    }
                });
            }
        })
        .join();
    }
}

/// A target on a fresh schema holding `verifier`'s keys, admitting by `path`.
async fn signed_target(verifier: Verifier, path: &str) -> Option<(Arc<PostgresTarget>, DropSchema)> {
    let url = service_url(POSTGRES_URL)?;
    let (c, s) = fresh_schema(&url).await;
    for key in verifier.keys() {
        s.add_fence_key(&c, key).await.expect("add key");
    }
    let guard = DropSchema(url.clone(), s.name().to_string());
    let target = PostgresTarget::connect_in(&url, IsolationLevel::ReadCommitted, s)
        .await
        .expect("target");
    let target = match path {
        "prepared" => target.with_prepared_admit(),
        "folded" => target.with_folded_fence(),
        _ => target,
    };
    Some((Arc::new(target), guard))
}

mod suite {
    use super::*;
    signed_fences_test!(signed_fences_unnamed, |v| signed_target(v, "unnamed"));
    signed_fences_test!(signed_fences_prepared, |v| signed_target(v, "prepared"));
    signed_fences_test!(signed_fences_folded, |v| signed_target(v, "folded"));
}

fn key(id: &str, byte: u8) -> FenceKey {
    FenceKey::new(id, [byte; 32]).expect("valid key")
}

/// At most two keys; removing the last one turns the check off again; the
/// key table and the key functions are the installer's alone.
#[tokio::test]
async fn keys_rotate_two_at_most_and_the_last_one_removed_turns_checks_off() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let (c, s) = fresh_schema(&url).await;
    let _guard = DropSchema(url.clone(), s.name().to_string());
    let r = unique_resource("pg-keys");
    let (a, b) = (key("a", 1), key("b", 2));
    s.add_fence_key(&c, &a).await.expect("add a");
    s.add_fence_key(&c, &a).await.expect("adding a again replaces it");
    s.add_fence_key(&c, &b).await.expect("add b");
    let third = s.add_fence_key(&c, &key("c", 3)).await;
    match third {
        Err(ArbiterError::Invalid(i)) => assert!(i.to_string().contains("two keys are installed (a, b)"), "{i}"),
        other => panic!("a third key must be refused, got {other:?}"),
    }
    assert_eq!(s.fence_key_ids(&c).await.expect("ids"), ["a", "b"]);
    let bad = s.add_fence_key(&c, &key("c", 3)).await;
    assert!(matches!(bad, Err(ArbiterError::Invalid(_))), "{bad:?}");

    let mut c = c;
    let tx = c.transaction().await.expect("begin");
    let res = s.admit(&tx, &fence(&r, 1), FenceMode::Strict).await;
    assert!(
        matches!(
            res,
            Err(ArbiterError::BadSignature {
                reason: SignatureError::Missing,
                ..
            })
        ),
        "{res:?}"
    );
    drop(tx);
    assert!(s.remove_fence_key(&c, "a").await.expect("remove a"));
    assert!(!s.remove_fence_key(&c, "a").await.expect("remove a again"));
    assert!(s.remove_fence_key(&c, "b").await.expect("remove b"));
    let tx = c.transaction().await.expect("begin");
    s.admit(&tx, &fence(&r, 1), FenceMode::Strict)
        .await
        .expect("no keys: unsigned fences are admitted again");
    tx.commit().await.expect("commit");
    assert_eq!(s.last_token(&c, &r).await.expect("last").map(|t| t.get()), Some(1));

    // Privileges: PUBLIC may neither read the keys nor call the functions
    // that change them.
    let privileges: (bool, bool, bool) = {
        let row = c
            .query_one(
                &format!(
                    "SELECT has_table_privilege('public', '{n}.leasefence_fence_keys', 'SELECT'),
                            has_function_privilege('public', '{n}.leasefence_fence_key_add(text, bytea)', 'EXECUTE'),
                            has_function_privilege('public', '{n}.leasefence_fence_key_remove(text)', 'EXECUTE')",
                    n = s.name()
                ),
                &[],
            )
            .await
            .expect("privileges");
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(privileges, (false, false, false));
}

/// A fence written by hand, bypassing the helpers, is checked too: the
/// trigger guards the table, not a function. And the signature is never
/// stored.
#[tokio::test]
async fn hand_written_sql_cannot_bypass_the_check_and_no_signature_is_stored() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let (c, s) = fresh_schema(&url).await;
    let _guard = DropSchema(url.clone(), s.name().to_string());
    let k = key("k1", 9);
    s.add_fence_key(&c, &k).await.expect("add");
    let r = unique_resource("pg-by-hand");
    let f = fence(&r, 5);
    let sig = k.sign(&f);
    let n = s.name();
    c.execute(
        &format!("SELECT {n}.leasefence_admit($1, 5, 'strict', $2)"),
        &[&r.as_str(), &sig],
    )
    .await
    .expect("a signed admit by hand");
    for sql in [
        format!("UPDATE {n}.leasefence_fences SET last_token = 9 WHERE resource = $1"),
        format!("INSERT INTO {n}.leasefence_fences (resource, last_token, mode) VALUES ($1 || 'x', 9, 'strict')"),
        format!(
            "UPDATE {n}.leasefence_fences SET last_token = 9, signature = 'v1.k1.{}' WHERE resource = $1",
            "0".repeat(64)
        ),
    ] {
        let e = c.execute(&sql, &[&r.as_str()]).await.expect_err(&sql);
        let code = e.code().map(|c| c.code().to_string());
        assert_eq!(code.as_deref(), Some(postgres::SQLSTATE_BAD_SIGNATURE), "{sql}: {e}");
    }
    let row = c
        .query_one(
            &format!("SELECT last_token, signature FROM {n}.leasefence_fences WHERE resource = $1"),
            &[&r.as_str()],
        )
        .await
        .expect("row");
    let (last, stored): (i64, Option<String>) = (row.get(0), row.get(1));
    assert_eq!((last, stored), (5, None));
    // The unsigned fold of a caller's own statement is refused as well.
    let folded = s.fold_fence("SELECT 1", 0).expect("folds");
    let e = c
        .execute(&folded, &[&r.as_str(), &6_i64, &"strict"])
        .await
        .expect_err("unsigned fold");
    assert_eq!(
        e.code().map(|c| c.code()),
        Some(postgres::SQLSTATE_BAD_SIGNATURE),
        "{e}"
    );
}

/// An arbiter installed by version 4 upgrades in place: the fence rows stay,
/// callers of the three-argument `leasefence_admit` keep working, and the
/// upgrade can run again.
#[tokio::test]
async fn version_4_upgrades_and_old_callers_keep_working() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let mut c = postgres::connect(&url).await.expect("connect");
    let name = format!("lf_v4_{:016x}", getrandom::u64().expect("os randomness"));
    common::pgcrypto_in_public(&mut c).await;
    c.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("schema");
    let _guard = DropSchema(url.clone(), name.clone());
    let tx = c.transaction().await.expect("begin");
    tx.batch_execute(&format!("SET LOCAL search_path = {name}, pg_temp"))
        .await
        .expect("path");
    tx.batch_execute(include_str!("fixtures/postgres_schema_v4.sql"))
        .await
        .expect("version 4 installs");
    tx.commit().await.expect("commit");
    let r = unique_resource("pg-v4");
    c.execute(
        &format!("SELECT {name}.leasefence_admit($1, 3, 'strict')"),
        &[&r.as_str()],
    )
    .await
    .expect("v4 admit");
    let s = Schema::new(&name).expect("name");
    s.install(&mut c).await.expect("upgrade to 5");
    s.install(&mut c).await.expect("upgrade again");
    assert_eq!(s.installed_version(&c).await.expect("version"), Some(5));
    assert_eq!(s.last_token(&c, &r).await.expect("last").map(|t| t.get()), Some(3));
    // The old three-argument call, typed as old clients send it.
    let stmt = c
        .prepare_typed(
            &format!("SELECT {name}.leasefence_admit($1, $2, $3)"),
            &[
                tokio_postgres::types::Type::TEXT,
                tokio_postgres::types::Type::INT8,
                tokio_postgres::types::Type::TEXT,
            ],
        )
        .await
        .expect("the three-argument call still resolves");
    c.execute(&stmt, &[&r.as_str(), &4_i64, &"strict"])
        .await
        .expect("old caller admits");
    let e = c
        .execute(&stmt, &[&r.as_str(), &4_i64, &"strict"])
        .await
        .expect_err("stale");
    assert_eq!(e.code().map(|c| c.code()), Some(postgres::SQLSTATE_STALE));
    assert_eq!(s.last_token(&c, &r).await.expect("last").map(|t| t.get()), Some(4));
}

/// A role that runs effects (no ownership, no access to the key table)
/// admits signed fences, is refused unsigned ones, and can neither read the
/// keys nor change them: the trigger reads them as its owner.
#[tokio::test]
async fn an_effects_role_verifies_without_reading_or_changing_the_keys() {
    let Some(url) = service_url(POSTGRES_URL) else { return };
    let (admin, s) = fresh_schema(&url).await;
    let _guard = DropSchema(url.clone(), s.name().to_string());
    let k = key("k1", 4);
    s.add_fence_key(&admin, &k).await.expect("add");
    let (n, role) = (
        s.name(),
        format!("lf_effects_{:016x}", getrandom::u64().expect("os randomness")),
    );
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {n} TO {role};
             GRANT SELECT, INSERT, UPDATE ON {n}.leasefence_fences TO {role};"
        ))
        .await
        .expect("role");
    let role_url = url.replacen("postgres@", &format!("{role}@"), 1);
    let outcome = async {
        let c = postgres::connect(&role_url).await.expect("connect as the effects role");
        let r = unique_resource("pg-effects-role");
        let f = fence(&r, 2);
        c.execute(
            &format!("SELECT {n}.leasefence_admit($1, 2, 'strict', $2)"),
            &[&r.as_str(), &k.sign(&f)],
        )
        .await
        .expect("a signed admit as the effects role");
        let e = c
            .execute(&format!("SELECT {n}.leasefence_admit($1, 3)"), &[&r.as_str()])
            .await
            .expect_err("unsigned");
        assert_eq!(
            e.code().map(|c| c.code()),
            Some(postgres::SQLSTATE_BAD_SIGNATURE),
            "{e}"
        );
        for sql in [
            format!("SELECT secret FROM {n}.leasefence_fence_keys"),
            format!("SELECT {n}.leasefence_fence_key_add('x', decode(repeat('00', 32), 'hex'))"),
            format!("SELECT {n}.leasefence_fence_key_remove('k1')"),
            format!("DROP TRIGGER leasefence_fence_signature ON {n}.leasefence_fences"),
        ] {
            let e = c.batch_execute(&sql).await.expect_err(&sql);
            assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{sql}: {e}");
        }
    }
    .await;
    drop(_guard);
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .expect("drop role");
    outcome
}
