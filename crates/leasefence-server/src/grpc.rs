//! The gRPC edge (`leasefence.v1.Leases`): decode, validate, call the engine,
//! encode. Refusals map to statuses through `leasefence_proto`; access
//! control's (see [`crate::auth`]) to UNAUTHENTICATED, PERMISSION_DENIED and
//! RESOURCE_EXHAUSTED with `leasefence-error` metadata.

use std::pin::Pin;
use std::sync::Arc;

use leasefence_core::{Grant, LeaseError, LeaseId, ResourceId};
use leasefence_proto::error_to_status;
use leasefence_proto::v1::leases_server::{Leases, LeasesServer};
use leasefence_proto::v1::{self as pb};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Access, AuthError, Caller, WatchSlot};
use crate::peer::PeerCertificate;
use crate::watch::Subscription;
use crate::watch::{Ended, Event, EventKind, Filter, WatchError};
use crate::{ApiError, Engine, Node, wire};
use leasefence_core::access::Verb;

pub fn service(node: Arc<Node>, access: Arc<Access>) -> LeasesServer<GrpcLeases> {
    // The same bound on a request as the HTTP edge's (tonic's default is 4 MiB).
    LeasesServer::new(GrpcLeases { node, access }).max_decoding_message_size(crate::http::BODY_BYTES_MAX)
}

pub struct GrpcLeases {
    node: Arc<Node>,
    access: Arc<Access>,
}

impl GrpcLeases {
    /// The engine to serve with, or the not-leader / unavailable answer.
    fn engine(&self) -> Result<Arc<Engine>, Status> {
        self.node.engine().map_err(status)
    }

    /// Who sent `request`: its `authorization` metadata, else its client certificate.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let authorization = request.metadata().get("authorization").map(|v| v.as_bytes());
        let peer = request.extensions().get::<PeerCertificate>();
        self.access.identify(authorization, peer).map_err(auth)
    }
}

fn auth(e: AuthError) -> Status {
    status(ApiError::Auth(e))
}

pub(crate) fn auth_status(e: &AuthError) -> Status {
    let mut s = match e {
        AuthError::Unauthenticated(m) => Status::unauthenticated(m.clone()),
        AuthError::PermissionDenied(_) | AuthError::NotOwner { .. } => Status::permission_denied(e.to_string()),
        AuthError::Limit { .. } => Status::resource_exhausted(e.to_string()),
    };
    s.metadata_mut().insert(
        leasefence_proto::META_ERROR,
        tonic::metadata::MetadataValue::from_static(e.kind()),
    );
    s
}

fn status(e: ApiError) -> Status {
    match e.counted() {
        ApiError::Lease(e) => error_to_status(&e),
        ApiError::Store(e) => Status::internal(e.to_string()),
        ApiError::ShuttingDown => Status::unavailable("coordinator is shutting down"),
        e @ ApiError::NotLeader { .. } => not_leader(&e),
        e @ ApiError::Unavailable(_) => Status::unavailable(e.to_string()),
        // UNAVAILABLE without an error kind: clients treat it as a call that
        // may have been carried out, which is what it is.
        e @ ApiError::OutcomeUnknown(_) => Status::unavailable(e.to_string()),
        ApiError::Auth(e) => auth_status(&e),
    }
}

/// `UNAVAILABLE` with the active coordinator's URL in `leasefence-leader`.
fn not_leader(e: &ApiError) -> Status {
    let mut status = Status::unavailable(e.to_string());
    if let ApiError::NotLeader { leader: Some(url) } = e
        && let Ok(v) = url.parse()
    {
        status.metadata_mut().insert(LEADER_METADATA, v);
    }
    status
}

/// The gRPC metadata key of a standby's leader hint.
pub const LEADER_METADATA: &str = "leasefence-leader";

fn invalid(e: leasefence_core::Invalid) -> Status {
    status(ApiError::Lease(LeaseError::Invalid(e)))
}

fn lease(node: &Node, engine: &Engine, g: &Grant) -> pb::Lease {
    pb::Lease {
        signature: node.signature(g).unwrap_or_default(),
        resource: g.resource.to_string(),
        token: g.token.get(),
        lease_id: g.lease_id.to_hex(),
        ttl_ms: wire::millis(g.ttl),
        expires_in_ms: wire::expires_in_ms(g, engine.now()),
        holder: g.holder.to_string(),
    }
}

