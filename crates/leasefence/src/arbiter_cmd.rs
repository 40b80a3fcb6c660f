//! `leasefence arbiter install URL`, `leasefence arbiter check URL`,
//! `leasefence arbiter put URL KEY VALUE`, and `leasefence arbiter key
//! add|remove|list URL` (the keys that verify signed fences).
//!
//! `put` is the smallest fenced writer: it takes the fence from the
//! environment (`LEASEFENCE_RESOURCE`, `LEASEFENCE_TOKEN` and, when the
//! coordinator signs fences, `LEASEFENCE_SIGNATURE`, as `leasefence run` sets them) and upserts `KEY = VALUE` into a key/value table through the
//! arbiter, recording every accepted write in a history table in the same
//! transaction. It prints `accepted …` and exits 0, or prints
//! `rejected: stale fencing token …` and exits 5 (stale). Tables, created on
//! first use next to the arbiter's own (install the arbiter first):
//! `leasefence_kv (key, value, resource, token)` and
//! `leasefence_kv_history (seq, key, value, resource, token)`. On Redis
//! (`redis://`, `redis+module://`) it is a fenced `SET KEY VALUE`, without a
//! history; on a gateway (`http://`) a fenced `PUT /objects/KEY` of VALUE.

use clap::{Subcommand, ValueEnum};
use leasefence_arbiter::redis::Via;
use leasefence_arbiter::{ArbiterError, BackendUrl, Fence, FenceMode, KeyChange};
use leasefence_core::{ENV_RESOURCE, ENV_SIGNATURE, ENV_TOKEN, Invalid};

use crate::out::{self, outln};
use crate::{CmdResult, Failure};

#[derive(Subcommand, Debug)]
pub enum ArbiterCommand {
    /// Install (or upgrade) the fence table and functions: postgres://, sqlite://PATH, redis://
    /// (redis+module:// only checks that the module is loaded; http:// that a gateway answers). A Redis that may evict fence
    /// keys (maxmemory-policy allkeys-*) is refused (exit 5); no persistence is a warning.
    Install { url: String },
    /// The pause test kit: prove a real arbiter rejects a paused worker's stale effect.
    Check {
        url: String,
        /// How many grant-pause-takeover-resume trials to run.
        #[arg(long, default_value_t = 100)]
        trials: u32,
    },
    /// Write KEY=VALUE through the arbiter at URL (sqlite://PATH, postgres://…, or a fenced
    /// SET on redis://… or redis+module://…, a PUT on a gateway's http://…), fenced by LEASEFENCE_RESOURCE and
    /// LEASEFENCE_TOKEN. Exit 5 if stale.
    Put {
        url: String,
        key: String,
        value: String,
        /// strict: one write per grant; monotonic: many writes under one grant.
        #[arg(long, value_enum, default_value_t = Mode::Strict)]
        mode: Mode,
    },
    /// The keys that verify signed fences (postgres://, redis://, redis+module://): once one is
    /// installed, the arbiter refuses unsigned and forged fences. Two at most, for a rotation.
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Install the key of a key file (`<key id>:<64 hex digits>`, as given to `serve --fence-key`).
    Add {
        url: String,
        #[arg(long, value_name = "FILE")]
        key_file: std::path::PathBuf,
    },
    /// Remove a key by its id (with the last one gone, fences are no longer checked).
    Remove { url: String, key_id: String },
    /// List the installed key ids.
    List { url: String },
}

/// [`FenceMode`] for the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Strict,
    Monotonic,
}

impl From<Mode> for FenceMode {
    fn from(m: Mode) -> FenceMode {
        match m {
            Mode::Strict => FenceMode::Strict,
            Mode::Monotonic => FenceMode::Monotonic,
        }
    }
}

