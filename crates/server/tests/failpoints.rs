//! Failures at the steps of a replica's life, in a 3-node cluster in one process: the
//! failing replica stops visibly (its `stopped` cause in `GetCluster`), the group goes on
//! with the others, and after its node restarts the replica holds every acknowledged
//! write — whatever step the failure (or a crash right there) hit.
//!
//! Failpoints are process-wide, so the tests take turns (`TURN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use phoenix_proto as proto;
use phoenix_server::failpoint::names;
use phoenix_server::{keys, MetaMember};

// (Only the server and URLs are used here.)
#[allow(dead_code)]
#[path = "../../engine/tests/support/minio.rs"]
mod minio_server;

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Cluster {
    dir: tempfile::TempDir,
    addrs: Vec<String>,
    meta: Vec<MetaMember>,
    nodes: Vec<Option<Node>>,
    /// Split keys of the bootstrap (none: one data group).
    splits: Vec<Vec<u8>>,
    /// How replaced and dropped data leaves the engine.
    drop_mode: phoenix_server::DropMode,
    /// Each node's `--sst-store` (empty: tables on local disk) and metrics address.
    sst_stores: Vec<String>,
    metrics: Vec<String>,
}

impl Cluster {
    fn cfg(&self, i: usize) -> phoenix_server::Config {
        let mut c = config(i as u64 + 1, &self.addrs[i], self.dir.path(), &self.meta, 3);
        // Small memtables and frequent truncation: a stopped follower falls behind the
        // leader's log and needs a snapshot.
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 10;
        c.log_truncate_interval = Duration::from_millis(100);
        c.split_keys = self.splits.clone();
        c.drop_mode = self.drop_mode;
        if let Some(url) = self.sst_stores.get(i) {
            c.sst_store = Some(url.clone());
            c.metrics_listen = Some(self.metrics[i].clone());
        }
        c
    }

    fn start() -> Cluster {
        Cluster::start_with(Vec::new(), phoenix_server::DropMode::Files)
    }

    /// A cluster bootstrapped with one data group per range between `splits`.
    fn start_split(splits: Vec<Vec<u8>>) -> Cluster {
        Cluster::start_with(splits, phoenix_server::DropMode::Files)
    }

    fn start_with(splits: Vec<Vec<u8>>, drop_mode: phoenix_server::DropMode) -> Cluster {
        Cluster::start_on(splits, drop_mode, None)
    }

    /// A cluster whose nodes keep their tables on `minio` (each under its own prefix)
    /// if given.
    fn start_on(
        splits: Vec<Vec<u8>>,
        drop_mode: phoenix_server::DropMode,
        minio: Option<&minio_server::Minio>,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let (addrs, meta) = loopback_members(3);
        let run: u32 = rand::random();
        let (sst_stores, metrics) = match minio {
            None => (Vec::new(), Vec::new()),
            Some(m) => (
                (0..3)
                    .map(|i| m.url(&format!("failpoints-{run:08x}/node-{}", i + 1)))
                    .collect(),
                (0..3)
                    .map(|_| format!("127.0.0.1:{}", free_port()))
                    .collect(),
            ),
        };
        let mut c = Cluster {
            dir,
            addrs,
            meta,
            nodes: Vec::new(),
            splits,
            drop_mode,
            sst_stores,
            metrics,
        };
        c.nodes = (0..3).map(|i| Some(start(c.cfg(i)))).collect();
        c
    }

    fn live(&self) -> Vec<String> {
        (0..3)
            .filter(|&i| self.nodes[i].is_some())
            .map(|i| self.addrs[i].clone())
            .collect()
    }

    async fn stop(&mut self, i: usize) {
        if let Some(n) = self.nodes[i].take() {
            n.stop().await;
        }
    }

    fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none());
        self.nodes[i] = Some(start(self.cfg(i)));
    }

    /// The stats node `node` (1-based) reports for `group`, as some live node's meta
    /// service sees them.
    async fn replica(&self, group: u64, node: u64) -> Option<proto::ReplicaStats> {
        self.replicas(group)
            .await
            .into_iter()
            .find(|r| r.node_id == node)
    }

    /// The stats of `node`'s replica of `group` once the meta service has its report
    /// (reports go every 200 ms: right after the group elects, there may be none yet).
    async fn reported(&self, group: u64, node: u64) -> proto::ReplicaStats {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self.replica(group, node).await {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no report of group {group}'s replica on node {node}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The stats of every replica of `group`, as some live node's meta service sees them.
    async fn replicas(&self, group: u64) -> Vec<proto::ReplicaStats> {
        cluster_groups(&self.live())
            .await
            .into_iter()
            .filter(|g| g.route.as_ref().is_some_and(|r| r.group_id == group))
            .flat_map(|g| g.replicas)
            .collect()
    }

    async fn wait_stopped(&self, group: u64, node: u64, cause: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                Instant::now() < deadline,
                "replica of group {group} on node {node} did not report stopping at {cause}"
            );
            if let Some(r) = self.replica(group, node).await {
                if r.stopped.contains(cause) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_applied(&self, group: u64, node: u64, at_least: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = None;
        loop {
            assert!(
                Instant::now() < deadline,
                "replica of group {group} on node {node} did not apply {at_least}; \
                 its last report: {seen:?}"
            );
            // (A report from before the restart may still say "stopped".)
            if let Some(r) = self.replica(group, node).await {
                if r.stopped.is_empty() && r.applied_index >= at_least {
                    return;
                }
                seen = Some(r);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `count` data groups' routes once each has a leader, by group id.
    async fn routes(&self, count: usize) -> Vec<proto::Route> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut routes = Vec::new();
            for a in self.live() {
                let Ok(mut m) =
                    proto::meta_client::MetaClient::connect(format!("http://{a}")).await
                else {
                    continue;
                };
                if let Ok(r) = m
                    .get_routes(proto::GetRoutesRequest { timeout_ms: 1000 })
                    .await
                {
                    routes = r.into_inner().routes;
                    break;
                }
            }
            routes.sort_by_key(|r| r.group_id);
            if routes.len() == count && routes.iter().all(|r| r.leader_node_id != 0) {
                return routes;
            }
            assert!(
                Instant::now() < deadline,
                "not every one of {count} groups has a leader: {routes:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until node `node` reports group `group` applied as far as the group's
    /// other replicas (every acknowledged write is applied on them).
    async fn wait_caught_up(&self, group: u64, node: u64) {
        // Reports reach the meta service every 200 ms: wait for one made after the writes.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let mut applied = 0;
        for r in self.replicas(group).await {
            if r.node_id != node {
                applied = applied.max(r.applied_index);
            }
        }
        self.wait_applied(group, node, applied).await;
    }

    async fn stop_all(&mut self) {
        for i in 0..3 {
            self.stop(i).await;
        }
    }
}

/// Every key of `want` is in node `i`'s engine with its value (the cluster is stopped).
fn check_engine(dir: &Path, i: usize, group: u64, want: &[(Vec<u8>, Vec<u8>)]) {
    check_engine_on(dir, i, None, group, want)
}

/// [`check_engine`] of a node whose tables are on `sst_store` if given.
fn check_engine_on(
    dir: &Path,
    i: usize,
    sst_store: Option<&str>,
    group: u64,
    want: &[(Vec<u8>, Vec<u8>)],
) {
    let db = open_stopped_engine_on(dir, i, sst_store);
    let ro = phoenix_engine::ReadOptions::default();
    for (k, v) in want {
        let got = db.get(&ro, &keys::data_key(group, k)).unwrap();
        assert_eq!(
            got.as_deref(),
            Some(v.as_slice()),
            "node {} lost acknowledged key {}",
            i + 1,
            String::from_utf8_lossy(k)
        );
    }
    db.close().unwrap();
}

async fn put_all(
    c: &Cluster,
    route: &proto::Route,
    from: u32,
    to: u32,
    want: &mut Vec<(Vec<u8>, Vec<u8>)>,
) {
    let value = vec![7u8; 1024];
    for i in from..to {
        // Inside the group's range: its start key, then the number.
        let mut k = route.start_key.to_vec();
        k.extend_from_slice(format!("k{i:05}").as_bytes());
        put(&c.live(), route, &k, &value).await;
        want.push((k, value.clone()));
    }
}

/// The end of every scenario: the failpoint `step` is turned off, the failed node
/// restarts, the group takes a few more writes, the replica catches up with the leader,
/// and once the cluster is stopped its engine holds every acknowledged write.
async fn restart_and_check(
    mut c: Cluster,
    route: &proto::Route,
    follower: usize,
    step: &str,
    more_from: u32,
    mut want: Vec<(Vec<u8>, Vec<u8>)>,
) {
    fail::remove(step);
    c.stop(follower).await;
    c.restart(follower);
    put_all(&c, route, more_from, more_from + 10, &mut want).await;
    c.wait_caught_up(route.group_id, follower as u64 + 1).await;
    let dir = c.dir.path().to_path_buf();
    let store = c.sst_stores.get(follower).cloned();
    c.stop_all().await;
    check_engine_on(&dir, follower, store.as_deref(), route.group_id, &want);
}

/// An error in one replica's apply stops that replica only: the group keeps taking
/// writes on the other two; once the node restarts, its replica replays and holds
/// every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_failure_stops_the_replica_and_a_restart_recovers_it() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    let follower = (route.leader_node_id as usize) % 3;
    let fnode = follower as u64 + 1;
    let mut want = Vec::new();
    put_all(&c, &route, 0, 20, &mut want).await;
    fail::cfg(names::APPLY_BEFORE_WRITE, &format!("return({fnode})")).unwrap();
    put_all(&c, &route, 20, 40, &mut want).await;
    c.wait_stopped(route.group_id, fnode, names::APPLY_BEFORE_WRITE)
        .await;
    // The group goes on without it.
    put_all(&c, &route, 40, 100, &mut want).await;
    restart_and_check(c, &route, follower, names::APPLY_BEFORE_WRITE, 100, want).await;
    scenario.teardown();
}

/// A follower far behind gets a snapshot; its install fails (as a crash would stop it)
/// before the engine switch, between the switch and the log reset, and in the middle of
/// the log reset. Each time the replica stops visibly; after a restart it is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_install_survives_a_failure_at_every_step() {
    install_failures(&[names::INSTALL_BEFORE_REPLACE, names::INSTALL_AFTER_REPLACE]).await;
}

/// The same with the old state hidden by a range tombstone instead of deleted
/// (`--drop-mode range-delete`, the repair benchmark's baseline).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_installed_over_a_range_tombstone_survives_a_failure_at_every_step() {
    install_failures_with(
        &[names::INSTALL_BEFORE_REPLACE, names::INSTALL_AFTER_REPLACE],
        phoenix_server::DropMode::RangeDelete,
    )
    .await;
}

/// The failure between the log reset's two steps (suffix dropped, prefix not yet): the
/// log on disk then ends below the engine's applied index, which `reconcile_log` must
/// accept at the next open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_install_survives_a_failure_inside_the_log_reset() {
    install_failures(&[names::INSTALL_AFTER_SUFFIX]).await;
}

/// The same where the tables are on MinIO: the follower is rebuilt by copy (the
/// leader's tables copied on the store, the rest streamed), and the install fails before
/// the engine switch (the copies are deleted), after it, and inside the log reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs minio"]
async fn a_snapshot_installed_by_copy_survives_a_failure_at_every_step_on_minio() {
    let minio = tokio::task::spawn_blocking(minio_server::Minio::start)
        .await
        .unwrap();
    install_failures_on(
        &[
            names::INSTALL_BEFORE_REPLACE,
            names::INSTALL_AFTER_REPLACE,
            names::INSTALL_AFTER_SUFFIX,
        ],
        phoenix_server::DropMode::Files,
        Some(&minio),
    )
    .await;
}

/// A follower whose copy of the leader's tables fails (the store refuses it to that
/// node: another server behind the same name, credentials for its own prefix alone) is
/// rebuilt all the same, by streaming, while the copy keeps failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs minio"]
async fn a_follower_whose_copy_fails_is_rebuilt_by_streaming_on_minio() {
    let minio = tokio::task::spawn_blocking(minio_server::Minio::start)
        .await
        .unwrap();
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let mut c = Cluster::start_on(Vec::new(), phoenix_server::DropMode::Files, Some(&minio));
    let (route, follower, want) = follower_behind(&mut c).await;
    let fnode = follower as u64 + 1;
    fail::cfg(names::SNAPSHOT_COPY_IN, &format!("return({fnode})")).unwrap();
    c.restart(follower);
    c.wait_caught_up(route.group_id, fnode).await;
    assert!(
        snapshot_bytes(&c, "streamed").await > 0.0,
        "no snapshot was streamed"
    );
    fail::remove(names::SNAPSHOT_COPY_IN);
    let dir = c.dir.path().to_path_buf();
    let store = c.sst_stores.get(follower).cloned();
    c.stop_all().await;
    check_engine_on(&dir, follower, store.as_deref(), route.group_id, &want);
    scenario.teardown();
}

/// The data group's route, a follower stopped while the group took 380 more writes
/// (past its leader's log: it needs a snapshot), and every acknowledged write.
async fn follower_behind(c: &mut Cluster) -> (proto::Route, usize, Vec<(Vec<u8>, Vec<u8>)>) {
    let route = wait_route(&c.addrs).await;
    let follower = (route.leader_node_id as usize) % 3;
    let mut want = Vec::new();
    put_all(c, &route, 0, 20, &mut want).await;
    c.stop(follower).await;
    put_all(c, &route, 20, 400, &mut want).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    (route, follower, want)
}

/// Snapshot bytes the cluster's nodes sent `how` ("streamed", "copied").
async fn snapshot_bytes(c: &Cluster, how: &str) -> f64 {
    let mut total = 0.0;
    for m in &c.metrics {
        let (_, text) = http_get(m, "/metrics").await;
        total += sample(
            &text,
            "phoenix_snapshot_bytes_total",
            &format!("how=\"{how}\""),
        )
        .unwrap_or(0.0);
    }
    total
}

async fn install_failures(steps: &[&str]) {
    install_failures_with(steps, phoenix_server::DropMode::Files).await
}

async fn install_failures_with(steps: &[&str], mode: phoenix_server::DropMode) {
    install_failures_on(steps, mode, None).await
}

async fn install_failures_on(
    steps: &[&str],
    mode: phoenix_server::DropMode,
    minio: Option<&minio_server::Minio>,
) {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    for &step in steps {
        let mut c = Cluster::start_on(Vec::new(), mode, minio);
        let (route, follower, want) = follower_behind(&mut c).await;
        let fnode = follower as u64 + 1;
        fail::cfg(step, &format!("return({fnode})")).unwrap();
        c.restart(follower);
        c.wait_stopped(route.group_id, fnode, step).await;
        if minio.is_some() {
            // The snapshot that failed to install came by copy.
            assert!(
                snapshot_bytes(&c, "copied").await > 0.0,
                "{step}: no snapshot went by copy"
            );
        }
        restart_and_check(c, &route, follower, step, 400, want).await;
        eprintln!("{step}: replica whole after restart");
    }
    scenario.teardown();
}

/// A replica that cannot be opened when its node starts is stopped (visibly); the node
/// starts all the same and its other replicas serve; the next start opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_cannot_open_does_not_keep_its_node_down() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let mut c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    let follower = (route.leader_node_id as usize) % 3;
    let fnode = follower as u64 + 1;
    let mut want = Vec::new();
    put_all(&c, &route, 0, 20, &mut want).await;
    c.stop(follower).await;
    fail::cfg(names::OPEN_REPLICA, &format!("return({fnode})")).unwrap();
    c.restart(follower);
    // Its node heartbeats (the meta group is served by the others) and reports the cause.
    c.wait_stopped(route.group_id, fnode, names::OPEN_REPLICA)
        .await;
    put_all(&c, &route, 20, 60, &mut want).await;
    restart_and_check(c, &route, follower, names::OPEN_REPLICA, 60, want).await;
    scenario.teardown();
}

/// A log truncation that fails loses nothing and stops nothing: the replica keeps
/// applying with its longer log, and truncates once the step works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_log_truncation_is_retried_and_loses_nothing() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    let follower = (route.leader_node_id as usize) % 3;
    let fnode = follower as u64 + 1;
    let mut want = Vec::new();
    let first = c.reported(route.group_id, fnode).await.log_first_index;
    fail::cfg(names::TRUNCATE_BEFORE, &format!("return({fnode})")).unwrap();
    // 300 KiB through 64 KiB memtables: flushes move the persisted index, so every
    // replica whose truncation works cuts its log.
    put_all(&c, &route, 0, 300, &mut want).await;
    let leader = route.leader_node_id;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let l = c.replica(route.group_id, leader).await;
        if l.as_ref().is_some_and(|r| r.log_first_index > first + 100) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader's log was never truncated: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several truncation intervals later the follower still holds its whole log, and
    // runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let f = c.replica(route.group_id, fnode).await.unwrap();
    assert_eq!(f.log_first_index, first, "{f:?}");
    assert!(f.stopped.is_empty(), "{f:?}");
    put_all(&c, &route, 300, 320, &mut want).await;
    fail::remove(names::TRUNCATE_BEFORE);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let f = c.replica(route.group_id, fnode).await;
        if f.as_ref().is_some_and(|r| r.log_first_index > first + 100) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower never truncated once the step worked: {f:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    restart_and_check(c, &route, follower, names::TRUNCATE_BEFORE, 320, want).await;
    scenario.teardown();
}

/// Replica creation stopped after the registry names the replica, before it opens (as
/// a crash there would): the node hosts no replica of the group meanwhile (the meta
/// service's placement keeps asking), and its next start opens the replica from the
/// registry; it catches up and holds every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_created_up_to_the_registry_opens_at_the_next_start() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    fail::cfg(names::CREATE_AFTER_REGISTRY, "return(3)").unwrap();
    let c = Cluster::start();
    // Nodes 1 and 2 are a quorum of group 1.
    let route = wait_route(&c.addrs).await;
    let mut want = Vec::new();
    put_all(&c, &route, 0, 50, &mut want).await;
    // Past several heartbeats, node 3 still reports no replica of the group.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(c.replica(route.group_id, 3).await, None);
    restart_and_check(c, &route, 2, names::CREATE_AFTER_REGISTRY, 50, want).await;
    scenario.teardown();
}

