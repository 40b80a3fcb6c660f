//! A TCP proxy in front of a real engine (PostgreSQL, etcd), so a test can
//! take the engine away from a store (`cut`: every connection is closed and
//! new ones are closed on arrival), hang it (`hold`: bytes stop flowing,
//! sockets stay open), lose its answers (`hold_replies`: requests still reach
//! the engine, nothing comes back), and give it back (`restore`). The crate's
//! own tests load it too, so each user takes only some of it.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const FLOWING: u8 = 0;
const HELD: u8 = 1;
const CUT: u8 = 2;
const REPLIES_HELD: u8 = 3;

struct State {
    mode: AtomicU8,
    sockets: Mutex<Vec<TcpStream>>,
}

pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(State {
            mode: AtomicU8::new(FLOWING),
            sockets: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&state);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if accepting.mode.load(Ordering::SeqCst) == CUT {
                    continue; // dropped: closed on arrival
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        accepting.sockets.lock().expect("sockets").push(c);
                    }
                }
                pump(&accepting, &client, &server, Direction::Request);
                pump(&accepting, &server, &client, Direction::Reply);
            }
        });
        Proxy { addr, state }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn cut(&self) {
        self.state.mode.store(CUT, Ordering::SeqCst);
        for s in self.state.sockets.lock().expect("sockets").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn hold(&self) {
        self.state.mode.store(HELD, Ordering::SeqCst);
    }

    /// Requests still reach the engine (and take effect there); its answers
    /// stop at the proxy until [`Proxy::restore`].
    pub fn hold_replies(&self) {
        self.state.mode.store(REPLIES_HELD, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.state.mode.store(FLOWING, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Request,
    Reply,
}

fn pump(state: &Arc<State>, from: &TcpStream, to: &TcpStream, direction: Direction) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let state = Arc::clone(state);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            while held(state.mode.load(Ordering::SeqCst), direction) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if state.mode.load(Ordering::SeqCst) == CUT || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

fn held(mode: u8, direction: Direction) -> bool {
    mode == HELD || (mode == REPLIES_HELD && direction == Direction::Reply)
}
