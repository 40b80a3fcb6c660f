//! What the transport knows about the other end of a connection, handed to
//! the edges as an extension of every request on it (HTTP and gRPC alike).
//!
//! The TLS listener inserts a [`PeerCertificate`] when the client presented a
//! certificate that the configured client CA verified; access control may
//! take a principal from its names. Without TLS, or without a client
//! certificate, the extension is absent.

/// The verified client certificate of the connection a request came on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The certificate's subject alternative names: DNS names, URIs and email
    /// addresses as written, IP addresses in their usual text form.
    pub names: Vec<String>,
}
