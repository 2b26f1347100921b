//! Certificates for local clusters and tests (feature `dev-certs`): a CA made on the
//! spot, and node and client certificates it signs (rcgen, ECDSA P-256). The CA's key
//! lives only in memory: what it signed cannot be added to later, which is what a
//! playground or a test wants. Production clusters bring their own CA.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::security::SecurityError;

/// A certificate and its private key, as PEM.
pub struct PemPair {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

impl PemPair {
    /// Writes the certificate to `cert` and the key to `key`, both readable by their
    /// owner only, synced.
    pub fn write(&self, cert: &Path, key: &Path) -> std::io::Result<()> {
        write_private(cert, self.cert.as_bytes())?;
        write_private(key, self.key.as_bytes())
    }
}

/// Writes `bytes` to `path`, readable by its owner only, synced.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// A CA made on the spot.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    name: String,
    cert: String,
}

fn failed(e: rcgen::Error) -> SecurityError {
    SecurityError::Config(format!("making a certificate: {e}"))
}

impl DevCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<DevCa, SecurityError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.self_signed(&key).map_err(failed)?.pem();
        Ok(DevCa {
            issuer: Issuer::new(params, key),
            name: name.to_string(),
            cert,
        })
    }

    /// The CA's certificate.
    pub fn cert_pem(&self) -> &str {
        &self.cert
    }

    /// A node's certificate for `hosts` (names or IP addresses), for server and client
    /// authentication (nodes present theirs to each other).
    pub fn node(&self, who: &str, hosts: &[&str]) -> Result<PemPair, SecurityError> {
        self.sign(
            who,
            hosts,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client's certificate (client authentication only).
    pub fn client(&self, who: &str) -> Result<PemPair, SecurityError> {
        self.sign(who, &[], vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn sign(
        &self,
        who: &str,
        hosts: &[&str],
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<PemPair, SecurityError> {
        let names: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let mut params = CertificateParams::new(names).map_err(failed)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{} {who}", self.name));
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        Ok(PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}
