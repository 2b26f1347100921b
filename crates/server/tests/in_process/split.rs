//! Splitting a group while clients write and read through `phoenix-client`: every
//! acknowledged write is found afterwards in the group that owns its key, the client
//! follows the new routes by itself (StaleEpoch answers carry them), scans cross the
//! boundary, and a restart of every node (memtables lost: the split replays from the
//! log) keeps it all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::workload::{check_all, client, key, load, value, KEYS};
use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_split_under_load_loses_no_write_and_serves_both_halves() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    // Writers and a reader keep going through the split.
    let stop = Arc::new(AtomicBool::new(false));
    let (writers, reader) = load(&addrs, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (left, right) = c.split_group(g, &key(100)).await.unwrap();
    assert_eq!(left.group_id, g);
    assert_ne!(right.group_id, g);
    assert_eq!(
        (left.start.as_slice(), left.end.clone()),
        (&b""[..], key(100))
    );
    assert_eq!(
        (right.start.clone(), right.end.as_slice()),
        (key(100), &b""[..])
    );
    assert_eq!(
        (left.epoch, right.epoch),
        (route.epoch + 1, route.epoch + 1)
    );
    // Asking again for the same split (an answer lost, say) answers it done; a split at
    // a key outside the group's range is refused.
    let again = c.split_group(g, &key(100)).await.unwrap();
    assert_eq!((again.0.group_id, again.1.group_id), (g, right.group_id));
    assert!(c.split_group(g, &key(150)).await.is_err());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    let reads = reader.await.unwrap();
    eprintln!("split under load: {reads} reads, last rounds {acked:?}");
    check_all(&c, &acked).await;
    // Both groups have leaders and take writes; a batch across them is refused.
    let routes = routes_with_leaders_at_least(&addrs, 2).await;
    assert_eq!(routes.len(), 2);
    let cross = c
        .batch_write(&[
            phoenix_client::WriteOp::Put(key(1), b"a".to_vec()),
            phoenix_client::WriteOp::Put(key(150), b"b".to_vec()),
        ])
        .await;
    assert!(cross.is_err(), "a batch across the two groups: {cross:?}");
    // A fresh client learns both routes from the meta service.
    check_all(&client(&addrs).await, &acked).await;
    // Every node restarts: what the engine had in memory is lost, the split replays.
    for n in nodes {
        n.stop().await;
    }
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    routes_with_leaders_at_least(&addrs, 2).await;
    check_all(&client(&addrs).await, &acked).await;
    for n in nodes {
        n.stop().await;
    }
}

/// A replica down while its group splits comes back behind the split: it gets its
/// parent's state by snapshot (the log before a split is not sent), its replica of the
/// new group is created empty from the routing table and filled by a snapshot of the
/// new group. Then it leads both groups and serves every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_down_during_the_split_catches_up_on_both_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    // Any follower: the meta group keeps a quorum without it.
    let down = (route.leader_node_id as usize) % 3;
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    nodes[down].take().unwrap().stop().await;
    let (_, right) = c.split_group(g, &key(120)).await.unwrap();
    for i in (0..KEYS).step_by(3) {
        c.put(&key(i), &value(i, 1)).await.unwrap();
        acked.insert(i, 1);
    }
    nodes[down] = Some(start(cfg(down)));
    let node = down as u64 + 1;
    // Leadership of both groups moves to the node once it has caught up (a transfer
    // goes to an up-to-date replica only: retried until it is).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for group in [g, right.group_id] {
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "node {node} did not catch up on group {group} within 60 s"
            );
            if c.transfer_leader(group, node).await.ok() == Some(node) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    check_all(&c, &acked).await;
    let routes = routes_with_leaders_at_least(&addrs, 2).await;
    assert_eq!(routes.len(), 2);
    assert!(
        routes.iter().all(|r| r.leader_node_id == node),
        "{routes:?}"
    );
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// A replica added to a group after it split starts empty with the group's new range:
/// it must not replay the log from before the split (its commands were checked against
/// the wider range and older epoch), so it gets a snapshot — then holds every key of
/// its range, written before the split or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_added_after_a_split_gets_the_narrowed_group() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<phoenix_server::MetaMember> = meta[..3].to_vec();
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let nodes: Vec<Node> = (0..4).map(|i| start(cfg(i))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let spare = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    c.split_group(g, &key(100)).await.unwrap();
    for i in (0..KEYS).step_by(5) {
        c.put(&key(i), &value(i, 1)).await.unwrap();
        acked.insert(i, 1);
    }
    let voters = c.add_replica(g, spare).await.unwrap();
    assert!(voters.contains(&spare), "{voters:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while c.transfer_leader(g, spare).await.ok() != Some(spare) {
        assert!(
            std::time::Instant::now() < deadline,
            "node {spare} did not catch up on group {g} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check_all(&c, &acked).await;
    for n in nodes {
        n.stop().await;
    }
}

/// Splits asked for at once in two groups both happen: each plan names the next group
/// id when it is made, and the one applied second finds its id taken (the plan is then
/// made again with the next one, instead of being refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn splits_asked_at_once_in_two_groups_both_happen() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    let (_, right) = c.split_group(g, &key(100)).await.unwrap();
    for round in 0..3u32 {
        let groups = c.cluster_status().await.unwrap().groups;
        // Each group split at the middle of its keys, all at once.
        let asks: Vec<_> = groups
            .iter()
            .map(|gs| {
                let lo = gs.start.get(3..).and_then(|k| std::str::from_utf8(k).ok());
                let lo: u32 = lo.and_then(|k| k.parse().ok()).unwrap_or(0);
                let hi: u32 = gs
                    .end
                    .get(3..)
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.parse().ok())
                    .unwrap_or(KEYS);
                let (c, id, mid) = (c.clone(), gs.group_id, (lo + hi) / 2);
                tokio::spawn(async move { (id, c.split_group(id, &key(mid)).await) })
            })
            .collect();
        let mut new_ids = std::collections::BTreeSet::new();
        for a in asks {
            let (id, r) = a.await.unwrap();
            let (_, r) = r.unwrap_or_else(|e| panic!("round {round}: split of group {id}: {e}"));
            assert!(new_ids.insert(r.group_id), "group id {} twice", r.group_id);
        }
        assert_eq!(new_ids.len(), groups.len());
    }
    let groups = c.cluster_status().await.unwrap().groups;
    assert_eq!(groups.len(), 16, "two groups, split three times each");
    assert!(groups.iter().any(|x| x.group_id == right.group_id));
    check_all(&c, &acked).await;
    for n in nodes {
        n.stop().await;
    }
}