/// The same, for a batch: node 3's first creation (every group of a 4-group bootstrap)
/// stops after the registry names them all, before any opens. The node hosts none of
/// them meanwhile; its next start opens every one, and each catches up and holds every
/// acknowledged write of its group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_replicas_created_up_to_the_registry_opens_at_the_next_start() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    fail::cfg(names::CREATE_AFTER_REGISTRY, "return(3)").unwrap();
    // Keys are the group's start key, then `k…` (below the first split).
    let splits = vec![b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec()];
    let mut c = Cluster::start_split(splits);
    let routes = c.routes(4).await;
    let mut want: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![Vec::new(); routes.len()];
    for (r, w) in routes.iter().zip(&mut want) {
        put_all(&c, r, 0, 20, w).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let node3 = c.dir.path().join("node-3");
    let registry = phoenix_server::registry::load(&node3).unwrap();
    for r in &routes {
        let g = r.group_id;
        assert_eq!(c.replica(g, 3).await, None, "group {g} opened on node 3");
        assert!(
            registry.iter().any(|x| x.group_id == g),
            "node 3's registry does not name group {g}: {registry:?}"
        );
    }
    fail::remove(names::CREATE_AFTER_REGISTRY);
    c.stop(2).await;
    c.restart(2);
    for (r, w) in routes.iter().zip(&mut want) {
        put_all(&c, r, 20, 30, w).await;
    }
    for r in &routes {
        c.wait_caught_up(r.group_id, 3).await;
    }
    let dir = c.dir.path().to_path_buf();
    c.stop_all().await;
    for (r, w) in routes.iter().zip(&want) {
        check_engine(&dir, 2, r.group_id, w);
    }
    scenario.teardown();
}

