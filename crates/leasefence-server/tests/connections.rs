//! `--connections-max`: beyond the limit a new connection is still accepted,
//! but every request on it is refused with the limit, in its own protocol
//! (HTTP 429 with `Connection: close`, gRPC `RESOURCE_EXHAUSTED`), and a
//! slot frees as soon as a connection closes.

use std::time::Duration;

use leasefence_proto::v1::{GetRequest, leases_client::LeasesClient};
use leasefence_server::auth::Limits;
use leasefence_server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX: usize = 3;

/// One HTTP/1.1 request on `stream`, kept alive; the status line and body.
async fn get(stream: &mut TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_told_so_and_a_closed_one_frees_its_slot() {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), std::env::temp_dir());
    config.limits = Limits {
        connections_max: MAX,
        ..Limits::default()
    };
    let server = Server::bind_with_store(config, leasefence_store::MemoryStore::new())
        .await
        .expect("bind");
    let addr = server.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let mut open = Vec::new();
    for _ in 0..MAX {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let answer = get(&mut s, "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        open.push(s);
    }
    let mut refused = 0;
    for i in 0..100 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let path = if i % 2 == 0 {
            "/healthz"
        } else {
            "/v1/status?resource=r"
        };
        let answer = get(&mut s, path).await;
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
        assert!(
            answer.contains(r#""limit":"connections-max""#) && answer.contains(r#""value":3"#),
            "{answer}"
        );
        refused += 1;
    }
    let mut grpc = LeasesClient::connect(format!("http://{addr}")).await.expect("connect");
    let status = grpc
        .get(GetRequest { resource: "r".into() })
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("connections-max"), "{status:?}");
    drop(grpc);

    // A kept-alive connection under the limit goes on being served.
    let answer = get(&mut open[0], "/healthz").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Closing one frees a slot for the next connection.
    drop(open.pop());
    let mut served = false;
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        if get(&mut s, "/healthz").await.starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a closed connection's slot is given to a new one");
    assert_eq!(refused, 100);
    let _ = stop.send(());
}
