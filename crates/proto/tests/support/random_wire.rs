//! Random wire values for the fuzz tests of what peers send (shared by the proto
//! and server tests).
#![allow(dead_code)]

use bytes::Bytes;
use phoenix_proto as proto;
use phoenix_raft as raft;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// A number a peer might send: small, at the edges, or anything.
pub fn num(rng: &mut ChaCha8Rng) -> u64 {
    match rng.gen_range(0..8) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX - rng.gen_range(0..4),
        4 | 5 => rng.gen_range(0..16),
        _ => rng.gen(),
    }
}

pub fn bytes(rng: &mut ChaCha8Rng, max: usize) -> Bytes {
    let n = rng.gen_range(0..=max);
    Bytes::from((0..n).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>())
}

pub fn ids(rng: &mut ChaCha8Rng) -> Vec<u64> {
    let n = rng.gen_range(0..5);
    let mut v: Vec<u64> = (0..n).map(|_| num(rng)).collect();
    if rng.gen_bool(0.5) {
        v.sort_unstable();
        v.dedup();
    }
    v
}

pub fn enum_value(rng: &mut ChaCha8Rng, known: i32) -> i32 {
    if rng.gen_bool(0.9) {
        rng.gen_range(0..known)
    } else {
        rng.gen()
    }
}

pub fn random_message(rng: &mut ChaCha8Rng) -> proto::RaftMessage {
    let index = num(rng);
    let n = rng.gen_range(0..4);
    let contiguous = rng.gen_bool(0.7);
    let entries = (0..n)
        .map(|i| {
            let kind = enum_value(rng, 2);
            let data = if kind == proto::EntryKind::ConfChange as i32 && rng.gen_bool(0.5) {
                raft::ConfChange::AddVoter(num(rng)).encode()
            } else {
                bytes(rng, 24)
            };
            proto::RaftEntry {
                term: num(rng),
                index: if contiguous {
                    index.wrapping_add(1).wrapping_add(i)
                } else {
                    num(rng)
                },
                kind,
                data,
            }
        })
        .collect();
    proto::RaftMessage {
        kind: enum_value(rng, 13),
        from: num(rng),
        to: num(rng),
        term: num(rng),
        log_term: num(rng),
        index,
        entries,
        commit: num(rng),
        reject: rng.gen(),
        reject_hint: num(rng),
        snapshot: rng.gen_bool(0.2).then(|| proto::SnapshotMeta {
            index: num(rng),
            term: num(rng),
            conf: rng.gen_bool(0.8).then(|| proto::ConfState {
                voters: ids(rng),
                learners: ids(rng),
            }),
        }),
        context: bytes(rng, 16),
        leader_transfer: rng.gen(),
    }
}
