//! Certificates for the tests, made by rcgen: a CA, and client certificates it signs.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA that signs client certificates.
pub(crate) struct TestCa {
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A client certificate and its key.
pub(crate) struct ClientCert {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
}

impl TestCa {
    pub(crate) fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA's PEM into `dir` and returns the file.
    pub(crate) fn write(&self, dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).unwrap();
        path
    }

    /// A client certificate with CN `cn` (none when empty) and O `organization` (rcgen keeps
    /// one value per attribute type).
    pub(crate) fn client(&self, cn: &str, organization: Option<&str>) -> ClientCert {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        // rcgen's default subject has a CN of its own.
        params.distinguished_name = DistinguishedName::new();
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        if let Some(o) = organization {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ClientCert {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}
