//! Real `phoenix server` processes on loopback, killed with SIGKILL: acknowledged
//! writes survive the loss of any single node and of all nodes; a killed follower
//! catches up (by snapshot when its log was truncated meanwhile); a killed leader is
//! replaced within seconds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use phoenix_proto as proto;

#[path = "../../engine/tests/support/port.rs"]
mod port;
use port::free_port;

struct Cluster {
    addrs: Vec<String>,
    meta: String,
    dir: tempfile::TempDir,
    procs: Vec<Option<Child>>,
    extra: Vec<String>,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::with_args(n, &[])
    }

    /// Starts `n` servers with `extra` arguments each.
    fn with_args(n: usize, extra: &[&str]) -> Cluster {
        Cluster::with_meta(n, n, extra)
    }

    /// `n` nodes, the first `meta` of them meta members.
    fn with_meta(n: usize, meta: usize, extra: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let meta = addrs
            .iter()
            .take(meta)
            .enumerate()
            .map(|(i, a)| format!("{}@{a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            addrs,
            meta,
            dir: tempfile::tempdir().unwrap(),
            procs: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..n {
            c.start(i);
        }
        c
    }

    fn start(&mut self, i: usize) {
        assert!(self.procs[i].is_none());
        let data = self.dir.path().join(format!("node-{}", i + 1));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{}.log", i + 1)))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_phoenix"))
            .args([
                "server",
                "--id",
                &(i + 1).to_string(),
                "--listen",
                &self.addrs[i],
            ])
            .arg("--data-dir")
            .arg(&data)
            .args(["--meta", &self.meta])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs[i] = Some(child);
    }

    fn kill9(&mut self, i: usize) {
        let mut c = self.procs[i].take().unwrap();
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    fn live(&self) -> Vec<String> {
        (0..self.addrs.len())
            .filter(|&i| self.procs[i].is_some())
            .map(|i| self.addrs[i].clone())
            .collect()
    }

    fn log_text(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node-{}.log", i + 1)))
            .unwrap_or_default()
    }

    fn dump_logs(&self) {
        for i in 0..self.addrs.len() {
            let p = self.dir.path().join(format!("node-{}.log", i + 1));
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("---- node {} log tail ----", i + 1);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for c in self.procs.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn route(addrs: &[String], within: Duration) -> proto::Route {
    let deadline = Instant::now() + within;
    loop {
        assert!(Instant::now() < deadline, "no route with a leader in time");
        for a in addrs {
            let Ok(mut m) = proto::meta_client::MetaClient::connect(format!("http://{a}")).await
            else {
                continue;
            };
            if let Ok(r) = m
                .get_routes(proto::GetRoutesRequest { timeout_ms: 1000 })
                .await
            {
                if let Some(r) = r.into_inner().routes.first() {
                    return r.clone();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn header(r: &proto::Route) -> Option<proto::RequestHeader> {
    Some(proto::RequestHeader {
        group_id: r.group_id,
        epoch: r.epoch,
        timeout_ms: 3000,
        ..Default::default()
    })
}

/// Puts via whichever live node leads; returns once acknowledged.
async fn put(addrs: &[String], r: &proto::Route, key: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "put {key} not acknowledged in 30 s"
        );
        for a in addrs {
            let Ok(mut c) = proto::kv_client::KvClient::connect(format!("http://{a}")).await else {
                continue;
            };
            let req = proto::PutRequest {
                keep_ttl: false,
                ttl_ms: 0,
                header: header(r),
                key: key.as_bytes().to_vec().into(),
                value: value.as_bytes().to_vec().into(),
            };
            if let Ok(resp) = c.put(req).await {
                if resp.into_inner().error.is_none() {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(addrs: &[String], r: &proto::Route, key: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "get {key} not answered in 30 s");
        for a in addrs {
            let Ok(mut c) = proto::kv_client::KvClient::connect(format!("http://{a}")).await else {
                continue;
            };
            let req = proto::GetRequest {
                header: header(r),
                key: key.as_bytes().to_vec().into(),
            };
            if let Ok(resp) = c.get(req).await {
                let resp = resp.into_inner();
                if resp.error.is_none() {
                    return resp
                        .found
                        .then(|| String::from_utf8(resp.value.to_vec()).unwrap());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn check_all(addrs: &[String], r: &proto::Route, acked: &[(String, String)]) {
    for (k, v) in acked {
        assert_eq!(
            get(addrs, r, k).await.as_deref(),
            Some(v.as_str()),
            "key {k}"
        );
    }
}

fn leader_index(r: &proto::Route) -> usize {
    assert!(r.leader_node_id > 0);
    r.leader_node_id as usize - 1
}

async fn current_route(addrs: &[String]) -> proto::Route {
    // Wait for a route whose leader is reported.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = route(addrs, Duration::from_secs(30)).await;
        if r.leader_node_id != 0 && addrs.contains(&r.leader_addr) {
            return r;
        }
        assert!(Instant::now() < deadline, "no live leader reported");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let mut c = Cluster::new(3);
    let r = route(&c.addrs, Duration::from_secs(60)).await;
    let mut acked = Vec::new();
    let mut n = 0;
    let write = |n: &mut i32| {
        *n += 1;
        (format!("key{:05}", *n), format!("value-{}", *n))
    };
    for _ in 0..100 {
        let (k, v) = write(&mut n);
        put(&c.addrs, &r, &k, &v).await;
        acked.push((k, v));
    }

    // Kill -9 a follower; writes go on; it restarts and catches up.
    let r = current_route(&c.addrs).await;
    let follower = (leader_index(&r) + 1) % 3;
    c.kill9(follower);
    for _ in 0..50 {
        let (k, v) = write(&mut n);
        put(&c.live(), &r, &k, &v).await;
        acked.push((k, v));
    }
    c.start(follower);

    // Kill -9 the leader; a new one must take writes within seconds.
    let r = current_route(&c.addrs).await;
    let leader = leader_index(&r);
    // Make sure the restarted follower is back in the quorum before the leader dies.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.kill9(leader);
    let t = Instant::now();
    let (k, v) = write(&mut n);
    put(&c.live(), &r, &k, &v).await;
    acked.push((k, v));
    let failover = t.elapsed();
    eprintln!("write accepted {failover:?} after the leader was killed");
    assert!(
        failover < Duration::from_secs(15),
        "failover took {failover:?}"
    );
    for _ in 0..50 {
        let (k, v) = write(&mut n);
        put(&c.live(), &r, &k, &v).await;
        acked.push((k, v));
    }
    c.start(leader);
    check_all(&c.live(), &r, &acked).await;

    // Kill -9 every node at once, restart all: every acknowledged write is readable.
    for i in 0..3 {
        c.kill9(i);
    }
    for i in 0..3 {
        c.start(i);
    }
    let r = route(&c.addrs, Duration::from_secs(60)).await;
    check_all(&c.addrs, &r, &acked).await;
}

/// The applied index of each replica of group `g` as the meta group last heard it.
async fn applied_indexes(addrs: &[String], g: u64) -> Vec<(u64, u64)> {
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
        if let Some(grp) = c
            .groups
            .iter()
            .find(|x| x.route.as_ref().is_some_and(|r| r.group_id == g))
        {
            return grp
                .replicas
                .iter()
                .map(|r| (r.node_id, r.applied_index))
                .collect();
        }
    }
    Vec::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_follower_behind_truncated_log_catches_up_by_snapshot() {
    // Small memtables flush often and logs are cut every 100 ms down to 10 entries past
    // the persisted applied index, so a follower down for a while falls off the log.
    let mut c = Cluster::with_args(
        3,
        &[
            "--memtable-mb",
            "1",
            "--log-keep-entries",
            "10",
            "--log-truncate-ms",
            "100",
        ],
    );
    route(&c.addrs, Duration::from_secs(60)).await;
    let r = current_route(&c.addrs).await;
    let follower = (leader_index(&r) + 1) % 3;
    c.kill9(follower);
    let filler = "x".repeat(16 << 10);
    let mut acked = Vec::new();
    for n in 0..300 {
        let (k, v) = (format!("snap{n:05}"), format!("{n}-{filler}"));
        put(&c.live(), &r, &k, &v).await;
        acked.push((k, v));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.start(follower);
    // It must be sent a snapshot (its log ends below the leader's first entry) and
    // then apply as far as the leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "follower {} did not catch up by snapshot",
            follower + 1
        );
        let snap = c.log_text(follower).contains("snapshot received");
        let applied = applied_indexes(&c.addrs, r.group_id).await;
        let of = |id: usize| {
            applied
                .iter()
                .find(|(n, _)| *n == id as u64 + 1)
                .map(|x| x.1)
        };
        let leader_applied = applied.iter().map(|x| x.1).max();
        if let (true, Some(f), Some(l)) = (snap, of(follower), leader_applied) {
            if f >= 300 && f + 5 >= l {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old leader dies: the caught-up follower is needed for every new write.
    let r = current_route(&c.addrs).await;
    c.kill9(leader_index(&r));
    for n in 300..320 {
        let (k, v) = (format!("snap{n:05}"), format!("{n}-after"));
        put(&c.live(), &r, &k, &v).await;
        acked.push((k, v));
    }
    check_all(&c.live(), &r, &acked).await;
}

/// The voters of group `g` in the routing table (learners left out), sorted.
async fn voters(addrs: &[String], g: u64) -> Vec<u64> {
    let r = route(addrs, Duration::from_secs(30)).await;
    assert_eq!(r.group_id, g);
    let mut v: Vec<u64> = r
        .replicas
        .iter()
        .map(|x| x.node_id)
        .filter(|id| !r.learners.contains(id))
        .collect();
    v.sort_unstable();
    v
}

/// Replicas moved by hand and by repair, with real processes: `phoenix cluster move` (as
/// a script runs it: JSON out, exit 0) moves a replica off one node onto the spare
/// fourth; then a node of the group is killed -9 for good and, past `--down-after`, the
/// meta leader gives the group a replica on the live node it lacks and removes the dead
/// one. Every acknowledged write stays readable throughout. The dead node was a meta
/// member: the meta group, too, gets a member on the fourth node in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_move_on_request_and_away_from_a_dead_node() {
    let mut c = Cluster::with_meta(4, 3, &["--down-after", "5s"]);
    let r = current_route(&c.addrs).await;
    let g = r.group_id;
    let mut acked = Vec::new();
    for i in 0..50 {
        let (k, v) = (format!("key{i:05}"), format!("value-{i}"));
        put(&c.addrs, &r, &k, &v).await;
        acked.push((k, v));
    }
    let on = voters(&c.addrs, g).await;
    let spare = (1..=4u64).find(|n| !on.contains(n)).unwrap();
    let from = on[0];
    let out = Command::new(env!("CARGO_BIN_EXE_phoenix"))
        .args([
            "--output",
            "json",
            "cluster",
            "move",
            "--endpoints",
            &c.addrs[0],
        ])
        .args([g.to_string(), from.to_string(), spare.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster move: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut moved: Vec<u64> = on.iter().copied().filter(|&n| n != from).collect();
    moved.push(spare);
    moved.sort_unstable();
    let mut printed: Vec<u64> = json["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    printed.sort_unstable();
    assert_eq!(printed, moved, "{json}");
    assert_eq!(voters(&c.addrs, g).await, moved);
    check_all(&c.addrs, &r, &acked).await;

    // A node of the group dies for good: `from` (hosting nothing now) takes its place.
    let dead = moved[0];
    c.kill9(dead as usize - 1);
    let t = Instant::now();
    let mut want: Vec<u64> = moved.iter().copied().filter(|&n| n != dead).collect();
    want.push(from);
    want.sort_unstable();
    loop {
        let now = voters(&c.live(), g).await;
        if now == want {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "group {g} not repaired 60 s after node {dead} died: voters {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "node {dead} killed: group {g} repaired in {:?}",
        t.elapsed()
    );
    check_all(&c.live(), &r, &acked).await;
    put(&c.live(), &r, "after-repair", "v").await;

    // The dead node was a meta member (the first three nodes are; it is one of the two
    // lowest ids): the meta group is repaired too, on node 4, and `cluster status`
    // names the members.
    assert!(dead <= 3);
    let want: Vec<u64> = (1..=4u64).filter(|&n| n != dead).collect();
    let t = Instant::now();
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_phoenix"))
            .args(["--output", "json", "cluster", "status", "--endpoints"])
            .arg(c.live().join(","))
            .output()
            .unwrap();
        let members = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .filter(|j| j["meta_learners"].as_array().is_some_and(|l| l.is_empty()))
            .and_then(|j| {
                let mut m: Vec<u64> = j["meta_members"]
                    .as_array()?
                    .iter()
                    .filter_map(|v| v.as_u64())
                    .collect();
                m.sort_unstable();
                Some(m)
            });
        if members.as_deref() == Some(&want[..]) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "meta group not repaired 60 s after node {dead} died: {members:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("meta member {dead} replaced in {:?}", t.elapsed());
}