/// A replica whose creation fails to open it is reported stopped with the cause, and is
/// created again when the meta service asks again — no restart — then catches up and
/// holds every acknowledged write. (It used to be stopped until the node restarted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_fails_to_open_at_creation_is_created_when_asked_again() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    // Group 1 is the one data group of an unsplit bootstrap.
    fail::cfg(names::OPEN_REPLICA, "return(3/1)").unwrap();
    let mut c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    assert_eq!(route.group_id, 1, "the failpoint names group 1");
    let mut want = Vec::new();
    put_all(&c, &route, 0, 20, &mut want).await;
    c.wait_stopped(1, 3, names::OPEN_REPLICA).await;
    fail::remove(names::OPEN_REPLICA);
    put_all(&c, &route, 20, 40, &mut want).await;
    c.wait_caught_up(1, 3).await;
    let dir = c.dir.path().to_path_buf();
    c.stop_all().await;
    check_engine(&dir, 2, 1, &want);
    scenario.teardown();
}

/// A replica of the registry that fails to open at its node's start stays in the
/// registry when a later creation rewrites it (it was dropped, so forgotten at the next
/// start), and opens whole at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_cannot_open_stays_in_the_registry_through_a_later_creation() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let mut c = Cluster::start_split(vec![b"m".to_vec()]);
    let routes = c.routes(2).await;
    let (a, b) = (&routes[0], &routes[1]);
    let mut want = Vec::new();
    put_all(&c, a, 0, 20, &mut want).await;
    put_all(&c, b, 0, 20, &mut Vec::new()).await;
    c.stop(2).await;
    // Node 3 as a crash before group b's creation reached its registry leaves it.
    let node3 = c.dir.path().join("node-3");
    let registry: Vec<proto::Route> = phoenix_server::registry::load(&node3)
        .unwrap()
        .into_iter()
        .filter(|r| r.group_id != b.group_id)
        .collect();
    assert!(registry.iter().any(|r| r.group_id == a.group_id));
    phoenix_server::registry::save(&node3, &registry).unwrap();
    fail::cfg(names::OPEN_REPLICA, &format!("return(3/{})", a.group_id)).unwrap();
    c.restart(2);
    c.wait_stopped(a.group_id, 3, names::OPEN_REPLICA).await;
    // The meta service asks node 3 for group b: its creation rewrites the registry.
    c.wait_caught_up(b.group_id, 3).await;
    let registry = phoenix_server::registry::load(&node3).unwrap();
    assert!(
        registry.iter().any(|r| r.group_id == a.group_id),
        "creating group {} dropped group {} (unopened) from the registry: {registry:?}",
        b.group_id,
        a.group_id
    );
    let a = a.clone();
    restart_and_check(c, &a, 2, names::OPEN_REPLICA, 20, want).await;
    scenario.teardown();
}

