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

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Cluster {
    dir: tempfile::TempDir,
    addrs: Vec<String>,
    meta: Vec<MetaMember>,
    nodes: Vec<Option<Node>>,
}

impl Cluster {
    fn cfg(&self, i: usize) -> phoenix_server::Config {
        let mut c = config(i as u64 + 1, &self.addrs[i], self.dir.path(), &self.meta, 3);
        // Small memtables and frequent truncation: a stopped follower falls behind the
        // leader's log and needs a snapshot.
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 10;
        c.log_truncate_interval = Duration::from_millis(100);
        c
    }

    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addrs: Vec<String> = (0..3)
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
        let mut c = Cluster {
            dir,
            addrs,
            meta,
            nodes: Vec::new(),
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

    async fn stop_all(&mut self) {
        for i in 0..3 {
            self.stop(i).await;
        }
    }
}

/// Every key of `want` is in node `i`'s engine with its value (the cluster is stopped).
fn check_engine(dir: &Path, i: usize, group: u64, want: &[(Vec<u8>, Vec<u8>)]) {
    let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    let db_dir = dir.join(format!("node-{}", i + 1)).join("db");
    let opts = phoenix_engine::Options {
        wal: phoenix_engine::WalMode::None,
        ..Default::default()
    };
    // The stopped node's last tasks may hold the engine a moment longer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let db = loop {
        match phoenix_engine::Db::open(Arc::clone(&fs), &db_dir, opts.clone()) {
            Ok(db) => break db,
            Err(e) if Instant::now() < deadline => {
                eprintln!("opening {}: {e}; retrying", db_dir.display());
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("opening {}: {e}", db_dir.display()),
        }
    };
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
        let k = format!("k{i:05}").into_bytes();
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
    // Reports reach the meta service every 200 ms: wait for one made after the writes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The writes are applied on a quorum, which holds a replica other than the follower.
    let mut applied = 0;
    for n in (1..=3).filter(|&n| n != follower as u64 + 1) {
        if let Some(r) = c.replica(route.group_id, n).await {
            applied = applied.max(r.applied_index);
        }
    }
    c.wait_applied(route.group_id, follower as u64 + 1, applied)
        .await;
    let dir = c.dir.path().to_path_buf();
    c.stop_all().await;
    check_engine(&dir, follower, route.group_id, &want);
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

/// The failure between the log reset's two steps (suffix dropped, prefix not yet): the
/// log on disk then ends below the engine's applied index, which `reconcile_log` must
/// accept at the next open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_install_survives_a_failure_inside_the_log_reset() {
    install_failures(&[names::INSTALL_AFTER_SUFFIX]).await;
}

async fn install_failures(steps: &[&str]) {
    let _turn = TURN.lock().await;
    let scenario = fail::FailScenario::setup();
    for &step in steps {
        let mut c = Cluster::start();
        let route = wait_route(&c.addrs).await;
        let follower = (route.leader_node_id as usize) % 3;
        let fnode = follower as u64 + 1;
        let mut want = Vec::new();
        put_all(&c, &route, 0, 20, &mut want).await;
        c.stop(follower).await;
        put_all(&c, &route, 20, 400, &mut want).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        fail::cfg(step, &format!("return({fnode})")).unwrap();
        c.restart(follower);
        c.wait_stopped(route.group_id, fnode, step).await;
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
    let first = c
        .replica(route.group_id, fnode)
        .await
        .unwrap()
        .log_first_index;
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
