//! The gRPC layer over a real TCP listener: a hand-written unary service
//! (`/test.Fenced/Put`, a string in, a string out) whose handler fences its
//! write through the embedded arbiter, served by tonic with the fence taken
//! either by the [`RequireFence`] interceptor or in the handler, and called
//! through the [`AttachFence`] client interceptor or with raw metadata.

mod common;

use std::convert::Infallible;
use std::sync::Arc;

use common::{Headers, fence, malformed_fences, unique_resource};
use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_arbiter::grpc::{
    AttachFence, METADATA_CURRENT, METADATA_PRESENTED, RequireFence, arbiter_status, attach_fence, require_fence,
    stale_from_status,
};
use leasefence_arbiter::{ArbiterError, Fence, FenceMode, ResourceId, Token};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

const PUT: &str = "/test.Fenced/Put";

/// Where the server takes the fence from.
#[derive(Clone, Copy, Debug)]
enum Guard {
    /// [`RequireFence`] in front of the service; the handler reads the extension.
    Interceptor,
    /// The handler calls [`require_fence`] itself.
    Handler,
}

#[derive(Clone)]
struct Fenced {
    arbiter: Arc<EmbeddedArbiter>,
    guard: Guard,
}

impl tonic::server::NamedService for Fenced {
    const NAME: &'static str = "test.Fenced";
}

/// One unary call: `key=value` (the request), fenced (strict).
struct PutSvc(Fenced);

impl tonic::server::UnaryService<String> for PutSvc {
    type Response = String;
    type Future = BoxFuture<Response<String>, Status>;

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let Fenced { arbiter, guard } = self.0.clone();
        Box::pin(async move {
            let fence = match guard {
                Guard::Interceptor => request
                    .extensions()
                    .get::<Fence>()
                    .cloned()
                    .ok_or_else(|| Status::internal("the interceptor let a call without a fence through"))?,
                Guard::Handler => require_fence(&request)?,
            };
            let body = request.into_inner();
            let (key, value) = body
                .split_once('=')
                .ok_or_else(|| Status::invalid_argument("key=value"))?;
            let (key, value) = (key.to_string(), value.to_string());
            tokio::task::spawn_blocking(move || arbiter.put(&fence, FenceMode::Strict, &key, value.as_bytes()))
                .await
                .map_err(|e| arbiter_status(ArbiterError::Task(e.to_string())))?
                .map_err(arbiter_status)?;
            Ok(Response::new("ok".to_string()))
        })
    }
}

impl Service<http::Request<tonic::body::Body>> for Fenced {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let svc = PutSvc(self.clone());
        Box::pin(async move {
            if req.uri().path() != PUT {
                return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<String, String>::default());
            Ok(grpc.unary(svc, req).await)
        })
    }
}

struct App {
    channel: Channel,
    arbiter: Arc<EmbeddedArbiter>,
    _dir: tempfile::TempDir,
}

async fn start(guard: Guard) -> App {
    let dir = tempfile::tempdir().expect("temp dir");
    let arbiter = Arc::new(EmbeddedArbiter::open(&dir.path().join("grpc.redb")).expect("open"));
    let svc = Fenced {
        arbiter: Arc::clone(&arbiter),
        guard,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = match guard {
        Guard::Interceptor => Server::builder().add_service(InterceptedService::new(svc, RequireFence)),
        Guard::Handler => Server::builder().add_service(svc),
    };
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.expect("serve") });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    App {
        channel,
        arbiter,
        _dir: dir,
    }
}

/// One call of `/test.Fenced/Put` through any client stack.
async fn put<S>(grpc: &mut tonic::client::Grpc<S>, request: Request<String>) -> Result<String, Status>
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    grpc.ready().await.map_err(|e| Status::unknown(e.into().to_string()))?;
    let codec = ProstCodec::<String, String>::default();
    let answer = grpc.unary(request, PathAndQuery::from_static(PUT), codec).await?;
    Ok(answer.into_inner())
}

