//! Merging two neighbouring groups while clients write and read through
//! `phoenix-client`: every acknowledged write is found afterwards in the merged group,
//! the client follows the routes by itself, the source's replicas are dropped from every
//! node, and a restart of every node (memtables lost: the merge replays from the log,
//! waiting for the source's prepare) keeps it all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::workload::{check_all, client, key, load, value, KEYS};
use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_groups_merged_under_load_lose_no_write_and_serve_as_one() {
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
    let (left, right) = c.split_group(g, &key(100)).await.unwrap();
    routes_with_leaders_at_least(&addrs, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (writers, reader) = load(&addrs, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The right group goes into the left one.
    let merged = c.merge_group(right.group_id, left.group_id).await.unwrap();
    assert_eq!(merged.group_id, left.group_id);
    assert_eq!(
        (merged.start.as_slice(), merged.end.as_slice()),
        (&b""[..], &b""[..])
    );
    assert!(merged.epoch > left.epoch.max(right.epoch), "{merged:?}");
    // Asking again (an answer lost, say) answers it done; merging a group that is gone
    // is refused.
    let again = c.merge_group(right.group_id, left.group_id).await.unwrap();
    assert_eq!(again.group_id, left.group_id);
    assert!(c.merge_group(left.group_id, right.group_id).await.is_err());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    let reads = reader.await.unwrap();
    eprintln!("merge under load: {reads} reads, last rounds {acked:?}");
    check_all(&c, &acked).await;
    // One group is left, led, holding every key; its replicas agree.
    let routes = routes_with_leaders_at_least(&addrs, 1).await;
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(routes[0].group_id, left.group_id);
    let scrub = c.scrub_group(left.group_id).await.unwrap();
    assert!(scrub.consistent, "{scrub:?}");
    // The right group's replicas are dropped on every node.
    for i in 0..3 {
        wait_dropped(&dir.path().join(format!("node-{}", i + 1)), right.group_id).await;
    }
    // Every node restarts: what the engine had in memory is lost, the merge replays.
    for n in nodes {
        n.stop().await;
    }
    let nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    routes_with_leaders_at_least(&addrs, 1).await;
    let c = client(&addrs).await;
    check_all(&c, &acked).await;
    let scrub = c.scrub_group(left.group_id).await.unwrap();
    assert!(scrub.consistent, "{scrub:?}");
    for n in nodes {
        n.stop().await;
    }
    for i in 0..3 {
        let left_over =
            group_left_on_disk(&dir.path().join(format!("node-{}", i + 1)), right.group_id);
        assert_eq!(
            left_over,
            (0, false),
            "node {}: the merged group's keys and log",
            i + 1
        );
    }
}

/// A merge whose source cannot freeze on every replica (one node is down) is given up
/// after its prepare time: the source thaws and takes writes again, the routing table
/// keeps both groups, and the node that was down replays the freeze and the thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_merge_that_cannot_prepare_everywhere_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let c = client(&addrs).await;
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    let (left, right) = c.split_group(route.group_id, &key(100)).await.unwrap();
    routes_with_leaders_at_least(&addrs, 2).await;
    // A node leading neither group goes down.
    let mut routes = wait_routes(&addrs, "two led groups", |rs| {
        rs.len() == 2 && rs.iter().all(|r| r.leader_node_id != 0)
    })
    .await;
    routes.sort_by_key(|r| r.group_id);
    let down = (1..=3u64)
        .find(|n| routes.iter().all(|r| r.leader_node_id != *n))
        .unwrap_or(3) as usize
        - 1;
    nodes[down].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|i| *i != down)
        .map(|i| addrs[i].clone())
        .collect();
    let c = client(&live).await;
    let started = std::time::Instant::now();
    let r = c.merge_group(right.group_id, left.group_id).await;
    assert!(r.is_err(), "a merge with a source replica down: {r:?}");
    // The plan ends rolled back: both groups are routed, and the source takes writes.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = c.cluster_status().await.unwrap();
        let merging = status.operators.iter().any(|o| o.kind == "merge");
        if !merging {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the merge was not rolled back: {:?}",
            status.operators
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("rolled back after {:?}", started.elapsed());
    for i in (100..KEYS).step_by(5) {
        c.put(&key(i), &value(i, 1)).await.unwrap();
        acked.insert(i, 1);
    }
    let routes = wait_routes(&live, "both groups", |rs| rs.len() == 2).await;
    assert_eq!(routes.len(), 2, "{routes:?}");
    // The node comes back: it replays the freeze and the thaw, and serves everything.
    nodes[down] = Some(start(cfg(down)));
    let c = client(&addrs).await;
    check_all(&c, &acked).await;
    for g in [left.group_id, right.group_id] {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let s = c.scrub_group(g).await;
            if s.as_ref()
                .is_ok_and(|s| s.consistent && s.replicas.len() == 3)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "group {g} scrub: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// Two small neighbours on different voters (one replica moved by hand while merges
/// were off) are merged once merges are on: the merge check first moves the smaller
/// group's replicas onto its neighbour's voters, a change at a time, then merges the
/// two; every write is kept and the merged group's replicas agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn neighbours_on_different_voters_are_aligned_then_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, members) = loopback_members(4);
    let meta = members[..3].to_vec();
    let cfg = |i: usize, merge: bool| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.split_keys = vec![key(KEYS / 2)];
        if merge {
            c.group_merge_bytes = 64 << 20;
            c.merge_after = Duration::from_secs(1);
        }
        c
    };
    // Both groups start on nodes 1-3 (node 4 is not up at the bootstrap); the right one
    // then moves its replica on 3 to 4.
    let mut nodes: Vec<Node> = (0..3).map(|i| start(cfg(i, false))).collect();
    let routes = routes_with_leaders_at_least(&addrs[..3], 2).await;
    nodes.push(start(cfg(3, false)));
    let right = routes
        .iter()
        .find(|r| r.start_key.as_ref() == key(KEYS / 2).as_slice())
        .unwrap()
        .group_id;
    let c = client(&addrs).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !c
        .cluster_status()
        .await
        .is_ok_and(|s| s.nodes.iter().any(|n| n.node_id == 4 && n.alive))
    {
        assert!(std::time::Instant::now() < deadline, "node 4 not up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let voters = c.move_replica(right, 3, 4).await.unwrap();
    assert_eq!(voters, vec![1, 2, 4]);
    let mut acked = BTreeMap::new();
    for i in 0..KEYS {
        c.put(&key(i), &value(i, 0)).await.unwrap();
        acked.insert(i, 0u32);
    }
    for n in nodes {
        n.stop().await;
    }
    // Merges on: the two become one, on one set of voters.
    let nodes: Vec<Node> = (0..4).map(|i| start(cfg(i, true))).collect();
    let merged = wait_routes(&addrs, "the two groups merged", |rs| {
        rs.len() == 1 && rs[0].leader_node_id != 0
    })
    .await;
    let c = client(&addrs).await;
    check_all(&c, &acked).await;
    let g = merged[0].group_id;
    let scrub = c.scrub_group(g).await.unwrap();
    assert!(scrub.consistent, "{scrub:?}");
    assert_eq!(merged[0].replicas.len(), 3, "{merged:?}");
    for n in nodes {
        n.stop().await;
    }
}
