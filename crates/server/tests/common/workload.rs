//! A keyed workload through `phoenix-client` for the tests that change groups under
//! load (split, merge): writers that each own a share of the keys, a reader, and the
//! check that every acknowledged write is found.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use phoenix_client::{Client, ClientOptions};

/// Keys written.
pub const KEYS: u32 = 200;
/// Concurrent writers of [`load`].
pub const WRITERS: u32 = 4;

pub fn key(i: u32) -> Vec<u8> {
    format!("key{i:05}").into_bytes()
}

pub fn value(i: u32, round: u32) -> Vec<u8> {
    format!("{i}:{round}:{}", "x".repeat(100)).into_bytes()
}

pub async fn client(addrs: &[String]) -> Client {
    let opts = ClientOptions {
        timeout: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    Client::connect(addrs.to_vec(), opts).await.unwrap()
}

/// Every key holds the value of its last acknowledged write, by point reads and by one
/// scan over the whole key space (across every group).
pub async fn check_all(c: &Client, acked: &BTreeMap<u32, u32>) {
    for (&i, &round) in acked {
        assert_eq!(
            c.get(&key(i)).await.unwrap(),
            Some(value(i, round)),
            "key {i} lost its acknowledged write of round {round}"
        );
    }
    let all = c.scan(b"", b"", 0).await.unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = acked
        .iter()
        .map(|(&i, &round)| (key(i), value(i, round)))
        .collect();
    assert_eq!(all.len(), want.len(), "scan over every group");
    assert!(all == want, "scan over every group differs from the writes");
}

/// Writers (each owns the keys ≡ w mod [`WRITERS`], so its last acknowledged write is
/// each key's value; each returns the last round it wrote per key) and a reader (every
/// key it reads is present; it returns how many it read), until `stop`.
pub async fn load(
    addrs: &[String],
    stop: &Arc<AtomicBool>,
) -> (
    Vec<tokio::task::JoinHandle<BTreeMap<u32, u32>>>,
    tokio::task::JoinHandle<u32>,
) {
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let c = client(addrs).await;
        let stop = Arc::clone(stop);
        writers.push(tokio::spawn(async move {
            let mut last = BTreeMap::new();
            let mut round = 1;
            while !stop.load(Ordering::Relaxed) {
                for i in (w..KEYS).step_by(WRITERS as usize) {
                    c.put(&key(i), &value(i, round))
                        .await
                        .unwrap_or_else(|e| panic!("put of key {i} round {round}: {e}"));
                    last.insert(i, round);
                }
                round += 1;
            }
            last
        }));
    }
    let reader = {
        let c = client(addrs).await;
        let stop = Arc::clone(stop);
        tokio::spawn(async move {
            let mut reads = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let i = reads * 7 % KEYS;
                let v = c
                    .get(&key(i))
                    .await
                    .unwrap_or_else(|e| panic!("get {i}: {e}"));
                let v = v.unwrap_or_else(|| panic!("key {i} missing under load"));
                assert!(v.starts_with(format!("{i}:").as_bytes()));
                reads += 1;
            }
            reads
        })
    };
    (writers, reader)
}