impl App {
    /// A call with `fence` attached by the client interceptor.
    async fn put_fenced(&self, fence: &Fence, body: &str) -> Result<String, Status> {
        let intercepted = InterceptedService::new(self.channel.clone(), AttachFence(fence.clone()));
        put(
            &mut tonic::client::Grpc::new(intercepted),
            Request::new(body.to_string()),
        )
        .await
    }

    /// A call with exactly the metadata given (raw bytes, repeats allowed).
    async fn put_raw(&self, metadata: &Headers, body: &str) -> Result<String, Status> {
        let mut request = Request::new(body.to_string());
        for (name, value) in metadata {
            let value = http::HeaderValue::from_bytes(value).expect("metadata value");
            request.metadata_mut().as_mut().append(*name, value);
        }
        put(&mut tonic::client::Grpc::new(self.channel.clone()), request).await
    }

    fn value(&self, key: &str) -> Option<String> {
        let v = self.arbiter.get(key).expect("get");
        v.map(|b| String::from_utf8(b).expect("utf-8"))
    }

    fn last_token(&self, r: &ResourceId) -> Option<u64> {
        self.arbiter.last_token(r).expect("last_token").map(Token::get)
    }
}

async fn current_writes_and_stale_is_failed_precondition(guard: Guard) {
    let app = start(guard).await;
    let r = unique_resource("grpc-stale ß");
    assert_eq!(app.put_fenced(&fence(&r, 5), "k=five").await.expect("admitted"), "ok");
    assert_eq!(app.value("k").as_deref(), Some("five"));
    for late in [5, 4, 1] {
        let status = app.put_fenced(&fence(&r, late), "k=late").await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{guard:?} token {late}: {status:?}"
        );
        let md = status.metadata();
        assert_eq!(md.get(METADATA_PRESENTED), Some(&MetadataValue::from(late)));
        assert_eq!(md.get(METADATA_CURRENT), Some(&MetadataValue::from(5u64)));
        let stale = stale_from_status(&status).expect("a stale status decodes");
        assert_eq!(
            (&stale.resource, stale.presented.get(), stale.current.get()),
            (&r, late, 5)
        );
    }
    assert_eq!(app.value("k").as_deref(), Some("five"));

    // attach_fence on one request works as the interceptor does.
    let mut request = Request::new("k=max".to_string());
    attach_fence(&mut request, &fence(&r, u64::MAX)).expect("attach");
    let plain = &mut tonic::client::Grpc::new(app.channel.clone());
    assert_eq!(put(plain, request).await.expect("admitted"), "ok");
    assert_eq!(app.value("k").as_deref(), Some("max"));
    assert_eq!(app.last_token(&r), Some(u64::MAX));
}

#[tokio::test]
async fn interceptor_current_writes_and_stale_is_failed_precondition() {
    current_writes_and_stale_is_failed_precondition(Guard::Interceptor).await;
}

#[tokio::test]
async fn handler_current_writes_and_stale_is_failed_precondition() {
    current_writes_and_stale_is_failed_precondition(Guard::Handler).await;
}

async fn missing_and_malformed_fences_are_refused(guard: Guard) {
    let app = start(guard).await;
    let status = app.put_raw(&Vec::new(), "k=unfenced").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{guard:?}: {status:?}");
    assert!(status.message().contains("leasefence-token"), "{}", status.message());
    assert_eq!(stale_from_status(&status), None, "a missing fence is not a stale one");

    let r = unique_resource("grpc-malformed");
    for (why, metadata) in malformed_fences(r.as_str()) {
        let status = app.put_raw(&metadata, "k=bad").await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{guard:?}, {why}: {status:?}");
        assert!(
            status.message().contains("leasefence-token"),
            "{why}: {}",
            status.message()
        );
    }
    assert_eq!(app.value("k"), None);
    assert_eq!(app.last_token(&r), None);
}

#[tokio::test]
async fn interceptor_refuses_missing_and_malformed_fences() {
    missing_and_malformed_fences_are_refused(Guard::Interceptor).await;
}

#[tokio::test]
async fn handler_refuses_missing_and_malformed_fences() {
    missing_and_malformed_fences_are_refused(Guard::Handler).await;
}
