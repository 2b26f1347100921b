//! Shared setup of the in-process server tests: nodes started on loopback inside the
//! test's runtime, and put/get helpers that follow the leader.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use phoenix_proto as proto;
use phoenix_server::{Config, MetaMember};
use tokio::sync::oneshot;

pub mod certs;
pub mod workload;

#[path = "../../../engine/tests/support/port.rs"]
mod port;
pub use port::free_port;

/// Addresses for `n` nodes on loopback (free ports) and the meta members naming them
/// (ids 1..=n).
pub fn loopback_members(n: usize) -> (Vec<String>, Vec<MetaMember>) {
    let addrs: Vec<String> = (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let meta = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| MetaMember {
            id: i as u64 + 1,
            addr: a.clone(),
        })
        .collect();
    (addrs, meta)
}

pub struct Node {
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<phoenix_server::Result<()>>,
}

impl Node {
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.handle.await.unwrap().unwrap();
    }
}

pub fn start(cfg: Config) -> Node {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(phoenix_server::run(cfg, async move {
        let _ = rx.await;
    }));
    Node {
        stop: Some(tx),
        handle,
    }
}

pub fn config(id: u64, addr: &str, dir: &Path, meta: &[MetaMember], replication: usize) -> Config {
    let mut c = Config::new(id, addr, dir.join(format!("node-{id}")), meta.to_vec());
    c.replication = replication;
    c.tick = Duration::from_millis(10);
    c.election_ticks = 20;
    c.heartbeat_interval = Duration::from_millis(200);
    // The host's free space must not decide a test (the full-disk test sets its own).
    c.reserve_space = 0;
    // Leaderships stay where elections put them unless a test moves them (the
    // balancer's test turns it on).
    c.balance_leaders = false;
    // Replicas stay where they are put (added replicas are not trimmed) unless a test
    // turns the replica balancer on.
    c.balance_replicas = false;
    // Nor are replicas replaced when a node is stopped (the repair test turns it on).
    c.down_after = Duration::ZERO;
    c.scrub_interval = Duration::ZERO;
    // Nor are groups split by size (the split test turns it on).
    c.group_split_bytes = 0;
    c.group_split_keys = 0;
    c.group_split_qps = 0;
    // Nor merged (the merge test asks for its merges).
    c.group_merge_bytes = 0;
    c
}

