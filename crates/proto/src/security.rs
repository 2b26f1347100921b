//! Security of every gRPC hop, client → node and node → node: TLS (rustls) with the
//! cluster's CA, and bearer tokens in gRPC metadata (`authorization: Bearer <token>`).
//!
//! - [`TlsFiles`]: a CA and, optionally, a certificate and key, read from PEM files and
//!   checked when read (a bad file is refused at start, not at the first connection).
//! - [`Credentials`]: what a caller presents — the CA it checks nodes against, its own
//!   certificate (nodes always; clients if they have one) and a token. It makes the
//!   [`Endpoint`] to a node and the channel whose calls carry the token ([`Bearer`]).
//! - [`Gate`]: what a node asks of every caller. With TLS, a caller is let in by a
//!   certificate the CA signed, or else by a token; with tokens and no TLS, by a token.
//!   Without either, everyone is let in (as before TLS existed). The services only
//!   peers call take the first token only (the nodes' own, [`Gate::for_peers`]).
//!
//! Nodes present their own certificate to their peers, so a node's certificate is for
//! both server and client authentication, and names the host of its advertised address.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};
use tonic::{Request, Status};

/// The metadata key the token travels under.
pub const TOKEN_KEY: &str = "authorization";

/// A token file's size at most: it holds a few lines.
const TOKEN_FILE_BYTES_MAX: u64 = 1 << 20;

/// Why security material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A file could not be read.
    #[error("reading the {what} {}: {source}", path.display())]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but does not hold what it should.
    #[error("the {what} {}: {why}", path.display())]
    Invalid {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Flags that do not go together.
    #[error("{0}")]
    Config(String),
}

/// A TLS handshake may take this long, on either side: a peer that accepted the TCP
/// connection but is stalled must not hold a connection attempt for good.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS material read from PEM files: the CA every node's certificate is signed by, and
/// optionally this side's certificate chain and private key. Kept as read (for tonic)
/// and parsed (for rustls users: the Redis port).
#[derive(Clone)]
pub struct TlsFiles {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    ca_certs: Vec<CertificateDer<'static>>,
    parsed_identity: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// Reads the CA (`ca`) and, if both are given, a certificate chain and its key.
    pub fn read(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<TlsFiles, SecurityError> {
        let ca_pem = read_file("CA certificate (--tls-ca)", ca)?;
        let ca_certs = certificates("CA certificate (--tls-ca)", ca, &ca_pem)?;
        let (identity, parsed_identity) = match cert_key {
            None => (None, None),
            Some((cert, key)) => {
                let cert_pem = read_file("certificate (--tls-cert)", cert)?;
                let chain = certificates("certificate (--tls-cert)", cert, &cert_pem)?;
                let key_pem = read_file("private key (--tls-key)", key)?;
                let parsed_key = private_key(key, &key_pem)?;
                (
                    Some((cert_pem, key_pem)),
                    Some((chain, Arc::new(parsed_key))),
                )
            }
        };
        Ok(TlsFiles {
            ca: ca_pem,
            identity,
            ca_certs,
            parsed_identity,
        })
    }

    /// Reads the three flags' files as a node or client does: the CA alone, all three,
    /// or none (no TLS); a certificate without its key (or the reverse), or either
    /// without a CA, is refused.
    pub fn from_flags(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<TlsFiles>, SecurityError> {
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), None, None) => TlsFiles::read(ca, None).map(Some),
            (Some(ca), Some(cert), Some(key)) => TlsFiles::read(ca, Some((cert, key))).map(Some),
            (None, _, _) => Err(SecurityError::Config(
                "--tls-cert and --tls-key need --tls-ca (the CA that signed the nodes' certificates)"
                    .into(),
            )),
            _ => Err(SecurityError::Config(
                "--tls-cert and --tls-key go together".into(),
            )),
        }
    }

    /// Whether a certificate and key are held.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// The CA's certificates.
    pub fn ca_certs(&self) -> &[CertificateDer<'static>] {
        &self.ca_certs
    }

    /// The certificate chain and its key, if held.
    pub fn identity(&self) -> Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        self.parsed_identity
            .as_ref()
            .map(|(chain, key)| (chain.clone(), key.clone_key()))
    }

    /// The node side: serve TLS with this certificate, verify callers' certificates
    /// against the CA, and require one unless `certificate_optional` (callers may then
    /// come in by token instead).
    pub fn server_config(
        &self,
        certificate_optional: bool,
    ) -> Result<ServerTlsConfig, SecurityError> {
        let Some((cert, key)) = &self.identity else {
            return Err(SecurityError::Config(
                "a node serving TLS needs --tls-cert and --tls-key".into(),
            ));
        };
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .client_auth_optional(certificate_optional)
            .timeout(HANDSHAKE_TIMEOUT))
    }

    fn client_config(&self) -> ClientTlsConfig {
        let c = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.identity {
            Some((cert, key)) => c.identity(Identity::from_pem(cert, key)),
            None => c,
        }
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The certificates of `pem`: at least one, and nothing unreadable.
fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let invalid = |why: String| SecurityError::Invalid {
        what,
        path: path.to_path_buf(),
        why,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The private key of `pem`.
fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, SecurityError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| SecurityError::Invalid {
        what: "private key (--tls-key)",
        path: path.to_path_buf(),
        why: format!("no PEM private key: {e}"),
    })
}

