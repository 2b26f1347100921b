//! Peers speaking nonsense to a live cluster (a seeded fuzz run; `PHOENIX_SEED` replays
//! one, and a failure prints its seed). Raft batches and snapshot streams that break
//! the protocol are sent to every node while a client writes: batches for another node,
//! messages for groups the node does not host, messages whose sender is not the batch's,
//! malformed raft messages; snapshot streams without a header, for another node, with a
//! wrong raft message, a bad file name, files whose bytes do not match their sizes and
//! checksums, or files that match them but hold no table; node heartbeats with node id
//! 0 or an address no one could dial. Each is refused or dropped: no snapshot is
//! accepted, no node is registered, no node stops, no replica stops, every acknowledged
//! write is still there, and the cluster serves on.
//!
//! Well-formed messages that lie (a forged vote or acknowledgement in the name of a
//! member) are outside Raft's fault model; the peers' gate (TLS, the nodes' token) is
//! what keeps them out (docs/security.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../proto/tests/support/random_wire.rs"]
mod random_wire;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use phoenix_client::{Client, ClientOptions};
use phoenix_proto as proto;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use random_wire::{bytes, random_message};

/// Nonsense sent, of each kind.
const ROUNDS: usize = 150;

/// A group id no node hosts.
const STRANGER_GROUP: u64 = 1 << 40;

type RaftClient = proto::raft_transport_client::RaftTransportClient<tonic::transport::Channel>;

async fn raft_client(addr: &str) -> RaftClient {
    RaftClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .max_encoding_message_size(proto::limits::MESSAGE_BYTES_MAX)
}

/// A raft message that decoding must refuse (one defect, chosen at random).
fn malformed(rng: &mut ChaCha8Rng, from: u64, to: u64) -> proto::RaftMessage {
    let mut m = random_message(rng);
    m.from = from;
    m.to = to;
    match rng.gen_range(0..4) {
        0 => m.kind = 99,
        1 => m.from = 0,
        2 => {
            m.kind = proto::RaftMessageType::Append as i32;
            m.snapshot = None;
            m.index = 5;
            m.entries = vec![proto::RaftEntry {
                term: 1,
                index: 9,
                kind: proto::EntryKind::Normal as i32,
                data: bytes(rng, 8),
            }];
        }
        _ => {
            m.kind = proto::RaftMessageType::Snapshot as i32;
            m.snapshot = None;
        }
    }
    m
}

/// A batch to node `to` (of `n` nodes) that the node must refuse or drop whole.
fn nonsense_batch(rng: &mut ChaCha8Rng, to: u64, n: u64) -> proto::RaftBatch {
    let from = rng.gen_range(1..=n);
    let messages = |rng: &mut ChaCha8Rng,
                    group: &dyn Fn(&mut ChaCha8Rng) -> u64,
                    msg: &dyn Fn(&mut ChaCha8Rng) -> proto::RaftMessage| {
        (0..rng.gen_range(1..4))
            .map(|_| proto::GroupMessage {
                group_id: group(rng),
                epoch: rng.gen_range(0..4),
                message: Some(msg(rng)),
            })
            .collect::<Vec<_>>()
    };
    let real_group = |rng: &mut ChaCha8Rng| rng.gen_range(0..2);
    match rng.gen_range(0..4) {
        // For another node.
        0 => proto::RaftBatch {
            from_node: from,
            to_node: to + n,
            messages: messages(rng, &real_group, &|r| random_message(r)),
        },
        // For groups it does not host.
        1 => proto::RaftBatch {
            from_node: from,
            to_node: to,
            messages: messages(rng, &|r| STRANGER_GROUP + r.gen_range(0..1000), &|r| {
                let mut m = random_message(r);
                m.from = from;
                m.to = to;
                m
            }),
        },
        // Messages in another sender's name.
        2 => proto::RaftBatch {
            from_node: from,
            to_node: to,
            messages: messages(rng, &real_group, &|r| {
                let mut m = random_message(r);
                m.from = from + n;
                m.to = to;
                m
            }),
        },
        // Malformed.
        _ => proto::RaftBatch {
            from_node: from,
            to_node: to,
            messages: messages(rng, &real_group, &|r| malformed(r, from, to)),
        },
    }
}

