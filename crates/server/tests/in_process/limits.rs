//! Limits a node enforces with clear errors, and overload it survives: oversized keys,
//! values, batches and messages are refused with their typed error; a flood of requests
//! beyond the in-flight limit gets `ServerBusy` for the excess, and the node goes on
//! serving with every acknowledged write intact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use phoenix_proto as proto;
use phoenix_server::MetaMember;
use proto::error::Kind;

use crate::common::*;

fn kind(e: Option<proto::Error>) -> Option<Kind> {
    e.and_then(|e| e.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_requests_are_refused_and_overload_gets_server_busy() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let mut cfg = config(1, &addr, dir.path(), &meta, 1);
    cfg.value_bytes_max = 1024;
    cfg.inflight_requests_max = 4;
    let node = start(cfg);
    let addrs = vec![addr.clone()];
    let route = wait_route(&addrs).await;
    put(&addrs, &route, b"before", b"ok").await;
    let mut c = kv(&addr).await;

    // A value over the configured limit.
    let r = c
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: b"big".to_vec().into(),
            value: vec![1u8; 2000].into(),
        })
        .await
        .unwrap()
        .into_inner();
    match kind(r.error) {
        Some(Kind::ValueTooLarge(v)) => assert_eq!((v.size, v.limit), (2000, 1024)),
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    // A key over 4 KiB, in a batch this time: the whole batch is refused.
    let r = c
        .batch_write(proto::BatchWriteRequest {
            header: header(&route),
            mutations: vec![
                put_mutation(*b"fine", b"v"),
                put_mutation(vec![b'k'; proto::limits::KEY_BYTES_MAX + 1], b"v"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(kind(r.error), Some(Kind::KeyTooLarge(_))),
        "oversized key in a batch accepted"
    );
    // Too many keys in one batch.
    let many: Vec<proto::Mutation> = (0..proto::limits::BATCH_KEYS_MAX + 1)
        .map(|i| proto::Mutation {
            expire_at_ms: 0,
            keep_ttl: false,
            ttl_ms: 0,
            op: proto::MutationOp::Delete as i32,
            key: format!("m{i}").into_bytes().into(),
            value: Default::default(),
        })
        .collect();
    let r = c
        .batch_write(proto::BatchWriteRequest {
            header: header(&route),
            mutations: many,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(kind(r.error), Some(Kind::RequestTooLarge(_))),
        "batch over BATCH_KEYS_MAX accepted"
    );
    // A key expiry that is not well formed: never a client's absolute time, never a new
    // expiry and the key's own at once (nothing written).
    for m in [
        proto::Mutation {
            ttl_ms: 1_000,
            keep_ttl: true,
            ..proto::Mutation::default()
        },
        proto::Mutation {
            expire_at_ms: 1,
            ..proto::Mutation::default()
        },
    ] {
        let r = c
            .batch_write(proto::BatchWriteRequest {
                header: header(&route),
                mutations: vec![proto::Mutation {
                    op: proto::MutationOp::Put as i32,
                    key: b"ttl".to_vec().into(),
                    value: b"v".to_vec().into(),
                    ..m
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let k = kind(r.error);
        assert!(
            matches!(k, Some(Kind::InvalidArgument(_))),
            "a malformed expiry got {k:?}"
        );
    }
    // A gRPC message over the transport limit is refused by the transport.
    let st = c
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: b"huge".to_vec().into(),
            value: vec![0u8; proto::limits::MESSAGE_BYTES_MAX + 1].into(),
        })
        .await;
    assert!(st.is_err(), "a message over MESSAGE_BYTES_MAX got through");
    for k in [&b"big"[..], b"fine", b"m0", b"huge", b"ttl"] {
        assert_eq!(
            get(&addrs, &route, k).await,
            None,
            "refused write {k:?} applied"
        );
    }

    // A flood: many more concurrent requests than the in-flight limit. The excess gets
    // ServerBusy, nothing else; what was acknowledged is there afterwards.
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let ch = kv(&addr).await;
        let route = route.clone();
        tasks.push(tokio::spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..40u32 {
                let mut ch = ch.clone();
                let h = header(&route);
                set.spawn(async move {
                    let k = format!("flood-{t}-{i}");
                    let r = ch
                        .put(proto::PutRequest {
                            keep_ttl: false,
                            ttl_ms: 0,
                            header: h,
                            key: k.clone().into_bytes().into(),
                            value: k.clone().into_bytes().into(),
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    (k, kind(r.error))
                });
            }
            let mut out = Vec::new();
            while let Some(r) = set.join_next().await {
                out.push(r.unwrap());
            }
            out
        }));
    }
    let (mut ok, mut busy) = (Vec::new(), 0);
    for t in tasks {
        for (k, e) in t.await.unwrap() {
            match e {
                None => ok.push(k),
                Some(Kind::ServerBusy(_)) => busy += 1,
                other => panic!("flooded put {k}: unexpected {other:?}"),
            }
        }
    }
    eprintln!("flood: {} acknowledged, {busy} ServerBusy", ok.len());
    assert!(busy > 0, "320 concurrent puts never exceeded 4 in flight");
    assert!(!ok.is_empty(), "no flooded put was served");
    for k in &ok {
        assert_eq!(
            get(&addrs, &route, k.as_bytes()).await,
            Some(k.clone().into_bytes())
        );
    }
    // Still serving normally.
    put(&addrs, &route, b"after", b"ok").await;
    assert_eq!(get(&addrs, &route, b"before").await, Some(b"ok".to_vec()));
    tokio::time::timeout(Duration::from_secs(30), node.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_stream_answers_every_item_and_ends_when_the_node_stops() {
    use proto::batch_request_item::Request as Q;
    use proto::batch_response_item::Response as A;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let mut cfg = config(1, &addr, dir.path(), &meta, 1);
    cfg.inflight_requests_max = 4;
    let node = start(cfg);
    let addrs = vec![addr.clone()];
    let route = wait_route(&addrs).await;
    let mut c = kv(&addr).await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut answers = c
        .batch(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // An item with no request, then more puts at once than the node admits, in one
    // message: each gets its own answer.
    let n = 200u64;
    let mut items = vec![proto::BatchRequestItem {
        id: 0,
        request: None,
    }];
    for i in 1..=n {
        items.push(proto::BatchRequestItem {
            id: i,
            request: Some(Q::Put(proto::PutRequest {
                keep_ttl: false,
                ttl_ms: 0,
                header: header(&route),
                key: format!("s{i}").into_bytes().into(),
                value: b"v".to_vec().into(),
            })),
        });
    }
    tx.send(proto::BatchRequest { items }).unwrap();
    let mut got = std::collections::HashMap::new();
    while got.len() < n as usize + 1 {
        let msg = tokio::time::timeout(Duration::from_secs(30), answers.message())
            .await
            .expect("answers within 30 s")
            .unwrap()
            .expect("the stream stays open while the client's side is");
        for item in msg.items {
            assert!(
                got.insert(item.id, item).is_none(),
                "an item answered twice"
            );
        }
    }
    assert!(
        matches!(kind(got[&0].error.clone()), Some(Kind::InvalidArgument(_))),
        "{:?}",
        got[&0]
    );
    let (mut ok, mut busy) = (Vec::new(), 0);
    for i in 1..=n {
        match &got[&i].response {
            Some(A::Put(r)) => match kind(r.error.clone()) {
                None => ok.push(i),
                Some(Kind::ServerBusy(_)) => busy += 1,
                other => panic!("put {i}: unexpected {other:?}"),
            },
            other => panic!("put {i}: {other:?}"),
        }
    }
    eprintln!("batch flood: {} acknowledged, {busy} ServerBusy", ok.len());
    assert!(!ok.is_empty() && busy > 0, "admission applies per item");
    // The stream goes on after all that: an oversized key gets its typed error, and
    // acknowledged writes are readable on it.
    let mut items: Vec<_> = ok
        .iter()
        .map(|i| proto::BatchRequestItem {
            id: 1000 + i,
            request: Some(Q::Get(proto::GetRequest {
                header: header(&route),
                key: format!("s{i}").into_bytes().into(),
            })),
        })
        .take(3)
        .collect();
    items.push(proto::BatchRequestItem {
        id: 999,
        request: Some(Q::Put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: vec![b'k'; proto::limits::KEY_BYTES_MAX + 1].into(),
            value: b"v".to_vec().into(),
        })),
    });
    tx.send(proto::BatchRequest { items }).unwrap();
    let mut read = 0;
    while read < ok.len().min(3) + 1 {
        let msg = tokio::time::timeout(Duration::from_secs(30), answers.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for item in msg.items {
            match item.response {
                Some(A::Put(r)) if item.id == 999 => {
                    assert!(
                        matches!(kind(r.error.clone()), Some(Kind::KeyTooLarge(_))),
                        "{r:?}"
                    );
                    read += 1;
                }
                Some(A::Get(r)) if r.error.is_none() => {
                    assert!(r.found && r.value.as_ref() == b"v", "{r:?}");
                    read += 1;
                }
                other => panic!("get {}: {other:?}", item.id),
            }
        }
    }
    // The node stops with the stream open (the client never ends its side): the
    // stream ends and the stop does not wait on it.
    tokio::time::timeout(Duration::from_secs(30), node.stop())
        .await
        .expect("a node with an open batch stream stops");
    let end = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("the stream ends when the node stops");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
    drop(tx);
}
