//! Every message a peer can send, against random input (a seeded fuzz run;
//! `PHOENIX_SEED` replays one, and a failure prints its seed):
//! - random bytes, and valid encodings with random bytes changed, decoded as each
//!   message a peer sends (raft batches, snapshot chunks, node heartbeats): never a
//!   panic, and the raft messages inside go through the same validation as on a node;
//! - raft messages with random fields (extremes, unknown kinds, holes, overflowing
//!   indexes, broken memberships): `message_from_wire` refuses them or hands the raft
//!   core a message that keeps the invariants it relies on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use bytes::Bytes;
use phoenix_proto as proto;
use phoenix_proto::convert::message_from_wire;
use phoenix_raft as raft;
use prost::Message as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::random_wire::{bytes, num, random_message};

fn seed() -> u64 {
    let seed = std::env::var("PHOENIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    // (Printed first, so a panic's output names it.)
    eprintln!("PHOENIX_SEED={seed}");
    seed
}

/// What the raft core may assume of a message the wire layer hands it.
fn check_accepted(m: &raft::Message) {
    assert_ne!(m.from, raft::NONE, "{m:?}");
    assert_ne!(m.to, raft::NONE, "{m:?}");
    if !m.entries.is_empty() {
        assert_eq!(m.kind, raft::MessageType::Append, "{m:?}");
    }
    for (i, e) in m.entries.iter().enumerate() {
        let want = m.index.checked_add(1 + i as u64);
        assert_eq!(
            Some(e.index),
            want,
            "entries not contiguous after {}: {m:?}",
            m.index
        );
        if e.kind == raft::EntryKind::ConfChange {
            // Refused or decoded: never a panic.
            let _ = raft::ConfChange::decode(&e.data);
        }
    }
    assert_eq!(
        m.snapshot.is_some(),
        m.kind == raft::MessageType::Snapshot,
        "{m:?}"
    );
    if let Some(s) = &m.snapshot {
        s.meta.conf.validate().unwrap();
    }
}

fn decode_raft(wire: proto::RaftMessage) {
    if let Ok(m) = message_from_wire(wire, Bytes::new()) {
        check_accepted(&m);
    }
}

#[test]
fn raft_messages_with_random_fields_are_refused_or_sound() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut accepted = 0;
    for _ in 0..100_000 {
        let wire = random_message(&mut rng);
        if let Ok(m) = message_from_wire(wire, Bytes::new()) {
            check_accepted(&m);
            accepted += 1;
        }
    }
    // The generator must reach the accepting side too, or the check above checks nothing.
    assert!(
        accepted > 1_000,
        "only {accepted} of 100,000 accepted (seed {seed})"
    );
}

/// A valid encoding of each message a peer sends, for mutation.
fn samples(rng: &mut ChaCha8Rng) -> Vec<(&'static str, Vec<u8>)> {
    let batch = proto::RaftBatch {
        from_node: 2,
        to_node: 1,
        messages: (0..3)
            .map(|g| proto::GroupMessage {
                group_id: g,
                epoch: 1,
                message: Some(random_message(rng)),
            })
            .collect(),
    };
    let chunk = proto::SnapshotChunk {
        header: Some(proto::SnapshotHeader {
            group_id: 7,
            from_node: 2,
            to_node: 1,
            message: Some(random_message(rng)),
            start_key: bytes(rng, 8),
            end_key: bytes(rng, 8),
            epoch: 3,
            files: vec![proto::SnapshotFile {
                name: "000001.sst".into(),
                size: num(rng),
                crc32c: rng.gen(),
            }],
            format: rng.gen(),
            store_id: String::from_utf8_lossy(&bytes(rng, 16)).into_owned(),
            copies: vec![proto::SharedTable {
                level: rng.gen(),
                object: String::from_utf8_lossy(&bytes(rng, 24)).into_owned(),
                size: num(rng),
            }],
        }),
        file_index: 0,
        offset: 0,
        data: bytes(rng, 64),
    };
    let heartbeat = proto::HeartbeatRequest {
        node_id: 2,
        addr: "127.0.0.1:7002".into(),
        ..Default::default()
    };
    vec![
        ("RaftBatch", batch.encode_to_vec()),
        ("SnapshotChunk", chunk.encode_to_vec()),
        ("HeartbeatRequest", heartbeat.encode_to_vec()),
    ]
}

/// Decodes `buf` as the message `kind` names, and what a node does next with it.
fn decode_as(kind: &str, buf: &[u8]) {
    match kind {
        "RaftBatch" => {
            if let Ok(b) = proto::RaftBatch::decode(buf) {
                for gm in b.messages {
                    if let Some(m) = gm.message {
                        decode_raft(m);
                    }
                }
            }
        }
        "SnapshotChunk" => {
            if let Ok(c) = proto::SnapshotChunk::decode(buf) {
                if let Some(m) = c.header.and_then(|h| h.message) {
                    decode_raft(m);
                }
            }
        }
        _ => {
            let _ = proto::HeartbeatRequest::decode(buf);
        }
    }
}

#[test]
fn random_bytes_as_peer_messages_never_panic() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..2_000 {
        for (kind, valid) in samples(&mut rng) {
            // Any bytes.
            let junk = bytes(&mut rng, 256);
            decode_as(kind, &junk);
            // A valid encoding, cut or with bytes changed.
            let mut m = valid.clone();
            for _ in 0..rng.gen_range(1..4) {
                if m.is_empty() {
                    break;
                }
                let i = rng.gen_range(0..m.len());
                m[i] = rng.gen();
            }
            decode_as(kind, &m);
            let cut = rng.gen_range(0..=valid.len());
            decode_as(kind, &valid[..cut]);
        }
    }
}
