//! Makes a test's client vanish the way a powered-off host or a stopped VM
//! does: its connection is forgotten without a FIN or an RST, so the server
//! learns of it only by probing (TCP keepalive).
//!
//! A socket closed in `TCP_REPAIR` mode is dropped by its kernel without a
//! word to the peer. That needs `CAP_NET_ADMIN`: without it [`vanish`] fails
//! the test under `CI=true` and says it skipped elsewhere.
//!
//! Shared by the keepalive tests of several crates (included with `#[path]`).

use std::os::fd::AsRawFd;

/// Closes `stream` so that the peer is never told: `false` when this
/// process may not (no `CAP_NET_ADMIN`), after saying the test skipped.
pub fn vanish(stream: tokio::net::TcpStream) -> bool {
    let stream = stream.into_std().expect("a std socket");
    let on: libc::c_int = 1;
    // SAFETY: the descriptor is an open TCP socket owned by `stream`, which
    // outlives the call; the value is a c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true needs CAP_NET_ADMIN to make a client vanish (TCP_REPAIR): {e}"
        );
        eprintln!("skipped: cannot make a client vanish without CAP_NET_ADMIN (TCP_REPAIR: {e})");
        return false;
    }
    drop(stream);
    true
}
