//! TLS and tokens on every hop: a cluster started with its CA, certificates and a
//! token file serves clients that present the right ones — its peers replicating,
//! forwarding and heartbeating over TLS — and refuses, with a clear error and nothing
//! served, plaintext, a certificate or CA from elsewhere, and a missing or wrong token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::certs::Ca;
use crate::common::*;
use phoenix_client::{Client, ClientError, ClientOptions};
use phoenix_proto as proto;
use phoenix_proto::security::{Credentials, TlsFiles};
use phoenix_server::Security;

/// The nodes' own token (first in their file) and a client's.
const NODE_TOKEN: &str = "the-nodes-token-0123456789";
const TOKEN: &str = "a-client-token-0123456789";

fn options(creds: Credentials) -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(3),
        credentials: creds,
        ..ClientOptions::default()
    }
}

fn tls(ca: &std::path::Path, pair: Option<&certs::Pair>) -> TlsFiles {
    TlsFiles::read(ca, pair.map(|p| (p.cert.as_path(), p.key.as_path()))).unwrap()
}

/// The error of a client that cannot get in, within a short deadline.
async fn refused(addrs: &[String], creds: Credentials) -> ClientError {
    let opts = ClientOptions {
        timeout: Duration::from_secs(2),
        ..options(creds)
    };
    match Client::connect(addrs.to_vec(), opts).await {
        Ok(c) => match c.put(b"never", b"written").await {
            Ok(()) => panic!("a client without the right credentials wrote"),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_tokens_serves_the_right_credentials_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "cluster");
    let elsewhere = Ca::new(dir.path(), "elsewhere");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("# nodes, then clients\n{NODE_TOKEN}\n{TOKEN}\n"),
    )
    .unwrap();
    let (addrs, meta) = loopback_members(3);
    let mut nodes = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        let pair = ca.node(&format!("node{id}"), &["127.0.0.1", "localhost"]);
        let mut cfg = config(id, a, dir.path(), &meta, 3);
        cfg.security = Security {
            tls: Some(tls(&ca.cert, Some(&pair))),
            tokens: phoenix_proto::security::read_tokens(&tokens).unwrap(),
        };
        nodes.push(start(cfg));
    }

    // The right CA and token: everything works. Writes commit only on a majority, and
    // the cluster status comes from the meta leader's heartbeats: peers talk over TLS.
    let good = Credentials::new(Some(&tls(&ca.cert, None)), Some(TOKEN)).unwrap();
    let client = Client::connect(addrs.clone(), options(good.clone()))
        .await
        .unwrap();
    for i in 0..20u32 {
        let k = format!("k{i:02}");
        client.put(k.as_bytes(), b"v").await.unwrap();
        assert_eq!(client.get(k.as_bytes()).await.unwrap(), Some(b"v".to_vec()));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let st = client.cluster_status().await.unwrap();
        let alive = st.nodes.iter().filter(|n| n.alive).count();
        if alive == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodes alive by heartbeat over TLS: {alive} of 3"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A follower forwards a write to the leader with its own credentials.
    let route = {
        let ch = good.endpoint(&addrs[0]).unwrap().connect().await.unwrap();
        let mut m = proto::meta_client::MetaClient::new(good.authorize(ch));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let routes = m
                .get_routes(proto::GetRoutesRequest { timeout_ms: 2000 })
                .await
                .unwrap()
                .into_inner()
                .routes;
            if let Some(r) = routes.into_iter().find(|r| r.leader_node_id != 0) {
                break r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no route with a leader"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let route = &route;
    let follower = route
        .replicas
        .iter()
        .find(|r| r.node_id != route.leader_node_id)
        .unwrap();
    let ch = good
        .endpoint(&follower.addr)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = proto::kv_client::KvClient::new(good.authorize(ch));
    let r = kv
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(route),
            key: b"via-follower".to_vec().into(),
            value: b"forwarded".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none(), "forwarded put refused: {:?}", r.error);
    assert_eq!(
        client.get(b"via-follower").await.unwrap(),
        Some(b"forwarded".to_vec())
    );

    // A client certificate the CA signed lets a client in without a token.
    let with_cert = ca.client("client");
    let by_cert = Credentials::new(Some(&tls(&ca.cert, Some(&with_cert))), None).unwrap();
    let c = Client::connect(addrs.clone(), options(by_cert))
        .await
        .unwrap();
    assert_eq!(c.get(b"k00").await.unwrap(), Some(b"v".to_vec()));

    // No token, a wrong token: refused by the node, typed, at once.
    for (what, token) in [
        ("no token", None),
        ("a wrong token", Some("not-the-token-0123456789")),
    ] {
        let creds = Credentials::new(Some(&tls(&ca.cert, None)), token).unwrap();
        let e = refused(&addrs, creds).await;
        assert!(
            matches!(&e, ClientError::Unauthenticated { why, .. } if why.contains("token")),
            "{what}: {e}"
        );
    }
    // The nodes' certificates checked against another CA: the client refuses them.
    let e = refused(
        &addrs,
        Credentials::new(Some(&tls(&elsewhere.cert, None)), Some(TOKEN)).unwrap(),
    )
    .await;
    assert!(
        matches!(&e, ClientError::Unauthenticated { why, .. } if why.contains("TLS") && why.contains("certificate")),
        "another CA: {e}"
    );
    // Plaintext to the TLS port, even with the token: the node closes the connection
    // and nothing is served (the client cannot tell why: it says what it saw).
    let e = refused(&addrs, Credentials::new(None, Some(TOKEN)).unwrap()).await;
    assert!(
        matches!(&e, ClientError::DeadlineExceeded { last, .. } if last.contains("127.0.0.1")),
        "plaintext: {e}"
    );
    // A certificate from another CA: the node ends the handshake.
    let stranger = elsewhere.client("stranger");
    let e = refused(
        &addrs,
        Credentials::new(Some(&tls(&ca.cert, Some(&stranger))), None).unwrap(),
    )
    .await;
    assert!(
        matches!(&e, ClientError::Unauthenticated { why, .. } if why.contains("UnknownCA")),
        "a stranger's certificate: {e}"
    );

    // The peers' own service takes a certificate or the nodes' token only: a raft
    // stream opened with nothing, or with a client's token, is refused before any
    // message is taken.
    for (what, token) in [("nothing", None), ("a client's token", Some(TOKEN))] {
        let creds = Credentials::new(Some(&tls(&ca.cert, None)), token).unwrap();
        let st = raft_stream(&creds, &addrs[1]).await.unwrap_err();
        assert_eq!(st.code(), tonic::Code::Unauthenticated, "{what}: {st}");
    }
    let nodes_token = Credentials::new(Some(&tls(&ca.cert, None)), Some(NODE_TOKEN)).unwrap();
    raft_stream(&nodes_token, &addrs[1]).await.unwrap();

    // What was refused wrote nothing.
    assert_eq!(client.get(b"never").await.unwrap(), None);
    for n in nodes {
        n.stop().await;
    }
}

/// An empty raft stream to `addr`: accepted, or the refusal.
async fn raft_stream(creds: &Credentials, addr: &str) -> Result<(), tonic::Status> {
    let ch = creds.endpoint(addr).unwrap().connect().await.unwrap();
    let mut raft = proto::raft_transport_client::RaftTransportClient::new(creds.authorize(ch));
    raft.stream(tokio_stream::iter(Vec::<proto::RaftBatch>::new()))
        .await
        .map(drop)
}

/// Starts three nodes, node i with `security(i)`.
fn start_three(
    dir: &std::path::Path,
    security: impl Fn(usize) -> Security,
) -> (Vec<String>, Vec<Node>) {
    let (addrs, meta) = loopback_members(3);
    let nodes = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut cfg = config(i as u64 + 1, a, dir, &meta, 3);
            cfg.security = security(i);
            start(cfg)
        })
        .collect();
    (addrs, nodes)
}