fn failure(e: ArbiterError) -> Failure {
    match e {
        ArbiterError::Invalid(_) => Failure::new(Failure::INVALID, e),
        // A server that can lose fences (Redis evicting fence keys): the
        // check failed before any trial.
        ArbiterError::UnsafeSettings { .. } => Failure::new(Failure::CHECK_FAILED, e),
        ArbiterError::BadSignature { .. } => {
            // The failure is reported either way; a stdout that cannot take
            // this line adds nothing to it.
            let _ = out::line(format_args!("refused: {e}"));
            Failure::new(Failure::CHECK_FAILED, e)
        }
        ArbiterError::Stale(s) => {
            let _ = out::line(format_args!("rejected: {s}"));
            Failure::new(
                Failure::CHECK_FAILED,
                anyhow::anyhow!("the arbiter rejected the write: {s}"),
            )
        }
        other => Failure::new(Failure::INTERNAL, other),
    }
}

pub async fn run(c: ArbiterCommand) -> CmdResult {
    match c {
        ArbiterCommand::Install { url } => {
            let installed = leasefence_arbiter::install(&url).await.map_err(failure)?;
            warn(&installed.warnings);
            outln!("installed the leasefence arbiter: {installed}")?;
            Ok(())
        }
        ArbiterCommand::Check { url, trials } => check(&url, trials).await,
        ArbiterCommand::Put { url, key, value, mode } => {
            let fence = fence_from_env()?;
            put(&url, &fence, mode.into(), &key, &value).await.map_err(failure)?;
            outln!("accepted {key} under {fence}")?;
            Ok(())
        }
        ArbiterCommand::Key(k) => key(k).await,
    }
}

async fn key(k: KeyCommand) -> CmdResult {
    let (url, loaded);
    let change = match &k {
        KeyCommand::Add { url: u, key_file } => {
            loaded = crate::gateway_cmd::read_key_file(key_file, "--key-file")?;
            url = u;
            KeyChange::Add(&loaded)
        }
        KeyCommand::Remove { url: u, key_id } => {
            url = u;
            KeyChange::Remove(key_id)
        }
        KeyCommand::List { url: u } => {
            url = u;
            KeyChange::List
        }
    };
    let (changed, ids) = leasefence_arbiter::fence_keys(url, change).await.map_err(failure)?;
    match change {
        KeyChange::Add(key) => outln!("installed fence key {}", key.id())?,
        KeyChange::Remove(id) if changed => outln!("removed fence key {id}")?,
        KeyChange::Remove(id) => outln!("no fence key {id} was installed")?,
        KeyChange::List => {}
    }
    if ids.is_empty() {
        outln!("no fence keys: fences are not checked")?;
    } else {
        outln!("fence keys: {}", ids.join(", "))?;
    }
    Ok(())
}

async fn check(url: &str, trials: u32) -> CmdResult {
    let report = leasefence_arbiter::check(url, trials).await.map_err(failure)?;
    warn(&report.warnings);
    for c in &report.counterexamples {
        outln!(
            "counterexample: trial {} on {}: paused token {}, newer token {}: {}",
            c.trial,
            c.resource,
            c.paused_token,
            c.newer_token,
            c.what
        )?;
    }
    outln!(
        "{} trials, {} stale accepted, {} stale rejected",
        report.trials,
        report.stale_accepted,
        report.stale_rejected
    )?;
    if report.passed() {
        Ok(())
    } else {
        Err(Failure::new(
            Failure::CHECK_FAILED,
            anyhow::anyhow!("the arbiter accepted stale effects"),
        ))
    }
}

/// Settings of the backend that can lose fences (Redis without persistence,
/// a CONFIG that could not be read): printed, never fatal.
fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// The fence `leasefence run` put in this process's environment.
fn fence_from_env() -> Result<Fence, Failure> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| {
            Failure::invalid(format!(
                "{name} is not set: run this under `leasefence run`, or set {ENV_RESOURCE} and {ENV_TOKEN}"
            ))
        })
    };
    let fence = Fence::from_parts(&var(ENV_RESOURCE)?, &var(ENV_TOKEN)?).map_err(Failure::invalid)?;
    Ok(match std::env::var(ENV_SIGNATURE) {
        Ok(s) if !s.is_empty() => fence.with_signature(s),
        _ => fence,
    })
}

