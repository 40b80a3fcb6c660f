//! What the NATS and RabbitMQ consumer tests share: a PostgreSQL table the
//! handlers apply effects to (fenced through the arbiter, or not at all for
//! the control), the checker that finds stale and repeated effects in it,
//! the trial plan, and the process-wide metrics recorder. The arbiter is the
//! one in `public`, or ([`signed`]) a keyed one in a schema of its own.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::FutureExt;
use leasefence_arbiter::postgres::{self, Once, Schema};
use leasefence_arbiter::queue::{self, HandleError, Handled, Message};
use leasefence_arbiter::{ArbiterError, Fence, FenceKey, ResourceId, SignatureError, Stale, Token};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Mutex as AsyncMutex;

use crate::common::{self, POSTGRES_URL};

pub mod scenarios;
pub mod signed;

pub const NATS_URL: &str = "LEASEFENCE_TEST_NATS_URL";
pub const AMQP_URL: &str = "LEASEFENCE_TEST_AMQP_URL";

/// A random lowercase hex name part.
pub fn hex() -> String {
    format!("{:016x}", getrandom::u64().expect("os randomness"))
}

/// The recorder of this test binary (installed once; tests tell their
/// counters apart by their own `queue` label).
pub fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder of this binary");
        snapshotter
    })
}

/// The value of counter `name` labelled `queue`, 0 if never incremented.
/// A snapshot resets every counter it reads, so the totals of all
/// snapshots are kept here, for every test of the binary.
pub fn counter(name: &str, queue: &str) -> u64 {
    static TOTALS: Mutex<Vec<(String, String, u64)>> = Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().expect("lock");
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let DebugValue::Counter(n) = value else { continue };
        let Some(label) = key.key().labels().find(|l| l.key() == "queue") else {
            continue;
        };
        let (metric, label) = (key.key().name().to_owned(), label.value().to_owned());
        match totals.iter_mut().find(|(m, q, _)| *m == metric && *q == label) {
            Some(slot) => slot.2 += n,
            None => totals.push((metric, label, n)),
        }
    }
    totals
        .iter()
        .find(|(m, q, _)| m == name && q == queue)
        .map_or(0, |(.., n)| *n)
}

/// One applied effect, as the table holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    pub resource: String,
    pub token: u64,
    pub message_id: String,
}

pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Handled, HandleError>> + Send>>;

/// The effects table (fresh per test) and the consumer name its dedup rows
/// are kept under; `cleanup` drops both and the test's fence rows (and a
/// keyed arbiter's whole schema).
pub struct Effects {
    client: AsyncMutex<tokio_postgres::Client>,
    /// Where the arbiter the handler applies through is installed.
    schema: Schema,
    pub table: String,
    pub consumer: String,
    /// Resources of this test start with it.
    pub prefix: String,
    /// Handler calls so far.
    pub calls: AtomicU64,
    /// Message ids whose first delivery applies and then "loses its ack"
    /// (the handler answers Retry), as when a consumer dies before acking.
    pub lose_first_ack: Mutex<Vec<String>>,
    /// Message ids whose first delivery fails before applying anything (the
    /// consumer briefly cannot reach its database): the handler answers
    /// Retry and the broker delivers the message again later.
    pub fail_first: Mutex<Vec<String>>,
    /// The signature refusals the arbiter answered, as (message id, reason),
    /// one per delivery refused.
    pub refused: Mutex<Vec<(String, SignatureError)>>,
    /// A key the handler installs in the arbiter after its first
    /// `unknown_key` refusal, as an operator finishing a rotation would.
    pub install_after_unknown_key: Mutex<Option<FenceKey>>,
}

impl Effects {
    /// `None`: no PostgreSQL configured (skipped, or failed under CI).
    pub async fn new(name: &str) -> Option<Arc<Effects>> {
        let url = common::service_url(POSTGRES_URL)?;
        snapshotter(); // before anything counts
        let mut client = postgres::connect(&url).await.expect("connect");
        postgres::install(&mut client).await.expect("install");
        Some(Arc::new(Effects::on(client, Schema::PUBLIC, name).await))
    }

    /// The effects table for a test called `name`, applied through the
    /// arbiter installed in `schema`.
    async fn on(client: tokio_postgres::Client, schema: Schema, name: &str) -> Effects {
        let id = hex();
        let table = format!("lf_queue_effects_{id}");
        client
            .batch_execute(&format!(
                "CREATE TABLE {table} (seq bigserial PRIMARY KEY, resource text NOT NULL, \
                 token bigint NOT NULL, message_id text NOT NULL)"
            ))
            .await
            .expect("effects table");
        Effects {
            client: AsyncMutex::new(client),
            schema,
            table,
            consumer: format!("test-{name}-{id}"),
            prefix: format!("test/queue/{name}/{id}"),
            calls: AtomicU64::new(0),
            lose_first_ack: Mutex::new(Vec::new()),
            fail_first: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
            install_after_unknown_key: Mutex::new(None),
        }
    }

