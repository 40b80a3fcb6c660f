//! The Redis conformance target (the Functions library or the module, per
//! [`Via`]): the effect is one fenced `XADD` to a
//! per-resource stream, whose entries (in stream order, which is commit order)
//! are both the key-value model and the history. An aborted unit is an `XADD`
//! with the invalid ID `0-0`: the command fails after the fence check, so the
//! fence must not move.

use std::collections::BTreeSet;
use std::sync::Mutex;

use leasefence_core::{Fence, FenceMode, ResourceId, Token};
use redis::aio::MultiplexedConnection;

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome};
use crate::redis::{Via, connect, fence_key, last_token};

/// Stream entries, newest first: (id, [field, value, ...]).
type Entries = Vec<(String, Vec<String>)>;

pub struct RedisTarget {
    conn: MultiplexedConnection,
    via: Via,
    namespace: String,
    /// Every key this target wrote, removed by `cleanup`.
    touched: Mutex<BTreeSet<String>>,
}

impl RedisTarget {
    /// Connects to `url`; the Functions library must be installed.
    pub async fn connect(url: &str) -> Result<RedisTarget, ArbiterError> {
        RedisTarget::connect_via(url, Via::Functions).await
    }

    /// Connects to `url` and runs every fenced call through `via`, which must
    /// be installed (the library) or loaded (the module).
    pub async fn connect_via(url: &str, via: Via) -> Result<RedisTarget, ArbiterError> {
        let mut conn = connect(url).await?;
        if via.installed_version(&mut conn).await?.is_none() {
            return Err(match via {
                Via::Functions => ArbiterError::NotInstalled { backend: "redis" },
                Via::Module => ArbiterError::ModuleNotLoaded,
            });
        }
        Ok(RedisTarget {
            conn,
            via,
            namespace: super::fresh_namespace(),
            touched: Mutex::new(BTreeSet::new()),
        })
    }

    fn stream(&self, resource: &ResourceId) -> String {
        let stream = format!("leasefence:check:effects:{{{resource}}}");
        if let Ok(mut t) = self.touched.lock() {
            t.insert(stream.clone());
            t.insert(fence_key(resource));
        }
        stream
    }

    async fn entries(&self, resource: &ResourceId) -> Result<Entries, ArbiterError> {
        let mut conn = self.conn.clone();
        let stream = self.stream(resource);
        Ok(redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await?)
    }
}

fn field<'a>(fields: &'a [String], name: &str) -> Option<&'a str> {
    fields.chunks_exact(2).find(|kv| kv[0] == name).map(|kv| kv[1].as_str())
}

impl ConformanceTarget for RedisTarget {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn admit_and_write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> Result<(), ArbiterError> {
        let mut conn = self.conn.clone();
        let stream = self.stream(&fence.resource);
        let token = fence.token.get().to_string();
        let fields = [("key", key), ("value", value), ("token", token.as_str())];
        let id = match outcome {
            Outcome::Commit => "*",
            Outcome::Abort => "0-0",
        };
        match (
            self.via.xadd(&mut conn, fence, mode, &stream, id, &fields).await,
            outcome,
        ) {
            (Ok(_), Outcome::Commit) => Ok(()),
            (Ok(id), Outcome::Abort) => Err(ArbiterError::Protocol {
                backend: "redis",
                message: format!("XADD with ID 0-0 must fail, but added {id}"),
            }),
            (Err(ArbiterError::Redis(e)), Outcome::Abort) if e.to_string().contains("0-0") => Ok(()),
            (Err(e), _) => Err(e),
        }
    }

    async fn read(&self, resource: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        let entries = self.entries(resource).await?;
        Ok(entries
            .iter()
            .rev()
            .find(|(_, f)| field(f, "key") == Some(key))
            .and_then(|(_, f)| field(f, "value").map(str::to_string)))
    }

    async fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        let mut conn = self.conn.clone();
        self.stream(resource);
        last_token(&mut conn, resource).await
    }

    async fn history(&self, resource: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        let entries = self.entries(resource).await?;
        entries
            .iter()
            .map(|(id, f)| {
                field(f, "token")
                    .and_then(|t| t.parse::<u64>().ok())
                    .and_then(Token::new)
                    .ok_or_else(|| ArbiterError::Protocol {
                        backend: "redis",
                        message: format!("stream entry {id} has no valid token field"),
                    })
            })
            .collect()
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        let keys: Vec<String> = match self.touched.lock() {
            Ok(mut t) => std::mem::take(&mut *t).into_iter().collect(),
            Err(_) => return Err(ArbiterError::Task("touched-key set poisoned".to_string())),
        };
        let mut conn = self.conn.clone();
        for chunk in keys.chunks(100) {
            let _: u64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
        }
        Ok(())
    }
}