/// A leader whose replica stops hands the group to a follower at once, even one asleep:
/// the group hibernates, the leader takes one write and fails before anything of it
/// leaves, and no request reaches the followers afterwards — only the hand-off can wake
/// them. (Before it, the group had no leader until a client happened to ask a follower.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_leader_hands_its_sleeping_group_over() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    let g = route.group_id;
    let mut want = Vec::new();
    put_all(&c, &route, 0, 20, &mut want).await;
    // The group leads from the node that took the writes: find it, wait until asleep.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let reps = c.replicas(g).await;
        let asleep = reps.len() == 3 && reps.iter().all(|r| r.hibernating);
        if let (true, Some(l)) = (asleep, reps.iter().find(|r| r.is_leader)) {
            break l.clone();
        }
        assert!(Instant::now() < deadline, "group {g} never slept: {reps:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lnode = leader.node_id;
    fail::cfg(names::READY_BEFORE_SEND, &format!("return({lnode}/{g})")).unwrap();
    // One write, to the leader alone.
    let mut k = kv(&c.addrs[lnode as usize - 1]).await;
    let r = k
        .put(proto::PutRequest {
            keep_ttl: false,
            ttl_ms: 0,
            header: header(&route),
            key: b"lost-leader".to_vec().into(),
            value: b"v".to_vec().into(),
        })
        .await;
    let answered = r.map(|r| r.into_inner().error);
    assert!(
        !matches!(answered, Ok(None)),
        "the stopped leader acknowledged a write: {answered:?}"
    );
    c.wait_stopped(g, lnode, names::READY_BEFORE_SEND).await;
    // Nothing asks the followers: one of them must lead on its own, in a new term.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reps = c.replicas(g).await;
        if let Some(l) = reps
            .iter()
            .find(|r| r.is_leader && r.node_id != lnode && r.stopped.is_empty())
        {
            assert!(l.term > leader.term, "{l:?} after {leader:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no follower took over the group of the stopped leader: {reps:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let follower = lnode as usize - 1;
    restart_and_check(c, &route, follower, names::READY_BEFORE_SEND, 20, want).await;
    scenario.teardown();
}

/// Node 3's replica of the first of two groups is removed while the drop of its data
/// fails at `step`; returns the cluster, the dropped group's id and the kept group's
/// route with the writes it acknowledged. Node 3's registry already holds the replica's
/// tombstone, still marked dropping, and the node no longer reports the replica.
async fn removal_failing_at(
    step: &str,
    drop_mode: phoenix_server::DropMode,
) -> (Cluster, u64, proto::Route, Vec<(Vec<u8>, Vec<u8>)>) {
    let c = Cluster::start_with(vec![b"m".to_vec()], drop_mode);
    let routes = c.routes(2).await;
    let (gone, kept) = (routes[0].clone(), routes[1].clone());
    let (mut w_gone, mut w_kept) = (Vec::new(), Vec::new());
    // Past a memtable (64 KiB) of the dropped group: some of it is in tables.
    put_all(&c, &gone, 0, 100, &mut w_gone).await;
    put_all(&c, &kept, 0, 30, &mut w_kept).await;
    c.wait_caught_up(gone.group_id, 3).await;
    fail::cfg(step, "return(3)").unwrap();
    let r = remove_replica(&c.addrs[0], gone.group_id, 3).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let node3 = c.dir.path().join("node-3");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !phoenix_server::registry::load_tombstones(&node3)
        .unwrap()
        .iter()
        .any(|t| t.group_id == gone.group_id && t.dropping)
    {
        assert!(
            Instant::now() < deadline,
            "no tombstone of group {}",
            gone.group_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several tries of the drop (one per heartbeat interval), each failing.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let tombs = phoenix_server::registry::load_tombstones(&node3).unwrap();
    assert!(
        tombs
            .iter()
            .any(|t| t.group_id == gone.group_id && t.dropping),
        "the drop went through despite {step}: {tombs:?}"
    );
    assert!(
        !phoenix_server::registry::load(&node3)
            .unwrap()
            .iter()
            .any(|r| r.group_id == gone.group_id),
        "the registry still names the removed replica"
    );
    assert_eq!(c.replica(gone.group_id, 3).await, None);
    (c, gone.group_id, kept, w_kept)
}

/// The end of a drop scenario: nothing of group `gone` is left on node 3, its kept
/// group catches up and holds every acknowledged write, and a restart brings nothing
/// of the dropped group back.
async fn check_dropped(
    mut c: Cluster,
    gone: u64,
    kept: &proto::Route,
    mut want: Vec<(Vec<u8>, Vec<u8>)>,
) {
    let node3 = c.dir.path().join("node-3");
    let tomb = wait_dropped(&node3, gone).await;
    assert!(tomb.term >= 1, "{tomb:?}");
    put_all(&c, kept, 30, 40, &mut want).await;
    c.wait_caught_up(kept.group_id, 3).await;
    c.stop(2).await;
    assert_eq!(group_left_on_disk(&node3, gone), (0, false));
    c.restart(2);
    c.wait_caught_up(kept.group_id, 3).await;
    assert_eq!(
        c.replica(gone, 3).await,
        None,
        "the dropped replica came back"
    );
    let dir = c.dir.path().to_path_buf();
    c.stop_all().await;
    assert_eq!(group_left_on_disk(&node3, gone), (0, false));
    check_engine(&dir, 2, kept.group_id, &want);
}

/// A removed replica's drop cut short at each of its steps (the step fails, then the
/// node stops, as a crash there would leave it): the registry's tombstone keeps the
/// replica from opening again, and the next start finishes the drop: no engine key and
/// no log stream of the group are left, and the node's other group is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drop_cut_short_at_any_step_is_finished_at_the_next_start() {
    drop_cut_short_with(
        &[
            names::DROP_BEFORE_ENGINE,
            names::DROP_BEFORE_LOG,
            names::DROP_BEFORE_DONE,
        ],
        phoenix_server::DropMode::Files,
    )
    .await;
}

/// The same with `--drop-mode range-delete` (a range tombstone, then a flush), cut also
/// between the two: the keys are hidden, not deleted, once the flush made the tombstone
/// durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_range_delete_drop_cut_short_at_any_step_is_finished_at_the_next_start() {
    drop_cut_short_with(
        &[
            names::DROP_BEFORE_ENGINE,
            names::DROP_BEFORE_FLUSH,
            names::DROP_BEFORE_LOG,
            names::DROP_BEFORE_DONE,
        ],
        phoenix_server::DropMode::RangeDelete,
    )
    .await;
}

async fn drop_cut_short_with(steps: &[&str], drop_mode: phoenix_server::DropMode) {
    let _turn = TURN.lock().await;
    for &step in steps {
        eprintln!("--- drop cut short at {step} ({drop_mode:?})");
        let scenario = fail::FailScenario::setup();
        let (mut c, gone, kept, want) = removal_failing_at(step, drop_mode).await;
        let node3 = c.dir.path().join("node-3");
        c.stop(2).await;
        let (keys, stream) = group_left_on_disk(&node3, gone);
        match step {
            // Before the flush the tombstone is in a memtable only (a stop may flush it:
            // the keys are there or hidden, the stream is there).
            names::DROP_BEFORE_FLUSH => assert!(stream, "{keys} keys, {stream}"),
            names::DROP_BEFORE_ENGINE => assert!(keys > 0 && stream, "{keys} keys, {stream}"),
            names::DROP_BEFORE_LOG => assert!(keys == 0 && stream, "{keys} keys, {stream}"),
            _ => assert!(keys == 0 && !stream, "{keys} keys, {stream}"),
        }
        fail::remove(step);
        c.restart(2);
        check_dropped(c, gone, &kept, want).await;
        scenario.teardown();
    }
}

/// A drop that fails is tried again while the node runs, and finishes once the fault
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_drop_is_tried_again_without_a_restart() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let (c, gone, kept, want) =
        removal_failing_at(names::DROP_BEFORE_LOG, phoenix_server::DropMode::Files).await;
    fail::remove(names::DROP_BEFORE_LOG);
    check_dropped(c, gone, &kept, want).await;
    scenario.teardown();
}

/// Splits the data group at `key` through the meta service of some live node; returns
/// the two routes (left, right).
async fn split_at(c: &Cluster, group: u64, key: &[u8]) -> (proto::Route, proto::Route) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "split of group {group} did not finish: {last}"
        );
        for a in c.live() {
            let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{a}")).await
            else {
                continue;
            };
            let r = m
                .split_group(proto::SplitGroupRequest {
                    group_id: group,
                    split_key: key.to_vec().into(),
                    timeout_ms: 10_000,
                })
                .await;
            match r.map(|r| r.into_inner()) {
                Ok(proto::SplitGroupResponse {
                    error: None,
                    left: Some(l),
                    right: Some(r),
                }) => return (l, r),
                Ok(other) => last = format!("{a}: {other:?}"),
                Err(s) => last = format!("{a}: {s}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// No key of `absent` is in group `group` of node `i`'s engine (the cluster is stopped).
fn check_engine_absent(dir: &Path, i: usize, group: u64, absent: &[(Vec<u8>, Vec<u8>)]) {
    let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    let db_dir = dir.join(format!("node-{}", i + 1)).join("db");
    let opts = phoenix_engine::Options {
        wal: phoenix_engine::WalMode::None,
        ..Default::default()
    };
    let db = phoenix_engine::Db::open(fs, &db_dir, opts).unwrap();
    let ro = phoenix_engine::ReadOptions::default();
    for (k, _) in absent {
        assert_eq!(
            db.get(&ro, &keys::data_key(group, k)).unwrap(),
            None,
            "node {} kept key {} in group {group} after the split moved it",
            i + 1,
            String::from_utf8_lossy(k)
        );
    }
    db.close().unwrap();
}

/// A split that fails on one follower at each of its steps — the new group recorded in
/// the registry, the new range epoch published, the round written but the new replica
/// not opened — stops that replica (or leaves the new one unopened) visibly while the
/// others split; after the node restarts, its parent replays the split (or its new
/// replica opens), and both groups hold exactly their keys, every acknowledged write
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_cut_short_at_any_step_is_whole_after_a_restart() {
    let _turn = TURN.lock().await;
    for step in [
        names::SPLIT_AFTER_REGISTRY,
        names::SPLIT_BEFORE_WRITE,
        names::SPLIT_BEFORE_OPEN,
    ] {
        eprintln!("split failing at {step}");
        let scenario = fail::FailScenario::setup();
        let mut c = Cluster::start();
        let route = wait_route(&c.addrs).await;
        let g = route.group_id;
        let follower = (route.leader_node_id as usize) % 3;
        let fnode = follower as u64 + 1;
        let value = vec![5u8; 512];
        let mut left = Vec::new();
        let mut right = Vec::new();
        for i in 0..30u32 {
            let k = format!("k{i:05}").into_bytes();
            put(&c.live(), &route, &k, &value).await;
            if i < 15 {
                left.push((k, value.clone()));
            } else {
                right.push((k, value.clone()));
            }
        }
        fail::cfg(step, &format!("return({fnode})")).unwrap();
        let (l, r) = split_at(&c, g, b"k00015").await;
        assert_eq!((l.group_id, l.end_key.as_ref()), (g, &b"k00015"[..]));
        assert_eq!(r.start_key.as_ref(), b"k00015");
        assert!(r.end_key.is_empty() && l.epoch == r.epoch && l.epoch == route.epoch + 1);
        let child = r.group_id;
        let (stopped_group, cause) = if step == names::SPLIT_BEFORE_OPEN {
            (child, step)
        } else {
            (g, step)
        };
        c.wait_stopped(stopped_group, fnode, cause).await;
        // Both groups go on without it.
        let routes = c.routes(2).await;
        let (lr, rr) = (routes[0].clone(), routes[1].clone());
        assert_eq!((lr.group_id, rr.group_id), (g, child));
        for i in 0..10u32 {
            let k = format!("a{i:05}").into_bytes();
            put(&c.live(), &lr, &k, &value).await;
            left.push((k, value.clone()));
            let k = format!("z{i:05}").into_bytes();
            put(&c.live(), &rr, &k, &value).await;
            right.push((k, value.clone()));
        }
        fail::remove(step);
        c.stop(follower).await;
        c.restart(follower);
        c.wait_caught_up(g, fnode).await;
        c.wait_caught_up(child, fnode).await;
        let dir = c.dir.path().to_path_buf();
        c.stop_all().await;
        check_engine(&dir, follower, g, &left);
        check_engine(&dir, follower, child, &right);
        check_engine_absent(&dir, follower, g, &right);
        check_engine_absent(&dir, follower, child, &left);
        scenario.teardown();
    }
}

/// Asks the meta service to merge `source` into `target`, until it answers the merged
/// route.
async fn merge_at(c: &Cluster, source: u64, target: u64) -> proto::Route {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "merge of group {source} into {target} did not finish: {last}"
        );
        for a in c.live() {
            let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{a}")).await
            else {
                continue;
            };
            let r = m
                .merge_group(proto::MergeGroupRequest {
                    source,
                    target,
                    timeout_ms: 10_000,
                })
                .await;
            match r.map(|r| r.into_inner()) {
                Ok(proto::MergeGroupResponse {
                    error: None,
                    route: Some(r),
                }) => return r,
                Ok(other) => last = format!("{a}: {other:?}"),
                Err(s) => last = format!("{a}: {s}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A merge that fails on one follower at each of its steps — the commit taken into the
/// target's round but not written, the round durable but the source not dropped — stops
/// that replica visibly while the others merge; after the node restarts, its target
/// replays the merge from its log (waiting for its source's prepare) or finds it done
/// and drops the source, and the merged group holds every acknowledged write while the
/// source's keys and log are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_merge_cut_short_at_any_step_is_whole_after_a_restart() {
    let _turn = TURN.lock().await;
    for step in [names::MERGE_BEFORE_WRITE, names::MERGE_BEFORE_DROP] {
        eprintln!("merge failing at {step}");
        let scenario = fail::FailScenario::setup();
        let mut c = Cluster::start_split(vec![b"k00015".to_vec()]);
        let routes = c.routes(2).await;
        let (target, source) = (routes[0].clone(), routes[1].clone());
        assert_eq!(source.start_key.as_ref(), b"k00015");
        // A node leading neither group: both go on without it.
        let follower = (1..=3u64)
            .find(|n| *n != target.leader_node_id && *n != source.leader_node_id)
            .unwrap_or(1);
        let fi = follower as usize - 1;
        let value = vec![7u8; 512];
        let mut all = Vec::new();
        for i in 0..30u32 {
            let k = format!("k{i:05}").into_bytes();
            let route = if i < 15 { &target } else { &source };
            put(&c.live(), route, &k, &value).await;
            all.push((k, value.clone()));
        }
        let failing = if step == names::MERGE_BEFORE_WRITE {
            target.group_id
        } else {
            source.group_id
        };
        fail::cfg(step, &format!("return({follower}/{failing})")).unwrap();
        let merged = merge_at(&c, source.group_id, target.group_id).await;
        assert_eq!(merged.group_id, target.group_id);
        assert!(merged.start_key.is_empty() && merged.end_key.is_empty());
        if step == names::MERGE_BEFORE_WRITE {
            c.wait_stopped(target.group_id, follower, step).await;
        } else {
            // (The source is out of the routing table: its stop is not reported.)
            tokio::time::sleep(Duration::from_millis(800)).await;
        }
        let routes = c.routes(1).await;
        for i in 0..10u32 {
            let k = format!("z{i:05}").into_bytes();
            put(&c.live(), &routes[0], &k, &value).await;
            all.push((k, value.clone()));
        }
        fail::remove(step);
        c.stop(fi).await;
        c.restart(fi);
        c.wait_caught_up(target.group_id, follower).await;
        wait_dropped(
            &c.dir.path().join(format!("node-{follower}")),
            source.group_id,
        )
        .await;
        let dir = c.dir.path().to_path_buf();
        c.stop_all().await;
        check_engine(&dir, fi, target.group_id, &all);
        let left_over = group_left_on_disk(&dir.join(format!("node-{follower}")), source.group_id);
        assert_eq!(
            left_over,
            (0, false),
            "the source's keys and log after {step}"
        );
        scenario.teardown();
    }
}

/// A round cut at a scrub point that fails after its first batch (written with the
/// sentinel of the scrub entry), before the rest: the replica stops while writes go on;
/// after a restart it replays what followed the scrub point, holds every acknowledged
/// write, and a scrub finds every replica alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_round_cut_at_a_scrub_point_that_fails_between_its_batches_recovers() {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    let mut c = Cluster::start();
    let route = wait_route(&c.addrs).await;
    let g = route.group_id;
    let follower = (route.leader_node_id as usize) % 3;
    let fnode = follower as u64 + 1;
    let value = vec![3u8; 256];
    let mut all = Vec::new();
    for i in 0..20u32 {
        let k = format!("k{i:05}").into_bytes();
        put(&c.live(), &route, &k, &value).await;
        all.push((k, value.clone()));
    }
    let step = names::SCRUB_AFTER_FIRST_BATCH;
    fail::cfg(step, &format!("return({fnode}/{g})")).unwrap();
    // Writes keep coming while the scrub point applies, so the round may hold entries
    // after it; the scrub itself cannot finish (a replica stops): its answer is not
    // awaited.
    let scrub = {
        let addrs = c.live();
        tokio::spawn(async move {
            for a in addrs {
                if let Ok(mut m) =
                    proto::meta_client::MetaClient::connect(format!("http://{a}")).await
                {
                    let _ = m
                        .scrub_group(proto::ScrubGroupRequest {
                            group_id: g,
                            timeout_ms: 3_000,
                        })
                        .await;
                    return;
                }
            }
        })
    };
    for i in 20..60u32 {
        let k = format!("k{i:05}").into_bytes();
        put(&c.live(), &route, &k, &value).await;
        all.push((k, value.clone()));
    }
    c.wait_stopped(g, fnode, step).await;
    let _ = scrub.await;
    fail::remove(step);
    for i in 60..70u32 {
        let k = format!("k{i:05}").into_bytes();
        put(&c.live(), &route, &k, &value).await;
        all.push((k, value.clone()));
    }
    c.stop(follower).await;
    c.restart(follower);
    c.wait_caught_up(g, fnode).await;
    // Every replica alike at a new scrub point.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut m = proto::meta_client::MetaClient::connect(format!("http://{}", c.addrs[0]))
            .await
            .unwrap();
        let r = m
            .scrub_group(proto::ScrubGroupRequest {
                group_id: g,
                timeout_ms: 10_000,
            })
            .await
            .map(|r| r.into_inner());
        if let Ok(r) = &r {
            if r.error.is_none() {
                assert!(r.consistent, "replicas differ after the restart: {r:?}");
                assert_eq!(r.replicas.len(), 3, "{r:?}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "no scrub answer: {r:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let dir = c.dir.path().to_path_buf();
    c.stop_all().await;
    check_engine(&dir, follower, g, &all);
    scenario.teardown();
}