type LeaseStream = Pin<Box<dyn Stream<Item = Result<pb::Lease, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Leases for GrpcLeases {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Result<Response<pb::Lease>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let mut req = wire::acquire_proto(&r).map_err(invalid)?;
        caller.check(Verb::Acquire, &req.resource).map_err(auth)?;
        req.holder = caller.holder(req.holder).map_err(invalid)?;
        let engine = self.engine()?;
        let grant = engine.acquire_limited(req, caller.limit()).await.map_err(status)?;
        Ok(Response::new(lease(&self.node, &engine, &grant)))
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Result<Response<pb::Lease>, Status> {
        let caller = self.caller(&request)?;
        // Checked before the engine is asked for, as every other call is.
        let (resource, id) = renewal(&caller, request.get_ref())?;
        let engine = self.engine()?;
        let lease = renew_checked(&self.node, &engine, &caller, &resource, &id).await?;
        Ok(Response::new(lease))
    }

    type KeepAliveStream = LeaseStream;

    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::RenewRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let caller = self.caller(&request)?;
        let engine = self.engine()?;
        let node = self.node.clone();
        let mut incoming = request.into_inner();
        let stopping = engine.stopping();
        let out = async_stream(move |tx| async move {
            tokio::pin!(stopping);
            loop {
                let msg = tokio::select! {
                    m = incoming.next() => m,
                    () = &mut stopping => {
                        let _ = tx.send(Err(Status::unavailable("coordinator is shutting down"))).await;
                        return;
                    }
                };
                let Some(msg) = msg else { return };
                let reply = match msg {
                    Err(e) => Err(e),
                    Ok(r) => renew_one(&node, &engine, &caller, &r).await,
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(out))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Result<Response<pb::Released>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let resource = wire::resource(&r.resource).map_err(invalid)?;
        let id = wire::lease_id(&r.lease_id).map_err(invalid)?;
        caller.check(Verb::Acquire, &resource).map_err(auth)?;
        let engine = self.engine()?;
        let token = engine
            .release_as(&resource, &id, caller.principal())
            .await
            .map_err(status)?;
        Ok(Response::new(pb::Released {
            resource: r.resource,
            token: token.get(),
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        if !(r.prefix && r.resource.is_empty()) {
            let resource = wire::resource(&r.resource).map_err(invalid)?;
            if !r.prefix {
                caller.check(Verb::Read, &resource).map_err(auth)?;
            }
        }
        if r.prefix {
            caller.check_prefix(Verb::Read, &r.resource).map_err(auth)?;
        }
        let after = wire::resume(r.after_revision, &r.coordinator_id).map_err(invalid)?;
        let filter = Filter {
            resource: r.resource,
            prefix: r.prefix,
        };
        let engine = self.engine()?;
        engine.health().map_err(status)?;
        let slot = self.access.watching(&caller).map_err(auth)?;
        let sub = engine.watch(&filter, after, &r.coordinator_id).map_err(|e| match e {
            WatchError::Unavailable(msg) => Status::unavailable(msg),
            e => Status::failed_precondition(e.to_string()),
        })?;
        Ok(Response::new(watch_stream(sub, filter, engine.stopping(), slot)))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::ResourceStatus>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let resource = wire::resource(&r.resource).map_err(invalid)?;
        caller.check(Verb::Read, &resource).map_err(auth)?;
        let s = self.engine()?.status(&resource).await.map_err(status)?;
        Ok(Response::new(pb::ResourceStatus {
            resource: r.resource,
            last_token: s.last_token.map_or(0, |t| t.get()),
            held: s.held.map(|h| pb::Holder {
                holder: h.holder.to_string(),
                token: h.token.get(),
                expires_in_ms: wire::millis(h.expires_in),
            }),
            waiters: u32::try_from(s.waiters).unwrap_or(u32::MAX),
        }))
    }

    async fn force_release(
        &self,
        request: Request<pb::ForceReleaseRequest>,
    ) -> Result<Response<pb::ForceReleased>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let resource = wire::resource(&r.resource).map_err(invalid)?;
        caller.check(Verb::Admin, &resource).map_err(auth)?;
        let ended = self.engine()?.force_release(&resource).await.map_err(status)?;
        caller.audit_force_release(&resource, ended);
        Ok(Response::new(pb::ForceReleased {
            resource: r.resource,
            token: ended.map_or(0, |t| t.get()),
            released: ended.is_some(),
        }))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send + 'static>>;

fn event(coordinator_id: &str, e: &Event) -> pb::WatchEvent {
    let kind = match e.kind {
        EventKind::Granted => pb::watch_event::Kind::Granted,
        EventKind::Released => pb::watch_event::Kind::Released,
        EventKind::Expired => pb::watch_event::Kind::Expired,
    };
    pb::WatchEvent {
        revision: e.revision,
        coordinator_id: coordinator_id.to_string(),
        resource: e.resource.to_string(),
        kind: kind as i32,
        token: e.token.get(),
        holder: e.holder.as_ref().map(|h| h.to_string()).unwrap_or_default(),
    }
}

/// Replays the backlog, then forwards live events until the watcher leaves,
/// falls too far behind (told where to resume), or the coordinator stops.
fn watch_stream(
    sub: Subscription,
    filter: Filter,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
    slot: WatchSlot,
) -> WatchStream {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let item = |id: &str, e: &Event| Ok(event(id, e));
    let ended = |ended| {
        Err(match ended {
            Ended::ShuttingDown => Status::unavailable("coordinator is shutting down"),
            Ended::Lagged { after_revision } => Status::resource_exhausted(format!(
                "watcher fell behind; resume with after_revision={after_revision}"
            )),
        })
    };
    tokio::spawn(crate::watch::forward(sub, filter, stopping, tx, item, ended, slot));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// One renewal on the keep-alive stream.
async fn renew_one(
    node: &Node,
    engine: &Arc<Engine>,
    caller: &Caller,
    r: &pb::RenewRequest,
) -> Result<pb::Lease, Status> {
    let (resource, id) = renewal(caller, r)?;
    renew_checked(node, engine, caller, &resource, &id).await
}

/// A renewal's resource and lease id, read and allowed for `caller`.
fn renewal(caller: &Caller, r: &pb::RenewRequest) -> Result<(ResourceId, LeaseId), Status> {
    let resource = wire::resource(&r.resource).map_err(invalid)?;
    let id = wire::lease_id(&r.lease_id).map_err(invalid)?;
    caller.check(Verb::Acquire, &resource).map_err(auth)?;
    Ok((resource, id))
}

async fn renew_checked(
    node: &Node,
    engine: &Arc<Engine>,
    caller: &Caller,
    resource: &ResourceId,
    id: &LeaseId,
) -> Result<pb::Lease, Status> {
    let grant = engine
        .renew_as(resource, id, caller.principal())
        .await
        .map_err(status)?;
    Ok(lease(node, engine, &grant))
}

/// A stream fed by a task: the producer ends the stream by returning.
fn async_stream<F, Fut>(producer: F) -> LeaseStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<pb::Lease, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(producer(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
