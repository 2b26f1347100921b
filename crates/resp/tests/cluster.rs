//! The Redis front end over a real three-node cluster (two groups, split at "m"):
//! binary keys and values at the size limit, errors that leave the connection usable,
//! INCR from several connections at once adding up exactly (one replicated command each,
//! or a compare-and-swap while a node has not said it applies increments yet),
//! MSET refused across groups and atomic within one, SCAN and DBSIZE over both groups.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{pipeline, req, R};
use phoenix_client::{Client, ClientOptions};
use phoenix_resp::{ClusterStore, InNode, ServerInfo};
use phoenix_server::{Config, MetaMember};
use tokio::net::TcpStream;

#[path = "../../engine/tests/support/port.rs"]
mod port;
use port::free_port;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_commands_run_against_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let meta: Vec<MetaMember> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| MetaMember {
            id: i as u64 + 1,
            addr: a.clone(),
        })
        .collect();
    let mut stops = Vec::new();
    let mut nodes = Vec::new();
    // The front end runs "inside" node 1: its calls to node 1 take node 1's request
    // layer in the process.
    let in_node_1 = phoenix_server::Requests::default();
    for (i, a) in addrs.iter().enumerate() {
        let mut c = Config::new(
            i as u64 + 1,
            a,
            dir.path().join(format!("n{i}")),
            meta.clone(),
        );
        c.tick = Duration::from_millis(10);
        c.reserve_space = 0;
        c.split_keys = vec![b"m".to_vec()];
        // Leaders stay where the test puts them.
        c.balance_leaders = false;
        // Nor are replicas moved (the made-up node the gate test registers has none).
        c.balance_replicas = false;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(tx);
        let requests = if i == 0 {
            in_node_1.clone()
        } else {
            phoenix_server::Requests::default()
        };
        nodes.push(tokio::spawn(phoenix_server::run_with(
            c,
            async move {
                let _ = rx.await;
            },
            requests,
        )));
    }
    let opts = ClientOptions {
        timeout: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    let client = Client::connect(addrs.clone(), opts.clone()).await.unwrap();
    // Both groups serve before the front end is tried.
    client.put(b"a-ready", b"1").await.unwrap();
    client.put(b"z-ready", b"1").await.unwrap();
    client.delete(b"a-ready").await.unwrap();
    client.delete(b"z-ready").await.unwrap();
    // Node 1 leads both groups, so the front end's calls are its own to serve.
    for route in client.cached_routes() {
        // (An election in between can refuse a transfer: ask again.)
        let mut tries = 0;
        while let Err(e) = client.transfer_leader(route.group_id, 1).await {
            tries += 1;
            assert!(tries < 20, "group {} to node 1: {e}", route.group_id);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_resp, resp_stopped) = tokio::sync::oneshot::channel::<()>();
    let gateway_client = Client::connect(
        vec![addrs[0].clone()],
        ClientOptions {
            local_node: Some(Arc::new(InNode::new(addrs[0].clone(), in_node_1.clone()))),
            ..opts
        },
    )
    .await
    .unwrap();
    let gateway = tokio::spawn(phoenix_resp::serve(
        listener,
        Arc::new(ClusterStore::new(gateway_client)),
        ServerInfo::default(),
        None,
        async move {
            let _ = resp_stopped.await;
        },
    ));
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();

    // Binary keys and values; the largest value the cluster takes, and one byte more.
    let big = vec![b'\x07'; phoenix_proto::limits::VALUE_BYTES_MAX];
    let too_big = vec![0u8; phoenix_proto::limits::VALUE_BYTES_MAX + 1];
    let r = pipeline(
        &mut c,
        &[
            req(&[b"SET", b"bin\x00\r\nkey", b"v\r\n\x00"]),
            req(&[b"GET", b"bin\x00\r\nkey"]),
            req(&[b"SET", b"big", &big]),
            req(&[b"SET", b"big2", &too_big]),
            req(&[b"STRLEN-NOT-A-COMMAND", b"big"]),
            req(&[b"GET", b"missing"]),
        ],
    )
    .await;
    assert_eq!(r[0], R::Simple("OK".into()));
    assert_eq!(r[1], R::Bulk(Some(b"v\r\n\x00".to_vec())));
    assert_eq!(r[2], R::Simple("OK".into()));
    assert!(
        matches!(&r[3], R::Error(e) if e.contains("exceeds the limit")),
        "{:?}",
        r[3]
    );
    assert!(matches!(&r[4], R::Error(e) if e.starts_with("ERR unknown command")));
    assert_eq!(r[5], R::Bulk(None));
    let r = pipeline(&mut c, &[req(&[b"GET", b"big"])]).await;
    assert_eq!(r[0], R::Bulk(Some(big)));

    // INCR from four connections at once: every increment counts once. Once the
    // nodes have heard every node's protocol level, each is one replicated command:
    // one call to node 1's request layer (the compare-and-swap loop takes two or more).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client.incr(b"a-gate", 1).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the INCR gate stayed shut"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.delete(b"a-gate").await.unwrap();
    let served_before = in_node_1.served();
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(tokio::spawn(async move {
            let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            for _ in 0..25 {
                let r = pipeline(&mut c, &[req(&[b"INCR", b"counter"])]).await;
                assert!(matches!(r[0], R::Int(_)), "{r:?}");
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let r = pipeline(&mut c, &[req(&[b"GET", b"counter"])]).await;
    assert_eq!(r[0], R::Bulk(Some(b"100".to_vec())));
    let calls = in_node_1.served() - served_before - 1;
    assert!(
        (100..150).contains(&calls),
        "{calls} calls for 100 INCRs (and one GET)"
    );

    // Key expiry (the gate is open: the nodes heard each other's level above).
    let r = pipeline(
        &mut c,
        &[
            req(&[b"SET", b"t1", b"v", b"PX", b"1500"]),
            req(&[b"SETEX", b"t2", b"100", b"v"]),
            req(&[b"TTL", b"t2"]),
            req(&[b"EXPIRE", b"t2", b"50", b"GT"]),
            req(&[b"PERSIST", b"t2"]),
            req(&[b"TTL", b"t2"]),
            req(&[b"INCR", b"tc"]),
            req(&[b"EXPIRE", b"tc", b"1", b"NX"]),
            req(&[b"INCR", b"tc"]),
            req(&[b"GET", b"t1"]),
        ],
    )
    .await;
    assert_eq!(
        r,
        vec![
            R::Simple("OK".into()),
            R::Simple("OK".into()),
            R::Int(100),
            R::Int(0),
            R::Int(1),
            R::Int(-1),
            R::Int(1),
            R::Int(1),
            R::Int(2),
            R::Bulk(Some(b"v".to_vec())),
        ]
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let r = pipeline(
        &mut c,
        &[
            req(&[b"GET", b"t1"]),
            req(&[b"EXISTS", b"t1", b"t2", b"tc"]),
            req(&[b"TTL", b"tc"]),
            req(&[b"DEL", b"t2"]),
        ],
    )
    .await;
    assert_eq!(r, vec![R::Bulk(None), R::Int(1), R::Int(-2), R::Int(1)]);

    // MSET: refused across the two groups (nothing written), atomic within one.
    let r = pipeline(
        &mut c,
        &[
            req(&[b"MSET", b"a1", b"x", b"z1", b"y"]),
            req(&[b"MGET", b"a1", b"z1"]),
            req(&[b"MSET", b"a1", b"x", b"a2", b"y", b"a1", b"x2"]),
            req(&[b"MGET", b"a1", b"a2", b"z1"]),
            req(&[b"MSET", b"z1", b"1", b"z2", b"2"]),
            req(&[b"EXISTS", b"a1", b"z1", b"nope", b"a1"]),
            req(&[b"DEL", b"a1", b"z2", b"nope"]),
            req(&[b"SET", b"a2", b"n", b"XX", b"GET"]),
            req(&[b"SETNX", b"a2", b"again"]),
            req(&[b"INCR", b"a2"]),
        ],
    )
    .await;
    assert!(
        matches!(&r[0], R::Error(e) if e.starts_with("CROSSSLOT")),
        "{:?}",
        r[0]
    );
    assert_eq!(r[1], R::Array(Some(vec![R::Bulk(None), R::Bulk(None)])));
    assert_eq!(r[2], R::Simple("OK".into()));
    assert_eq!(
        r[3],
        R::Array(Some(vec![
            R::Bulk(Some(b"x2".to_vec())),
            R::Bulk(Some(b"y".to_vec())),
            R::Bulk(None)
        ]))
    );
    assert_eq!(r[4], R::Simple("OK".into()));
    assert_eq!(r[5], R::Int(3));
    assert_eq!(r[6], R::Int(2));
    assert_eq!(r[7], R::Bulk(Some(b"y".to_vec())));
    assert_eq!(r[8], R::Int(0));
    assert!(
        matches!(&r[9], R::Error(e) if e.contains("not an integer")),
        "{:?}",
        r[9]
    );

    // SCAN and DBSIZE see the keys of both groups.
    let r = pipeline(&mut c, &[req(&[b"DBSIZE"]), req(&[b"KEYS", b"*"])]).await;
    let R::Array(Some(keys)) = &r[1] else {
        panic!("{r:?}")
    };
    let keys: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| match k {
            R::Bulk(Some(k)) => k.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            b"a2".to_vec(),
            b"big".to_vec(),
            b"bin\x00\r\nkey".to_vec(),
            b"counter".to_vec(),
            b"z1".to_vec()
        ]
    );
    assert_eq!(r[0], R::Int(5));
    let mut cursor = b"0".to_vec();
    let mut scanned = Vec::new();
    loop {
        let r = pipeline(&mut c, &[req(&[b"SCAN", &cursor, b"COUNT", b"2"])]).await;
        let R::Array(Some(parts)) = &r[0] else {
            panic!("{r:?}")
        };
        let (R::Bulk(Some(next)), R::Array(Some(page))) = (&parts[0], &parts[1]) else {
            panic!("{r:?}")
        };
        scanned.extend(page.iter().cloned());
        if next == b"0" {
            break;
        }
        cursor = next.clone();
    }
    assert_eq!(scanned.len(), 5, "{scanned:?}");

    // A node registered at level 6, then heard at 5, shuts the INCR gate: the front end
    // falls back to its swap loop, and asks the cluster once in 5 s, not at every INCR
    // (one refused call, then a read and a swap each).
    let beat = |protocol: u32| {
        let addrs = addrs.clone();
        async move {
            for a in &addrs {
                let mut m = phoenix_proto::meta_client::MetaClient::connect(format!("http://{a}"))
                    .await
                    .unwrap();
                let r = m
                    .heartbeat(phoenix_proto::HeartbeatRequest {
                        node_id: 9,
                        addr: "127.0.0.1:1".into(),
                        stats: Some(phoenix_proto::NodeStats {
                            protocol,
                            ..Default::default()
                        }),
                        timeout_ms: 3000,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                if r.error.is_none() {
                    return;
                }
            }
            panic!("no meta leader took the heartbeat");
        }
    };
    beat(phoenix_meta::PROTOCOL).await;
    beat(phoenix_meta::PROTOCOL_INCR - 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !matches!(
        client.incr(b"a-gate", 1).await,
        Err(phoenix_client::ClientError::Unsupported { .. })
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "the INCR gate stayed open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served_before = in_node_1.served();
    for i in 1..=20 {
        let r = pipeline(&mut c, &[req(&[b"INCR", b"a-swapped"])]).await;
        assert_eq!(r[0], R::Int(i), "{r:?}");
    }
    let calls = in_node_1.served() - served_before;
    assert!(
        (40..50).contains(&calls),
        "{calls} calls for 20 INCRs on a shut gate (41 with the kept refusal, 60 without)"
    );
    beat(phoenix_meta::PROTOCOL).await;

    // The single-key calls (GET, SET, INCR, SET NX's compare-and-swap…) took node 1's request
    // layer in the process.
    let served = in_node_1.served();
    assert!(served >= 20, "{served} calls served in the process");
    let _ = stop_resp.send(());
    gateway.await.unwrap();
    for s in stops {
        let _ = s.send(());
    }
    for n in nodes {
        n.await.unwrap().unwrap();
    }
    // A stopped node's request layer refuses, unserved, so a client goes elsewhere.
    assert!(!in_node_1.ready());
    let answer = in_node_1
        .serve(phoenix_client::LocalRequest::Get(
            phoenix_proto::GetRequest {
                header: Some(phoenix_proto::RequestHeader {
                    group_id: 1,
                    timeout_ms: 1000,
                    ..Default::default()
                }),
                key: b"a".to_vec().into(),
            },
        ))
        .await;
    let phoenix_client::LocalResponse::Get(get) = answer else {
        panic!("a get answered with {answer:?}");
    };
    let error = get.error.expect("refused");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(in_node_1.served(), served);
}