    pub fn resource(&self, i: usize) -> ResourceId {
        ResourceId::new(&format!("{}/{i}", self.prefix)).expect("valid resource")
    }

    /// A handler that applies each message's effect through the PostgreSQL
    /// arbiter (monotonic, deduplicated by message id; a signature refusal
    /// is recorded in `refused` and returned as it came), or, with
    /// `fenced: false`, the control: the same insert with no fence and no
    /// dedup, as a consumer that does not check tokens would.
    pub fn handler(self: &Arc<Self>, fenced: bool) -> impl Fn(Fence, Message) -> HandlerFuture + use<> {
        let fx = self.clone();
        move |fence: Fence, message: Message| {
            let fx = fx.clone();
            Box::pin(async move {
                fx.calls.fetch_add(1, Ordering::SeqCst);
                let id = message
                    .id
                    .clone()
                    .ok_or_else(|| HandleError::Poison("no message id".into()))?;
                if !message.redelivered && fx.fail_first.lock().expect("lock").contains(&id) {
                    return Err(HandleError::Retry("test: the database is briefly unreachable".into()));
                }
                let handled = if fenced {
                    let applied = fx.apply_fenced(&fence, &id).await;
                    if let Err(ArbiterError::BadSignature { reason, .. }) = &applied {
                        fx.refused.lock().expect("lock").push((id.clone(), reason.clone()));
                        if matches!(reason, SignatureError::UnknownKey(_)) {
                            fx.install_pending_key().await;
                        }
                    }
                    applied?
                } else {
                    fx.apply_plain(&fence, &id).await?
                };
                let lose = !message.redelivered && fx.lose_first_ack.lock().expect("lock").contains(&id);
                if lose && handled == Handled::Applied {
                    return Err(HandleError::Retry("test: the ack of an applied message is lost".into()));
                }
                Ok(handled)
            })
        }
    }

    /// Installs the key of `install_after_unknown_key`, once.
    async fn install_pending_key(&self) {
        let key = self.install_after_unknown_key.lock().expect("lock").take();
        if let Some(key) = key {
            let client = self.client.lock().await;
            self.schema.add_fence_key(&*client, &key).await.expect("add key");
        }
    }

    async fn apply_fenced(&self, fence: &Fence, id: &str) -> Result<Handled, ArbiterError> {
        let mut client = self.client.lock().await;
        let insert = format!(
            "INSERT INTO {} (resource, token, message_id) VALUES ($1, $2, $3)",
            self.table
        );
        let (resource, token) = (fence.resource.as_str().to_owned(), fence.token.get() as i64);
        let id_owned = id.to_owned();
        let once = self
            .schema
            .with_fence_once(&mut client, &self.consumer, id, fence, queue::MODE, |tx| {
                Box::pin(async move {
                    tx.execute(&insert, &[&resource, &token, &id_owned]).await?;
                    Ok::<_, ArbiterError>(())
                })
            })
            .await?;
        Ok(match once {
            Once::Applied(()) => Handled::Applied,
            Once::Duplicate => Handled::Duplicate,
        })
    }

    async fn apply_plain(&self, fence: &Fence, id: &str) -> Result<Handled, ArbiterError> {
        let client = self.client.lock().await;
        let insert = format!(
            "INSERT INTO {} (resource, token, message_id) VALUES ($1, $2, $3)",
            self.table
        );
        let token = fence.token.get() as i64;
        client
            .execute(&insert, &[&fence.resource.as_str(), &token, &id])
            .await?;
        Ok(Handled::Applied)
    }

    /// Every effect, in the order applied.
    pub async fn effects(&self) -> Vec<Effect> {
        let client = self.client.lock().await;
        let sql = format!("SELECT resource, token, message_id FROM {} ORDER BY seq", self.table);
        let rows = client.query(&sql, &[]).await.expect("effects");
        rows.iter()
            .map(|r| Effect {
                resource: r.get(0),
                token: r.get::<_, i64>(1) as u64,
                message_id: r.get(2),
            })
            .collect()
    }

    /// The token the arbiter recorded for `resource`, `None` if it admitted
    /// none.
    pub async fn last_token(&self, resource: &ResourceId) -> Option<Token> {
        let client = self.client.lock().await;
        self.schema.last_token(&*client, resource).await.expect("last token")
    }