pub async fn kv(addr: &str) -> proto::kv_client::KvClient<tonic::transport::Channel> {
    proto::kv_client::KvClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Waits until some node reports a route and returns (route, leader addr).
pub async fn wait_route(addrs: &[String]) -> proto::Route {
    let routes = wait_routes(addrs, "a route with a leader", |rs| {
        rs.first().is_some_and(|r| r.leader_node_id != 0)
    })
    .await;
    routes[0].clone()
}

/// At least `want` routes, every one with a leader.
pub async fn routes_with_leaders_at_least(addrs: &[String], want: usize) -> Vec<proto::Route> {
    wait_routes(addrs, &format!("{want} groups with leaders"), |rs| {
        rs.len() >= want && rs.iter().all(|r| r.leader_node_id != 0)
    })
    .await
}

/// The routing table as the first node that answers gives it, once `ok` says so; within
/// 30 s, else the test fails naming `what`.
pub async fn wait_routes(
    addrs: &[String],
    what: &str,
    ok: impl Fn(&[proto::Route]) -> bool,
) -> Vec<proto::Route> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "{what} not seen within 30 s");
        for a in addrs {
            let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{a}")).await
            else {
                continue;
            };
            if let Ok(r) = m
                .get_routes(proto::GetRoutesRequest { timeout_ms: 1000 })
                .await
            {
                let routes = r.into_inner().routes;
                if ok(&routes) {
                    return routes;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A batch write's put of `key` to `value` (no expiry).
pub fn put_mutation(key: impl Into<Vec<u8>>, value: &[u8]) -> proto::Mutation {
    proto::Mutation {
        op: proto::MutationOp::Put as i32,
        key: key.into().into(),
        value: value.to_vec().into(),
        ..proto::Mutation::default()
    }
}

pub fn header(route: &proto::Route) -> Option<proto::RequestHeader> {
    Some(proto::RequestHeader {
        group_id: route.group_id,
        epoch: route.epoch,
        timeout_ms: 5000,
        ..Default::default()
    })
}

/// Puts through whichever replica is the leader now (retrying on NotLeader).
pub async fn put(addrs: &[String], route: &proto::Route, key: &[u8], value: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "put of {key:?} did not succeed; last answer: {last}"
        );
        for a in addrs {
            let Ok(mut c) = proto::kv_client::KvClient::connect(format!("http://{a}")).await else {
                last = format!("{a}: cannot connect");
                continue;
            };
            let r = c
                .put(proto::PutRequest {
                    keep_ttl: false,
                    ttl_ms: 0,
                    header: header(route),
                    key: key.to_vec().into(),
                    value: value.to_vec().into(),
                })
                .await;
            match r {
                Err(s) => last = format!("{a}: {s}"),
                Ok(r) => match r.into_inner().error {
                    None => return,
                    Some(e) => last = format!("{a}: {e}"),
                },
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn get(addrs: &[String], route: &proto::Route, key: &[u8]) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "get of {key:?} did not succeed");
        for a in addrs {
            let Ok(mut c) = proto::kv_client::KvClient::connect(format!("http://{a}")).await else {
                continue;
            };
            let Ok(r) = c
                .get(proto::GetRequest {
                    header: header(route),
                    key: key.to_vec().into(),
                })
                .await
            else {
                continue;
            };
            let r = r.into_inner();
            if r.error.is_none() {
                return r.found.then(|| r.value.to_vec());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cluster as the meta leader sees it, from the first of `addrs` that answers.
pub async fn cluster(addrs: &[String]) -> Option<proto::GetClusterResponse> {
    for a in addrs {
        let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{a}")).await else {
            continue;
        };
        let Ok(c) = m
            .get_cluster(proto::GetClusterRequest { timeout_ms: 2000 })
            .await
        else {
            continue;
        };
        let c = c.into_inner();
        if c.error.is_none() {
            return Some(c);
        }
    }
    None
}

/// The groups with their replicas' stats as the meta service last heard of them, from
/// the first of `addrs` that answers (empty if none does).
pub async fn cluster_groups(addrs: &[String]) -> Vec<proto::GroupInfo> {
    cluster(addrs).await.map(|c| c.groups).unwrap_or_default()
}

/// What a stopped node (data directory `node_dir`) still holds of group `g`: the
/// number of its engine keys (data and system keys), and whether its log stream exists.
pub fn group_left_on_disk(node_dir: &Path, g: u64) -> (usize, bool) {
    use std::sync::Arc;
    let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    let opts = phoenix_engine::Options {
        wal: phoenix_engine::WalMode::None,
        ..Default::default()
    };
    // The stopped node's last tasks may hold the files a moment longer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let db = loop {
        match phoenix_engine::Db::open(Arc::clone(&fs), &node_dir.join("db"), opts.clone()) {
            Ok(db) => break db,
            Err(e) if Instant::now() < deadline => {
                eprintln!("opening {}: {e}; retrying", node_dir.display());
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("opening {}: {e}", node_dir.display()),
        }
    };
    let mut it = db.iter(&phoenix_engine::ReadOptions::default()).unwrap();
    let prefix = g.to_be_bytes();
    it.seek(&prefix);
    let mut keys = 0;
    while it.valid() && it.key().starts_with(&prefix) {
        keys += 1;
        it.next();
    }
    it.status().unwrap();
    drop(it);
    db.close().unwrap();
    let log = phoenix_log::LogStore::open(
        Arc::clone(&fs),
        &node_dir.join("log"),
        phoenix_log::LogOptions::default(),
    )
    .unwrap();
    let stream = log.streams().contains(&g);
    log.close().unwrap();
    (keys, stream)
}

/// Asks `addr`'s meta service to remove the replica of `group` on `node` (waiting up
/// to 30 s for it).
pub async fn remove_replica(addr: &str, group: u64, node: u64) -> proto::RemoveReplicaResponse {
    proto::meta_client::MetaClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .remove_replica(proto::RemoveReplicaRequest {
            group_id: group,
            node_id: node,
            timeout_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Waits until node `node`'s registry holds a tombstone of group `g` whose drop is done.
pub async fn wait_dropped(node_dir: &std::path::Path, g: u64) -> proto::ReplicaTombstone {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tombs = phoenix_server::registry::load_tombstones(node_dir).unwrap();
        if let Some(t) = tombs.iter().find(|t| t.group_id == g && !t.dropping) {
            return *t;
        }
        assert!(
            Instant::now() < deadline,
            "{}: group {g} not dropped: {tombs:?}",
            node_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Node `i`'s engine (in `dir/node-<i+1>/db`) opened directly; the node is stopped (its
/// last tasks may hold the engine a moment longer: retried for 10 s).
pub fn open_stopped_engine(dir: &Path, i: usize) -> std::sync::Arc<phoenix_engine::Db> {
    open_stopped_engine_on(dir, i, None)
}

/// [`open_stopped_engine`] of a node whose tables are on `sst_store` (its
/// `--sst-store` URL) if given.
pub fn open_stopped_engine_on(
    dir: &Path,
    i: usize,
    sst_store: Option<&str>,
) -> std::sync::Arc<phoenix_engine::Db> {
    let fs: phoenix_storage::SharedFs = std::sync::Arc::new(phoenix_storage::LocalFs::new());
    let db_dir = dir.join(format!("node-{}", i + 1)).join("db");
    let opts = phoenix_engine::Options {
        wal: phoenix_engine::WalMode::None,
        ..Default::default()
    };
    // The stopped node's last tasks may hold the engine a moment longer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let db = loop {
        let opened = match sst_store {
            None => phoenix_engine::Db::open(std::sync::Arc::clone(&fs), &db_dir, opts.clone()),
            Some(url) => phoenix_engine::ObjectTableStore::from_url(url).and_then(|store| {
                phoenix_engine::Db::open_with_store(
                    std::sync::Arc::clone(&fs),
                    &db_dir,
                    std::sync::Arc::new(store),
                    opts.clone(),
                )
            }),
        };
        match opened {
            Ok(db) => break db,
            Err(e) if Instant::now() < deadline => {
                eprintln!("opening {}: {e}; retrying", db_dir.display());
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("opening {}: {e}", db_dir.display()),
        }
    };
    db
}

/// One HTTP/1.1 GET on loopback: (status code, body).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// The value of the sample `name{labels}` (labels as written, e.g.
/// `method="put",result="ok"`; empty for none) in a metrics text.
pub fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' ')?.trim().parse().ok())
}
