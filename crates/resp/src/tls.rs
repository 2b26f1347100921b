//! TLS on the Redis port (`--tls-cert/--tls-key/--tls-ca` of the node): the node's
//! certificate, and clients' certificates checked against the cluster's CA. A client
//! whose certificate the CA signed is let in without a password; without one it must
//! AUTH, and when the node takes no password at all the handshake asks for a
//! certificate (so no connection is ever let in by neither).

use std::sync::Arc;

use phoenix_proto::security::{TlsFiles, HANDSHAKE_TIMEOUT};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

/// The TLS side of the Redis port.
#[derive(Clone)]
pub struct Tls {
    /// Client certificate asked for in the handshake.
    certificate_required: tokio_rustls::TlsAcceptor,
    /// Client certificate checked if shown.
    certificate_optional: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(…)")
    }
}

impl Tls {
    /// Serves with `files`' certificate, which must be there.
    pub fn new(files: &TlsFiles) -> Result<Tls, String> {
        Ok(Tls {
            certificate_required: acceptor(files, true)?,
            certificate_optional: acceptor(files, false)?,
        })
    }

    /// Runs the handshake on `sock`, asking for a client certificate if
    /// `certificate_required`: the stream, and whether the client showed a certificate
    /// the CA signed.
    pub(crate) async fn accept(
        &self,
        sock: TcpStream,
        certificate_required: bool,
    ) -> std::io::Result<(TlsStream<TcpStream>, bool)> {
        let acceptor = if certificate_required {
            &self.certificate_required
        } else {
            &self.certificate_optional
        };
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the TLS handshake took too long",
                )
            })??;
        let by_certificate = stream
            .get_ref()
            .1
            .peer_certificates()
            .is_some_and(|c| !c.is_empty());
        Ok((stream, by_certificate))
    }
}

fn acceptor(
    files: &TlsFiles,
    certificate_required: bool,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    let (chain, key) = files
        .identity()
        .ok_or("TLS on the Redis port needs --tls-cert and --tls-key")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in files.ca_certs() {
        roots.add(c.clone()).map_err(|e| format!("--tls-ca: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    );
    let verifier = if certificate_required {
        verifier
    } else {
        verifier.allow_unauthenticated()
    }
    .build()
    .map_err(|e| format!("--tls-ca: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