/// Reads a token file: one token per line; blank lines and lines starting with `#` are
/// skipped. Tokens are visible ASCII (they travel in a header) and at least 16 bytes (a
/// short one could be guessed). At least one is required.
pub fn read_tokens(path: &Path) -> Result<Vec<String>, SecurityError> {
    let what = "token file (--token-file)";
    let invalid = |why: String| SecurityError::Invalid {
        what,
        path: path.to_path_buf(),
        why,
    };
    let len = std::fs::metadata(path)
        .map_err(|source| SecurityError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if len > TOKEN_FILE_BYTES_MAX {
        return Err(invalid(format!(
            "is {len} bytes, more than a token file holds"
        )));
    }
    let text = String::from_utf8(read_file(what, path)?)
        .map_err(|_| invalid("is not UTF-8 text".into()))?;
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "line {}: a token is visible ASCII without spaces",
                i + 1
            )));
        }
        if t.len() < 16 {
            return Err(invalid(format!(
                "line {}: a token is at least 16 characters",
                i + 1
            )));
        }
        tokens.push(t.to_string());
    }
    if tokens.is_empty() {
        return Err(invalid("holds no token".into()));
    }
    Ok(tokens)
}

/// What a caller presents to the nodes it calls.
#[derive(Clone, Default)]
pub struct Credentials {
    tls: Option<ClientTlsConfig>,
    bearer: Bearer,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls.is_some())
            .field("token", &self.bearer.0.is_some())
            .finish()
    }
}

impl Credentials {
    /// Calls over TLS with `tls` (None: plaintext), carrying `token` if given.
    pub fn new(tls: Option<&TlsFiles>, token: Option<&str>) -> Result<Credentials, SecurityError> {
        let bearer = match token {
            None => Bearer(None),
            Some(t) => {
                let mut v = MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| {
                    SecurityError::Config("a token is visible ASCII without spaces".into())
                })?;
                // Kept out of HTTP/2 header compression tables and Debug output.
                v.set_sensitive(true);
                Bearer(Some(v))
            }
        };
        Ok(Credentials {
            tls: tls.map(TlsFiles::client_config),
            bearer,
        })
    }

    /// A client's credentials from its flags' files: the CA (TLS if given), an optional
    /// certificate and key, and the first token of `token_file`.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        token_file: Option<&Path>,
    ) -> Result<Credentials, SecurityError> {
        let tls = TlsFiles::from_flags(ca, cert, key)?;
        let token = match token_file {
            Some(f) => read_tokens(f)?.into_iter().next(),
            None => None,
        };
        Credentials::new(tls.as_ref(), token.as_deref())
    }

    /// The endpoint of the node at `addr` (host:port): `https` with these credentials'
    /// TLS, else `http`. The node's certificate must name `addr`'s host.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad address {addr:?}: {e}"))?;
        match &self.tls {
            Some(tls) => ep
                .tls_config(tls.clone())
                .map_err(|e| format!("TLS to {addr}: {e}")),
            None => Ok(ep),
        }
    }

    /// `channel` with the token (if any) added to every call.
    pub fn authorize(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, self.bearer.clone())
    }
}

/// Adds `authorization: Bearer <token>` to each call (nothing without a token).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert(TOKEN_KEY, v.clone());
        }
        Ok(req)
    }
}

/// A channel whose calls carry the caller's token.
pub type AuthChannel = InterceptedService<Channel, Bearer>;

/// What a node asks of every caller (see the module doc); an [`Interceptor`] on the
/// node's server.
#[derive(Clone, Default)]
pub struct Gate {
    tokens: Arc<Vec<Vec<u8>>>,
    /// Callers come in by certificate (the node serves TLS and verified the caller's
    /// certificate against the CA in the handshake).
    tls: bool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("tokens", &self.tokens.len())
            .field("tls", &self.tls)
            .finish()
    }
}

impl Gate {
    /// A gate taking `tokens`, and certificates if the node serves TLS.
    pub fn new(tokens: Vec<String>, tls: bool) -> Gate {
        Gate {
            tokens: Arc::new(tokens.into_iter().map(String::into_bytes).collect()),
            tls,
        }
    }

