//! Replica scrubbing through `phoenix-client`: the replicas of a group checksum its data
//! at the same log index and agree; a replica whose engine was changed behind raft's back
//! is found out (the scrub answers a mismatch, naming it, and the cluster status lists
//! it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use phoenix_client::{Client, ClientOptions};
use phoenix_server::keys;

fn key(i: u32) -> Vec<u8> {
    format!("key{i:04}").into_bytes()
}

async fn client(addrs: &[String]) -> Client {
    let opts = ClientOptions {
        timeout: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    Client::connect(addrs.to_vec(), opts).await.unwrap()
}

/// Writes `value` under group `g`'s user key `k` straight into node `i`'s engine (the
/// node is stopped): a change no raft entry made, as a bit flip or a bug would.
fn tamper(dir: &std::path::Path, i: usize, g: u64, k: &[u8], value: &[u8]) {
    let db = open_stopped_engine(dir, i);
    let wo = phoenix_engine::WriteOptions::default();
    db.put(&wo, &keys::data_key(g, k), value).unwrap();
    db.flush().unwrap();
    db.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_agree_and_a_tampered_one_is_found_out() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let c = client(&addrs).await;
    for i in 0..100 {
        c.put(&key(i), format!("v{i}").as_bytes()).await.unwrap();
    }
    let first = c.scrub_group(g).await.unwrap();
    assert!(first.consistent, "{first:?}");
    assert_eq!(first.replicas.len(), 3, "{first:?}");
    assert!(
        first
            .replicas
            .iter()
            .all(|r| r.keys == 100 && r.index == first.index),
        "{first:?}"
    );
    // The state moves on: a later point, another checksum, still alike.
    for i in 0..10 {
        c.delete(&key(i)).await.unwrap();
    }
    let second = c.scrub_group(g).await.unwrap();
    assert!(
        second.consistent && second.index > first.index,
        "{second:?}"
    );
    assert!(second.replicas.iter().all(|r| r.keys == 90), "{second:?}");
    assert_ne!(second.replicas[0].crc, first.replicas[0].crc);
    // Under writes: each replica cuts its apply rounds elsewhere, so only a checksum
    // taken at the scrub point exactly agrees.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4u32)
        .map(|w| {
            let (c, stop) = (c.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let i = 1000 + w * 10_000 + n % 500;
                    c.put(&key(i), format!("w{w}:{n}").as_bytes())
                        .await
                        .unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut last = second.index;
    for _ in 0..3 {
        let r = c.scrub_group(g).await.unwrap();
        assert!(r.consistent && r.index > last, "under writes: {r:?}");
        last = r.index;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        assert!(w.await.unwrap() > 0);
    }
    // A follower's copy of one key changed behind raft's back.
    let leader = c.cluster_status().await.unwrap().groups[0].leader.unwrap();
    let bad = (0..3).find(|&i| i as u64 + 1 != leader).unwrap();
    nodes[bad].take().unwrap().stop().await;
    tamper(dir.path(), bad, g, &key(50), b"not what was written");
    nodes[bad] = Some(start(cfg(bad)));
    let deadline = Instant::now() + Duration::from_secs(60);
    let third = loop {
        // (Until the restarted node reports again, its voter has no scrub past the
        // last: the request times out and is asked again.)
        match c.scrub_group(g).await {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => eprintln!("scrub: {e}; again"),
            Err(e) => panic!("scrub after the restart: {e}"),
        }
    };
    assert!(!third.consistent, "tampered replica not found: {third:?}");
    let odd: Vec<u64> = third
        .replicas
        .iter()
        .filter(|r| {
            r.crc
                != third
                    .replicas
                    .iter()
                    .find(|x| x.node_id == leader)
                    .unwrap()
                    .crc
        })
        .map(|r| r.node_id)
        .collect();
    assert_eq!(odd, vec![bad as u64 + 1], "{third:?}");
    // The meta leader lists it in the cluster status.
    let status = c.cluster_status().await.unwrap();
    assert!(
        status
            .scrub_mismatches
            .iter()
            .any(|m| m.group_id == g && m.index == third.index),
        "{:?}",
        status.scrub_mismatches
    );
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}
