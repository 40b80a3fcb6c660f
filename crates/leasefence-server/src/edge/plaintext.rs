//! What a TLS port answers a plaintext client, in the client's own
//! protocol, before closing: `400` with one line for HTTP/1 (or anything
//! that is not HTTP/2), an empty SETTINGS and a GOAWAY (`INADEQUATE_SECURITY`,
//! the same line as debug data) after the first request of an HTTP/2 client.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest the refusal of a plaintext client waits for its first bytes, and
/// then for it to close after the answer.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Most bytes of HTTP/2 frames read from a plaintext client before its
/// first request.
const H2_READ_MAX: usize = 64 * 1024;
/// What an HTTP/2 client sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Answers a plaintext client in its own protocol that this port speaks
/// TLS, then closes. Reading what it sent before closing lets the answer
/// arrive instead of a reset.
pub(super) async fn refuse(mut stream: TcpStream) {
    let mut head = Vec::with_capacity(H2_PREFACE.len());
    let _ = tokio::time::timeout(REFUSAL_WAIT, async {
        let mut buf = [0u8; 24];
        while head.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&head) {
            match stream.read(&mut buf[..H2_PREFACE.len() - head.len()]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let answer = if head.as_slice() == H2_PREFACE {
        // A GOAWAY before the client's first request would reach it as a
        // bare "connection closed"; after it, the request fails with the
        // GOAWAY's message.
        let _ = tokio::time::timeout(REFUSAL_WAIT, first_headers(&mut stream)).await;
        h2_refusal()
    } else {
        http1_refusal()
    };
    if stream.write_all(&answer).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(REFUSAL_WAIT, async {
        let mut sink = [0u8; 1024];
        while matches!(stream.read(&mut sink).await, Ok(1..)) {}
    })
    .await;
}

/// Reads HTTP/2 frames up to the first HEADERS (the first request), at
/// most [`H2_READ_MAX`] bytes of them.
async fn first_headers(stream: &mut TcpStream) {
    const HEADERS: u8 = 0x1;
    let mut read = 0usize;
    let mut header = [0u8; 9];
    let mut sink = vec![0u8; 4096];
    while read < H2_READ_MAX {
        if stream.read_exact(&mut header).await.is_err() {
            return;
        }
        if header[3] == HEADERS {
            return;
        }
        let mut left = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        read += header.len() + left;
        while left > 0 {
            let n = left.min(sink.len());
            if stream.read_exact(&mut sink[..n]).await.is_err() {
                return;
            }
            left -= n;
        }
    }
}

fn http1_refusal() -> Vec<u8> {
    let body = format!("{}\n", leasefence_proto::TLS_REQUIRED);
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An empty SETTINGS frame (a server's preface), then GOAWAY with
/// `INADEQUATE_SECURITY` and the message as its debug data.
fn h2_refusal() -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const INADEQUATE_SECURITY: u32 = 0xc;
    let debug = leasefence_proto::TLS_REQUIRED.as_bytes();
    let frame = |kind: u8, payload: &[u8]| {
        let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    };
    let mut goaway = Vec::with_capacity(8 + debug.len());
    goaway.extend_from_slice(&0u32.to_be_bytes());
    goaway.extend_from_slice(&INADEQUATE_SECURITY.to_be_bytes());
    goaway.extend_from_slice(debug);
    let mut out = frame(SETTINGS, &[]);
    out.extend(frame(GOAWAY, &goaway));
    out
}
