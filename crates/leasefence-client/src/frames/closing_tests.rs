//! The client's side of version 2, against scripted coordinators: the
//! answer to a request that crossed a `Closing` notice is taken, and that
//! connection is not used again; a coordinator of an earlier release, which
//! refuses any version but 1, is spoken to in version 1 from then on.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasefence_core::ResourceId;
use leasefence_proto::frame::{self, Refusal, Request, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::{ClientOptions, FrameClient};

/// What a scripted coordinator does.
#[derive(Clone, Copy)]
enum Script {
    /// Speaks version 2, sends `Closing` before its first answer on each
    /// connection, and keeps the connection open (as within the grace).
    Closing,
    /// Speaks version 1 alone, as the release before version 2 did, and
    /// closes each connection after its first answer.
    Old,
}

/// The `Hello` versions a scripted coordinator was greeted with, in order.
type Hellos = Arc<Mutex<Vec<u8>>>;

async fn send(s: &mut TcpStream, r: &Response) -> bool {
    let mut out = Vec::new();
    frame::encode_response(r, &mut out);
    s.write_all(&out).await.is_ok()
}

async fn answer(mut s: TcpStream, script: Script, hellos: Hellos) {
    let mut buf = Vec::new();
    let mut answered = false;
    while let Ok(true) = frame::read_frame(&mut s, &mut buf).await {
        let answer = match frame::decode_request(&buf) {
            Ok(Request::Hello { version, .. }) => {
                hellos.lock().expect("hellos").push(version);
                match (script, version) {
                    (Script::Old, 1) => Response::Welcome { version: 1 },
                    (Script::Old, v) => {
                        let message = format!("invalid frame: protocol version {v} is not spoken here; allowed: 1");
                        let _ = send(&mut s, &Response::Refused(Refusal::new("invalid", message))).await;
                        return;
                    }
                    (Script::Closing, v) => Response::Welcome { version: v.min(2) },
                }
            }
            Ok(Request::Status { .. }) => {
                if matches!(script, Script::Closing) && !answered && !send(&mut s, &Response::Closing).await {
                    return;
                }
                Response::Status {
                    last_token: 3,
                    held: None,
                    waiters: 0,
                }
            }
            _ => return,
        };
        let welcome = matches!(answer, Response::Welcome { .. });
        if !send(&mut s, &answer).await {
            return;
        }
        if !welcome {
            answered = true;
            if matches!(script, Script::Old) {
                return;
            }
        }
    }
}

async fn coordinator(script: Script) -> (SocketAddr, Hellos) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hellos = Hellos::default();
    let seen = hellos.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s, script, seen.clone()));
        }
    });
    (addr, hellos)
}

/// Two status calls of one client against a coordinator of `script`; the
/// `Hello` versions it was greeted with.
async fn status_twice(script: Script) -> Vec<u8> {
    let (addr, hellos) = coordinator(script).await;
    let client = FrameClient::connect(&format!("leasefence://{addr}"), ClientOptions::default())
        .await
        .expect("client");
    let r = ResourceId::new("jobs").expect("resource");
    for _ in 0..2 {
        let status = tokio::time::timeout(Duration::from_secs(5), client.status(&r)).await;
        let status = status.expect("in time").expect("answered");
        assert_eq!(status.last_token.map(|t| t.get()), Some(3));
    }
    hellos.lock().expect("hellos").clone()
}

#[tokio::test]
async fn an_answer_behind_a_closing_notice_is_taken_and_its_connection_not_reused() {
    // The second call opened a connection of its own.
    assert_eq!(
        status_twice(Script::Closing).await,
        vec![frame::VERSION, frame::VERSION]
    );
}

#[tokio::test]
async fn a_coordinator_that_speaks_only_version_1_is_spoken_to_in_version_1() {
    // Refused once in version 2, then version 1 at once on every connection.
    assert_eq!(status_twice(Script::Old).await, vec![frame::VERSION, 1, 1]);
}
