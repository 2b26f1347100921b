//! Faults injected into a spawned cluster while `phoenix bench cluster` runs
//! (`--nemesis kill,pause,partition,diskerror,diskfull`): one node at a time, the same schedule
//! for every target.
//!
//! Every 1–3 s (uniform) the nemesis picks a node and a fault: `kill` sends SIGKILL and
//! starts the node again 0.5–2.5 s later (same command line, same data); `pause` sends
//! SIGSTOP and SIGCONT 0.5–2.5 s later; `partition` cuts the node's links to every
//! other node for 2–6 s (clients still reach it), through the nodes' fault-injection
//! service (PhoenixKV servers started with `--fault-injection`); `diskerror` makes the
//! node's writes and syncs fail (the same service) for 0.5–2.5 s, then work again (its
//! replicas stop at the first failed write or sync, and the node restarts its storage
//! by itself once the disk takes writes again); `diskfull` makes the node see its disk as full (free space capped to 0
//! through the same service: it refuses client writes with DiskFull) for 2–6 s, then
//! lifts the cap (it takes writes again by itself); `powerloss` kills and restarts a node whose servers keep unsynced bytes in
//! memory (`--unsynced-in-memory`, so every kill of that run loses them). The choices
//! come from
//! a seeded generator, so a run with the same `--seed` faults the same nodes at the
//! same offsets for PhoenixKV and for etcd. When the run ends every node is brought
//! back (links healed) before the cluster is stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cmd::playground::Proc;

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL a node, restart it later (a crash: the process loses what it never synced
    /// to the OS; the OS keeps the rest).
    Kill,
    /// SIGSTOP a node, SIGCONT it later (a stall: its sockets stay open but silent).
    Pause,
    /// Cut a node off from the other nodes, heal later (PhoenixKV only: its servers'
    /// fault-injection service drops the raft, snapshot and meta traffic between them).
    Partition,
    /// Make a node's disk fail (writes and syncs), then kill and restart it (PhoenixKV
    /// only, through the same service).
    #[value(name = "diskerror")]
    DiskError,
    /// Make a node see its disk as full (free space capped to 0) for a while, then lift
    /// the cap (PhoenixKV only, through the same service): writes through it are refused
    /// meanwhile, and taken again without a restart.
    #[value(name = "diskfull")]
    DiskFull,
    /// SIGKILL a node whose servers keep unsynced bytes in memory (spawned with
    /// `--unsynced-in-memory`), restart it later: a power loss (PhoenixKV only).
    #[value(name = "powerloss")]
    PowerLoss,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::DiskError => "diskerror",
            Fault::DiskFull => "diskfull",
            Fault::PowerLoss => "powerloss",
        }
    }
}

/// Time between the end of one fault and the start of the next, in milliseconds.
const INTERVAL_MS: std::ops::Range<u64> = 1_000..3_001;
/// How long a node stays down or paused, in milliseconds.
const DOWN_MS: std::ops::Range<u64> = 500..2_501;

/// One fault as it happened, offsets from the nemesis' start.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which fault.
    pub fault: Fault,
    /// Index of the node in the process list (node id − 1).
    pub node: usize,
    /// When the fault began.
    pub at: Duration,
    /// How long the node was down or paused.
    pub down: Duration,
    /// Set when bringing the node back failed (the run's figures are then suspect).
    pub error: Option<String>,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7.2}s {} node {} for {:.2}s",
            self.at.as_secs_f64(),
            self.fault.name(),
            self.node + 1,
            self.down.as_secs_f64()
        )?;
        if let Some(e) = &self.error {
            write!(f, " (bringing it back failed: {e})")?;
        }
        Ok(())
    }
}

/// A running nemesis; [`Nemesis::finish`] stops it and hands the processes back.
pub struct Nemesis {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Proc>>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Nemesis {
    /// Starts faulting `procs` (one at a time) with `faults`, choices drawn from `seed`.
    /// `links` are the nodes' addresses (node id = index + 1), needed for `partition`.
    pub fn start(
        procs: Vec<Proc>,
        faults: Vec<Fault>,
        seed: u64,
        links: Option<Vec<String>>,
    ) -> Result<Self, String> {
        if faults.is_empty() || procs.is_empty() {
            return Err("the nemesis needs at least one fault and one process".into());
        }
        let needs_links = faults
            .iter()
            .any(|f| matches!(f, Fault::Partition | Fault::DiskError | Fault::DiskFull));
        let links = match (needs_links, links) {
            (true, None) => {
                return Err(
                    "partition, diskerror and diskfull need PhoenixKV nodes (their \
                     fault-injection service)"
                        .into(),
                )
            }
            (true, Some(l)) if l.len() != procs.len() => {
                return Err(format!("{} addresses for {} nodes", l.len(), procs.len()))
            }
            (_, l) => l,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let stop = Arc::clone(&stop);
            let events = Arc::clone(&events);
            std::thread::Builder::new()
                .name("nemesis".into())
                .spawn(move || run(procs, &faults, seed, links.as_deref(), &stop, &events))
                .map_err(|e| format!("start the nemesis thread: {e}"))?
        };
        Ok(Nemesis {
            stop,
            thread,
            events,
        })
    }

