//! Signed fences in Redis: the Functions library (its SHA-256 and HMAC in
//! Lua, checked against the Rust ones) and the module, on a throwaway
//! `redis-server` of their own (their keys then bind no other test). The
//! module is the `.so` in `LEASEFENCE_TEST_REDIS_MODULE_SO` (`.ci/run` sets it).

#[macro_use]
mod common;
#[macro_use]
mod redis_common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{fence, splitmix, unique_resource};
use leasefence_arbiter::redis::{self as lf, Via};
use leasefence_arbiter::targets::RedisTarget;
use leasefence_arbiter::{ArbiterError, Fence, FenceKey, FenceMode, ResourceId, SignatureError, Token, Verifier};
use redis_common::server::{Server, redis_server_available};

const MODULE_SO: &str = "LEASEFENCE_TEST_REDIS_MODULE_SO";

/// The module's `.so`; unset: fails under `CI=true`, else skipped.
fn module_so() -> Option<PathBuf> {
    common::service_url(MODULE_SO).map(PathBuf::from)
}

/// A server with the library installed and, when `with_module`, the module
/// loaded (`None`: skipped).
async fn server(with_module: bool) -> Option<(Server, tempfile::TempDir)> {
    if !redis_server_available() {
        return None;
    }
    let module = if with_module { Some(module_so()?) } else { None };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), module.as_deref(), &["--save", "", "--appendonly", "no"]);
    lf::install_url(&server.url()).await.expect("install the library");
    Some((server, dir))
}

async fn signed_target(verifier: Verifier, via: Via) -> Option<(Arc<RedisTarget>, (Server, tempfile::TempDir))> {
    let (server, dir) = server(via == Via::Module).await?;
    let mut c = lf::connect(&server.url()).await.expect("connect");
    for key in verifier.keys() {
        via.add_fence_key(&mut c, key).await.expect("add key");
    }
    let t = RedisTarget::connect_via(&server.url(), via).await.expect("target");
    Some((Arc::new(t), (server, dir)))
}

mod suite {
    use super::*;
    signed_fences_test!(signed_fences_library, |v| signed_target(v, Via::Functions));
    signed_fences_test!(signed_fences_module, |v| signed_target(v, Via::Module));
}

/// A resource of `len` bytes of varied text: ASCII, two-, three- and
/// four-byte UTF-8.
fn random_resource(seed: &mut u64, len: usize) -> ResourceId {
    const PIECES: [&str; 8] = ["a", "Z", "/", " ", "é", "ß", "日", "🦀"];
    let mut s = String::new();
    while s.len() < len {
        let piece = PIECES[(splitmix(seed) % PIECES.len() as u64) as usize];
        if s.len() + piece.len() > len {
            break;
        }
        s.push_str(piece);
    }
    if s.is_empty() {
        s.push('r');
    }
    ResourceId::new(&s).expect("valid resource")
}

/// The library's HMAC-SHA256 (SHA-256 on Lua numbers with the bit library)
/// equals the Rust one on 600 random fences: resources of 1 to 512 bytes
/// (every message length modulo 64, so every padding case, and up to nine
/// SHA-256 blocks), multi-byte UTF-8, tokens across the u64 range, random keys.
#[tokio::test]
async fn the_library_hmac_matches_the_rust_one() {
    let Some((server, _dir)) = server(false).await else {
        return;
    };
    let mut c = lf::connect(&server.url()).await.expect("connect");
    let mut seed = getrandom::u64().expect("os randomness");
    eprintln!("seed {seed}");
    for i in 0..600usize {
        let mut secret = [0u8; 32];
        for chunk in secret.chunks_mut(8) {
            chunk.copy_from_slice(&splitmix(&mut seed).to_le_bytes());
        }
        let key = FenceKey::new(&format!("k{}", i % 7), secret).expect("key");
        let len = if i < 512 {
            i + 1
        } else {
            (splitmix(&mut seed) % 512 + 1) as usize
        };
        let token = Token::new(splitmix(&mut seed) >> (i % 64)).unwrap_or(Token::FIRST);
        let f = Fence::new(random_resource(&mut seed, len), token);
        let message = leasefence_core::signing::signed_message(key.id(), &f);
        let line = key.to_line();
        let hex = line.split_once(':').map(|(_, h)| h).expect("key line");
        let lua: String = redis::cmd("FCALL_RO")
            .arg("leasefence_hmac")
            .arg(0)
            .arg(hex)
            .arg(&message)
            .query_async(&mut c)
            .await
            .expect("hmac");
        assert_eq!(
            format!("v1.{}.{lua}", key.id()),
            key.sign(&f),
            "case {i} (seed {seed}): message of {} bytes",
            message.len()
        );
    }
}

fn key(id: &str, byte: u8) -> FenceKey {
    FenceKey::new(id, [byte; 32]).expect("valid key")
}

