//! TLS to `https://` coordinators: which CA to trust and which client
//! certificate to present, and plain words for the errors of a client and a
//! coordinator that disagree about TLS.
//!
//! Without a CA, an `https://` coordinator's certificate is checked against
//! the system's roots. `http://` coordinators are spoken to in plaintext
//! whatever is configured here.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use leasefence_core::Invalid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The TLS settings of a client; see [`crate::ClientOptions::with_tls`].
///
/// ```
/// use leasefence_client::ClientTls;
///
/// let e = ClientTls::new().with_ca_pem("not a certificate").unwrap_err();
/// assert_eq!(e.field(), "ca");
/// ```
#[derive(Clone, Default)]
pub struct ClientTls {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for ClientTls {
    // Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// TLS with the system's roots and no client certificate.
    pub fn new() -> ClientTls {
        ClientTls::default()
    }

    /// Trusts the CA certificates in `pem` (instead of the system's roots).
    /// Refused (field `ca`) unless it holds at least one PEM certificate.
    pub fn with_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Result<ClientTls, Invalid> {
        let pem = pem.as_ref();
        certificates("ca", pem)?;
        self.ca = Some(pem.to_vec());
        Ok(self)
    }

    /// Presents this certificate chain and its private key (PEM) to
    /// coordinators that require client certificates (mutual TLS). Refused
    /// (field `cert` or `key`) unless each holds what it should.
    pub fn with_identity_pem(mut self, cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Result<ClientTls, Invalid> {
        let chain = certificates("cert", cert.as_ref())?;
        let der = PrivateKeyDer::from_pem_slice(key.as_ref()).map_err(|e| {
            Invalid::new(
                "key",
                format!("holds no usable PEM private key ({e}); allowed: PKCS#8, PKCS#1 or SEC1 in PEM"),
            )
        })?;
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, der, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => Invalid::new("key", "does not belong to the certificate"),
            e => Invalid::new("key", format!("cannot be used: {e}")),
        })?;
        self.identity = Some((cert.as_ref().to_vec(), key.as_ref().to_vec()));
        Ok(self)
    }

    /// tonic's configuration for these settings.
    pub(crate) fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

impl ClientTls {
    /// A rustls configuration for these settings (the frame protocol's TLS):
    /// the given CA, else the system's roots; the client certificate, if any.
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig, Invalid> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(pem) => {
                for cert in certificates("ca", pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| Invalid::new("ca", format!("cannot be trusted: {e}")))?;
                }
            }
            None => {
                // Unreadable system certificates are skipped, as tonic's native roots do.
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Invalid::new("tls", e.to_string()))?
            .with_root_certificates(roots);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = certificates("cert", cert)?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| Invalid::new("key", format!("holds no usable PEM private key ({e})")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| Invalid::new("key", format!("cannot be used: {e}")))
            }
        }
    }
}

fn certificates(field: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Invalid> {
    let found = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Invalid::new(field, format!("is not PEM ({e}); allowed: PEM certificates")))?;
    if found.is_empty() {
        return Err(Invalid::new(
            field,
            "holds no PEM certificate; allowed: one or more -----BEGIN CERTIFICATE----- blocks",
        ));
    }
    Ok(found)
}

/// What to say instead of `e`, a failure talking to `url`, when it shows
/// that client and coordinator disagree about TLS, or that the
/// coordinator's certificate is not trusted.
pub(crate) fn mismatch(url: &str, e: &(dyn Error + 'static)) -> Option<String> {
    let https = url.starts_with("https://");
    let mut cur = Some(e);
    while let Some(err) = cur {
        if !https && err.to_string().contains(leasefence_proto::TLS_REQUIRED) {
            return Some(format!(
                "the coordinator speaks TLS on this port and refused this plaintext connection: use \
                 {} (and a CA that issued its certificate, if not the system's)",
                url.replacen("http://", "https://", 1)
            ));
        }
        if https && let Some(certificate) = refused_certificate(err) {
            return Some(format!(
                "the coordinator's certificate was not accepted ({certificate}): trust the CA that issued it \
                 (the client's CA option; `--ca FILE` on the command line), and reach it by a name or \
                 address its certificate lists"
            ));
        }
        if https && not_tls(err) {
            return Some(format!(
                "the coordinator did not answer TLS: is it serving plaintext? Then use {} ({err})",
                url.replacen("https://", "http://", 1)
            ));
        }
        cur = err.source();
    }
    None
}

/// Whether `e` is a TLS handshake that got something other than TLS back:
/// bytes that are no TLS record, or a close before any.
fn not_tls(e: &(dyn Error + 'static)) -> bool {
    let Some(io) = e.downcast_ref::<std::io::Error>() else {
        return false;
    };
    if io.kind() == std::io::ErrorKind::UnexpectedEof && io.to_string().contains("handshake") {
        return true;
    }
    matches!(rustls_error(e), Some(rustls::Error::InvalidMessage(_)))
}

/// The rustls error of `e` when it is an I/O error wrapping one.
fn rustls_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    e.downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
}

/// The reason the coordinator's certificate was refused, if it was.
fn refused_certificate(e: &(dyn Error + 'static)) -> Option<String> {
    match rustls_error(e)? {
        rustls::Error::InvalidCertificate(reason) => Some(format!("{reason:?}")),
        _ => None,
    }
}
