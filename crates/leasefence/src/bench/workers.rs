//! What one benchmark client does, per target: connect (its own connection),
//! then run cycles of acquire + release on the resource it is handed.
//!
//! - leasefence: `Acquire` (with a wait when resources are shared) + `Release`.
//! - noop: two `Get`s, the cheapest unary call of our own server, on the same
//!   client and transport: the ceiling a two-call cycle can reach.
//! - With `--transport frames`, leasefence and noop make the same calls over
//!   the frame protocol ([`FrameClient`]).
//! - Redis: `SET key value NX PX ttl` + a Lua compare-and-delete (`EVALSHA`).
//! - etcd: see [`super::etcd`].
//!
//! Redis and etcd have no queue to wait in: on a busy resource they poll
//! every [`POLL`] until [`WAIT`] has passed, as their lock clients do.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use leasefence_client::{Client, FrameClient};
use leasefence_core::ResourceId;

use super::Target;

/// How long an acquire may wait for a busy (shared) resource.
pub const WAIT: Duration = Duration::from_secs(10);
/// The pause between two tries of Redis or etcd on a busy resource.
pub const POLL: Duration = Duration::from_millis(1);
/// The TTL of each leasefence lease and Redis key (released long before).
const TTL: Duration = Duration::from_secs(10);

/// Compare-and-delete: deletes the key only while it holds our value.
const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// Where each target is, as the flags gave it.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub server: Vec<String>,
    pub token: Option<String>,
    /// For an https:// server: `--ca`, `--cert` and `--key`, read.
    pub tls: Option<leasefence_client::ClientTls>,
    pub redis: String,
    /// host:port; read only by a build with the `etcd` feature.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub etcd: String,
    /// leasefence and noop over the frame protocol (`server` is then one `leasefence(s)://` URL).
    pub frames: bool,
}

/// One benchmark client, connected.
pub enum Worker {
    Leasefence {
        client: Client,
        wait: Duration,
    },
    Noop {
        client: Client,
    },
    Frames {
        client: FrameClient,
        wait: Duration,
    },
    FramesNoop {
        client: FrameClient,
    },
    Redis {
        con: redis::aio::MultiplexedConnection,
        unlock: redis::Script,
        value: String,
        seq: u64,
    },
    #[cfg(feature = "etcd")]
    Etcd(Box<super::etcd::EtcdWorker>),
}

impl Worker {
    /// Connects client `id` to `target`. `shared`: resources are contended, so
    /// an acquire waits for a busy one.
    pub async fn connect(
        target: Target,
        ep: &Endpoints,
        id: usize,
        shared: bool,
        segment: Duration,
    ) -> anyhow::Result<Worker> {
        let wait = if shared { WAIT } else { Duration::ZERO };
        Ok(match target {
            Target::Leasefence | Target::Noop => {
                let mut options = leasefence_client::ClientOptions::default();
                if let Some(t) = &ep.token {
                    options = options.with_token(t.clone());
                }
                if let Some(tls) = &ep.tls {
                    options = options.with_tls(tls.clone());
                }
                if ep.frames {
                    let url = ep.server.first().map_or("", String::as_str);
                    let client = FrameClient::connect(url, options)
                        .await
                        .with_context(|| format!("cannot reach the coordinator's frame port at {url}"))?;
                    return Ok(match target {
                        Target::Noop => Worker::FramesNoop { client },
                        _ => Worker::Frames { client, wait },
                    });
                }
                let client = Client::connect_any_with(&ep.server, options)
                    .await
                    .with_context(|| format!("cannot reach the coordinator at {}", ep.server.join(",")))?;
                if target == Target::Noop {
                    Worker::Noop { client }
                } else {
                    Worker::Leasefence { client, wait }
                }
            }
            Target::Redis => {
                let con = redis::Client::open(ep.redis.as_str())
                    .context("--redis")?
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(|| format!("cannot reach Redis at {}", crate::store_url::redact(&ep.redis)))?;
                Worker::Redis {
                    con,
                    unlock: redis::Script::new(UNLOCK),
                    value: format!("{}-{id}", std::process::id()),
                    seq: 0,
                }
            }
            #[cfg(feature = "etcd")]
            Target::Etcd => Worker::Etcd(Box::new(super::etcd::EtcdWorker::connect(&ep.etcd, segment).await?)),
            #[cfg(not(feature = "etcd"))]
            Target::Etcd => {
                let _ = segment;
                bail!("{}", super::plan::ETCD_FEATURE)
            }
        })
    }

    /// One acquire + release of `key` (a resource name, a Redis key, an etcd key).
    pub async fn cycle(&mut self, key: &str) -> anyhow::Result<()> {
        match self {
            Worker::Leasefence { client, wait } => {
                let resource = ResourceId::new(key).map_err(|e| anyhow::anyhow!("{e}"))?;
                let lease = client.acquire(&resource, TTL, None, *wait).await?;
                client.release(&resource, &lease.lease_id).await?;
            }
            Worker::Noop { client } => {
                let resource = ResourceId::new(key).map_err(|e| anyhow::anyhow!("{e}"))?;
                client.status(&resource).await?;
                client.status(&resource).await?;
            }
            Worker::Frames { client, wait } => {
                let resource = ResourceId::new(key).map_err(|e| anyhow::anyhow!("{e}"))?;
                let lease = client.acquire(&resource, TTL, None, *wait).await?;
                client.release(&resource, &lease.lease_id).await?;
            }
            Worker::FramesNoop { client } => {
                let resource = ResourceId::new(key).map_err(|e| anyhow::anyhow!("{e}"))?;
                client.status(&resource).await?;
                client.status(&resource).await?;
            }
            Worker::Redis {
                con,
                unlock,
                value,
                seq,
            } => {
                *seq += 1;
                let value = format!("{value}-{seq}");
                let ttl_ms = TTL.as_millis() as u64;
                let give_up = Instant::now() + WAIT;
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(&value)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(con)
                        .await?;
                    if set.is_some() {
                        break;
                    }
                    if Instant::now() >= give_up {
                        bail!("busy for longer than {WAIT:?}");
                    }
                    tokio::time::sleep(POLL).await;
                }
                let deleted: i64 = unlock.key(key).arg(&value).invoke_async(con).await?;
                if deleted != 1 {
                    bail!("the lock was gone before its release");
                }
            }
            #[cfg(feature = "etcd")]
            Worker::Etcd(w) => w.cycle(key).await?,
        }
        Ok(())
    }

    /// Undoes what `connect` set up outside the cycles (etcd's session lease).
    pub async fn close(self) {
        #[cfg(feature = "etcd")]
        if let Worker::Etcd(w) = self {
            (*w).close().await;
        }
    }
}
