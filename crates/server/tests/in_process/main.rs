//! Nodes started in-process on loopback: single-node put/get through raft with
//! restart recovery (log-as-WAL), a three-node cluster with the meta group, the meta
//! group bootstrapping split ranges and serving its table from every node, and a
//! leader cut off by fault injection; and, in modules of this one test binary (the
//! server is linked once for them all), limits, merges, splits, the scrub, security,
//! peers speaking nonsense, and tables on MinIO. (Failpoints are process-wide: their
//! tests are a binary of their own.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use phoenix_proto as proto;
use phoenix_server::MetaMember;

#[path = "../common/mod.rs"]
mod common;
use common::*;

// The other cluster tests: one test binary links the server once, not once per file.
mod compactor;
mod limits;
mod merge;
mod minio;
mod peer_fuzz;
mod scrub;
mod security;
mod split;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_node_put_get_restart() {
    single_node(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_node_put_get_restart_engine_wal() {
    single_node(true).await;
}

async fn single_node(engine_wal: bool) {
    let cfg = |addr: &str, dir: &Path, meta: &[MetaMember]| {
        let mut c = config(1, addr, dir, meta, 1);
        c.engine_wal = engine_wal;
        c
    };
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let node = start(cfg(&addr, dir.path(), &meta));
    let route = wait_route(&addrs).await;
    assert_eq!(route.group_id, 1);
    for i in 0..200u32 {
        put(
            &addrs,
            &route,
            format!("k{i:04}").as_bytes(),
            &i.to_be_bytes(),
        )
        .await;
    }
    // Typed errors.
    let mut c = kv(&addr).await;
    let r = c
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: vec![b'x'; 5000].into(),
            value: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        r.error.and_then(|e| e.kind),
        Some(proto::error::Kind::KeyTooLarge(_))
    ));
    let r = c
        .get(proto::GetRequest {
            header: Some(proto::RequestHeader {
                group_id: 1,
                epoch: 1,
                timeout_ms: 0,
                ..Default::default()
            }),
            key: b"a".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        r.error.and_then(|e| e.kind),
        Some(proto::error::Kind::InvalidArgument(_))
    ));
    // CAS and scan.
    let r = c
        .cas(proto::CasRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: b"k0001".to_vec().into(),
            expect_exists: true,
            expected: 1u32.to_be_bytes().to_vec().into(),
            delete: false,
            new_value: b"new".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none() && r.succeeded, "{r:?}");
    let r = c
        .cas(proto::CasRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: b"k0001".to_vec().into(),
            expect_exists: true,
            expected: 1u32.to_be_bytes().to_vec().into(),
            delete: false,
            new_value: b"newer".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none() && !r.succeeded && r.current_value.as_ref() == b"new");
    let r = c
        .scan(proto::ScanRequest {
            header: header(&route),
            start: b"k0010".to_vec().into(),
            end: b"k0020".to_vec().into(),
            limit: 5,
            keys_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none());
    assert_eq!(r.pairs.len(), 5);
    assert!(r.more);
    assert_eq!(r.next_key.as_ref(), b"k0015");
    drop(c);
    // Restart: the engine lost its memtables (WAL off); the log replays.
    node.stop().await;
    let node = start(cfg(&addr, dir.path(), &meta));
    let route = wait_route(&addrs).await;
    for i in (0..200u32).step_by(7) {
        let want = if i == 1 {
            b"new".to_vec()
        } else {
            i.to_be_bytes().to_vec()
        };
        assert_eq!(
            get(&addrs, &route, format!("k{i:04}").as_bytes()).await,
            Some(want),
            "key {i}"
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_replicate_and_survive_leader_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let mut nodes: Vec<Option<Node>> = (0..3)
        .map(|i| Some(start(config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3))))
        .collect();
    let route = wait_route(&addrs).await;
    assert_eq!(route.replicas.len(), 3);
    for i in 0..100u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v1").await;
    }
    // Stop the group's leader; another replica takes over and has every write.
    let leader = route.leader_node_id as usize - 1;
    nodes[leader].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| addrs[i].clone())
        .collect();
    let started = Instant::now();
    put(&live, &route, b"after", b"v2").await;
    eprintln!("new leader accepted a write after {:?}", started.elapsed());
    for i in (0..100u32).step_by(9) {
        assert_eq!(
            get(&live, &route, format!("k{i:04}").as_bytes()).await,
            Some(b"v1".to_vec())
        );
    }
    // The stopped node comes back and catches up.
    nodes[leader] = Some(start(config(
        leader as u64 + 1,
        &addrs[leader],
        dir.path(),
        &meta,
        3,
    )));
    put(&addrs, &route, b"after2", b"v3").await;
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// Waits until the meta service reports follower `follower` (an index into `addrs`)
/// applied at least `min` and within 5 entries of `leader`.
async fn wait_caught_up(
    addrs: &[String],
    route: &proto::Route,
    leader: usize,
    follower: usize,
    min: u64,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    let mut last = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "follower {} did not catch up within {within:?}; applied (node, index): {last:?}",
            follower + 1
        );
        let groups = cluster_groups(addrs).await;
        let g = groups.iter().find(|g| {
            g.route
                .as_ref()
                .is_some_and(|r| r.group_id == route.group_id)
        });
        last = g
            .map(|g| {
                g.replicas
                    .iter()
                    .map(|r| (r.node_id, r.applied_index))
                    .collect()
            })
            .unwrap_or_default();
        let of = |i: usize| last.iter().find(|(n, _)| *n == i as u64 + 1).map(|x| x.1);
        if let (Some(f), Some(l)) = (of(follower), of(leader)) {
            if f >= min && f + 5 >= l {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A follower that missed more than one gRPC message's worth of entries (16 MiB) catches
/// up from the leader's log, in appends of at most 1 MiB that the transport batches
/// under its message limit (`transport::tests::a_burst_of_large_appends_arrives_whole`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_far_behind_catches_up_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let leader = route.leader_node_id as usize - 1;
    let follower = (leader + 1) % 3;
    nodes[follower].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != follower)
        .map(|i| addrs[i].clone())
        .collect();
    // 32 MiB in 256 KiB values: about 32 appends of 1 MiB once the follower is back.
    let value = vec![5u8; 256 << 10];
    let n = 128u32;
    for i in 0..n {
        put(&live, &route, format!("b{i:05}").as_bytes(), &value).await;
    }
    nodes[follower] = Some(start(cfg(follower)));
    let started = Instant::now();
    wait_caught_up(
        &addrs,
        &route,
        leader,
        follower,
        u64::from(n),
        Duration::from_secs(30),
    )
    .await;
    eprintln!("the follower caught up in {:?}", started.elapsed());
    // It holds the data: with the old leader gone it serves every key.
    nodes[leader].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| addrs[i].clone())
        .collect();
    for i in (0..n).step_by(17) {
        assert_eq!(
            get(&live, &route, format!("b{i:05}").as_bytes()).await,
            Some(value.clone()),
            "key {i}"
        );
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_truncated_log_catches_up_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        // Small memtables flush often, so the persisted applied index advances and the
        // logs are cut far past what a stopped follower has.
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 10;
        c.log_truncate_interval = Duration::from_millis(100);
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let leader = route.leader_node_id as usize - 1;
    let follower = (leader + 1) % 3;
    nodes[follower].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != follower)
        .map(|i| addrs[i].clone())
        .collect();
    let value = vec![7u8; 1024];
    for i in 0..600u32 {
        put(&live, &route, format!("s{i:05}").as_bytes(), &value).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The follower returns; its log ends far below the leader's first index.
    nodes[follower] = Some(start(cfg(follower)));
    // Wait until the meta leader sees it applied (nearly) everything the leader has.
    wait_caught_up(
        &addrs,
        &route,
        leader,
        follower,
        600,
        Duration::from_secs(30),
    )
    .await;
    // Now stop the old leader: the caught-up follower must serve every write.
    nodes[leader].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| addrs[i].clone())
        .collect();
    for i in (0..600u32).step_by(37) {
        assert_eq!(
            get(&live, &route, format!("s{i:05}").as_bytes()).await,
            Some(value.clone()),
            "key {i}"
        );
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// A follower back after every group's log was cut past it takes a snapshot of each,
/// at most `snapshot::STAGED_MAX` of them received and not installed at any time (the
/// rest wait for room): the space a repair takes stays near the data's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_behind_in_many_groups_stages_a_few_snapshots_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let splits: Vec<Vec<u8>> = (1..12u8).map(|i| vec![i * 20]).collect();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 10;
        c.log_truncate_interval = Duration::from_millis(100);
        c.split_keys = splits.clone();
        // Slow streams: without the cap, every group's copy would be on disk at once.
        c.snapshot_bytes_per_sec = 1 << 20;
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let routes = routes_with_leaders_at_least(&addrs, 12).await;
    let follower = 2;
    nodes[follower].take().unwrap().stop().await;
    let live: Vec<String> = addrs[..2].to_vec();
    let value = vec![5u8; 1024];
    for r in &routes {
        for i in 0..120u32 {
            // (The first group starts at the empty key: its keys start with byte 1.)
            let mut k = if r.start_key.is_empty() {
                vec![1]
            } else {
                r.start_key.to_vec()
            };
            k.extend_from_slice(format!("k{i:04}").as_bytes());
            put(&live, r, &k, &value).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    nodes[follower] = Some(start(cfg(follower)));
    let staging = dir.path().join("node-3").join("snap-recv");
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sampler = {
        let (staging, most) = (staging.clone(), std::sync::Arc::clone(&most));
        tokio::spawn(async move {
            loop {
                let n = std::fs::read_dir(&staging).map_or(0, |d| d.count());
                most.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    for r in &routes {
        let leader = r.leader_node_id as usize - 1;
        let leader = if leader == follower { 0 } else { leader };
        wait_caught_up(&addrs, r, leader, follower, 120, Duration::from_secs(60)).await;
    }
    sampler.abort();
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("at most {most} snapshots staged at once");
    assert!(
        most <= phoenix_server::snapshot::STAGED_MAX,
        "{most} snapshots staged at once"
    );
    assert!(
        most >= 2,
        "snapshots never overlapped ({most}): the test shows nothing"
    );
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

async fn meta_client(addr: &str) -> proto::meta_client::MetaClient<tonic::transport::Channel> {
    proto::meta_client::MetaClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Asks `addr` for the routing table until it returns `want` routes that all have a
/// known leader.
async fn routes_with_leaders(addr: &str, want: usize) -> Vec<proto::Route> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "{addr}: no {want} routes with leaders within 30 s"
        );
        if let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{addr}")).await {
            if let Ok(r) = m
                .get_routes(proto::GetRoutesRequest { timeout_ms: 1000 })
                .await
            {
                let r = r.into_inner();
                if r.error.is_none()
                    && r.routes.len() == want
                    && r.routes.iter().all(|x| x.leader_node_id != 0)
                {
                    return r.routes;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Bootstrap with split keys, served by every node (meta leader, meta followers that
/// forward to it, and a node outside the meta group that forwards to the members);
/// the table survives a restart of every node (meta state reloaded from the engine,
/// its log replayed past the persisted applied index).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn meta_bootstraps_split_keys_and_every_node_serves_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..4)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    // Nodes 1-3 host the meta group; node 4 does not.
    let meta: Vec<MetaMember> = addrs[..3]
        .iter()
        .enumerate()
        .map(|(i, a)| MetaMember {
            id: i as u64 + 1,
            addr: a.clone(),
        })
        .collect();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.split_keys = vec![b"g".to_vec(), b"p".to_vec()];
        c
    };
    let mut nodes: Vec<Node> = (0..4).map(|i| start(cfg(i))).collect();

    let table = routes_with_leaders(&addrs[3], 3).await;
    let ranges: Vec<(&[u8], &[u8])> = table
        .iter()
        .map(|r| (r.start_key.as_ref(), r.end_key.as_ref()))
        .collect();
    assert_eq!(
        ranges,
        vec![
            (&b""[..], &b"g"[..]),
            (&b"g"[..], &b"p"[..]),
            (&b"p"[..], &b""[..])
        ]
    );
    for r in &table {
        assert_eq!(r.epoch, 1);
        assert_eq!(r.replicas.len(), 3, "{r:?}");
        for rep in &r.replicas {
            assert_eq!(rep.addr, addrs[rep.node_id as usize - 1], "{r:?}");
        }
    }
    // Every node serves the same table; a request without a deadline is refused with
    // a typed error wherever it lands.
    for a in &addrs {
        let got = routes_with_leaders(a, 3).await;
        let ids: Vec<(u64, u64)> = got.iter().map(|r| (r.group_id, r.epoch)).collect();
        assert_eq!(ids, vec![(1, 1), (2, 1), (3, 1)], "{a}");
        let bad = meta_client(a)
            .await
            .get_routes(proto::GetRoutesRequest { timeout_ms: 0 })
            .await
            .unwrap()
            .into_inner();
        assert!(
            matches!(
                bad.error.and_then(|e| e.kind),
                Some(proto::error::Kind::InvalidArgument(_))
            ),
            "{a}"
        );
    }
    // Each group takes writes in its own range.
    for (r, key) in table.iter().zip([&b"apple"[..], b"kiwi", b"zucchini"]) {
        put(&addrs, r, key, b"v").await;
    }
    // Cluster status from a node outside the meta group: all four nodes alive.
    let deadline = Instant::now() + Duration::from_secs(20);
    let cluster = loop {
        let c = meta_client(&addrs[3])
            .await
            .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
            .await
            .unwrap()
            .into_inner();
        if c.error.is_none() && c.nodes.len() == 4 && c.nodes.iter().all(|n| n.alive) {
            break c;
        }
        assert!(Instant::now() < deadline, "cluster status: {c:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!((1..=3).contains(&cluster.meta_leader_node_id));
    assert_eq!(cluster.groups.len(), 3);

    // Stop everything and start again: the same table comes back.
    for n in nodes.drain(..) {
        n.stop().await;
    }
    let nodes: Vec<Node> = (0..4).map(|i| start(cfg(i))).collect();
    let again = routes_with_leaders(&addrs[0], 3).await;
    // Routes without the soft parts (leaders, addresses as served).
    let key = |rs: &[proto::Route]| -> Vec<proto::Route> {
        rs.iter()
            .map(|r| proto::Route {
                leader_node_id: 0,
                leader_addr: String::new(),
                ..r.clone()
            })
            .collect()
    };
    assert_eq!(key(&again), key(&table));
    for (r, k) in again.iter().zip([&b"apple"[..], b"kiwi", b"zucchini"]) {
        assert_eq!(get(&addrs, r, k).await, Some(b"v".to_vec()));
    }
    for n in nodes {
        n.stop().await;
    }
}

/// Exactly-once writes through a real node: a resent write (same client id and
/// sequence) is answered with its first result and not applied again, even after
/// another client's write of the same key, and across a restart; a resend below the
/// session's acknowledged mark gets SessionExpired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resent_writes_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let mut node = start(config(1, &addr, dir.path(), &meta, 1));
    let route = wait_route(&addrs).await;
    let h = |client_id: u64, seq: u64, acked_below: u64| {
        Some(proto::RequestHeader {
            client_id,
            seq,
            acked_below,
            ..header(&route).unwrap()
        })
    };
    let cas = |client_id, seq, acked_below| proto::CasRequest {
        header: h(client_id, seq, acked_below),
        key: b"counter".to_vec().into(),
        expect_exists: false,
        new_value: b"1".to_vec().into(),
        ..Default::default()
    };
    let put = |client_id, seq, value: &str| proto::PutRequest {
        keep_ttl: false,
        ttl_ms: 0,
        header: h(client_id, seq, 1),
        key: b"k".to_vec().into(),
        value: value.as_bytes().to_vec().into(),
    };
    let mut c = kv(&addr).await;
    // The first CAS creates the key; its resend gets the same answer, not a failure.
    for _ in 0..2 {
        let r = c.cas(cas(7, 1, 1)).await.unwrap().into_inner();
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.succeeded && !r.current_found, "{r:?}");
    }
    // A different write of the same client is applied.
    let r = c.cas(cas(7, 2, 1)).await.unwrap().into_inner();
    assert!(!r.succeeded && r.current_found, "{r:?}");
    // put(k=a) by client 7, put(k=b) by client 8, then 7's put resent: k stays b.
    put_ok(&mut c, put(7, 3, "a")).await;
    put_ok(&mut c, put(8, 1, "b")).await;
    put_ok(&mut c, put(7, 3, "a")).await;
    assert_eq!(get(&addrs, &route, b"k").await, Some(b"b".to_vec()));
    // Sessions are state: they survive a restart.
    node.stop().await;
    node = start(config(1, &addr, dir.path(), &meta, 1));
    wait_route(&addrs).await;
    let mut c = kv(&addr).await;
    let r = c.cas(cas(7, 1, 1)).await.unwrap().into_inner();
    assert!(r.succeeded && !r.current_found, "after restart: {r:?}");
    put_ok(&mut c, put(7, 3, "a")).await;
    assert_eq!(get(&addrs, &route, b"k").await, Some(b"b".to_vec()));
    // Client 7 says it has every answer below 4: a resend of 1 is refused.
    let r = c.cas(cas(7, 4, 4)).await.unwrap().into_inner();
    assert!(r.error.is_none() && !r.succeeded, "{r:?}");
    let r = c.cas(cas(7, 1, 4)).await.unwrap().into_inner();
    assert!(matches!(
        r.error.and_then(|e| e.kind),
        Some(proto::error::Kind::SessionExpired(_))
    ));
    node.stop().await;
}

/// INCR is one replicated command: once the heartbeat answers say every node applies
/// it, concurrent increments through every node (followers forward) add up exactly, a
/// resend in its session is answered with its first result and not applied again, and
/// the replicas agree (a new leader has the same count).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn increments_are_one_replicated_command_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let mut nodes: Vec<Option<Node>> = (0..3)
        .map(|i| Some(start(config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3))))
        .collect();
    let route = wait_route(&addrs).await;
    let opts = || phoenix_client::ClientOptions {
        timeout: Duration::from_secs(20),
        ..phoenix_client::ClientOptions::default()
    };
    let mut clients = Vec::new();
    for a in &addrs {
        clients.push(
            phoenix_client::Client::connect(vec![a.clone()], opts())
                .await
                .unwrap(),
        );
    }
    // The gate opens at the first heartbeat answer of every node.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match clients[0].incr(b"ctr", 1).await {
            Ok(o) => break o,
            Err(phoenix_client::ClientError::Unsupported { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(first, phoenix_client::IncrOutcome::Value(1));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..30 {
                match c.incr(b"ctr", 2).await {
                    Ok(phoenix_client::IncrOutcome::Value(v)) => seen.push(v),
                    other => panic!("client {i}: {other:?}"),
                }
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    // Every increment saw its own value: 3, 5, …, 181, each once.
    all.sort_unstable();
    assert_eq!(all, (1..=90).map(|i| 1 + 2 * i).collect::<Vec<i64>>());
    assert_eq!(get(&addrs, &route, b"ctr").await, Some(b"181".to_vec()));
    // Failures change nothing; a resend in its session is answered as the first time.
    clients[1].put(b"text", b"abc").await.unwrap();
    assert_eq!(
        clients[1].incr(b"text", 1).await.unwrap(),
        phoenix_client::IncrOutcome::NotAnInteger
    );
    let incr = |seq: u64, by: i64| proto::IncrRequest {
        header: Some(proto::RequestHeader {
            client_id: 0x77,
            seq,
            acked_below: 1,
            ..header(&route).unwrap()
        }),
        key: b"ctr".to_vec().into(),
        by,
    };
    let leader = route.leader_node_id as usize - 1;
    let mut k = kv(&addrs[leader]).await;
    for _ in 0..3 {
        let r = k.incr(incr(1, 100)).await.unwrap().into_inner();
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.value, 281);
    }
    let r = k.incr(incr(2, 1)).await.unwrap().into_inner();
    assert_eq!(r.value, 282);
    // The version gate on real nodes: a node registered at this level, then heard
    // downgraded, closes it (a typed refusal, nothing proposed); upgraded, it opens.
    let heartbeat = |protocol: u32| proto::HeartbeatRequest {
        node_id: 9,
        addr: "127.0.0.1:1".into(),
        stats: Some(proto::NodeStats {
            protocol,
            ..Default::default()
        }),
        timeout_ms: 3000,
        ..Default::default()
    };
    let beat = |protocol: u32| {
        let addrs = addrs.clone();
        async move {
            for a in &addrs {
                let r = meta_client(a)
                    .await
                    .heartbeat(heartbeat(protocol))
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
    let until = |want_served: bool| {
        let c = clients[2].clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match c.incr(b"gate", 1).await {
                    Ok(_) if want_served => return,
                    Err(phoenix_client::ClientError::Unsupported { why, .. }) if !want_served => {
                        assert!(why.contains("protocol level"), "{why}");
                        return;
                    }
                    other => assert!(
                        Instant::now() < deadline,
                        "gate {}: {other:?}",
                        if want_served { "closed" } else { "open" }
                    ),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    beat(phoenix_meta::PROTOCOL).await;
    beat(phoenix_meta::PROTOCOL_INCR - 1).await;
    until(false).await;
    // Key expiry's gate too, and on the node the request reaches, before any forward:
    // a follower asked not to forward refuses a write with an expiry as unsupported, not
    // as NotLeader (a forward would have reached a leader that might drop the expiry).
    let follower = (0..3)
        .find(|&i| i + 1 != route.leader_node_id as usize)
        .unwrap();
    // (The follower closes its gate at its own next heartbeat answer: asked until then.)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = kv(&addrs[follower])
            .await
            .put(proto::PutRequest {
                header: Some(proto::RequestHeader {
                    no_forward: true,
                    ..header(&route).unwrap()
                }),
                key: b"ttl".to_vec().into(),
                value: b"v".to_vec().into(),
                ttl_ms: 60_000,
                keep_ttl: false,
            })
            .await
            .unwrap()
            .into_inner();
        let kind = r.error.as_ref().and_then(|e| e.kind.as_ref());
        if matches!(kind, Some(proto::error::Kind::Unsupported(_))) {
            break;
        }
        assert!(
            Instant::now() < deadline && matches!(kind, Some(proto::error::Kind::NotLeader(_))),
            "{:?}",
            r.error
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every gated request is refused there alike (the gate is the request layer's, not
    // each method's): a swap and a batch write with an expiry, EXPIRE, TTL and INCR.
    let mut f = kv(&addrs[follower]).await;
    let h = || {
        Some(proto::RequestHeader {
            no_forward: true,
            ..header(&route).unwrap()
        })
    };
    let unsupported = |e: Option<proto::Error>| {
        matches!(
            e.and_then(|e| e.kind),
            Some(proto::error::Kind::Unsupported(_))
        )
    };
    let cas = f
        .cas_ex(proto::CasRequest {
            header: h(),
            key: b"ttl".to_vec().into(),
            new_value: b"v".to_vec().into(),
            ttl_ms: 60_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported(cas.error.clone()), "cas: {:?}", cas.error);
    let bw = f
        .batch_write(proto::BatchWriteRequest {
            header: h(),
            mutations: vec![proto::Mutation {
                ttl_ms: 60_000,
                ..put_mutation(*b"ttl", b"v")
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported(bw.error.clone()), "batch write: {:?}", bw.error);
    let ex = f
        .expire(proto::ExpireRequest {
            header: h(),
            key: b"ttl".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported(ex.error.clone()), "expire: {:?}", ex.error);
    let ttl = f
        .ttl(proto::TtlRequest {
            header: h(),
            key: b"ttl".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported(ttl.error.clone()), "ttl: {:?}", ttl.error);
    let incr = f
        .incr(proto::IncrRequest {
            header: h(),
            key: b"ctr".to_vec().into(),
            by: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported(incr.error.clone()), "incr: {:?}", incr.error);
    let before = get(&addrs, &route, b"ctr").await;
    assert!(matches!(
        clients[0].incr(b"ctr", 1).await,
        Err(phoenix_client::ClientError::Unsupported { .. })
    ));
    assert_eq!(get(&addrs, &route, b"ctr").await, before);
    beat(phoenix_meta::PROTOCOL).await;
    until(true).await;
    // The leader goes; the new one counts the same.
    nodes[leader].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| addrs[i].clone())
        .collect();
    let c = phoenix_client::Client::connect(live.clone(), opts())
        .await
        .unwrap();
    // (The new leader may not have heard the fake node's upgrade yet: its gate opens at
    // its next heartbeat answer, once the meta group has a leader again if it lost it.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        match c.incr(b"ctr", -282).await {
            Err(phoenix_client::ClientError::Unsupported { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(out, phoenix_client::IncrOutcome::Value(0));
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// A put that must succeed.
async fn put_ok(
    c: &mut proto::kv_client::KvClient<tonic::transport::Channel>,
    req: proto::PutRequest,
) {
    let r = c.put(req).await.unwrap().into_inner();
    assert!(r.error.is_none(), "{r:?}");
}

/// Groups whose three replicas all report hibernating.
fn asleep(groups: &[proto::GroupInfo]) -> usize {
    groups
        .iter()
        .filter(|g| g.replicas.len() == 3 && g.replicas.iter().all(|r| r.hibernating))
        .count()
}

/// 1,000 idle groups go to sleep (no ticks, no heartbeats); a write wakes its group
/// without an election and the group sleeps again; when a node stops, the groups it
/// led wake up on the other nodes and elect a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_groups_hibernate_and_wake() {
    const GROUPS: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.split_keys = phoenix_server::even_split_keys(GROUPS).unwrap();
        c
    };
    let started = Instant::now();
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let table = routes_with_leaders(&addrs[0], GROUPS).await;
    eprintln!("{GROUPS} groups led after {:?}", started.elapsed());

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut groups;
    loop {
        groups = cluster_groups(&addrs).await;
        let n = asleep(&groups);
        if n * 100 >= GROUPS * 99 {
            eprintln!(
                "{n} of {GROUPS} groups asleep after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} of {GROUPS} groups hibernate"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A write to a sleeping group: served at once by its leader, same term.
    let route = table[GROUPS / 2].clone();
    let term_of = |groups: &[proto::GroupInfo], g: u64| {
        groups
            .iter()
            .find(|x| x.route.as_ref().is_some_and(|r| r.group_id == g))
            .and_then(|x| x.replicas.iter().find(|r| r.is_leader).map(|r| r.term))
    };
    let term = term_of(&groups, route.group_id).expect("the group has a leader");
    // (The start key then zero bytes stays below the next group's four-byte start.)
    let key = [&route.start_key[..], b"\0\0\0\0woken"].concat();
    let t = Instant::now();
    put(&addrs, &route, &key, b"v").await;
    eprintln!("write to a sleeping group took {:?}", t.elapsed());
    assert_eq!(get(&addrs, &route, &key).await, Some(b"v".to_vec()));
    // It sleeps again, with the same leader and term (no election was needed).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let groups = cluster_groups(&addrs).await;
        let g = groups
            .iter()
            .find(|x| {
                x.route
                    .as_ref()
                    .is_some_and(|r| r.group_id == route.group_id)
            })
            .unwrap();
        if g.replicas.len() == 3 && g.replicas.iter().all(|r| r.hibernating) {
            assert_eq!(term_of(&groups, route.group_id), Some(term), "{g:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the woken group never slept again: {g:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The node that led the most groups stops: every group it led, asleep, must elect
    // a leader on the other two. (Which node won the first elections varies.)
    let victim = (1..=3u64)
        .max_by_key(|&n| table.iter().filter(|r| r.leader_node_id == n).count())
        .unwrap();
    let led: Vec<proto::Route> = table
        .iter()
        .filter(|r| r.leader_node_id == victim)
        .take(3)
        .cloned()
        .collect();
    assert!(!led.is_empty(), "no node leads a group: {table:?}");
    nodes[victim as usize - 1].take().unwrap().stop().await;
    let others: Vec<_> = addrs
        .iter()
        .enumerate()
        .filter(|&(i, _)| i as u64 + 1 != victim)
        .map(|(_, a)| a.clone())
        .collect();
    let t = Instant::now();
    for r in &led {
        put(
            &others,
            r,
            &[&r.start_key[..], b"\0\0\0\0failover"].concat(),
            b"v",
        )
        .await;
    }
    eprintln!(
        "writes to {} groups led by the stopped node served after {:?}",
        led.len(),
        t.elapsed()
    );
    for n in nodes.iter_mut() {
        if let Some(n) = n.take() {
            n.stop().await;
        }
    }
}

/// Sets node `addr`'s cut links; the service's answer.
async fn set_links(addr: &str, cut: Vec<u64>) -> proto::SetLinksResponse {
    let mut f = proto::faults_client::FaultsClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    f.set_links(proto::SetLinksRequest { cut_nodes: cut })
        .await
        .unwrap()
        .into_inner()
}

/// A leader cut off from its followers (fault injection; clients still reach it) takes
/// no write while the other two elect and serve; once healed it catches up. A node
/// without `--fault-injection` refuses the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_leader_is_replaced_and_catches_up_when_healed() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            // Node 3 serves no fault injection.
            c.fault_injection = i < 2;
            start(c)
        })
        .collect();
    let route = wait_route(&addrs).await;
    let refused = set_links(&addrs[2], vec![1]).await;
    assert!(
        refused
            .error
            .as_ref()
            .is_some_and(|e| e.message.contains("--fault-injection")),
        "{refused:?}"
    );
    assert!(refused.cut_nodes.is_empty());
    for i in 0..20u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v1").await;
    }
    // Cut the leader off. A node that cuts a link drops the raft traffic on it both
    // ways, so the link is cut if either end (one with the service) cuts it.
    // The leader now: the node that takes a write itself (leadership may have moved
    // since the route was read); `no_forward`, so a follower does not pass it on.
    let own = Some(proto::RequestHeader {
        no_forward: true,
        ..header(&route).unwrap()
    });
    let mut leader = None;
    for (i, a) in addrs.iter().enumerate() {
        let r = kv(a)
            .await
            .put(proto::PutRequest {
                keep_ttl: false,
                ttl_ms: 0,
                header: own,
                key: b"probe".to_vec().into(),
                value: b"p".to_vec().into(),
            })
            .await
            .unwrap()
            .into_inner();
        if r.error.is_none() {
            leader = Some(i);
            break;
        }
    }
    let leader = leader.expect("no node took the probe write as leader");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    if leader < 2 {
        let cut: Vec<u64> = others.iter().map(|&j| j as u64 + 1).collect();
        assert_eq!(set_links(&addrs[leader], cut.clone()).await.cut_nodes, cut);
    }
    for &j in &others {
        if j < 2 {
            let r = set_links(&addrs[j], vec![leader as u64 + 1]).await;
            assert!(r.error.is_none(), "{r:?}");
        }
    }
    // The old leader cannot commit: a write to it alone gets no success.
    let mut k = kv(&addrs[leader]).await;
    let mut h = own;
    if let Some(h) = h.as_mut() {
        h.timeout_ms = 1500;
    }
    let r = k
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: h,
            key: b"cut-off".to_vec().into(),
            value: b"x".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_some(), "a cut-off leader acknowledged a write");
    // The majority side elects and serves.
    let majority: Vec<String> = others.iter().map(|&j| addrs[j].clone()).collect();
    let started = Instant::now();
    put(&majority, &route, b"during", b"v2").await;
    eprintln!(
        "the majority side took a write after {:?}",
        started.elapsed()
    );
    // Healed, the old leader catches up (it applies the write made without it).
    for a in &addrs[..2] {
        assert!(set_links(a, Vec::new()).await.error.is_none());
    }
    put(&addrs, &route, b"after", b"v3").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let groups = cluster_groups(&addrs).await;
        let applied: Vec<(u64, u64)> = groups
            .iter()
            .filter(|g| {
                g.route
                    .as_ref()
                    .is_some_and(|r| r.group_id == route.group_id)
            })
            .flat_map(|g| g.replicas.iter().map(|r| (r.node_id, r.applied_index)))
            .collect();
        let of = |n: usize| applied.iter().find(|x| x.0 == n as u64 + 1).map(|x| x.1);
        let top = applied.iter().map(|x| x.1).max().unwrap_or(0);
        if of(leader).is_some_and(|a| a == top && a > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the healed node did not catch up: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in nodes {
        n.stop().await;
    }
}

/// A node whose disk fails (writes and syncs, by fault injection) — the meta leader's —
/// stops its replica visibly with the cause, while the group goes on with the other two;
/// it stays stopped while the disk fails (the probe fails too); once the disk works
/// again the node restarts its storage by itself, catches up and the group serves every
/// acknowledged write — no restart by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_disk_stops_the_replica_and_the_node_recovers_by_itself() {
    failing_disk_recovers(true).await;
}

/// As above with writes working and only syncs failing: the entries the node wrote but
/// could not sync are still readable (from the page cache), and its restart cuts them
/// from its log (none was acknowledged) and takes them again from the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_syncs_fail_recovers_by_itself_without_the_unsynced_entries() {
    failing_disk_recovers(false).await;
}

async fn failing_disk_recovers(fail_writes: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.fault_injection = true;
        c
    };
    let nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    for i in 0..20u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v1").await;
    }
    // The meta leader's node: its disk failing must not take the cluster's view with
    // it (its meta replica is idle, so only the data group's appends see the disk).
    let follower = loop {
        let c = meta_client(&addrs[0])
            .await
            .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
            .await
            .unwrap()
            .into_inner();
        if c.meta_leader_node_id != 0 {
            break c.meta_leader_node_id as usize - 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut f = proto::faults_client::FaultsClient::connect(format!("http://{}", addrs[follower]))
        .await
        .unwrap();
    let r = f
        .set_disk(proto::SetDiskRequest {
            fail_writes,
            fail_syncs: true,
            space_cap: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.error.is_none() && r.fail_writes == fail_writes && r.fail_syncs,
        "{r:?}"
    );
    for i in 20..60u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v2").await;
    }
    // Why the follower's replica stopped ("": it runs), as the cluster reports it.
    let stopped_of = |groups: &[proto::GroupInfo]| {
        groups
            .iter()
            .filter(|g| {
                g.route
                    .as_ref()
                    .is_some_and(|r| r.group_id == route.group_id)
            })
            .flat_map(|g| g.replicas.iter())
            .find(|r| r.node_id == follower as u64 + 1)
            .map(|r| r.stopped.clone())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stopped = stopped_of(&cluster_groups(&addrs).await).unwrap_or_default();
        if stopped.contains("injected disk error") {
            break;
        }

        assert!(
            Instant::now() < deadline,
            "the replica on the failing disk did not stop with the cause: {stopped:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // While the disk fails, the node does not restart: the replica stays stopped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped = stopped_of(&cluster_groups(&addrs).await).unwrap_or_default();
    assert!(
        stopped.contains("injected disk error"),
        "the replica came back on a failing disk: {stopped:?}"
    );
    // The disk works again: the node restarts its storage by itself and catches up.
    let r = f
        .set_disk(proto::SetDiskRequest {
            fail_writes: false,
            fail_syncs: false,
            space_cap: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none(), "{r:?}");
    put(&addrs, &route, b"after", b"v3").await;
    let leader = (0..3).find(|&i| i != follower).unwrap();
    wait_caught_up(
        &addrs,
        &route,
        leader,
        follower,
        60,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        stopped_of(&cluster_groups(&addrs).await).as_deref(),
        Some(""),
        "the replica is still stopped after the node's storage restart"
    );
    // Its data is whole: leading the group, it serves every acknowledged write itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = transfer(&addrs[0], route.group_id, follower as u64 + 1).await;
        if r.error.is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "no transfer: {:?}", r.error);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let own = Some(proto::RequestHeader {
        no_forward: true,
        ..header(&route).unwrap()
    });
    let mut k = kv(&addrs[follower]).await;
    for i in 0..60u32 {
        let want: &[u8] = if i < 20 { b"v1" } else { b"v2" };
        let r = k
            .get(proto::GetRequest {
                header: own,
                key: format!("k{i:04}").into_bytes().into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            r.error.is_none(),
            "k{i:04} at the restarted node: {:?}",
            r.error
        );
        assert_eq!(r.value.as_ref(), want, "k{i:04}");
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// A follower forwards a request to the leader and returns its answer (writes, reads,
/// compare-and-swap, with the client's session: a resend through another follower
/// applies once); a client that asked for redirects, or a request forwarded already,
/// gets NotLeader with the leader's address; with the leader gone, a forwarded write is
/// refused or its outcome is unknown, never reported as done. Single-key requests go
/// on the follower's batch stream to the leader, others as unary calls (its metrics).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_forward_requests_to_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut nodes: Vec<Option<Node>> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            c.metrics_listen = Some(metrics[i].clone());
            Some(start(c))
        })
        .collect();
    let route = wait_route(&addrs).await;
    // A write through the leader first: every replica then knows who leads.
    put(&addrs, &route, b"first", b"1").await;
    let leader = route.leader_node_id as usize - 1;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let session = |seq: u64| {
        Some(proto::RequestHeader {
            client_id: 0xF0F0,
            seq,
            ..header(&route).unwrap()
        })
    };
    let put_req = |h, v: &str| proto::PutRequest {
        keep_ttl: false,
        ttl_ms: 0,
        header: h,
        key: b"fwd".to_vec().into(),
        value: v.as_bytes().to_vec().into(),
    };
    let mut f0 = kv(&addrs[followers[0]]).await;
    let mut f1 = kv(&addrs[followers[1]]).await;
    // (The first write may have been forwarded by f0 already.)
    let forwards = |text: &str, how: &str| {
        sample(text, "phoenix_forwards_total", &format!("via=\"{how}\"")).unwrap_or(0.0)
    };
    let (_, before) = http_get(&metrics[followers[0]], "/metrics").await;
    let r = f0.put(put_req(session(1), "a")).await.unwrap().into_inner();
    assert_eq!(r.error, None, "a follower forwards a write");
    let g = f1
        .get(proto::GetRequest {
            header: header(&route),
            key: b"fwd".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((g.error, g.found, &g.value[..]), (None, true, &b"a"[..]));
    // Compare-and-swap through a follower, then its resend (same session sequence)
    // through the other follower: answered with the first result, applied once.
    let cas = |seq| proto::CasRequest {
        header: session(seq),
        key: b"fwd".to_vec().into(),
        expect_exists: true,
        expected: b"a".to_vec().into(),
        new_value: b"b".to_vec().into(),
        ..Default::default()
    };
    let first = f0.cas(cas(2)).await.unwrap().into_inner();
    let again = f1.cas(cas(2)).await.unwrap().into_inner();
    assert_eq!(first.error, None);
    assert!(first.succeeded);
    assert_eq!(
        (again.error, again.succeeded),
        (None, true),
        "resend: first result"
    );
    // A scan is no batch item: it goes as a unary call.
    let sc = f0
        .scan(proto::ScanRequest {
            header: header(&route),
            start: b"fwd".to_vec().into(),
            end: b"fwe".to_vec().into(),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((sc.error, sc.pairs.len()), (None, 1));
    let (_, text) = http_get(&metrics[followers[0]], "/metrics").await;
    let via = |how: &str| forwards(&text, how) - forwards(&before, how);
    assert_eq!(
        (via("stream"), via("unary")),
        (2.0, 1.0),
        "the put and the swap on the stream, the scan unary:\n{text}"
    );
    // The follower acknowledged the leader's appends of the two writes: raft messages
    // are counted by kind.
    let acks = |text: &str| {
        sample(
            text,
            "phoenix_raft_messages_sent_total",
            "kind=\"append_response\"",
        )
        .unwrap_or(0.0)
    };
    assert!(acks(&text) - acks(&before) >= 2.0, "{text}");
    // Redirects instead of forwarding when asked, and never a second hop.
    for h in [
        proto::RequestHeader {
            no_forward: true,
            ..header(&route).unwrap()
        },
        proto::RequestHeader {
            forwarded_by: 9,
            ..header(&route).unwrap()
        },
    ] {
        let r = f0.put(put_req(Some(h), "c")).await.unwrap().into_inner();
        match r.error.and_then(|e| e.kind) {
            Some(proto::error::Kind::NotLeader(nl)) => {
                let l = nl.leader.expect("leader hint");
                assert_eq!(l.node_id, route.leader_node_id);
                assert_eq!(l.addr, addrs[leader]);
            }
            other => panic!("expected NotLeader with a hint, got {other:?}"),
        }
    }
    let g = f1
        .get(proto::GetRequest {
            header: header(&route),
            key: b"fwd".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&g.value[..], b"b", "the refused writes did not apply");
    // The leader stops: a write a follower takes right away is not reported as done
    // unless a new leader applied it.
    nodes[leader].take().unwrap().stop().await;
    let r = f0.put(put_req(session(3), "d")).await.unwrap().into_inner();
    if let Some(e) = r.error {
        assert!(
            matches!(
                e.kind,
                Some(
                    proto::error::Kind::NotLeader(_)
                        | proto::error::Kind::OutcomeUnknown(_)
                        | proto::error::Kind::GroupUnavailable(_)
                        | proto::error::Kind::DeadlineExceeded(_)
                )
            ),
            "{e:?}"
        );
    }
    // Once the others elect, the write (resent with its sequence) goes through either
    // follower and applies once.
    let live: Vec<String> = followers.iter().map(|&i| addrs[i].clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = f1.put(put_req(session(3), "d")).await.unwrap().into_inner();
        if r.error.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader took the write: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&live, &route, b"fwd").await, Some(b"d".to_vec()));
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

async fn set_space_cap(addr: &str, cap: Option<u64>) {
    let mut f = proto::faults_client::FaultsClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let r = f
        .set_disk(proto::SetDiskRequest {
            fail_writes: false,
            fail_syncs: false,
            space_cap: cap,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none() && r.space_cap == cap, "{r:?}");
}

/// A raw put to `addr` (forwarded there if it is a follower): its error, if any.
async fn put_at(addr: &str, route: &proto::Route, key: &[u8]) -> Option<proto::Error> {
    kv(addr)
        .await
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(route),
            key: key.to_vec().into(),
            value: b"full?".to_vec().into(),
        })
        .await
        .unwrap()
        .into_inner()
        .error
}

/// The disk-full flag node `node` reports to the meta service.
async fn reports_disk_full(addrs: &[String], node: u64) -> Option<bool> {
    let c = meta_client(&addrs[0])
        .await
        .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
        .await
        .ok()?
        .into_inner();
    c.nodes
        .iter()
        .find(|n| n.node_id == node)
        .and_then(|n| n.stats.as_ref())
        .map(|s| s.disk_full)
}

/// The reported leader of `group`, if any replica says it leads.
async fn reported_leader(addrs: &[String], group: u64) -> Option<u64> {
    cluster_groups(addrs)
        .await
        .iter()
        .filter(|g| g.route.as_ref().is_some_and(|r| r.group_id == group))
        .flat_map(|g| g.replicas.iter())
        .filter(|r| r.is_leader)
        .max_by_key(|r| r.term)
        .map(|r| r.node_id)
}

/// The applied index node `node` reports for `group`.
async fn reported_applied(addrs: &[String], group: u64, node: u64) -> Option<u64> {
    cluster_groups(addrs)
        .await
        .iter()
        .filter(|g| g.route.as_ref().is_some_and(|r| r.group_id == group))
        .flat_map(|g| g.replicas.iter())
        .find(|r| r.node_id == node)
        .map(|r| r.applied_index)
}

fn disk_full_of(e: &Option<proto::Error>) -> Option<&proto::DiskFull> {
    match e.as_ref().and_then(|e| e.kind.as_ref()) {
        Some(proto::error::Kind::DiskFull(df)) => Some(df),
        _ => None,
    }
}

/// Puts `key` through `addr` until the answer is DiskFull. Other refusals (e.g. while
/// leadership moves) are retried; a write taken fails the test unless `probe` (a probe
/// may be taken before the nodes know of the full disks).
async fn refused_at(addr: &str, route: &proto::Route, key: &[u8], probe: bool) -> proto::Error {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let e = put_at(addr, route, key).await;
        if disk_full_of(&e).is_some() {
            return e.unwrap_or_default();
        }
        assert!(
            probe || e.is_some(),
            "{addr}: a write was taken while it must be refused"
        );
        assert!(Instant::now() < deadline, "{addr}: never refused: {e:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Disks under their reserve (fault injection caps the free space the nodes see).
/// Every node full: client writes are refused with a typed DiskFull — sent to any node,
/// forwarded — and none is applied; reads are served; the nodes report it. Room again on
/// the two nodes that do not lead: the full leader hands the group to one of them,
/// writes go on, and the full node takes no new entries. Then one of the two fills up:
/// no quorum has room, writes are refused by the leader though its own disk has room.
/// Space back everywhere: nothing to restart, the full node catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_refuses_writes_serves_reads_and_recovers_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            c.fault_injection = true;
            // Any disk has this much free: only the caps below make one look full.
            c.reserve_space = 4 << 20;
            c.disk_check_interval = Duration::from_millis(20);
            // Small memtables and a short log: the full node falls behind the leader's
            // truncated log, so only a snapshot could catch it up (refused while full).
            c.memtable_bytes = 64 << 10;
            c.log_keep_entries = 5;
            c.log_truncate_interval = Duration::from_millis(100);
            start(c)
        })
        .collect();
    let route = wait_route(&addrs).await;
    for i in 0..10u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v1").await;
    }
    for a in &addrs {
        set_space_cap(a, Some(1 << 20)).await;
    }
    refused_at(&addrs[0], &route, b"k-probe", true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 1..=3 {
        while reports_disk_full(&addrs, n).await != Some(true) {
            assert!(
                Instant::now() < deadline,
                "node {n} never reported its full disk"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for a in &addrs {
        let e = refused_at(a, &route, b"k-refused", false).await;
        let df = disk_full_of(&Some(e.clone())).cloned().unwrap_or_default();
        assert_eq!((df.group_id, df.reserve), (route.group_id, 4 << 20), "{e}");
        assert!(df.full_nodes.contains(&df.node_id), "{e}");
        assert!(df.available <= 1 << 20, "{e}");
        assert!(e.message.contains("disk is full"), "{e}");
    }
    // Reads are served.
    for a in &addrs {
        let r = kv(a)
            .await
            .get(proto::GetRequest {
                header: header(&route),
                key: b"k0003".to_vec().into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.error.is_none(), "{a}: {r:?}");
        assert!(r.found && r.value.as_ref() == b"v1", "{a}: {r:?}");
    }
    // Room on the two nodes that do not lead: the full leader hands the group over,
    // writes go on, and the full node takes no new entries.
    let deadline = Instant::now() + Duration::from_secs(10);
    let full = loop {
        if let Some(l) = reported_leader(&addrs, route.group_id).await {
            break l;
        }
        assert!(Instant::now() < deadline, "no leader reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let roomy: Vec<u64> = (1..=3).filter(|&n| n != full).collect();
    for &n in &roomy {
        set_space_cap(&addrs[n as usize - 1], None).await;
    }
    let full_applied = reported_applied(&addrs, route.group_id, full)
        .await
        .unwrap_or(0);
    put(&addrs, &route, b"k-after", b"v2").await;
    // 20 writes of 8 KiB: flushes move the persisted index, and the leader truncates its
    // log past what the full node holds.
    for i in 0..20u32 {
        put(
            &addrs,
            &route,
            format!("k{i:04}").as_bytes(),
            &[b'3'; 8 << 10],
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        match reported_leader(&addrs, route.group_id).await {
            Some(l) if l != full => break l,
            other => assert!(
                Instant::now() < deadline,
                "node {full} kept the lead: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = reported_applied(&addrs, route.group_id, leader)
            .await
            .unwrap_or(0);
        if l >= full_applied + 21 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new leader's applied index stays {l}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let first = cluster_groups(&addrs)
            .await
            .iter()
            .filter(|g| {
                g.route
                    .as_ref()
                    .is_some_and(|r| r.group_id == route.group_id)
            })
            .flat_map(|g| g.replicas.iter())
            .find(|r| r.node_id == leader)
            .map_or(0, |r| r.log_first_index);
        if first > full_applied + 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never truncated past the full node: first index {first}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several snapshot attempts' time.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let f = reported_applied(&addrs, route.group_id, full)
        .await
        .unwrap_or(0);
    assert!(
        f < full_applied + 21,
        "the full node took the new entries: applied {f}, was {full_applied}"
    );
    // The other node with room fills up too: no quorum has room, and the leader, its
    // own disk fine, refuses.
    let other = roomy.iter().copied().find(|&n| n != leader).unwrap_or(0);
    set_space_cap(&addrs[other as usize - 1], Some(0)).await;
    let e = refused_at(&addrs[leader as usize - 1], &route, b"k-probe2", true).await;
    let df = disk_full_of(&Some(e.clone())).cloned().unwrap_or_default();
    assert_eq!(df.node_id, leader, "{e}");
    let mut named = df.full_nodes.clone();
    named.sort_unstable();
    let mut want = vec![full, other];
    want.sort_unstable();
    assert_eq!(named, want, "{e}");
    assert!(e.message.contains("no quorum with room"), "{e}");
    refused_at(&addrs[leader as usize - 1], &route, b"k-refused", false).await;
    // Space back everywhere: writes taken, the full node catches up.
    for a in &addrs {
        set_space_cap(a, None).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 1..=3 {
        while reports_disk_full(&addrs, n).await != Some(false) {
            assert!(
                Instant::now() < deadline,
                "node {n} still reports a full disk"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    put(&addrs, &route, b"k-last", b"v4").await;
    let top = reported_applied(&addrs, route.group_id, leader)
        .await
        .unwrap_or(0);
    wait_caught_up(
        &addrs,
        &route,
        leader as usize - 1,
        full as usize - 1,
        top,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(get(&addrs, &route, b"k-refused").await, None);
    assert_eq!(
        get(&addrs, &route, b"k-after").await.as_deref(),
        Some(&b"v2"[..])
    );
    assert_eq!(
        get(&addrs, &route, b"k0019").await.as_deref(),
        Some(&[b'3'; 8 << 10][..])
    );
    for n in nodes {
        n.stop().await;
    }
}

/// The metrics endpoint serves the node's counters and state as OpenMetrics text: every
/// answered request by method and result, with latencies; proposals; replicas by state;
/// engine, log store and disk figures. Other paths are 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_metrics_endpoint_counts_requests_and_reports_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let maddr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let mut cfg = config(1, &addr, dir.path(), &meta, 1);
    cfg.metrics_listen = Some(maddr.clone());
    cfg.reserve_space = 1 << 20;
    let node = start(cfg);
    let route = wait_route(&addrs).await;
    let (code, before) = http_get(&maddr, "/metrics").await;
    assert_eq!(code, 200, "{before}");
    let puts_before = sample(
        &before,
        "phoenix_requests_total",
        "method=\"put\",result=\"ok\"",
    )
    .unwrap_or(0.0);
    for i in 0..30u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v").await;
    }
    assert_eq!(
        get(&addrs, &route, b"k0001").await.as_deref(),
        Some(&b"v"[..])
    );
    // A refused request is counted under its error kind.
    let e = kv(&addr)
        .await
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: vec![b'x'; 5000].into(),
            value: Default::default(),
        })
        .await
        .unwrap()
        .into_inner()
        .error;
    assert!(e.is_some());
    let (code, text) = http_get(&maddr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let s = |name: &str, labels: &str| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{text}"))
    };
    let puts = s("phoenix_requests_total", "method=\"put\",result=\"ok\"");
    assert_eq!(puts - puts_before, 30.0, "{text}");
    assert!(s("phoenix_requests_total", "method=\"get\",result=\"ok\"") >= 1.0);
    assert_eq!(
        s(
            "phoenix_requests_total",
            "method=\"put\",result=\"key_too_large\""
        ),
        1.0
    );
    assert!(s("phoenix_request_duration_seconds_count", "method=\"put\"") >= 31.0);
    assert!(s("phoenix_request_duration_seconds_sum", "method=\"put\"") > 0.0);
    assert!(s("phoenix_raft_proposals_total", "") >= 30.0);
    assert!(s("phoenix_raft_leader_changes_total", "") >= 1.0);
    assert!(
        s("phoenix_groups", "state=\"hosted\"") >= 2.0,
        "meta and data groups"
    );
    assert!(s("phoenix_groups", "state=\"leader\"") >= 2.0);
    assert_eq!(s("phoenix_groups", "state=\"stopped\""), 0.0);
    assert!(s("phoenix_log_syncs_total", "") >= 1.0);
    assert!(s("phoenix_log_write_bytes_total", "") > 0.0);
    assert!(s("phoenix_engine_user_write_bytes_total", "") > 0.0);
    assert!(s("phoenix_engine_level_files", "level=\"L0\"") >= 0.0);
    assert!(s("phoenix_disk_free_bytes", "") > 0.0);
    assert_eq!(s("phoenix_disk_full", ""), 0.0);
    assert_eq!(s("phoenix_disk_reserve_bytes", ""), 1048576.0);
    assert_eq!(s("phoenix_storage_restarts", ""), 0.0);
    // The lowest level of the registered nodes (this one) once a heartbeat answer said.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = http_get(&maddr, "/metrics").await;
        let level = sample(&text, "phoenix_cluster_protocol", "");
        if level == Some(f64::from(phoenix_meta::PROTOCOL)) {
            break;
        }
        assert!(Instant::now() < deadline, "cluster protocol {level:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, _) = http_get(&maddr, "/nothing-here").await;
    assert_eq!(code, 404);
    node.stop().await;
}

/// Node 1 of a 3-node cluster serving its metrics port, with a few writes done: the
/// address of its status page, the node addresses, and the cluster's first route.
async fn status_page_cluster(dir: &Path) -> (Vec<Node>, String, Vec<String>, proto::Route) {
    let (addrs, meta) = loopback_members(3);
    let maddr = format!("127.0.0.1:{}", free_port());
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir, &meta, 3);
            if i == 0 {
                c.metrics_listen = Some(maddr.clone());
            }
            start(c)
        })
        .collect();
    let route = wait_route(&addrs).await;
    for i in 0..10u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v").await;
    }
    (nodes, maddr, addrs, route)
}

/// The status page (`/` on the metrics port) is a page with its script, and
/// `/status.json` holds the cluster as the meta group sees it: every node with its
/// address, every group with its leader and replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_status_page_serves_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, maddr, addrs, route) = status_page_cluster(dir.path()).await;
    let (code, page) = http_get(&maddr, "/").await;
    assert_eq!(code, 200);
    assert!(
        page.contains("<canvas") && page.contains("/status.json"),
        "{page}"
    );
    // Until every node has heartbeated, the table may lack some: wait for all three.
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let (code, body) = http_get(&maddr, "/status.json").await;
        assert_eq!(code, 200, "{body}");
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        let alive = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["alive"] == true)
            .count();
        if alive == 3 || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(s["node_id"], 1);
    let listed: Vec<&str> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["addr"].as_str().unwrap())
        .collect();
    for a in &addrs {
        assert!(listed.contains(&a.as_str()), "{a} missing: {s}");
    }
    let g = &s["groups"][0];
    assert_eq!(g["group_id"], route.group_id);
    assert_eq!(g["replicas"].as_array().unwrap().len(), 3, "{s}");
    assert!(g["leader"].as_u64().is_some(), "{s}");
    assert!(s["meta_leader"].as_u64().is_some(), "{s}");
    for n in nodes {
        n.stop().await;
    }
}

/// The status page as a browser shows it: headless Chromium loads it, its script
/// fetches the status and the metrics, and the rendered tables list every node and
/// the group, and the chart's caption shows a request rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs chromium"]
async fn the_status_page_renders_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, maddr, addrs, route) = status_page_cluster(dir.path()).await;
    // (The chart needs two scrapes: the page polls every 2 s.)
    let url = format!("http://{maddr}/");
    let profile = dir.path().join("chromium");
    let out = tokio::task::spawn_blocking(move || {
        // (Bounded: a chromium that hangs must not hang the test.)
        std::process::Command::new("timeout")
            .args([
                "60",
                "chromium",
                "--headless",
                "--disable-dev-shm-usage",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--virtual-time-budget=5000",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(&url)
            .output()
    })
    .await
    .unwrap()
    .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chromium: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        dom.contains("served by node 1"),
        "summary not rendered:\n{dom}"
    );
    for a in &addrs {
        assert!(
            dom.contains(&format!("<td class=\"l\">{a}</td>")),
            "node {a} not listed:\n{dom}"
        );
    }
    assert!(
        dom.contains(&format!("<td>{}</td>", route.group_id)) && dom.contains("[-inf, +inf)"),
        "group not listed:\n{dom}"
    );
    assert!(
        dom.contains("requests/s, mean"),
        "no rate under the chart:\n{dom}"
    );
    for n in nodes {
        n.stop().await;
    }
}

/// A leader's node that stops cleanly hands its groups to a follower first: with
/// election timeouts of 3–6 s, a new leader takes writes well within the shortest one,
/// which only the hand-off explains.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_node_hands_its_leaderships_over() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let mut nodes: Vec<Option<Node>> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            c.election_ticks = 300;
            Some(start(c))
        })
        .collect();
    let route = wait_route(&addrs).await;
    for i in 0..10u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v1").await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        if let Some(l) = reported_leader(&addrs, route.group_id).await {
            break l;
        }
        assert!(Instant::now() < deadline, "no leader reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Let the group fall asleep: the hand-off wakes it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    if let Some(n) = nodes[leader as usize - 1].take() {
        n.stop().await;
    }
    let stopped_in = stopping.elapsed();
    let rest: Vec<String> = (1..=3u64)
        .filter(|&n| n != leader)
        .map(|n| addrs[n as usize - 1].clone())
        .collect();
    let t = Instant::now();
    put(&rest, &route, b"k-after", b"v2").await;
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "a write after the stop took {took:?} (stop took {stopped_in:?}): no hand-off"
    );
    assert_eq!(
        get(&rest, &route, b"k-after").await.as_deref(),
        Some(&b"v2"[..])
    );
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// Leaders per node as the meta service reports them (groups with no reported leader
/// are left out), and how many groups have one.
async fn leaders_per_node(addrs: &[String]) -> (std::collections::BTreeMap<u64, usize>, usize) {
    let mut per = std::collections::BTreeMap::new();
    let mut led = 0;
    for g in cluster_groups(addrs).await {
        if let Some(l) = g
            .replicas
            .iter()
            .filter(|r| r.is_leader)
            .max_by_key(|r| r.term)
        {
            *per.entry(l.node_id).or_insert(0) += 1;
            led += 1;
        }
    }
    (per, led)
}

async fn transfer(addr: &str, group: u64, to: u64) -> proto::TransferLeaderResponse {
    meta_client(addr)
        .await
        .transfer_leader(proto::TransferLeaderRequest {
            group_id: group,
            to_node: to,
            timeout_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// `TransferLeader` moves a group's leadership where asked, through any node (one that
/// is not the meta leader forwards), and answers once the meta leader heard it moved;
/// the group serves writes there. Impossible targets get a typed refusal at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leadership_moves_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            c.split_keys = vec![b"m".to_vec()];
            start(c)
        })
        .collect();
    let table = routes_with_leaders(&addrs[0], 2).await;
    let route = &table[0];
    let g = route.group_id;
    for round in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        let leader = loop {
            if let Some(l) = reported_leader(&addrs, g).await {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader reported");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let to = leader % 3 + 1;
        // Asked through each node in turn: the meta leader and those that forward.
        let asked = Instant::now();
        let r = transfer(&addrs[round], g, to).await;
        assert!(r.error.is_none(), "round {round}: {:?}", r.error);
        assert_eq!(r.leader_node_id, to);
        eprintln!(
            "round {round}: group {g} moved {leader} -> {to} in {:?}",
            asked.elapsed()
        );
        assert_eq!(reported_leader(&addrs, g).await, Some(to));
        let key = format!("after-{round}");
        assert_eq!(
            put_at(&addrs[to as usize - 1], route, key.as_bytes()).await,
            None,
            "the new leader takes writes"
        );
        // Asking again for the leader it has is answered at once.
        let r = transfer(&addrs[0], g, to).await;
        assert!(r.error.is_none() && r.leader_node_id == to, "{r:?}");
    }
    for (group, to, want) in [
        (g, 9, "holds no replica"),
        (99, 1, "not in the routing table"),
        // The meta group's leadership moves too, to a member only.
        (0, 9, "holds no replica"),
        (g, 0, "node id"),
    ] {
        let r = transfer(&addrs[1], group, to).await;
        let e = r
            .error
            .unwrap_or_else(|| panic!("group {group} to {to} accepted"));
        assert!(e.to_string().contains(want), "group {group} to {to}: {e}");
    }
    for n in nodes {
        n.stop().await;
    }
}

/// Node 1 wins every election (its timeout is a tenth of the others'), so it leads
/// every group at first; the meta leader's balancer then moves leaderships until each
/// node leads 12 / 3 ± 1 groups, and stops moving them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_balancer_spreads_leaders_over_the_nodes() {
    const GROUPS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
            c.split_keys = phoenix_server::even_split_keys(GROUPS).unwrap();
            c.balance_leaders = true;
            c.election_ticks = if i == 0 { 30 } else { 300 };
            start(c)
        })
        .collect();
    routes_with_leaders(&addrs[0], GROUPS).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut most_on_one = 0;
    let balanced = loop {
        let (per, led) = leaders_per_node(&addrs).await;
        most_on_one = most_on_one.max(per.values().copied().max().unwrap_or(0));
        if led == GROUPS && per.len() == 3 && per.values().all(|&c| (3..=5).contains(&c)) {
            break per;
        }
        assert!(
            Instant::now() < deadline,
            "leaders not balanced within 40 s: {per:?} ({led} of {GROUPS} led)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("balanced: {balanced:?} (at most {most_on_one} on one node before)");
    // Balanced, it stays put: no operator under way, the same leaders a while later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = meta_client(&addrs[0])
        .await
        .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
        .await
        .unwrap()
        .into_inner();
    assert!(c.operators.is_empty(), "{:?}", c.operators);
    let (after, _) = leaders_per_node(&addrs).await;
    assert_eq!(after, balanced);
    for n in nodes {
        n.stop().await;
    }
}

async fn add_replica(addr: &str, group: u64, node: u64) -> proto::AddReplicaResponse {
    meta_client(addr)
        .await
        .add_replica(proto::AddReplicaRequest {
            group_id: group,
            node_id: node,
            timeout_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// A replica added on a fourth node joins as a learner, catches up by snapshot (the
/// leader's log is truncated past what it would need), is promoted, and the routing
/// table lists it as a voter at a new membership version; it holds every write, can
/// lead the group, and keeps its membership across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_added_on_another_node_catches_up_and_votes() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    // Nodes 1-3 host the meta group; node 4 only data. (The group goes to three of the
    // four, whichever are alive first; the fourth gets the new replica.)
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let metrics: Vec<String> = (0..4)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.metrics_listen = Some(metrics[i].clone());
        // Small memtables flush often, so the persisted applied index advances and the
        // logs are cut.
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 5;
        c.log_truncate_interval = Duration::from_millis(100);
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..4).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let new = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let value = vec![7u8; 1024];
    for i in 0..200u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), &value).await;
    }
    // The leader's log no longer starts at 1: the new replica needs a snapshot.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let groups = cluster_groups(&addrs).await;
        let first = groups
            .iter()
            .flat_map(|gi| gi.replicas.iter())
            .filter(|r| r.is_leader)
            .map(|r| r.log_first_index)
            .max()
            .unwrap_or(0);
        if first > 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader's log was not truncated"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Refusals first: an unknown node, node 0.
    let r = add_replica(&addrs[0], g, 9).await;
    let e = r.error.expect("node 9 accepted");
    assert!(e.to_string().contains("not registered"), "{e}");
    let r = add_replica(&addrs[0], g, 0).await;
    let e = r.error.expect("node 0 accepted");
    assert!(e.to_string().contains("node id"), "{e}");

    let t = Instant::now();
    let r = add_replica(&addrs[3], g, new).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let added = r.route.unwrap();
    eprintln!(
        "replica on node {new} added in {:?}: {added:?}",
        t.elapsed()
    );
    let mut ids: Vec<u64> = added.replicas.iter().map(|x| x.node_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    assert!(added.learners.is_empty());
    assert!(added.conf_version > 0);
    // Every node's table says so; asking again is answered at once.
    let table = routes_with_leaders(&addrs[new as usize - 1], 1).await;
    assert_eq!(table[0].conf_version, added.conf_version);
    assert_eq!(
        table[0].epoch, route.epoch,
        "a membership change keeps the epoch"
    );
    let r = add_replica(&addrs[1], g, new).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    // It caught up by a snapshot (the node's count; a meta member may have installed
    // a meta snapshot too).
    let (_, text) = http_get(&metrics[new as usize - 1], "/metrics").await;
    let installed = sample(
        &text,
        "phoenix_snapshots_total",
        r#"event="installed",result="ok""#,
    );
    assert!(installed.is_some_and(|n| n >= 1.0), "{text}");

    // It leads the group and serves what was written before it joined.
    let moved = meta_client(&addrs[0])
        .await
        .transfer_leader(proto::TransferLeaderRequest {
            group_id: g,
            to_node: new,
            timeout_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(moved.error.is_none(), "{:?}", moved.error);
    let at_new = [addrs[new as usize - 1].clone()];
    for i in [0u32, 99, 199] {
        assert_eq!(
            get(&at_new, &route, format!("k{i:04}").as_bytes()).await,
            Some(value.clone()),
            "k{i:04} on node {new}"
        );
    }
    put(&at_new, &route, b"after-add", b"v2").await;

    // Restarted, it is still a voter (its membership was persisted) and catches up.
    if let Some(n) = nodes[new as usize - 1].take() {
        n.stop().await;
    }
    put(&addrs, &route, b"while-down", b"v3").await;
    nodes[new as usize - 1] = Some(start(cfg(new as usize - 1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let groups = cluster_groups(&addrs).await;
        let reps: Vec<&proto::ReplicaStats> =
            groups.iter().flat_map(|gi| gi.replicas.iter()).collect();
        let leader_commit = reps
            .iter()
            .filter(|r| r.is_leader)
            .map(|r| r.commit_index)
            .max();
        let mine = reps.iter().find(|r| r.node_id == new);
        if let (Some(c), Some(m)) = (leader_commit, mine) {
            if m.applied_index >= c
                && m.voters.contains(&new)
                && m.conf_version == added.conf_version
            {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "node {new} did not catch up after its restart: {reps:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// Two replicas added one after the other while the leader keeps its whole log: each
/// catches up from the log (the second one's log holds the first one's addition and
/// promotion, older than the membership it is created with), and the group ends with
/// five voters that all hold every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_added_from_the_log_replay_older_changes_safely() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(5);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let nodes: Vec<Node> = (0..5)
        .map(|i| start(config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3)))
        .collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let new: Vec<u64> = (1..=5u64).filter(|n| !on.contains(n)).collect();
    assert_eq!(new.len(), 2);
    for i in 0..20u32 {
        put(&addrs, &route, format!("a{i:03}").as_bytes(), b"1").await;
    }
    let first = add_replica(&addrs[0], g, new[0]).await;
    assert!(first.error.is_none(), "{:?}", first.error);
    for i in 0..20u32 {
        put(&addrs, &route, format!("b{i:03}").as_bytes(), b"2").await;
    }
    let second = add_replica(&addrs[0], g, new[1]).await;
    assert!(second.error.is_none(), "{:?}", second.error);
    let r = second.route.unwrap();
    assert_eq!(r.replicas.len(), 5, "{r:?}");
    assert!(r.learners.is_empty(), "{r:?}");
    assert!(r.conf_version > first.route.unwrap().conf_version);
    // Each new replica leads in turn and serves every write.
    for &n in &new {
        let moved = transfer(&addrs[0], g, n).await;
        assert!(moved.error.is_none(), "{:?}", moved.error);
        let at = [addrs[n as usize - 1].clone()];
        for key in ["a000", "a019", "b000", "b019"] {
            assert!(
                get(&at, &route, key.as_bytes()).await.is_some(),
                "{key} on node {n}"
            );
        }
    }
    // Every replica reports the same five voters at the same version.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let groups = cluster_groups(&addrs).await;
        let reps: Vec<&proto::ReplicaStats> =
            groups.iter().flat_map(|gi| gi.replicas.iter()).collect();
        let same = reps.len() == 5
            && reps.iter().all(|x| {
                let mut v = x.voters.clone();
                v.sort_unstable();
                v == vec![1, 2, 3, 4, 5] && x.conf_version == r.conf_version
            });
        if same {
            break;
        }
        assert!(Instant::now() < deadline, "memberships differ: {reps:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in nodes {
        n.stop().await;
    }
}

/// Whether some live node's meta service sees node `node` report a replica of `g`
/// (asked after a few heartbeats).
async fn reported(addrs: &[String], g: u64, node: u64) -> bool {
    cluster_groups(addrs)
        .await
        .iter()
        .filter(|gi| gi.route.as_ref().is_some_and(|r| r.group_id == g))
        .flat_map(|gi| gi.replicas.iter())
        .any(|r| r.node_id == node)
}

/// A replica moved off its leader's node (added on a fourth node, then the old one
/// removed): the leadership moves away first, the table lists the three others at a
/// newer membership version, and the old node drops the group: no engine key and no
/// log stream of it are left, and a restart does not bring it back. The writes are all
/// there on the new membership. Added back later, the node gets a new replica that
/// catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_moved_off_a_node_is_dropped_there() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let mut nodes: Vec<Option<Node>> = (0..4).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let new = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let from = route.leader_node_id;
    assert!(from != 0);
    let value = vec![5u8; 512];
    for i in 0..100u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), &value).await;
    }
    let r = add_replica(&addrs[0], g, new).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    // Removing a node that holds no replica is nothing to do.
    let other = remove_replica(&addrs[1], g, 9).await;
    assert!(other.error.is_none(), "{:?}", other.error);
    let t = Instant::now();
    let r = remove_replica(&addrs[2], g, from).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    eprintln!("replica on node {from} removed in {:?}", t.elapsed());
    let after = r.route.unwrap();
    let mut ids: Vec<u64> = after.replicas.iter().map(|x| x.node_id).collect();
    ids.sort_unstable();
    let mut want: Vec<u64> = on.iter().copied().filter(|&n| n != from).collect();
    want.push(new);
    want.sort_unstable();
    assert_eq!(ids, want);
    assert!(after.learners.is_empty());
    assert_eq!(
        after.epoch, route.epoch,
        "a membership change keeps the epoch"
    );
    // The old node drops the group and stops reporting it.
    let from_dir = dir.path().join(format!("node-{from}"));
    let tomb = wait_dropped(&from_dir, g).await;
    assert!(
        tomb.term >= 1 && tomb.conf_version == after.conf_version,
        "{tomb:?}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !reported(&addrs, g, from).await,
        "node {from} still reports group {g}"
    );
    // Every write is there, and the group takes more.
    for i in [0u32, 50, 99] {
        assert_eq!(
            get(&addrs, &after, format!("k{i:04}").as_bytes()).await,
            Some(value.clone())
        );
    }
    put(&addrs, &after, b"after-move", b"v").await;
    // On disk: nothing of the group is left on the old node; a restart keeps it so.
    if let Some(n) = nodes[from as usize - 1].take() {
        n.stop().await;
    }
    assert_eq!(group_left_on_disk(&from_dir, g), (0, false));
    nodes[from as usize - 1] = Some(start(cfg(from as usize - 1)));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !reported(&addrs, g, from).await,
        "node {from} brought group {g} back"
    );
    // Added back, the node gets a new replica that catches up.
    let r = add_replica(&addrs[3], g, from).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let back = r.route.unwrap();
    assert_eq!(back.replicas.len(), 4);
    assert!(back.conf_version > after.conf_version);
    let at_from = [addrs[from as usize - 1].clone()];
    let moved = meta_client(&addrs[0])
        .await
        .transfer_leader(proto::TransferLeaderRequest {
            group_id: g,
            to_node: from,
            timeout_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(moved.error.is_none(), "{:?}", moved.error);
    assert_eq!(
        get(&at_from, &back, b"after-move").await,
        Some(b"v".to_vec())
    );
    assert_eq!(get(&at_from, &back, b"k0042").await, Some(value.clone()));
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

/// A node down longer than `--down-after` has its replicas replaced: the group gets a
/// replica on the fourth node (added, caught up, promoted), then the down one is
/// removed; the table lists the three live nodes at a newer membership, every write is
/// there, and the group takes more. The down node, restarted, drops its old replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_replicas_of_a_node_down_too_long_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.down_after = phoenix_meta::ALIVE_WITHIN;
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..4).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let free = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let value = vec![3u8; 256];
    for i in 0..50u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), &value).await;
    }
    // A follower goes down (its leader keeps the group's writes flowing).
    let dead = *on.iter().find(|&&n| n != route.leader_node_id).unwrap();
    if let Some(n) = nodes[dead as usize - 1].take() {
        n.stop().await;
    }
    let live: Vec<String> = (1..=4u64)
        .filter(|&n| n != dead)
        .map(|n| addrs[n as usize - 1].clone())
        .collect();
    let mut want: Vec<u64> = on.iter().copied().filter(|&n| n != dead).collect();
    want.push(free);
    want.sort_unstable();
    let t = Instant::now();
    let deadline = t + Duration::from_secs(60);
    let after = loop {
        let r = wait_route(&live).await;
        let mut ids: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
        ids.sort_unstable();
        if ids == want && r.learners.is_empty() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "group {g} not repaired within 60 s: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "node {dead} down: its replica of group {g} replaced on node {free} within {:?}",
        t.elapsed()
    );
    assert!(after.conf_version > route.conf_version);
    assert_eq!(after.epoch, route.epoch);
    for i in [0u32, 25, 49] {
        assert_eq!(
            get(&live, &after, format!("k{i:04}").as_bytes()).await,
            Some(value.clone())
        );
    }
    put(&live, &after, b"after-repair", b"v").await;
    // Back, the old node is told the table left it out, and drops the group.
    nodes[dead as usize - 1] = Some(start(cfg(dead as usize - 1)));
    let dead_dir = dir.path().join(format!("node-{dead}"));
    let tomb = wait_dropped(&dead_dir, g).await;
    assert_eq!(tomb.conf_version, after.conf_version);
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
    assert_eq!(group_left_on_disk(&dead_dir, g), (0, false));
}

/// The meta group as the meta leader of the first of `addrs` that answers reports it.
async fn meta_group(addrs: &[String]) -> Option<proto::GroupInfo> {
    cluster(addrs).await.and_then(|c| c.meta_group)
}

/// Writes `k1` through the first data group and waits for the meta group's first
/// members, nodes 1-3 (of `addrs`' nodes, all started).
async fn meta_on_the_first_three(addrs: &[String]) -> (proto::Route, proto::GroupInfo) {
    let route = wait_route(addrs).await;
    put(addrs, &route, b"k1", b"v1").await;
    let first = wait_meta_group(addrs, "the first meta members", |g| {
        voters_of(g) == [1, 2, 3] && g.replicas.len() == 3
    })
    .await;
    (route, first)
}

/// The voters of a group as its route lists them, sorted.
fn voters_of(g: &proto::GroupInfo) -> Vec<u64> {
    let route = g.route.as_ref().unwrap();
    let mut v: Vec<u64> = route
        .replicas
        .iter()
        .map(|r| r.node_id)
        .filter(|n| !route.learners.contains(n))
        .collect();
    v.sort_unstable();
    v
}

/// Waits up to 60 s until the meta group, as reported, satisfies `ok`.
async fn wait_meta_group(
    addrs: &[String],
    what: &str,
    ok: impl Fn(&proto::GroupInfo) -> bool,
) -> proto::GroupInfo {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let g = meta_group(addrs).await;
        if let Some(g) = g.as_ref().filter(|g| ok(g)) {
            return g.clone();
        }
        assert!(Instant::now() < deadline, "{what} not within 60 s: {g:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The meta group replaces a dead member as any group does: with `--down-after`, a
/// meta member down for good is replaced on the fourth node (a learner told to create
/// its replica, caught up from the meta leader, promoted; then the dead one removed),
/// which learns it is a member. The new member counts in the quorum: with a second
/// first member stopped, the meta group still commits (a split is planned and
/// recorded). The dead member, back with the flags it was first started with, drops
/// its old meta replica and starts no new one, nor does it once its disk is wiped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_meta_member_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.down_after = phoenix_meta::ALIVE_WITHIN;
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..4).map(|i| Some(start(cfg(i)))).collect();
    let (_, first) = meta_on_the_first_three(&addrs).await;
    let leader = first.route.as_ref().unwrap().leader_node_id;
    // A meta member that does not lead the meta group goes down for good.
    let dead = (1..=3u64).find(|&n| n != leader).unwrap();
    if let Some(n) = nodes[dead as usize - 1].take() {
        n.stop().await;
    }
    let live: Vec<String> = (1..=4u64)
        .filter(|&n| n != dead)
        .map(|n| addrs[n as usize - 1].clone())
        .collect();
    let mut want: Vec<u64> = (1..=4u64).filter(|&n| n != dead).collect();
    want.sort_unstable();
    let t = Instant::now();
    let after = wait_meta_group(&live, "the meta member replaced", |g| {
        let route = g.route.as_ref().unwrap();
        voters_of(g) == want
            && route.learners.is_empty()
            && g.replicas
                .iter()
                .any(|r| r.node_id == 4 && r.applied_index > 0)
    })
    .await;
    eprintln!(
        "meta member {dead} down: replaced on node 4 within {:?}",
        t.elapsed()
    );
    let after_route = after.route.clone().unwrap();
    assert!(after_route.conf_version > first.route.as_ref().unwrap().conf_version);
    // Every live node keeps the new members for its next start.
    let deadline = Instant::now() + Duration::from_secs(20);
    for &n in &want {
        let node_dir = dir.path().join(format!("node-{n}"));
        loop {
            let known = phoenix_server::known_meta::load(&node_dir).unwrap();
            let mut ids: Vec<u64> = known.iter().map(|m| m.id).collect();
            ids.sort_unstable();
            if ids == want {
                assert!(known.iter().all(|m| m.addr == addrs[m.id as usize - 1]));
                break;
            }
            assert!(Instant::now() < deadline, "node {n} keeps {known:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The data group is repaired too (its replica on the dead node, if any, moved).
    let deadline = Instant::now() + Duration::from_secs(60);
    let data = loop {
        let r = wait_route(&live).await;
        if r.replicas.len() == 3
            && r.learners.is_empty()
            && r.replicas.iter().all(|x| x.node_id != dead)
        {
            break r;
        }
        assert!(Instant::now() < deadline, "group not repaired: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A second first member stops (not the meta leader): the meta group is down to its
    // leader and node 4, which must vote for anything to commit.
    let leader = after_route.leader_node_id;
    let second = (1..=3u64).find(|&n| n != dead && n != leader).unwrap();
    if let Some(n) = nodes[second as usize - 1].take() {
        n.stop().await;
    }
    let live: Vec<String> = [leader, 4]
        .iter()
        .map(|&n| addrs[n as usize - 1].clone())
        .collect();
    let mut m = proto::meta_client::MetaClient::connect(format!("http://{}", live[0]))
        .await
        .unwrap();
    let split = m
        .split_group(proto::SplitGroupRequest {
            group_id: data.group_id,
            split_key: b"m".to_vec().into(),
            timeout_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(split.error.is_none(), "{:?}", split.error);
    let left = split.left.unwrap();
    assert_eq!(left.epoch, data.epoch + 1);
    assert_eq!(get(&live, &left, b"k1").await, Some(b"v1".to_vec()));
    // The dead member comes back with its first flags: told the meta group left it out,
    // it drops its old replica, and does not start a new one.
    nodes[dead as usize - 1] = Some(start(cfg(dead as usize - 1)));
    let dead_dir = dir.path().join(format!("node-{dead}"));
    let tomb = wait_dropped(&dead_dir, phoenix_meta::META_GROUP).await;
    assert_eq!(tomb.conf_version, after_route.conf_version);
    // Its disk wiped (the tombstone gone with it) and started again with its first
    // flags, it starts no meta replica of the first membership either (that would be a
    // second meta group): the members it asks name a meta group without it.
    if let Some(n) = nodes[dead as usize - 1].take() {
        n.stop().await;
    }
    std::fs::remove_dir_all(&dead_dir).unwrap();
    nodes[dead as usize - 1] = Some(start(cfg(dead as usize - 1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while phoenix_server::known_meta::load(&dead_dir)
        .map(|k| k.len() != want.len())
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the wiped node learned no members"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hosted = phoenix_server::registry::load(&dead_dir).unwrap();
    assert!(
        hosted
            .iter()
            .all(|r| r.group_id != phoenix_meta::META_GROUP),
        "{hosted:?}"
    );
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
    assert_eq!(
        group_left_on_disk(&dead_dir, phoenix_meta::META_GROUP),
        (0, false)
    );
    // Started again alone with `--meta` naming it, it starts none: the members it
    // learned leave it out.
    let alone = start(cfg(dead as usize - 1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    alone.stop().await;
    assert_eq!(
        group_left_on_disk(&dead_dir, phoenix_meta::META_GROUP),
        (0, false)
    );
}

/// The meta leader's own meta replica moves by hand (`cluster move 0 LEADER 4`): the
/// addition on node 4, then the removal, which moves the meta leadership away first
/// (the operator goes with the old leader; the client's retry carries the removal on at
/// the new one). The old leader's node drops its meta replica and still serves as a
/// data node: it follows the new members for its heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_meta_leaders_replica_moves_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let nodes: Vec<Node> = (0..4)
        .map(|i| start(config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3)))
        .collect();
    let (route, first) = meta_on_the_first_three(&addrs).await;
    let leader = first.route.as_ref().unwrap().leader_node_id;
    let c = workload::client(&addrs).await;
    let voters = c
        .move_replica(phoenix_meta::META_GROUP, leader, 4)
        .await
        .unwrap();
    let mut want: Vec<u64> = (1..=4u64).filter(|&n| n != leader).collect();
    want.sort_unstable();
    let mut got = voters.clone();
    got.sort_unstable();
    assert_eq!(got, want);
    let after = wait_meta_group(&addrs, "the meta replica moved", |g| {
        voters_of(g) == want && g.route.as_ref().unwrap().learners.is_empty()
    })
    .await;
    assert_ne!(after.route.as_ref().unwrap().leader_node_id, leader);
    let old_dir = dir.path().join(format!("node-{leader}"));
    let tomb = wait_dropped(&old_dir, phoenix_meta::META_GROUP).await;
    assert_eq!(
        tomb.conf_version,
        after.route.as_ref().unwrap().conf_version
    );
    // The meta group, with node 4 in it, takes a split; the old leader's node still
    // serves the data group's keys.
    let (left, _) = c.split_group(route.group_id, b"m").await.unwrap();
    assert_eq!(left.group_id, route.group_id);
    assert_eq!(c.get(b"k1").await.unwrap(), Some(b"v1".to_vec()));
    c.put(b"z-after-move", b"v").await.unwrap();
    let status = c.cluster_status().await.unwrap();
    let old = status.nodes.iter().find(|n| n.node_id == leader).unwrap();
    assert!(old.alive, "{status:?}");
    for n in nodes {
        n.stop().await;
    }
    assert_eq!(
        group_left_on_disk(&old_dir, phoenix_meta::META_GROUP),
        (0, false)
    );
}

/// Two nodes join a 3-node cluster of 6 groups: the replica balancer moves replicas to
/// them (each an addition, then a trim from the most loaded node) until every node
/// hosts 3 or 4 of the 18 replicas; every group keeps 3 voters and serves every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_spread_over_nodes_that_join() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(5);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let splits: Vec<Vec<u8>> = ["b", "c", "d", "e", "f"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.split_keys = splits.clone();
        c.balance_replicas = true;
        c
    };
    let mut nodes: Vec<Node> = (0..3).map(|i| start(cfg(i))).collect();
    let routes = routes_with_leaders(&addrs[0], 6).await;
    let value = b"v".to_vec();
    for r in &routes {
        let k = [r.start_key.to_vec(), b"0".to_vec()].concat();
        put(&addrs[..3], r, &k, &value).await;
    }
    nodes.extend((3..5).map(|i| start(cfg(i))));
    let t = Instant::now();
    let deadline = t + Duration::from_secs(60);
    let spread = loop {
        let routes = routes_with_leaders(&addrs[0], 6).await;
        let mut count = [0usize; 5];
        for r in &routes {
            for x in &r.replicas {
                count[x.node_id as usize - 1] += 1;
            }
        }
        let settled = routes
            .iter()
            .all(|r| r.replicas.len() == 3 && r.learners.is_empty());
        if settled && count.iter().all(|&c| (3..=4).contains(&c)) {
            break routes;
        }
        assert!(
            Instant::now() < deadline,
            "replicas not spread within 60 s: {count:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("replicas spread over 5 nodes in {:?}", t.elapsed());
    for r in &spread {
        let k = [r.start_key.to_vec(), b"0".to_vec()].concat();
        assert_eq!(get(&addrs, r, &k).await, Some(value.clone()));
        put(
            &addrs,
            r,
            &[r.start_key.to_vec(), b"after".to_vec()].concat(),
            b"w",
        )
        .await;
    }
    for n in nodes {
        n.stop().await;
    }
}

/// A drained node (here the group's leader) loses its replica: the group gets one on
/// the spare node, the leadership moves off, the table leaves the drained node out and
/// it drops the group (and its meta replica, if it is a meta member, goes to the spare
/// node too); the cluster view says it is draining until the drain is cancelled; every
/// write is there. Unknown nodes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_node_is_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(4);
    let meta: Vec<MetaMember> = meta[..3].to_vec();
    let cfg = |i: usize| config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
    let nodes: Vec<Node> = (0..4).map(|i| start(cfg(i))).collect();
    let route = wait_route(&addrs).await;
    let g = route.group_id;
    let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
    let spare = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let drained = route.leader_node_id;
    for i in 0..20u32 {
        put(&addrs, &route, format!("k{i:04}").as_bytes(), b"v").await;
    }
    let drain = |node: u64, cancel: bool| {
        let addr = addrs[0].clone();
        async move {
            meta_client(&addr)
                .await
                .drain_node(proto::DrainNodeRequest {
                    node_id: node,
                    cancel,
                    timeout_ms: 5_000,
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let r = drain(9, false).await;
    assert!(r.error.is_some(), "draining an unknown node: {r:?}");
    let r = drain(drained, false).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    // Its data replica, and its meta replica if it is a meta member (nodes 1-3).
    let meta_member = drained <= 3;
    assert_eq!(r.replicas, 1 + u64::from(meta_member));
    let t = Instant::now();
    let mut want: Vec<u64> = on.iter().copied().filter(|&n| n != drained).collect();
    want.push(spare);
    want.sort_unstable();
    let after = loop {
        let r = wait_route(&addrs).await;
        let mut ids: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
        ids.sort_unstable();
        if ids == want && r.learners.is_empty() {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "node {drained} not drained within 30 s: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("node {drained} drained in {:?}", t.elapsed());
    assert_ne!(after.leader_node_id, drained);
    if meta_member {
        // Its meta replica goes to the spare node as well.
        let mut want: Vec<u64> = (1..=4u64).filter(|&n| n != drained).collect();
        want.sort_unstable();
        wait_meta_group(&addrs, "the meta replica drained", |g| {
            voters_of(g) == want && g.route.as_ref().unwrap().learners.is_empty()
        })
        .await;
        wait_dropped(
            &dir.path().join(format!("node-{drained}")),
            phoenix_meta::META_GROUP,
        )
        .await;
    }
    wait_dropped(&dir.path().join(format!("node-{drained}")), g).await;
    let draining = |resp: &proto::GetClusterResponse| {
        resp.nodes
            .iter()
            .find(|n| n.node_id == drained)
            .is_some_and(|n| n.draining)
    };
    let status = meta_client(&addrs[1])
        .await
        .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
        .await
        .unwrap()
        .into_inner();
    assert!(draining(&status), "{status:?}");
    for i in [0u32, 19] {
        assert_eq!(
            get(&addrs, &after, format!("k{i:04}").as_bytes()).await,
            Some(b"v".to_vec())
        );
    }
    let r = drain(drained, true).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.replicas, 0);
    let status = meta_client(&addrs[2])
        .await
        .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
        .await
        .unwrap()
        .into_inner();
    assert!(!draining(&status));
    for n in nodes {
        n.stop().await;
    }
}

/// Snapshot files a crash left (received and not installed, or built and not sent) are
/// removed at the next start: nothing in this process will hand them to raft.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_files_left_by_a_crash_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let data = dir.path().join("node-1");
    let leftovers = [
        data.join("snap-recv").join("7-12-3"),
        data.join("snap-send").join("7-12-3").join("000001.sst"),
    ];
    let node = start(config(1, &addr, dir.path(), &meta, 1));
    wait_route(&addrs).await;
    node.stop().await;
    for f in &leftovers {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, vec![7u8; 4096]).unwrap();
    }
    let node = start(config(1, &addr, dir.path(), &meta, 1));
    wait_route(&addrs).await;
    for f in &leftovers {
        assert!(!f.exists(), "{} is still there", f.display());
    }
    node.stop().await;
}

/// A front end in the node's process (`phoenix_server::Requests`): it serves a put and a
/// get as the gRPC methods would, and stops serving the moment the node's future is
/// dropped without a clean stop (cancelled), so nothing calls a node that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_request_layer_in_the_process_serves_and_stops_with_the_node() {
    use proto::batch_request_item::Request as Req;
    use proto::batch_response_item::Response as Resp;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let requests = phoenix_server::Requests::default();
    assert!(!requests.ready());
    let node = tokio::spawn(phoenix_server::run_with(
        config(1, &addr, dir.path(), &meta, 1),
        std::future::pending(),
        requests.clone(),
    ));
    let route = wait_route(std::slice::from_ref(&addr)).await;
    assert!(requests.ready());
    let put = Req::Put(proto::PutRequest {
        keep_ttl: false,
        ttl_ms: 0,
        header: header(&route),
        key: b"k".to_vec().into(),
        value: b"v".to_vec().into(),
    });
    // The group's leader may still be elected: ask until it serves.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let Resp::Put(r) = requests.serve(put.clone()).await else {
            panic!("a put answered with another method's response");
        };
        match r.error {
            None => break,
            Some(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Some(e) => panic!("put refused: {e:?}"),
        }
    }
    let Resp::Get(g) = requests
        .serve(Req::Get(proto::GetRequest {
            header: header(&route),
            key: b"k".to_vec().into(),
        }))
        .await
    else {
        panic!("a get answered with another method's response");
    };
    assert_eq!((g.error, g.found, &g.value[..]), (None, true, &b"v"[..]));
    assert!(requests.served() >= 2);
    node.abort();
    let _ = node.await;
    assert!(
        !requests.ready(),
        "serving after the node's future was dropped"
    );
    let Resp::Put(r) = requests.serve(put).await else {
        panic!("a put answered with another method's response");
    };
    assert!(r.error.is_some_and(|e| e.is_retryable()));
}

/// Key expiry on a live cluster: a write with an expiry, `Kv.Ttl`, `Kv.Expire` with its
/// conditions and `PERSIST`, KEEPTTL; once an expiry passes, the key is absent for reads
/// through every node (get, batch get, scan) and for the commands that read before they
/// write; the leader's sweep then removes its records from every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_expire_on_every_replica_and_are_swept() {
    use phoenix_client::{ClientError, ExpireAt, ExpireCondition, Expiry, KeyTtl};
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| start(config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3)))
        .collect();
    let route = wait_route(&addrs).await;
    let mut clients = Vec::new();
    for a in &addrs {
        clients.push(
            phoenix_client::Client::connect(
                vec![a.clone()],
                phoenix_client::ClientOptions {
                    timeout: Duration::from_secs(20),
                    ..phoenix_client::ClientOptions::default()
                },
            )
            .await
            .unwrap(),
        );
    }
    let c = &clients[0];
    let short = Expiry::After(Duration::from_millis(1500));
    // The gate opens at the first heartbeat answer of every node.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.put_with(b"a", b"1", short).await {
            Ok(()) => break,
            Err(ClientError::Unsupported { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    let written = Instant::now();
    c.put_with(b"b", b"41", short).await.unwrap();
    c.put_with(b"long", b"v", Expiry::After(Duration::from_secs(600)))
        .await
        .unwrap();
    c.put(b"plain", b"v").await.unwrap();
    match c.ttl(b"a").await.unwrap() {
        KeyTtl::At { left_ms, .. } => assert!(left_ms <= 1500, "{left_ms}"),
        other => panic!("a: {other:?}"),
    }
    assert_eq!(c.ttl(b"plain").await.unwrap(), KeyTtl::Never);
    assert_eq!(c.ttl(b"none").await.unwrap(), KeyTtl::Absent);
    // Expiry changes and their conditions.
    let hour = ExpireAt::After(Duration::from_secs(3600));
    assert!(c
        .expire(b"plain", hour, ExpireCondition::ExpireIfNone)
        .await
        .unwrap());
    assert!(!c
        .expire(b"plain", hour, ExpireCondition::ExpireIfNone)
        .await
        .unwrap());
    assert!(!c
        .expire(
            b"plain",
            ExpireAt::After(Duration::from_secs(10)),
            ExpireCondition::ExpireIfLater
        )
        .await
        .unwrap());
    assert!(c
        .expire(b"plain", ExpireAt::Never, ExpireCondition::ExpireAlways)
        .await
        .unwrap());
    assert_eq!(c.ttl(b"plain").await.unwrap(), KeyTtl::Never);
    assert!(!c
        .expire(b"none", hour, ExpireCondition::ExpireAlways)
        .await
        .unwrap());
    let KeyTtl::At { at_ms: long_at, .. } = c.ttl(b"long").await.unwrap() else {
        panic!("long has no expiry");
    };
    // KEEPTTL keeps it; a plain write removes it.
    c.put_with(b"long", b"v2", Expiry::Keep).await.unwrap();
    assert!(matches!(c.ttl(b"long").await.unwrap(), KeyTtl::At { at_ms, .. } if at_ms == long_at));
    c.put(b"kept", b"x").await.unwrap();
    c.put_with(b"kept", b"y", Expiry::After(Duration::from_secs(600)))
        .await
        .unwrap();
    c.put(b"kept", b"z").await.unwrap();
    assert_eq!(c.ttl(b"kept").await.unwrap(), KeyTtl::Never);
    // An expiry at once deletes the key.
    c.put(b"gone", b"v").await.unwrap();
    assert!(c
        .expire(
            b"gone",
            ExpireAt::After(Duration::ZERO),
            ExpireCondition::ExpireAlways
        )
        .await
        .unwrap());
    assert_eq!(c.get(b"gone").await.unwrap(), None);
    // Before the expiry: there.
    assert_eq!(c.get(b"a").await.unwrap(), Some(b"1".to_vec()));
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(written.elapsed())).await;
    for (i, cl) in clients.iter().enumerate() {
        assert_eq!(cl.get(b"a").await.unwrap(), None, "through node {}", i + 1);
        assert_eq!(
            cl.batch_get(&[b"a".to_vec(), b"long".to_vec()])
                .await
                .unwrap(),
            vec![None, Some(b"v2".to_vec())],
            "through node {}",
            i + 1
        );
        let keys: Vec<Vec<u8>> = cl
            .scan(b"", b"", 0)
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            vec![b"kept".to_vec(), b"long".to_vec(), b"plain".to_vec()],
            "through node {}",
            i + 1
        );
        assert_eq!(cl.ttl(b"a").await.unwrap(), KeyTtl::Absent);
    }
    // An expired key is absent for the commands that read first.
    assert_eq!(
        c.incr(b"b", 1).await.unwrap(),
        phoenix_client::IncrOutcome::Value(1)
    );
    assert!(c.cas(b"a", None, Some(b"again")).await.unwrap().succeeded);
    assert_eq!(c.ttl(b"a").await.unwrap(), KeyTtl::Never);
    c.delete(b"a").await.unwrap();
    // A scan page passes over at most 4,096 expired keys not swept yet, then ends
    // early (the client goes on from where it stopped): 10,000 of them ahead of a live key
    // (a sweep between their expiry and the scan takes at most 4,096).
    let many: Vec<proto::Mutation> = (0..10_000)
        .map(|i| proto::Mutation {
            ttl_ms: 300,
            ..put_mutation(format!("x{i:05}"), b"v")
        })
        .collect();
    let leader = route.leader_node_id as usize - 1;
    let mut k = kv(&addrs[leader]).await;
    let r = k
        .batch_write(proto::BatchWriteRequest {
            header: header(&route),
            mutations: many,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none(), "{:?}", r.error);
    c.put(b"xz", b"live").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let page = k
        .scan(proto::ScanRequest {
            header: header(&route),
            start: b"x".to_vec().into(),
            end: b"y".to_vec().into(),
            limit: 10,
            keys_only: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(page.error.is_none(), "{:?}", page.error);
    assert!(
        page.pairs.is_empty() && page.more && page.next_key.as_ref() > &b"x"[..],
        "{} pairs, more {}, next {:?}",
        page.pairs.len(),
        page.more,
        page.next_key
    );
    let all = c.scan(b"x", b"y", 0).await.unwrap();
    assert_eq!(all, vec![(b"xz".to_vec(), b"live".to_vec())]);
    c.delete(b"xz").await.unwrap();
    // The sweep removes what is left of expired keys on every replica.
    c.put_with(b"swept", b"v", Expiry::After(Duration::from_millis(200)))
        .await
        .unwrap();
    // (Each sweep walks 4,096 records from where the last stopped: three passes cover the
    // 10,000 expired keys above and this one.)
    tokio::time::sleep(Duration::from_secs(6)).await;
    for n in nodes {
        n.stop().await;
    }
    for i in 0..3 {
        let fs: phoenix_storage::SharedFs = std::sync::Arc::new(phoenix_storage::LocalFs::new());
        let db_dir = dir.path().join(format!("node-{}", i + 1)).join("db");
        let opts = phoenix_engine::Options {
            wal: phoenix_engine::WalMode::None,
            ..Default::default()
        };
        let db = phoenix_engine::Db::open(fs, &db_dir, opts).unwrap();
        let ro = phoenix_engine::ReadOptions::default();
        let g = route.group_id;
        for (k, data, expiry) in [
            (&b"swept"[..], false, false),
            (b"long", true, true),
            (b"kept", true, false),
        ] {
            assert_eq!(
                db.get(&ro, &phoenix_server::keys::data_key(g, k))
                    .unwrap()
                    .is_some(),
                data,
                "node {}: the data of {}",
                i + 1,
                String::from_utf8_lossy(k)
            );
            assert_eq!(
                db.get(&ro, &phoenix_server::keys::expiry_key(g, k))
                    .unwrap()
                    .is_some(),
                expiry,
                "node {}: the expiry of {}",
                i + 1,
                String::from_utf8_lossy(k)
            );
        }
        db.close().unwrap();
    }
}