/// Tokens without TLS: asked of clients and peers alike (the nodes replicate with
/// their own token); a client's token does not open the peers' service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_without_tls_are_asked_of_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, nodes) = start_three(dir.path(), |_| Security {
        tls: None,
        tokens: vec![NODE_TOKEN.to_string(), TOKEN.to_string()],
    });
    let good = Credentials::new(None, Some(TOKEN)).unwrap();
    let client = Client::connect(addrs.clone(), options(good.clone()))
        .await
        .unwrap();
    for i in 0..10u32 {
        client.put(format!("k{i}").as_bytes(), b"v").await.unwrap();
    }
    assert_eq!(client.get(b"k9").await.unwrap(), Some(b"v".to_vec()));
    let e = refused(&addrs, Credentials::default()).await;
    assert!(
        matches!(&e, ClientError::Unauthenticated { .. }),
        "no token: {e}"
    );
    let st = raft_stream(&good, &addrs[0]).await.unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st}");
    // Nor does it let a client report as a node (a fake node would be given replicas,
    // and its protocol level would gate every group's commands).
    let st = heartbeat(&good, &addrs[0]).await.unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st}");
    // The nodes' own token gets in (the answer may still be "not the meta leader").
    let nodes_token = Credentials::new(None, Some(NODE_TOKEN)).unwrap();
    heartbeat(&nodes_token, &addrs[0]).await.unwrap();
    for n in nodes {
        n.stop().await;
    }
}

/// A `Meta.Heartbeat` of a node 9 at a valid address, to `addr`: its answer, or the
/// refusal.
async fn heartbeat(
    creds: &Credentials,
    addr: &str,
) -> Result<proto::HeartbeatResponse, tonic::Status> {
    let ch = creds.endpoint(addr).unwrap().connect().await.unwrap();
    let mut meta = proto::meta_client::MetaClient::new(creds.authorize(ch));
    meta.heartbeat(proto::HeartbeatRequest {
        node_id: 9,
        addr: "127.0.0.1:1".into(),
        timeout_ms: 2000,
        ..Default::default()
    })
    .await
    .map(tonic::Response::into_inner)
}

/// TLS without tokens: peers and clients get in by a certificate the CA signed only;
/// a client with the CA but no certificate fails the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_tokens_takes_certificates_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "cluster");
    let pairs: Vec<certs::Pair> = (1..=3)
        .map(|i| ca.node(&format!("node{i}"), &["127.0.0.1"]))
        .collect();
    let (addrs, nodes) = start_three(dir.path(), |i| Security {
        tls: Some(tls(&ca.cert, Some(&pairs[i]))),
        tokens: Vec::new(),
    });
    let with_cert = ca.client("client");
    let by_cert = Credentials::new(Some(&tls(&ca.cert, Some(&with_cert))), None).unwrap();
    let client = Client::connect(addrs.clone(), options(by_cert))
        .await
        .unwrap();
    for i in 0..10u32 {
        client.put(format!("k{i}").as_bytes(), b"v").await.unwrap();
    }
    assert_eq!(client.get(b"k9").await.unwrap(), Some(b"v".to_vec()));
    let e = refused(
        &addrs,
        Credentials::new(Some(&tls(&ca.cert, None)), Some(TOKEN)).unwrap(),
    )
    .await;
    assert!(
        matches!(&e, ClientError::Unauthenticated { why, .. } if why.contains("Certificate")),
        "no certificate: {e}"
    );
    for n in nodes {
        n.stop().await;
    }
}