    /// Stops injecting, brings the faulted node back, and returns the processes and
    /// every fault injected.
    pub fn finish(self) -> Result<(Vec<Proc>, Vec<Event>), String> {
        self.stop.store(true, Ordering::Relaxed);
        let procs = self
            .thread
            .join()
            .map_err(|_| "the nemesis thread panicked".to_string())?;
        let events = self.events.lock().map(|e| e.clone()).unwrap_or_default();
        Ok((procs, events))
    }
}

/// Sleeps `d` in short steps; false if `stop` was set meanwhile.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(20)));
    }
    !stop.load(Ordering::Relaxed)
}

/// Sets the cut links of every node: node `isolated` (index) cut from all the others,
/// or every link healed (`None`). Every node is told even if one fails; the first
/// failure is returned.
fn set_partition(
    rt: &tokio::runtime::Runtime,
    addrs: &[String],
    isolated: Option<usize>,
) -> Result<(), String> {
    rt.block_on(partition(addrs, isolated))
}

/// [`set_partition`] for async callers (`phoenix check`).
pub async fn partition(addrs: &[String], isolated: Option<usize>) -> Result<(), String> {
    let mut first_err = None;
    for (i, addr) in addrs.iter().enumerate() {
        let cut: Vec<u64> = match isolated {
            None => Vec::new(),
            Some(n) if n == i => (0..addrs.len())
                .filter(|&j| j != n)
                .map(|j| j as u64 + 1)
                .collect(),
            Some(n) => vec![n as u64 + 1],
        };
        if let Err(e) = set_links(addr, cut).await {
            first_err.get_or_insert(format!("node {} at {addr}: {e}", i + 1));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Heals every link, retrying for up to 5 s; a node that still cannot be told is killed
/// and restarted (its cut set lives in memory), so the cluster is handed back whole.
fn heal(rt: &tokio::runtime::Runtime, addrs: &[String], procs: &mut [Proc]) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last;
    loop {
        last = match set_partition(rt, addrs, None) {
            Ok(()) => return None,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, addr) in addrs.iter().enumerate() {
        if rt.block_on(set_links(addr, Vec::new())).is_err() {
            if let Some(p) = procs.get_mut(i) {
                p.kill();
                if let Err(e) = p.restart() {
                    last = format!("{last}; restarting node {}: {e}", i + 1);
                }
            }
        }
    }
    Some(format!(
        "{last} (nodes that could not be healed were restarted)"
    ))
}

type FaultsClient = phoenix_proto::faults_client::FaultsClient<tonic::transport::Channel>;

/// One call to node `addr`'s fault-injection service within 2 s; its error as text.
async fn faults_call<F, Fut>(addr: &str, call: F) -> Result<(), String>
where
    F: FnOnce(FaultsClient) -> Fut,
    Fut: std::future::Future<Output = Result<Option<phoenix_proto::Error>, tonic::Status>>,
{
    let attempt = async {
        let c = FaultsClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| e.to_string())?;
        match call(c).await.map_err(|s| s.to_string())? {
            Some(e) => Err(e.message),
            None => Ok(()),
        }
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
}

/// Makes node `addr`'s writes and syncs fail (or work again), and caps the free space it
/// sees (None: the real space).
pub async fn set_disk(addr: &str, fail: bool, space_cap: Option<u64>) -> Result<(), String> {
    faults_call(addr, |mut c| async move {
        let req = phoenix_proto::SetDiskRequest {
            fail_writes: fail,
            fail_syncs: fail,
            space_cap,
        };
        c.set_disk(req).await.map(|r| r.into_inner().error)
    })
    .await
}

/// `set_disk` on node `node` (index into `links`); the error, naming the node.
fn disk_call(
    rt: &tokio::runtime::Runtime,
    links: Option<&[String]>,
    node: usize,
    fail: bool,
    space_cap: Option<u64>,
) -> Option<String> {
    let addr = links
        .unwrap_or_default()
        .get(node)
        .map_or("", String::as_str);
    rt.block_on(set_disk(addr, fail, space_cap))
        .err()
        .map(|e| format!("node {} at {addr}: {e}", node + 1))
}

/// Replaces node `addr`'s cut links.
async fn set_links(addr: &str, cut_nodes: Vec<u64>) -> Result<(), String> {
    faults_call(addr, |mut c| async move {
        let req = phoenix_proto::SetLinksRequest { cut_nodes };
        c.set_links(req).await.map(|r| r.into_inner().error)
    })
    .await
}

fn run(
    mut procs: Vec<Proc>,
    faults: &[Fault],
    seed: u64,
    links: Option<&[String]>,
    stop: &AtomicBool,
    events: &Mutex<Vec<Event>>,
) -> Vec<Proc> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7321);
    // For the fault-injection calls (partition).
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            if let Ok(mut ev) = events.lock() {
                ev.push(Event {
                    fault: faults[0],
                    node: 0,
                    at: Duration::ZERO,
                    down: Duration::ZERO,
                    error: Some(format!("cannot start the nemesis' runtime: {e}")),
                });
            }
            return procs;
        }
    };
    let start = Instant::now();
    loop {
        // Draw every choice of a round up front so the schedule depends on the seed
        // alone, not on when the run ends.
        let wait = Duration::from_millis(rng.gen_range(INTERVAL_MS));
        let node = rng.gen_range(0..procs.len());
        let fault = faults[rng.gen_range(0..faults.len())];
        let down = Duration::from_millis(rng.gen_range(DOWN_MS));
        if !nap(wait, stop) {
            break;
        }
        let at = start.elapsed();
        let p = &mut procs[node];
        let mut error = None;
        let down = match fault {
            Fault::Kill | Fault::PowerLoss => {
                p.kill();
                down
            }
            Fault::Pause => {
                p.signal(libc::SIGSTOP);
                down
            }
            Fault::Partition => {
                // `start` checked that partition comes with the addresses.
                let addrs = links.unwrap_or_default();
                error = set_partition(&rt, addrs, Some(node)).err();
                // 2–6 s: long enough for the cut-off side to lose its leases and
                // elect, as in a real partition.
                down * 2 + Duration::from_secs(1)
            }
            Fault::DiskError => {
                error = disk_call(&rt, links, node, true, None);
                down
            }
            Fault::DiskFull => {
                error = disk_call(&rt, links, node, false, Some(0));
                down * 2 + Duration::from_secs(1)
            }
        };
        // The node comes back even if the run ends meanwhile: the cluster is handed
        // back whole.
        nap(down, stop);
        let back = match fault {
            Fault::Kill | Fault::PowerLoss => p.restart().err().map(|e| e.to_string()),
            Fault::Pause => {
                p.signal(libc::SIGCONT);
                None
            }
            Fault::Partition => heal(&rt, links.unwrap_or_default(), &mut procs),
            // A failed sync leaves the disk's state unknown: the node restarts its
            // storage by itself (reopening from what reached the disk) once its disk
            // takes writes again.
            Fault::DiskError => disk_call(&rt, links, node, false, None),
            // The node takes writes again by itself once the space is back.
            Fault::DiskFull => disk_call(&rt, links, node, false, None),
        };
        let error = match (error, back) {
            (Some(a), Some(b)) => Some(format!("{a}; healing: {b}")),
            (a, b) => a.or(b),
        };
        let ev = Event {
            fault,
            node,
            at,
            down: start.elapsed().saturating_sub(at),
            error,
        };
        if let Ok(mut e) = events.lock() {
            e.push(ev);
        }
    }
    procs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &std::path::Path, i: usize) -> Proc {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("600");
        Proc::spawn(format!("sleeper {i}"), cmd, dir.join(format!("{i}.log"))).unwrap()
    }

    /// The schedule is a function of the seed, and every faulted process is back when
    /// the nemesis finishes (a killed one restarted, a paused one continued).
    #[test]
    fn faults_follow_the_seed_and_every_node_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let seed = 7;
        let run = |seed| {
            let procs: Vec<Proc> = (0..3).map(|i| sleeper(dir.path(), i)).collect();
            let n = Nemesis::start(procs, vec![Fault::Kill, Fault::Pause], seed, None).unwrap();
            std::thread::sleep(Duration::from_millis(9_000));
            n.finish().unwrap()
        };
        let (mut procs, events) = run(seed);
        assert!(!events.is_empty(), "seed {seed}: no fault in 9 s");
        for p in &mut procs {
            assert!(p.is_running(), "seed {seed}: {} not running", p.name);
            let pid = p.pid().unwrap();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
            assert_ne!(state, Some("T"), "seed {seed}: {} left stopped", p.name);
        }
        for e in &events {
            assert!(e.error.is_none(), "seed {seed}: {e}");
            assert!(
                e.down >= Duration::from_millis(450),
                "seed {seed}: too short: {e}"
            );
        }
        drop(procs);
        let (_, again) = run(seed);
        let key = |v: &[Event]| v.iter().map(|e| (e.fault, e.node)).collect::<Vec<_>>();
        let n = events.len().min(again.len());
        assert_eq!(
            key(&events[..n]),
            key(&again[..n]),
            "seed {seed}: same seed, other faults"
        );
    }
}
