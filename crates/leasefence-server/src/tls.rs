//! TLS on the coordinator's one port: the certificate chain, its key and the
//! optional client CA, read from PEM files into a rustls configuration
//! (ALPN `h2` and `http/1.1`, so gRPC and HTTP/JSON share the port as in
//! plaintext), and the names of a verified client certificate.
//!
//! Everything that can be wrong with the files is found here, at start, and
//! named by the `serve` flag and the path: unreadable, not PEM, no
//! certificate or key in it, a key that does not belong to the certificate,
//! a client CA that is not a CA certificate.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use x509_parser::extensions::GeneralName;

use crate::peer::PeerCertificate;

/// The ALPN protocols offered, preferred first: gRPC needs `h2`.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Which of the TLS files an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    Cert,
    Key,
    ClientCa,
}

impl TlsFile {
    /// The `serve` flag that names this file.
    pub fn flag(self) -> &'static str {
        match self {
            TlsFile::Cert => "--tls-cert",
            TlsFile::Key => "--tls-key",
            TlsFile::ClientCa => "--tls-client-ca",
        }
    }
}

/// A TLS file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{} {}: {reason}", file.flag(), path.display())]
pub struct TlsError {
    pub file: TlsFile,
    pub path: PathBuf,
    pub reason: String,
}

/// Where the PEM files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, every client must present a certificate this CA (or one of
    /// these CAs) issued: mutual TLS.
    pub client_ca: Option<PathBuf>,
}

/// A loaded TLS configuration, ready to serve.
#[derive(Clone)]
pub struct Tls {
    config: Arc<rustls::ServerConfig>,
    client_auth: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("client_auth", &self.client_auth).finish()
    }
}

impl Tls {
    /// Reads and checks the files.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let cert_pem = read(TlsFile::Cert, &files.cert)?;
        let key_pem = read(TlsFile::Key, &files.key)?;
        let chain = certificates(&cert_pem).map_err(|reason| error(TlsFile::Cert, &files.cert, reason))?;
        let leaf = chain.first().map(|c| c.as_ref()).unwrap_or_default();
        if let Err(e) = x509_parser::parse_x509_certificate(leaf) {
            let reason = format!("the first certificate is not a valid X.509 certificate: {e}");
            return Err(error(TlsFile::Cert, &files.cert, reason));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            let reason = match e {
                rustls::pki_types::pem::Error::NoItemsFound => {
                    "holds no PEM private key (-----BEGIN PRIVATE KEY-----, RSA or EC PRIVATE KEY)".to_string()
                }
                e => format!("not a PEM private key: {e}"),
            };
            error(TlsFile::Key, &files.key, reason)
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| error(TlsFile::Cert, &files.cert, format!("no usable TLS version: {e}")))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let roots =
                    client_roots(&read(TlsFile::ClientCa, path)?).map_err(|r| error(TlsFile::ClientCa, path, r))?;
                // A client without a certificate completes the handshake so
                // that its requests can be refused in words it shows (see
                // `edge`); a certificate the CA did not issue fails it.
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| error(TlsFile::ClientCa, path, format!("cannot verify clients with it: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => error(
                TlsFile::Key,
                &files.key,
                format!(
                    "does not belong to the certificate in --tls-cert {}",
                    files.cert.display()
                ),
            ),
            e => error(TlsFile::Key, &files.key, format!("cannot use this key: {e}")),
        })?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Tls {
            config: Arc::new(config),
            client_auth: files.client_ca.is_some(),
        })
    }

    /// Whether clients must present a certificate (mutual TLS).
    pub fn client_auth(&self) -> bool {
        self.client_auth
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

fn error(file: TlsFile, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError {
        file,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read(file: TlsFile, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| error(file, path, format!("cannot read it: {e}")))
}

/// Every PEM certificate in `pem`, at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(chain)
}

fn client_roots(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// The subject alternative names of a (verified) client certificate, as
/// [`PeerCertificate`] lists them; none when it has no such extension.
pub(crate) fn peer_certificate(leaf: &[u8]) -> PeerCertificate {
    let mut names = Vec::new();
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf)
        && let Ok(Some(san)) = cert.subject_alternative_name()
    {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                    names.push((*s).to_string());
                }
                GeneralName::IPAddress(bytes) => names.extend(ip_text(bytes)),
                _ => {}
            }
        }
    }
    PeerCertificate { names }
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(Ipv4Addr::from(v4).to_string());
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| Ipv6Addr::from(v6).to_string())
}