    /// A future that completes once the handler has been called `n` times:
    /// the consumer's shutdown signal.
    pub fn after_calls(self: &Arc<Self>, n: u64) -> impl Future<Output = ()> + use<> {
        let fx = self.clone();
        async move {
            while fx.calls.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    pub async fn cleanup(&self) {
        let client = self.client.lock().await;
        client
            .batch_execute(&format!("DROP TABLE {}", self.table))
            .await
            .expect("drop effects");
        client
            .execute("DELETE FROM leasefence_consumed WHERE consumer = $1", &[&self.consumer])
            .await
            .expect("delete claims");
        let like = format!("{}/%", self.prefix);
        client
            .execute("DELETE FROM leasefence_fences WHERE resource LIKE $1", &[&like])
            .await
            .expect("delete fences");
        if self.schema != Schema::PUBLIC {
            let drop = format!("DROP SCHEMA \"{}\" CASCADE", self.schema.name());
            client.batch_execute(&drop).await.expect("drop the keyed schema");
        }
    }
}

/// Runs a test's `body`, then its `cleanup` whether the body passed or
/// panicked, so a failing test does not leave its table, schema, stream or
/// queue behind; a panic is raised again after the cleanup.
pub async fn cleaned<T>(body: impl Future<Output = T>, cleanup: impl Future<Output = ()>) -> T {
    let outcome = AssertUnwindSafe(body).catch_unwind().await;
    cleanup.await;
    match outcome {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// What the effects show: effects applied after an effect of a higher token
/// on their resource (stale), and messages applied more than once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Check {
    pub effects: usize,
    pub stale: usize,
    pub repeated: usize,
}

pub fn check(effects: &[Effect]) -> Check {
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut out = Check {
        effects: effects.len(),
        ..Check::default()
    };
    for e in effects {
        let top = highest.entry(&e.resource).or_insert(e.token);
        if e.token < *top {
            out.stale += 1;
        }
        *top = (*top).max(e.token);
        let n = seen.entry(&e.message_id).or_insert(0);
        *n += 1;
        if *n > 1 {
            out.repeated += 1;
        }
    }
    out
}

/// One message of a trial plan.
#[derive(Clone, Debug)]
pub struct Planned {
    pub fence: Fence,
    pub id: String,
    /// Published by the holder of the older grant.
    pub old_holder: bool,
}

/// The trials, in publish order: in each, holder B (token t+1) publishes
/// 1..=3 messages and holder A (token t), paused after its grant, publishes
/// its one message at a random place among them — first (then it is
/// current when applied) or after some of B's (then it is stale). One
/// trial in three also loses the ack of one of B's messages after it was
/// applied, so it is delivered again.
pub fn plan(fx: &Effects, trials: usize, seed: u64) -> Plan {
    let mut state = seed;
    let mut messages = Vec::new();
    let mut lost = Vec::new();
    let mut stale = 0;
    for i in 0..trials {
        let r = fx.resource(i);
        let t = 1 + common::splitmix(&mut state) % 1_000_000;
        let b_count = 1 + (common::splitmix(&mut state) % 3) as usize;
        let a_at = (common::splitmix(&mut state) % (b_count as u64 + 1)) as usize;
        if a_at > 0 {
            stale += 1;
        }
        let fence = |token: u64| Fence::new(r.clone(), Token::new(token).expect("non-zero"));
        let mut trial: Vec<Planned> = (0..b_count)
            .map(|j| Planned {
                fence: fence(t + 1),
                id: format!("{}-{i}-b{j}", fx.consumer),
                old_holder: false,
            })
            .collect();
        trial.insert(
            a_at,
            Planned {
                fence: fence(t),
                id: format!("{}-{i}-a", fx.consumer),
                old_holder: true,
            },
        );
        if common::splitmix(&mut state).is_multiple_of(3) {
            let j = common::splitmix(&mut state) as usize % b_count;
            lost.push(format!("{}-{i}-b{j}", fx.consumer));
        }
        messages.extend(trial);
    }
    let calls = messages.len() as u64 + lost.len() as u64;
    Plan {
        messages,
        lost,
        calls,
        stale,
    }
}

pub struct Plan {
    /// In publish order.
    pub messages: Vec<Planned>,
    /// Ids whose first delivery applies and then loses its ack.
    pub lost: Vec<String>,
    /// Handler calls the plan makes: one per message, one more per lost ack.
    pub calls: u64,
    /// Trials whose old holder publishes after the new one: stale messages.
    pub stale: u64,
}

/// Collects what `on_stale` is handed.
pub fn stale_sink() -> (Arc<Mutex<Vec<Stale>>>, impl Fn(&Stale) + Send + Sync + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (seen, move |s: &Stale| sink.lock().expect("lock").push(s.clone()))
}