/// A snapshot stream to node `to` with at least one defect.
fn nonsense_snapshot(rng: &mut ChaCha8Rng, to: u64, n: u64) -> Vec<proto::SnapshotChunk> {
    let from = rng.gen_range(1..=n);
    let mut msg = random_message(rng);
    msg.kind = proto::RaftMessageType::Snapshot as i32;
    msg.from = from;
    msg.to = to;
    msg.entries.clear();
    msg.snapshot = Some(proto::SnapshotMeta {
        index: rng.gen_range(1..1000),
        term: rng.gen_range(1..10),
        conf: Some(proto::ConfState {
            voters: (1..=n).collect(),
            learners: Vec::new(),
        }),
    });
    let data = bytes(rng, 300).to_vec();
    let mut header = proto::SnapshotHeader {
        group_id: rng.gen_range(0..2),
        from_node: from,
        to_node: to,
        message: Some(msg),
        start_key: Default::default(),
        end_key: Default::default(),
        epoch: 1,
        files: vec![proto::SnapshotFile {
            name: "000001.sst".into(),
            size: data.len() as u64,
            crc32c: crc32c::crc32c(&data),
        }],
        format: 0,
        store_id: String::new(),
        copies: Vec::new(),
    };
    let mut chunks = vec![data.clone()];
    match rng.gen_range(0..10) {
        0 => return Vec::new(),
        1 => {
            return vec![proto::SnapshotChunk {
                header: None,
                file_index: 0,
                offset: 0,
                data: data.into(),
            }]
        }
        2 => header.to_node = to + n,
        3 => header.message = Some(malformed(rng, from, to)),
        4 => header.files[0].name = "../000001.sst".into(),
        5 => header.files[0].crc32c ^= 1,
        // Every byte as declared, but no table: refused before raft sees it (installing
        // it would fail, and stop the replica).
        6 => {}
        // A format from a newer binary.
        7 => header.format = rng.gen_range(3..1000),
        // Tables to copy named in a streamed snapshot.
        8 => {
            header.store_id = "s3://bucket@http://127.0.0.1:1".into();
            header.copies = vec![proto::SharedTable {
                level: 1,
                object: "cluster/node-9/000007.sst".into(),
                size: 4096,
            }];
        }
        _ => {
            // Bytes short of, or past, the declared size.
            if rng.gen_bool(0.5) || data.is_empty() {
                chunks[0].push(0);
            } else {
                chunks[0].pop();
            }
        }
    }
    let mut out = vec![proto::SnapshotChunk {
        header: Some(header),
        file_index: 0,
        offset: 0,
        data: Default::default(),
    }];
    let mut offset = 0;
    for c in chunks {
        out.push(proto::SnapshotChunk {
            header: None,
            file_index: 0,
            offset,
            data: c.clone().into(),
        });
        offset += c.len() as u64;
    }
    out
}

/// A node heartbeat (from a node id past the cluster's `n`) with node id 0 or an address
/// no one could dial.
fn nonsense_heartbeat(rng: &mut ChaCha8Rng, n: u64) -> proto::HeartbeatRequest {
    const BAD: &[&str] = &[
        "",
        "host",
        "host:",
        "host:port",
        "host:70000",
        ":7001",
        "http://host:7001",
    ];
    let addr = if rng.gen_bool(0.5) {
        BAD[rng.gen_range(0..BAD.len())].to_string()
    } else {
        // Random text with a space somewhere: never an address.
        let mut s: String = (0..rng.gen_range(0..12))
            .map(|_| char::from(rng.gen_range(b'!'..=b'~')))
            .collect();
        s.insert(rng.gen_range(0..=s.len()), ' ');
        s
    };
    proto::HeartbeatRequest {
        node_id: if rng.gen_bool(0.2) {
            0
        } else {
            n + rng.gen_range(1..100)
        },
        addr,
        timeout_ms: 1000,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_speaking_nonsense_are_refused_and_change_nothing() {
    let seed: u64 = std::env::var("PHOENIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("PHOENIX_SEED={seed}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| start(config(i as u64 + 1, a, dir.path(), &meta, 3)))
        .collect();
    let client = Client::connect(
        addrs.clone(),
        ClientOptions {
            timeout: Duration::from_secs(20),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let mut acked = BTreeMap::new();
    let n = addrs.len() as u64;
    for round in 0..ROUNDS {
        let k = format!("key{:03}", round % 40);
        client
            .put(k.as_bytes(), round.to_string().as_bytes())
            .await
            .unwrap();
        acked.insert(k, round.to_string());

        let to = rng.gen_range(1..=n);
        let addr = &addrs[to as usize - 1];
        let batch = nonsense_batch(&mut rng, to, n);
        let mut raft = raft_client(addr).await;
        // Refused (the stream ends with an error) or dropped message by message.
        let _ = raft.stream(tokio_stream::iter(vec![batch])).await;

        let chunks = nonsense_snapshot(&mut rng, to, n);
        // Refused: an error, or an answer that says so.
        if let Ok(done) = raft.send_snapshot(tokio_stream::iter(chunks)).await {
            assert!(
                !done.get_ref().accepted,
                "a snapshot with a defect was accepted (seed {seed}, round {round})"
            );
        }

        let hb = nonsense_heartbeat(&mut rng, n);
        let mut meta = proto::meta_client::MetaClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        if let Ok(r) = meta.heartbeat(hb.clone()).await {
            assert!(
                r.get_ref().error.is_some(),
                "heartbeat {hb:?} taken (seed {seed}, round {round})"
            );
        }
    }
    // The cluster serves on, with everything acknowledged.
    for (k, v) in &acked {
        assert_eq!(
            client.get(k.as_bytes()).await.unwrap(),
            Some(v.as_bytes().to_vec()),
            "{k} (seed {seed})"
        );
    }
    client.put(b"after", b"nonsense").await.unwrap();
    let st = client.cluster_status().await.unwrap();
    let registered: Vec<u64> = st.nodes.iter().map(|n| n.node_id).collect();
    assert_eq!(registered, vec![1, 2, 3], "nodes registered (seed {seed})");
    for g in &st.groups {
        for r in &g.replica_status {
            assert!(
                r.stopped.is_empty(),
                "group {} stopped on node {}: {} (seed {seed})",
                g.group_id,
                r.node_id,
                r.stopped
            );
        }
    }
    // No node stopped on its own (stopping one that did fails here).
    for node in nodes {
        node.stop().await;
    }
}