/// With a small split size, a group that grows splits by itself, again and again (its
/// leader's node measures it, the meta leader plans the split at the reported middle
/// key); the groups tile the key space and keep every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_growing_group_splits_by_size_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.group_split_bytes = 256 << 10;
        c.split_check_interval = Duration::from_millis(200);
        c.memtable_bytes = 64 << 10;
        c
    };
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    wait_route(&addrs).await;
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    // About 2 MiB in all: room for several groups of 256 KiB.
    for round in 0..10u32 {
        for i in (0..KEYS).map(|i| i * 10 + round) {
            let v = format!(
                "{}{}",
                String::from_utf8(value(i, 0)).unwrap(),
                "y".repeat(900)
            );
            c.put(&key(i), v.as_bytes()).await.unwrap();
            acked.insert(i, v.into_bytes());
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let routes = loop {
        let routes = routes_with_leaders_at_least(&addrs, 1).await;
        if routes.len() >= 4 {
            break routes;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} groups after 60 s",
            routes.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut sorted = routes.clone();
    sorted.sort_by(|a, b| a.start_key.cmp(&b.start_key));
    assert!(sorted[0].start_key.is_empty() && sorted.last().unwrap().end_key.is_empty());
    for w in sorted.windows(2) {
        assert_eq!(w[0].end_key, w[1].start_key, "{sorted:?}");
    }
    eprintln!("split by size into {} groups", routes.len());
    let c = client(&addrs).await;
    for (i, v) in &acked {
        assert_eq!(c.get(&key(*i)).await.unwrap().as_ref(), Some(v), "key {i}");
    }
    let all = c.scan(b"", b"", 0).await.unwrap();
    assert_eq!(all.len(), acked.len());
    for n in nodes {
        n.stop().await;
    }
}

/// A small group that serves many requests splits by load, at the median of its
/// requests' keys, and keeps every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_group_splits_by_load() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.group_split_qps = 200;
        c.split_check_interval = Duration::from_secs(1);
        c
    };
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    wait_route(&addrs).await;
    let mut acked = BTreeMap::new();
    let c = client(&addrs).await;
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    // Readers over every key until the group has split (a few hundred reads a second
    // at least, well over the threshold).
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..4u32 {
        let c = client(&addrs).await;
        let stop = Arc::clone(&stop);
        readers.push(tokio::spawn(async move {
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                c.get(&key(i % KEYS)).await.unwrap();
                i += 7;
            }
        }));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let routes = loop {
        let routes = routes_with_leaders_at_least(&addrs, 1).await;
        if routes.len() >= 2 {
            break routes;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the hot group did not split within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    // Split near the middle of the keys read (the median of a sample).
    let boundary = routes
        .iter()
        .find(|r| !r.start_key.is_empty())
        .map(|r| r.start_key.to_vec())
        .unwrap();
    assert!(
        boundary.as_slice() > key(KEYS / 5).as_slice()
            && boundary.as_slice() < key(KEYS * 4 / 5).as_slice(),
        "split at {} is far from the middle",
        String::from_utf8_lossy(&boundary)
    );
    check_all(&client(&addrs).await, &acked).await;
    for n in nodes {
        n.stop().await;
    }
}