fn token_i64(fence: &Fence) -> Result<i64, ArbiterError> {
    i64::try_from(fence.token.get())
        .map_err(|_| Invalid::new("token", format!("{} does not fit a signed 64-bit integer", fence.token)).into())
}

async fn put(url: &str, fence: &Fence, mode: FenceMode, key: &str, value: &str) -> Result<(), ArbiterError> {
    match BackendUrl::parse(url)? {
        BackendUrl::Sqlite(path) => {
            let (fence, key, value) = (fence.clone(), key.to_string(), value.to_string());
            tokio::task::spawn_blocking(move || sqlite_put(&path, &fence, mode, &key, &value))
                .await
                .map_err(|e| ArbiterError::Task(format!("SQLite write task failed: {e}")))?
        }
        BackendUrl::Postgres(u) => postgres_put(&u, fence, mode, key, value).await,
        BackendUrl::Redis(u) => redis_put(&u, Via::Functions, fence, mode, key, value).await,
        BackendUrl::RedisModule(u) => redis_put(&u, Via::Module, fence, mode, key, value).await,
        BackendUrl::Gateway(u) => {
            let body = value.as_bytes().to_vec();
            leasefence_arbiter::gateway::client::put(&u, fence, mode, key, body)
                .await
                .map(drop)
        }
    }
}

async fn redis_put(
    url: &str,
    via: Via,
    fence: &Fence,
    mode: FenceMode,
    key: &str,
    value: &str,
) -> Result<(), ArbiterError> {
    let mut conn = leasefence_arbiter::redis::connect(url).await?;
    via.set(&mut conn, fence, mode, key, value).await
}

const SQLITE_KV: &str = "
CREATE TABLE IF NOT EXISTS leasefence_kv (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, resource TEXT NOT NULL, token INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS leasefence_kv_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, value TEXT NOT NULL,
    resource TEXT NOT NULL, token INTEGER NOT NULL) STRICT;";

const UPSERT: &str = "INSERT INTO leasefence_kv (key, value, resource, token) VALUES ($1, $2, $3, $4)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value, resource = excluded.resource, token = excluded.token";
const HISTORY: &str = "INSERT INTO leasefence_kv_history (key, value, resource, token) VALUES ($1, $2, $3, $4)";

fn sqlite_put(
    path: &std::path::Path,
    fence: &Fence,
    mode: FenceMode,
    key: &str,
    value: &str,
) -> Result<(), ArbiterError> {
    let mut conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let token = token_i64(fence)?;
    leasefence_arbiter::sqlite::with_fence(&mut conn, fence, mode, |tx| {
        tx.execute_batch(SQLITE_KV)?;
        let args = rusqlite::params![key, value, fence.resource.as_str(), token];
        tx.execute(UPSERT, args)?;
        tx.execute(HISTORY, args)?;
        Ok::<_, ArbiterError>(())
    })
}

const POSTGRES_KV: &str = "
CREATE TABLE IF NOT EXISTS leasefence_kv (
    key text PRIMARY KEY, value text NOT NULL, resource text NOT NULL, token bigint NOT NULL);
CREATE TABLE IF NOT EXISTS leasefence_kv_history (
    seq bigserial PRIMARY KEY, key text NOT NULL, value text NOT NULL,
    resource text NOT NULL, token bigint NOT NULL);";

async fn postgres_put(url: &str, fence: &Fence, mode: FenceMode, key: &str, value: &str) -> Result<(), ArbiterError> {
    let mut client = leasefence_arbiter::postgres::connect(url).await?;
    let token = token_i64(fence)?;
    let resource = fence.resource.as_str().to_string();
    let (key, value) = (key.to_string(), value.to_string());
    leasefence_arbiter::postgres::with_fence(&mut client, fence, mode, move |tx| {
        Box::pin(async move {
            tx.batch_execute(POSTGRES_KV).await?;
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&key, &value, &resource, &token];
            tx.execute(UPSERT, &args).await?;
            tx.execute(HISTORY, &args).await?;
            Ok::<_, ArbiterError>(())
        })
    })
    .await
}
