//! Test certificates made on the spot with rcgen: a CA, a server leaf for
//! 127.0.0.1 and localhost, and client leaves with chosen names, written as
//! PEM files the way an operator would have them.
//!
//! Shared by the TLS tests of several crates (included with `#[path]`).

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A certificate authority that signs leaves.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

/// The names a client leaf gets in the tests that look at them.
pub const CLIENT_NAMES: [&str; 3] = ["worker-7.example", "spiffe://example/worker", "ops@example.org"];

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn sign(&self, names: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, "leaf");
        params.subject_alt_names = names;
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).expect("sign the leaf");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> Leaf {
        let names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::DnsName("localhost".try_into().expect("ia5")),
        ];
        self.sign(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate named by [`CLIENT_NAMES`] (a DNS name, a URI
    /// and an email address) and 10.0.0.7.
    pub fn client(&self) -> Leaf {
        let names = vec![
            SanType::DnsName(CLIENT_NAMES[0].try_into().expect("ia5")),
            SanType::URI(CLIENT_NAMES[1].try_into().expect("ia5")),
            SanType::Rfc822Name(CLIENT_NAMES[2].try_into().expect("ia5")),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))),
        ];
        self.sign(names, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate with the one DNS name `name`.
    pub fn client_named(&self, name: &str) -> Leaf {
        let names = vec![SanType::DnsName(name.try_into().expect("ia5"))];
        self.sign(names, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// PEM files in a temporary directory.
pub struct Files {
    pub dir: tempfile::TempDir,
}

impl Files {
    pub fn new() -> Files {
        Files {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn write(&self, name: &str, pem: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}
