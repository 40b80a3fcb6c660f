//! What the client's tests run against: a real coordinator served in the
//! test process (embedded store in a temp dir), a stub that plays only the
//! *standby* role of the `Leases` service (every call refused as not the
//! leader, with a leader hint), a stub that takes a request and never
//! answers, and a TCP proxy whose connections can be cut.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasefence_proto::v1::leases_server::{Leases, LeasesServer};
use leasefence_proto::v1::{self as pb};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A real coordinator in this process on a free loopback port; it stops
/// when dropped.
pub struct Coordinator {
    pub url: String,
    pub addr: SocketAddr,
    /// The frame port, when configured.
    pub frames: Option<SocketAddr>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

pub async fn coordinator() -> Coordinator {
    coordinator_with(|_| {}).await
}

/// [`coordinator`], with its configuration changed by `configure` first.
pub async fn coordinator_with(configure: impl FnOnce(&mut leasefence_server::ServerConfig)) -> Coordinator {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = "127.0.0.1:0".parse().expect("addr");
    let mut config = leasefence_server::ServerConfig::new(listen, dir.path().to_path_buf());
    configure(&mut config);
    let server = leasefence_server::Server::bind(config).await.expect("bind");
    let addr = server.local_addr().expect("addr");
    let frames = server.frames_addr().map(|bound| bound.expect("frame port bound"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    Coordinator {
        url: format!("http://{addr}"),
        addr,
        frames,
        _stop: tx,
        _dir: dir,
    }
}

/// A URL on which nothing listens (the port was just free).
pub async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

/// How a stub answers.
#[derive(Clone, Debug)]
pub enum Role {
    /// As a standby does: `UNAVAILABLE`, `not the leader`, and the leader's
    /// URL in `leasefence-leader` when one is given.
    Standby { leader: Option<String> },
    /// Takes every request and never answers.
    Swallow,
}

/// A stub `Leases` service on a free loopback port.
pub struct Stub {
    pub url: String,
    pub addr: SocketAddr,
    /// Calls received, of every method.
    pub calls: Arc<AtomicUsize>,
    /// Notified on every call received (a permit is kept if nobody waits yet).
    pub received: Arc<Notify>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Stub {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

struct StubService {
    role: Role,
    calls: Arc<AtomicUsize>,
    received: Arc<Notify>,
}

impl StubService {
    async fn answer<T>(&self) -> Result<T, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.received.notify_one();
        match &self.role {
            Role::Standby { leader } => {
                let mut s = Status::unavailable("not the leader: this coordinator is a standby");
                if let Some(url) = leader {
                    s.metadata_mut()
                        .insert("leasefence-leader", url.parse().expect("ascii url"));
                }
                Err(s)
            }
            Role::Swallow => std::future::pending().await,
        }
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Leases for StubService {
    async fn acquire(&self, _: Request<pb::AcquireRequest>) -> Result<Response<pb::Lease>, Status> {
        self.answer().await
    }

    async fn renew(&self, _: Request<pb::RenewRequest>) -> Result<Response<pb::Lease>, Status> {
        self.answer().await
    }

    type KeepAliveStream = Boxed<pb::Lease>;

    async fn keep_alive(
        &self,
        _: Request<Streaming<pb::RenewRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        self.answer().await
    }

    async fn release(&self, _: Request<pb::ReleaseRequest>) -> Result<Response<pb::Released>, Status> {
        self.answer().await
    }

    async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::ResourceStatus>, Status> {
        self.answer().await
    }

    type WatchStream = Boxed<pb::WatchEvent>;

    async fn watch(&self, _: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.answer().await
    }

    async fn force_release(&self, _: Request<pb::ForceReleaseRequest>) -> Result<Response<pb::ForceReleased>, Status> {
        self.answer().await
    }
}

pub async fn stub(role: Role) -> Stub {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let calls = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(Notify::new());
    let service = StubService {
        role,
        calls: calls.clone(),
        received: received.clone(),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LeasesServer::new(service))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = rx.await;
            }),
    );
    Stub {
        url: format!("http://{addr}"),
        addr,
        calls,
        received,
        _stop: tx,
    }
}

/// A TCP proxy to `target`. [`Proxy::cut`] closes every connection it
/// carries and stops listening: to its clients the target is gone.
pub struct Proxy {
    pub url: String,
    cut: watch::Sender<bool>,
}

impl Proxy {
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

pub async fn proxy(target: SocketAddr) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (cut, cut_rx) = watch::channel(false);
    let mut accept_cut = cut_rx.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = accept_cut.wait_for(|c| *c) => return,
                a = listener.accept() => a,
            };
            let Ok((inbound, _)) = accepted else { return };
            tokio::spawn(carry(inbound, target, cut_rx.clone()));
        }
    });
    Proxy {
        url: format!("http://{addr}"),
        cut,
    }
}

async fn carry(mut inbound: TcpStream, target: SocketAddr, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = cut.wait_for(|c| *c) => {}
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
    }
    // Dropping both ends closes the connection under whatever it carried.
}
