//! The etcd client behind the store's blocking methods: a current-thread
//! runtime the store owns, a client per member (redialled after a failure), a
//! bound on every call, and what etcd's errors mean for a coordinator.
//!
//! The runtime runs only while a call blocks on it, from whatever thread calls
//! (a committer's thread, a `spawn_blocking` thread, a plain thread); several
//! threads may block on it at once.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    // Declared before `rt`: the clients' tasks live on it, so drop them first.
    members: Mutex<Members>,
    rt: Rt,
    config: EtcdConfig,
    /// Requests sent, retries included: what the tests count round trips by.
    sent: AtomicU64,
    /// Whether the last call was answered. While it is not, the writer reads
    /// a batch's records before it writes them, so that a batch meeting an
    /// etcd known to be unreachable fails as unavailable without being sent.
    answered: AtomicBool,
}

/// One client per member, dialled lazily, and the member calls go to. Calls
/// stay on one member until it fails as unavailable, then move to the next:
/// a client that balanced over every member would keep sending some calls to
/// a dead one.
struct Members {
    clients: Vec<Option<Client>>,
    current: usize,
}

impl Conn {
    pub(super) fn new(config: EtcdConfig) -> Result<Conn, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("leasefence-etcd")
            .build()
            .map_err(|e| StoreError::Io(format!("cannot start the etcd client's runtime: {e}")))?;
        Ok(Conn {
            members: Mutex::new(Members {
                clients: vec![None; config.endpoints().len()],
                current: 0,
            }),
            rt: Rt(Some(rt)),
            config,
            sent: AtomicU64::new(0),
            answered: AtomicBool::new(false),
        })
    }

    pub(super) fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Whether the last call, of any kind, was answered.
    pub(super) fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// Requests sent so far.
    #[cfg(test)]
    pub(super) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn block_on<F: Future>(&self, f: F) -> Result<F::Output, StoreError> {
        match &self.rt.0 {
            Some(rt) => Ok(rt.block_on(f)),
            None => Err(StoreError::Closed),
        }
    }

    /// The current member and its client, dialled when it has none (at first,
    /// and after it failed). Dialling is lazy: it only sets up a channel.
    fn client(&self) -> Result<(usize, Client), StoreError> {
        let mut m = self.members();
        let i = m.current;
        if let Some(c) = m.clients.get(i).and_then(Option::as_ref) {
            return Ok((i, c.clone()));
        }
        let options = ConnectOptions::new()
            .with_timeout(self.config.request_timeout())
            .with_connect_timeout(self.config.connect_timeout())
            .with_keep_alive(self.config.request_timeout(), self.config.request_timeout())
            // A member cut off from its quorum refuses at once rather than
            // letting the call hang until it times out.
            .with_require_leader(true);
        let endpoint = format!("http://{}", self.config.endpoints()[i]);
        let client = self
            .block_on(Client::connect([endpoint], Some(options)))?
            .map_err(|e| unavailable("connect", &e))?;
        m.clients[i] = Some(client.clone());
        Ok((i, client))
    }

    /// Drops member `i`'s client and moves calls to the next member, unless
    /// another call did so already.
    fn next_member(&self, i: usize) {
        let mut m = self.members();
        m.clients[i] = None;
        if m.current == i {
            m.current = (i + 1) % m.clients.len();
        }
    }

    /// Runs an exchange that is safe to send twice (a read, a keep-alive, a
    /// revoke, a lease grant: a spare lease only lapses), each attempt bounded
    /// by the request timeout. When a member fails as unavailable the call is
    /// tried on the next one, once per member.
    pub(super) fn idempotent<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call(what, Resend::Always, f)
    }

    /// Runs a write (a transaction that changes keys). It is tried on the next
    /// member only when the failed one certainly did not take it (refused the
    /// connection, or has no leader): a write that may have reached etcd is
    /// never sent twice, as its effect could then land twice. The call fails
    /// instead with [`StoreError::Indeterminate`], and the next call goes to
    /// the next member.
    pub(super) fn write<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call(what, Resend::IfNotTaken, f)
    }

    fn call<T, F, Fut>(&self, what: &str, resend: Resend, mut f: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.config.request_timeout();
        let mut tries = self.config.endpoints().len();
        loop {
            tries -= 1;
            let (i, client) = self
                .client()
                .inspect_err(|_| self.answered.store(false, Ordering::Relaxed))?;
            self.sent.fetch_add(1, Ordering::Relaxed);
            let call = f(client);
            let out = self.block_on(async move { tokio::time::timeout(timeout, call).await })?;
            let (err, not_taken) = match out {
                Ok(Ok(v)) => {
                    self.answered.store(true, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(e)) => (classify(what, &e), not_taken(&e)),
                Err(_) => (
                    StoreError::Unavailable(format!("etcd did not answer {what} within {timeout:?}")),
                    false,
                ),
            };
            // An error etcd sent is an answer; a timeout or a lost member is not.
            let unanswered = matches!(err, StoreError::Unavailable(_));
            self.answered.store(!unanswered, Ordering::Relaxed);
            if !unanswered {
                return Err(err);
            }
            self.next_member(i);
            let again = match resend {
                Resend::Always => true,
                Resend::IfNotTaken => not_taken,
            };
            if !again {
                // A write that may have reached etcd: "unavailable" would say
                // nothing was written, which nobody knows.
                return Err(match err {
                    StoreError::Unavailable(m) => StoreError::Indeterminate(m),
                    other => other,
                });
            }
            if tries == 0 {
                return Err(err);
            }
        }
    }
}

/// When a call that failed as unavailable may be sent to the next member.
#[derive(Clone, Copy)]
enum Resend {
    Always,
    IfNotTaken,
}

/// Whether `e` says the member never took the request: it refused the
/// connection, or (etcd's "no leader", which it checks before anything else)
/// it has no quorum.
fn not_taken(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    if s.code() == tonic::Code::Unavailable && s.message() == "etcdserver: no leader" {
        return true;
    }
    let mut source = std::error::Error::source(s);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = err.source();
    }
    false
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
