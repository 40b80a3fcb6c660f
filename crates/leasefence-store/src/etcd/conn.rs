//! The etcd client behind the store's blocking methods: a current-thread
//! runtime the store owns, one client (redialled after a failure), a bound on
//! every call, and what etcd's errors mean for a coordinator.
//!
//! The runtime runs only while a call blocks on it, from whatever thread calls
//! (a committer's thread, a `spawn_blocking` thread, a plain thread); several
//! threads may block on it at once.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use etcd_client::{Client, ConnectOptions};

use super::EtcdConfig;
use crate::StoreError;

/// A runtime that may be dropped anywhere, even inside another runtime's task
/// (where dropping a `Runtime` would panic): it shuts down in the background.
struct Rt(Option<tokio::runtime::Runtime>);

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub(super) struct Conn {
    // Declared before `rt`: the client's tasks live on it, so drop it first.
    client: Mutex<Option<Client>>,
    rt: Rt,
    config: EtcdConfig,
}

impl Conn {
    pub(super) fn new(config: EtcdConfig) -> Result<Conn, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("leasefence-etcd")
            .build()
            .map_err(|e| StoreError::Io(format!("cannot start the etcd client's runtime: {e}")))?;
        Ok(Conn {
            client: Mutex::new(None),
            rt: Rt(Some(rt)),
            config,
        })
    }

    pub(super) fn config(&self) -> &EtcdConfig {
        &self.config
    }

    fn slot(&self) -> MutexGuard<'_, Option<Client>> {
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn block_on<F: Future>(&self, f: F) -> Result<F::Output, StoreError> {
        match &self.rt.0 {
            Some(rt) => Ok(rt.block_on(f)),
            None => Err(StoreError::Closed),
        }
    }

    /// The client, dialling anew when there is none (at first, and after a
    /// call failed as unavailable). Dialling is lazy: it only sets up channels.
    fn client(&self) -> Result<Client, StoreError> {
        let mut slot = self.slot();
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let options = ConnectOptions::new()
            .with_timeout(self.config.request_timeout())
            .with_connect_timeout(self.config.connect_timeout())
            .with_keep_alive(self.config.request_timeout(), self.config.request_timeout())
            // A member cut off from its quorum refuses at once rather than
            // letting the call hang until it times out.
            .with_require_leader(true);
        let endpoints: Vec<String> = self.config.endpoints().iter().map(|e| format!("http://{e}")).collect();
        let client = self
            .block_on(Client::connect(endpoints, Some(options)))?
            .map_err(|e| unavailable("connect", &e))?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Runs one exchange with etcd, bounded by the request timeout. A failure
    /// that says the engine cannot be reached drops the client, so the next
    /// call dials again.
    pub(super) fn run<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client()?;
        let timeout = self.config.request_timeout();
        let out = self.block_on(async move { tokio::time::timeout(timeout, f(client)).await })?;
        let err = match out {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => classify(what, &e),
            Err(_) => StoreError::Unavailable(format!("etcd did not answer {what} within {timeout:?}")),
        };
        if matches!(err, StoreError::Unavailable(_)) {
            *self.slot() = None;
        }
        Err(err)
    }
}

fn unavailable(what: &str, e: &etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd {what}: {e}"))
}

/// What an etcd error means here: the engine out of reach (or unable to
/// decide: no leader, timed out) is [`StoreError::Unavailable`]; an answer that
/// refuses the request itself is [`StoreError::Io`].
fn classify(what: &str, e: &etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal
            | Code::ResourceExhausted => unavailable(what, e),
            _ => StoreError::Io(format!("etcd refused {what}: {}", s.message())),
        },
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) | E::LeaseKeepAliveError(_) => unavailable(what, e),
        _ => StoreError::Io(format!("etcd {what}: {e}")),
    }
}