    /// The gate of the services only nodes call (raft messages, snapshots, fault
    /// injection): a certificate the CA signed, or the nodes' own token — the first of
    /// the file, which nodes present to each other. Clients' tokens (the others) are not
    /// taken there: a client must not forge raft messages.
    pub fn for_peers(&self) -> Gate {
        Gate {
            tokens: Arc::new(self.tokens.first().cloned().into_iter().collect()),
            tls: self.tls,
        }
    }

    /// Whether everyone is let in.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty() && !self.tls
    }

    /// Lets `req` in, or says why not.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if self.is_open() {
            return Ok(());
        }
        if self.tls && req.peer_certs().is_some_and(|c| !c.is_empty()) {
            // (rustls verified the chain against the CA in the handshake.)
            return Ok(());
        }
        let given = match req.metadata().get(TOKEN_KEY) {
            None => {
                return Err(Status::unauthenticated(if self.tokens.is_empty() {
                    "this node takes callers with a certificate signed by its CA only"
                } else {
                    "this node needs a token (authorization: Bearer <token>) or a certificate signed by its CA"
                }))
            }
            Some(v) => v.as_bytes(),
        };
        let token = given.strip_prefix(b"Bearer ").unwrap_or(given);
        if matches_any(&self.tokens, token) {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "the token is not one this node takes",
            ))
        }
    }
}

impl Interceptor for Gate {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

/// Whether `given` is one of `secrets`: each is compared (see [`secret_matches`]), so
/// the time depends on their number and the given length only.
pub fn matches_any(secrets: &[Vec<u8>], given: &[u8]) -> bool {
    let mut found = false;
    for want in secrets {
        found |= secret_matches(want, given);
    }
    found
}

/// Whether `given` equals the secret `want`, in time that depends on the length of
/// `given` only: not on where they differ, nor on the secret's length. An empty `want`
/// matches nothing.
pub fn secret_matches(want: &[u8], given: &[u8]) -> bool {
    if want.is_empty() {
        return false;
    }
    let mut differ = u64::from(want.len() != given.len());
    for (i, b) in given.iter().enumerate() {
        differ |= u64::from(b ^ want[i % want.len()]);
    }
    std::hint::black_box(differ) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_match_only_themselves() {
        assert!(secret_matches(b"abcdefghijklmnop", b"abcdefghijklmnop"));
        assert!(!secret_matches(b"abcdefghijklmnop", b"abcdefghijklmnoq"));
        assert!(!secret_matches(
            b"abcdefghijklmnop",
            b"abcdefghijklmnopabcdefghijklmnop"
        ));
        assert!(!secret_matches(b"abcdefghijklmnop", b"abcdefgh"));
        assert!(!secret_matches(b"abcdefghijklmnop", b""));
        assert!(!secret_matches(b"", b""));
    }

    fn with_token(t: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(t) = t {
            r.metadata_mut()
                .insert(TOKEN_KEY, MetadataValue::try_from(t).unwrap());
        }
        r
    }

    #[test]
    fn a_gate_with_tokens_takes_those_and_nothing_else() {
        let g = Gate::new(
            vec!["token-one-0123456789".into(), "token-two-0123456789".into()],
            false,
        );
        assert!(g
            .check(&with_token(Some("Bearer token-one-0123456789")))
            .is_ok());
        assert!(g
            .check(&with_token(Some("Bearer token-two-0123456789")))
            .is_ok());
        for bad in [
            None,
            Some("Bearer token-three-0123456789"),
            Some("Bearer "),
            Some("x"),
        ] {
            let e = g.check(&with_token(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        // Without a certificate a TLS gate with no tokens takes nothing.
        let tls_only = Gate::new(Vec::new(), true);
        assert!(tls_only
            .check(&with_token(Some("Bearer token-one-0123456789")))
            .is_err());
        assert!(Gate::default().check(&with_token(None)).is_ok());
    }

    #[test]
    fn token_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("phoenix-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(
            &f,
            "# ops\n\n  first-token-0123456789  \nsecond-token-0123456789\n",
        )
        .unwrap();
        assert_eq!(
            read_tokens(&f).unwrap(),
            vec!["first-token-0123456789", "second-token-0123456789"]
        );
        for bad in [
            "",
            "# only a comment\n",
            "short\n",
            "has a space 0123456789\n",
        ] {
            std::fs::write(&f, bad).unwrap();
            let e = read_tokens(&f).unwrap_err().to_string();
            assert!(e.contains("token file"), "{bad:?}: {e}");
        }
        assert!(read_tokens(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
