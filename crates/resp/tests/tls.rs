//! TLS on the Redis port: a client trusting the cluster's CA gets in with AUTH (a
//! token) or with a certificate the CA signed; plaintext, a client trusting another CA
//! and a certificate from another CA get nothing; with no password configured, only a
//! certificate lets a client in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../server/tests/common/certs.rs"]
mod certs;
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, Pair};
use common::{pipeline, req, R};
use phoenix_proto::security::TlsFiles;
use phoenix_resp::{MemoryStore, Password, ServerInfo, Store, Tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const TOKEN: &[u8] = b"the-cluster-token-0123456789";

/// Serves `store` over TLS with `node`'s certificate; the default user takes TOKEN
/// if `with_password`.
async fn serve(store: &MemoryStore, ca: &Ca, node: &Pair, with_password: bool) -> SocketAddr {
    let files = TlsFiles::read(&ca.cert, Some((&node.cert, &node.key))).unwrap();
    let password = with_password.then(|| Password::any_of(vec![TOKEN.to_vec()]).unwrap());
    let tls = Tls::new(&files).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let info = ServerInfo {
        password,
        ..ServerInfo::default()
    };
    tokio::spawn(phoenix_resp::serve(
        listener,
        Arc::new(store.clone()),
        info,
        Some(tls),
        std::future::pending(),
    ));
    addr
}

/// A TLS connection trusting `trust`, showing `cert` if given; the handshake's error
/// as text if it fails.
async fn tls_client(
    addr: SocketAddr,
    trust: &Ca,
    cert: Option<&Pair>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&trust.cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match cert {
        None => builder.with_no_client_auth(),
        Some(p) => {
            let chain = CertificateDer::pem_file_iter(&p.cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(&p.key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    let sock = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), sock)
        .await
        .map_err(|e| e.to_string())
}

/// Everything the server sends back to `sent` before it closes (5 s at most).
async fn answer_to<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    io: &mut IO,
    sent: &[u8],
) -> Result<Vec<u8>, String> {
    io.write_all(sent).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut got)).await {
        Ok(Ok(_)) => Ok(got),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("still open after 5 s, having sent {got:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_port_over_tls_takes_a_token_or_a_certificate_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "cluster");
    let elsewhere = Ca::new(dir.path(), "elsewhere");
    let node = ca.node("node", &["127.0.0.1"]);
    let store = MemoryStore::default();
    let addr = serve(&store, &ca, &node, true).await;

    // The CA trusted, no certificate: AUTH with the token first.
    let mut c = tls_client(addr, &ca, None).await.unwrap();
    let r = pipeline(
        &mut c,
        &[
            req(&[b"SET", b"k", b"before"]),
            req(&[b"AUTH", b"not-the-token-0123456789"]),
            req(&[b"AUTH", TOKEN]),
            req(&[b"SET", b"k", b"v"]),
            req(&[b"GET", b"k"]),
        ],
    )
    .await;
    assert!(
        matches!(&r[0], R::Error(e) if e.starts_with("NOAUTH")),
        "{:?}",
        r[0]
    );
    assert!(
        matches!(&r[1], R::Error(e) if e.starts_with("WRONGPASS")),
        "{:?}",
        r[1]
    );
    assert_eq!(r[2], R::Simple("OK".into()));
    assert_eq!(r[3], R::Simple("OK".into()));
    assert_eq!(r[4], R::Bulk(Some(b"v".to_vec())));

    // A certificate the CA signed: in without AUTH.
    let client_cert = ca.client("client");
    let mut c = tls_client(addr, &ca, Some(&client_cert)).await.unwrap();
    let r = pipeline(&mut c, &[req(&[b"GET", b"k"])]).await;
    assert_eq!(r[0], R::Bulk(Some(b"v".to_vec())));

    // Plaintext, even with the token: no Redis reply, the connection closed.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    let got = answer_to(
        &mut plain,
        b"AUTH the-cluster-token-0123456789\r\nSET k plain\r\n",
    )
    .await;
    assert!(
        got.as_ref()
            .map_or(true, |b| !b.windows(3).any(|w| w == b"+OK")),
        "plaintext answered: {got:?}"
    );
    // The client trusts another CA: it refuses the node's certificate.
    let e = tls_client(addr, &elsewhere, None).await.unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    // A certificate from another CA: the node ends the connection.
    let stranger = elsewhere.client("stranger");
    let refused = match tls_client(addr, &ca, Some(&stranger)).await {
        Err(e) => Err(e),
        Ok(mut c) => answer_to(&mut c, b"SET k stranger\r\n").await,
    };
    assert!(
        refused.as_ref().map_or(true, |b| b.is_empty()),
        "a stranger's certificate was answered: {refused:?}"
    );
    assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_password_the_redis_port_over_tls_asks_for_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "cluster");
    let node = ca.node("node", &["127.0.0.1"]);
    let store = MemoryStore::default();
    let addr = serve(&store, &ca, &node, false).await;
    let refused = match tls_client(addr, &ca, None).await {
        Err(e) => Err(e),
        Ok(mut c) => answer_to(&mut c, b"SET k v\r\n").await,
    };
    assert!(
        refused.as_ref().map_or(true, |b| b.is_empty()),
        "a client without a certificate was answered: {refused:?}"
    );
    let client_cert = ca.client("client");
    let mut c = tls_client(addr, &ca, Some(&client_cert)).await.unwrap();
    let r = pipeline(&mut c, &[req(&[b"SET", b"k", b"v"]), req(&[b"GET", b"k"])]).await;
    assert_eq!(r[0], R::Simple("OK".into()));
    assert_eq!(r[1], R::Bulk(Some(b"v".to_vec())));
    assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
}
