//! An upload whose client vanishes (no FIN, no RST: a host powered off, a VM
//! stopped) ends, and its temp file is removed, instead of both waiting for
//! the rest of the body for as long as the gateway runs.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::blob::TMP_DIR;
use super::{Gateway, GatewayConfig, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};

#[path = "../../../leasefence-server/tests/support/vanish.rs"]
mod vanish;

fn temp_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join(TMP_DIR)).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_client_vanished_ends_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), dir.path());
    let gateway = Gateway::bind(config).await.expect("bind");
    let addr = gateway.local_addr().expect("addr");
    tokio::spawn(gateway.run(std::future::pending()));

    let mut client = TcpStream::connect(addr).await.expect("connect");
    let head = "PUT /objects/report HTTP/1.1\r\nhost: x\r\nleasefence-resource: reports\r\n\
                leasefence-token: 1\r\ncontent-length: 1000000\r\n\r\n";
    client.write_all(head.as_bytes()).await.expect("write");
    client.write_all(&[7u8; 4096]).await.expect("write");
    let started = Instant::now();
    while temp_files(dir.path()) == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "the upload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !vanish::vanish(client) {
        return;
    }
    let bound = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * (KEEPALIVE_PROBES + 1) + Duration::from_secs(3);
    let started = Instant::now();
    while temp_files(dir.path()) > 0 {
        assert!(
            started.elapsed() < bound,
            "the upload of a vanished client still holds its temp file after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
