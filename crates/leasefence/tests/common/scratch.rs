//! A test's own place in a shared store: a PostgreSQL schema or an etcd key
//! prefix under a name no other run uses, removed when the test ends, so
//! that the test database does not fill up with what every run left behind.

use std::time::Duration;

/// A store URL and a prefix of one test's own; removed on drop.
pub struct Scratch {
    place: Place,
}

/// Where a [`Scratch`] is: what tells whether anything is still there.
#[derive(Clone)]
pub struct Place {
    store: String,
    prefix: String,
}

impl Scratch {
    /// A prefix on `store` (`postgres://…` or `etcd://…`) for `test`, unique to
    /// this run: a schema name on PostgreSQL, a key prefix on etcd.
    pub fn new(store: &str, test: &str) -> Scratch {
        let n: u64 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let prefix = if store.starts_with("etcd://") {
            format!("/lftest-{test}-{n:x}/")
        } else {
            format!("lftest_{test}_{n:x}")
        };
        Scratch {
            place: Place {
                store: store.to_string(),
                prefix,
            },
        }
    }

    pub fn store(&self) -> &str {
        &self.place.store
    }

    pub fn prefix(&self) -> &str {
        &self.place.prefix
    }

    /// The place, to look at after the scratch is gone.
    pub fn place(&self) -> Place {
        self.place.clone()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = self.place.remove() {
            eprintln!("could not remove the test's {}: {e}", self.place.prefix);
        }
    }
}

impl Place {
    /// Whether the store holds anything under the prefix (the schema exists,
    /// or a key has the prefix).
    pub fn exists(&self) -> Result<bool, String> {
        if let Some(url) = self.store.strip_prefix("etcd://") {
            return etcd::exists(url, &self.prefix);
        }
        let (url, schema) = (self.store.clone(), self.prefix.clone());
        on_own_thread(async move {
            let client = pg(&url).await?;
            let row = client
                .query_one("SELECT count(*) FROM pg_namespace WHERE nspname = $1", &[&schema])
                .await
                .map_err(|e| e.to_string())?;
            Ok(row.get::<_, i64>(0) > 0)
        })
    }

    fn remove(&self) -> Result<(), String> {
        if let Some(url) = self.store.strip_prefix("etcd://") {
            return etcd::remove(url, &self.prefix);
        }
        // The name is ours (see `Scratch::new`): letters, digits, underscores.
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.prefix);
        let url = self.store.clone();
        on_own_thread(async move { pg(&url).await?.batch_execute(&sql).await.map_err(|e| e.to_string()) })
    }
}

/// A client of the PostgreSQL at `url`, its connection driven in the background.
async fn pg(url: &str) -> Result<tokio_postgres::Client, String> {
    let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
    let (client, conn) = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .map_err(|_| "PostgreSQL did not answer within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(client)
}

/// Runs `work` on a runtime of its own, on a thread of its own: a drop may
/// happen inside a test's runtime, where blocking on another would panic.
fn on_own_thread<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(work)
    })
    .join()
    .map_err(|_| "the store's thread panicked".to_string())?
}

#[cfg(feature = "etcd")]
mod etcd {
    use etcd_client::{Client, DeleteOptions, GetOptions};

    use super::on_own_thread;

    async fn client(url: &str) -> Result<Client, String> {
        let endpoints: Vec<String> = url.split(',').map(|e| format!("http://{e}")).collect();
        Client::connect(endpoints, None).await.map_err(|e| e.to_string())
    }

    pub fn exists(url: &str, prefix: &str) -> Result<bool, String> {
        let (url, prefix) = (url.to_string(), prefix.to_string());
        on_own_thread(async move {
            let options = GetOptions::new().with_prefix().with_count_only();
            let resp = client(&url).await?.get(prefix, Some(options)).await;
            Ok(resp.map_err(|e| e.to_string())?.count() > 0)
        })
    }

    pub fn remove(url: &str, prefix: &str) -> Result<(), String> {
        let (url, prefix) = (url.to_string(), prefix.to_string());
        on_own_thread(async move {
            let options = DeleteOptions::new().with_prefix();
            client(&url)
                .await?
                .delete(prefix, Some(options))
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    }
}

#[cfg(not(feature = "etcd"))]
mod etcd {
    pub fn exists(_: &str, _: &str) -> Result<bool, String> {
        Err("etcd needs the `etcd` feature".into())
    }

    pub fn remove(_: &str, _: &str) -> Result<(), String> {
        Err("etcd needs the `etcd` feature".into())
    }
}