/// Both flavours: two keys at most, a reinstall keeps them (the library
/// holds them in its code), the last one removed turns the check off.
#[tokio::test]
async fn keys_rotate_two_at_most_survive_a_reinstall_and_the_last_removed_turns_checks_off() {
    let Some((server, _dir)) = server(module_so().is_some()).await else {
        return;
    };
    let mut c = lf::connect(&server.url()).await.expect("connect");
    let has_module = lf::module_loaded(&mut c).await.is_ok();
    let vias: &[Via] = if has_module {
        &[Via::Functions, Via::Module]
    } else {
        &[Via::Functions]
    };
    for &via in vias {
        let r = unique_resource("redis keys");
        let data = format!("test:{{{r}}}:v");
        via.add_fence_key(&mut c, &key("a", 1)).await.expect("add a");
        via.add_fence_key(&mut c, &key("a", 1))
            .await
            .expect("adding a again replaces it");
        via.add_fence_key(&mut c, &key("b", 2)).await.expect("add b");
        match via.add_fence_key(&mut c, &key("c", 3)).await {
            Err(ArbiterError::Invalid(i)) => assert!(i.to_string().contains("two keys are installed (a, b)"), "{i}"),
            other => panic!("{via:?}: a third key must be refused, got {other:?}"),
        }
        assert_eq!(via.fence_key_ids(&mut c).await.expect("ids"), ["a", "b"], "{via:?}");
        let res = via.set(&mut c, &fence(&r, 1), FenceMode::Strict, &data, "x").await;
        assert!(
            matches!(
                res,
                Err(ArbiterError::BadSignature {
                    reason: SignatureError::Missing,
                    ..
                })
            ),
            "{via:?}: {res:?}"
        );
        let f = fence(&r, 1);
        let signed = f.clone().with_signature(key("a", 1).sign(&f));
        if via == Via::Functions {
            lf::install(&mut c).await.expect("reinstall");
            assert_eq!(
                via.fence_key_ids(&mut c).await.expect("ids"),
                ["a", "b"],
                "install keeps the keys"
            );
            let res = via.set(&mut c, &fence(&r, 1), FenceMode::Strict, &data, "x").await;
            assert!(matches!(res, Err(ArbiterError::BadSignature { .. })), "{res:?}");
        }
        via.set(&mut c, &signed, FenceMode::Strict, &data, "signed")
            .await
            .expect("signed");
        assert!(via.remove_fence_key(&mut c, "a").await.expect("remove a"));
        assert!(!via.remove_fence_key(&mut c, "a").await.expect("remove a again"));
        assert!(via.remove_fence_key(&mut c, "b").await.expect("remove b"));
        via.set(&mut c, &fence(&r, 2), FenceMode::Strict, &data, "unsigned")
            .await
            .expect("no keys: unsigned fences are admitted again");
        let g64 = "g".repeat(64);
        if via == Via::Module {
            for (id, hex) in [("UPPER", &"0".repeat(64)[..]), ("k", "00"), ("k", &g64[..])] {
                let res: Result<String, _> = redis::cmd("LEASEFENCE.KEY.ADD")
                    .arg(id)
                    .arg(hex)
                    .query_async(&mut c)
                    .await;
                let code = res.as_ref().err().and_then(|e| e.code().map(str::to_string));
                assert_eq!(code.as_deref(), Some("LFINVALID"), "{id} {hex}: {res:?}");
            }
        }
        assert!(via.fence_key_ids(&mut c).await.expect("ids").is_empty(), "{via:?}");
    }
}

/// The module reads its keys from its load arguments.
#[tokio::test]
async fn the_module_loads_its_keys_from_key_files() {
    let Some(so) = module_so() else { return };
    if !redis_server_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key("from-file", 7);
    let file = dir.path().join("fence.key");
    std::fs::write(&file, format!("{}\n", k.to_line())).expect("key file");
    let (so, file) = (so.to_string_lossy().into_owned(), file.to_string_lossy().into_owned());
    let settings = ["--save", "", "--loadmodule", &so, "fence-key-file", &file];
    let server = Server::start(dir.path(), None, &settings);
    let mut c = lf::connect(&server.url()).await.expect("connect");
    assert_eq!(Via::Module.fence_key_ids(&mut c).await.expect("ids"), ["from-file"]);
    let r = unique_resource("module key file");
    let data = format!("test:{{{r}}}:v");
    let res = Via::Module
        .set(&mut c, &fence(&r, 1), FenceMode::Strict, &data, "x")
        .await;
    assert!(matches!(res, Err(ArbiterError::BadSignature { .. })), "{res:?}");
    let f = fence(&r, 1);
    let signed = f.clone().with_signature(k.sign(&f));
    Via::Module
        .set(&mut c, &signed, FenceMode::Strict, &data, "x")
        .await
        .expect("signed");
}
