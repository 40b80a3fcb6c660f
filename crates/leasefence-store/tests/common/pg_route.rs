//! How a test reaches the real PostgreSQL through a proxy: the address its
//! URL names, and the same URL pointed at the proxy. The crate's own tests
//! load it too.

use std::net::{SocketAddr, ToSocketAddrs};

/// `url` with its host and port replaced by `addr` (as key=value settings).
pub fn through(url: &str, addr: SocketAddr) -> String {
    let pg: tokio_postgres::Config = url.parse().expect("test URL");
    let mut out = format!("host={} port={}", addr.ip(), addr.port());
    if let Some(user) = pg.get_user() {
        out.push_str(&format!(" user='{user}'"));
    }
    if let Some(db) = pg.get_dbname() {
        out.push_str(&format!(" dbname='{db}'"));
    }
    if let Some(pw) = pg.get_password() {
        out.push_str(&format!(" password='{}'", String::from_utf8_lossy(pw)));
    }
    out
}

/// The address `url` names (its first host and port).
pub fn upstream(url: &str) -> SocketAddr {
    let pg: tokio_postgres::Config = url.parse().expect("test URL");
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_string(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    (host.as_str(), port)
        .to_socket_addrs()
        .expect("resolve")
        .next()
        .expect("an address")
}
