//! `phoenix bench repair`: seed 000's full-repair experiment (§5.3, Fig. 11) scaled to one
//! machine. A 3-node loopback cluster with `--groups` groups is filled with `--keys`
//! keys; node 3 is killed -9; `--extra-percent` more keys are written while it is down,
//! with every log truncated to what is applied, so that each of node 3's groups needs a
//! snapshot; node 3 is restarted and its disk bytes are sampled every second until every
//! one of its replicas has caught up. Printed per drop mode: node 3's state-machine bytes
//! (the engine's files and received snapshot files waiting to be installed) at their peak
//! during the repair, the steady state (the same data on the nodes that stayed up, when
//! node 3 caught up), the space amplification (peak / steady − 1) and the repair time. The log store's bytes are left out of the
//! ratio (its segments are preallocated, a constant) and printed apart.
//!
//! The writes made while the node is down reach the logs' truncation only once the
//! engine flushes them (the log is the engine's WAL): if some group's log is not cut past
//! the node after them, half as many again are written, up to four times, and the total
//! is printed.
//!
//! The drop modes are the server's `--drop-mode`: `files` (a snapshot install deletes the
//! replica's old files at once) and `range-delete` (a range tombstone hides them and
//! compaction removes them later, as stock RocksDB users do).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use phoenix_client::{Client, ClusterStatus};

use super::BenchError;
use crate::cmd::playground::{ClusterSpec, LocalCluster};
use crate::output::Report;

/// The node killed and repaired.
pub(super) const VICTIM: u64 = 3;

/// Flags of `phoenix bench repair`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Groups the cluster is bootstrapped with (3 replicas each, one on every node).
    #[arg(long, default_value_t = 256)]
    pub groups: usize,
    /// Keys written before the kill (spread evenly over the groups).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Keys written while the node is down, in percent of `--keys`.
    #[arg(long, default_value_t = 2.0)]
    pub extra_percent: f64,
    /// Drop modes to measure, in turn (`files`, `range-delete`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "files,range-delete"
    )]
    pub drop_mode: Vec<Mode>,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    pub clients: u64,
    /// The servers' memtable size in MiB: small enough that the writes made while the
    /// node is down reach the tables, so the logs can be truncated past it.
    #[arg(long, default_value_t = 4)]
    pub memtable_mb: u64,
    /// Directory for the nodes (`<dir>/<mode>/node-N`); kept. Default: a temporary one,
    /// removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra argument for every server (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Give up on a repair that takes longer (e.g. 30m).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// A drop mode (`phoenix server --drop-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A replica's old files are deleted at once.
    Files,
    /// A range tombstone hides them; compaction removes them later.
    RangeDelete,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Files => "files",
            Mode::RangeDelete => "range-delete",
        }
    }
}

/// One mode's figures.
#[derive(Debug)]
struct Outcome {
    mode: Mode,
    fill_secs: f64,
    /// Node 3's state bytes before the kill.
    before_kill: u64,
    /// The other nodes' state bytes (mean) when node 3 caught up.
    steady: u64,
    peak: u64,
    /// Node 3's bytes when the last of its replicas caught up.
    at_done: u64,
    /// Node 3's whole directory (log store included) at its peak.
    node_peak: u64,
    /// Node 3's received snapshot files not yet installed, at their peak.
    staged_peak: u64,
    /// The other nodes' snapshot files built and not sent yet, at their peak (summed).
    sending_peak: u64,
    /// Keys written while node 3 was down.
    extra: u64,
    repair_secs: f64,
    /// Groups whose leader's log starts past what node 3 held (each needs a snapshot).
    needing: usize,
    snapshots: usize,
}

impl Outcome {
    fn amplification(&self) -> f64 {
        self.peak as f64 / self.steady.max(1) as f64 - 1.0
    }
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    if args.groups == 0 || args.keys == 0 || args.drop_mode.is_empty() {
        return Err("--groups, --keys and --drop-mode must not be empty or zero".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    let (root, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("phoenix-bench-repair-{}", std::process::id())),
            true,
        ),
    };
    let mut outcomes = Vec::new();
    for &mode in &args.drop_mode {
        let dir = root.join(mode.arg());
        let _ = std::fs::remove_dir_all(&dir);
        report.line(format_args!(
            "== drop mode {} ({})",
            mode.arg(),
            dir.display()
        ));
        let o = rt.block_on(one_mode(&args, mode, &dir, report))?;
        outcomes.push(o);
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    report.line(format_args!(
        "| drop mode | keys (+ while down) | before kill MiB | steady MiB | peak MiB | amplification | at done MiB | repair s | groups needing a snapshot | snapshots installed | staged snapshots peak MiB | senders' built snapshots peak MiB | node dir peak MiB |"
    ));
    report.line(format_args!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    ));
    for o in &outcomes {
        report.line(format_args!(
            "| {} | {} (+{}) | {:.1} | {:.1} | {:.1} | {:.1}% | {:.1} | {:.1} | {} of {} | {} | {:.1} | {:.1} | {:.1} |",
            o.mode.arg(),
            args.keys,
            o.extra,
            mib(o.before_kill),
            mib(o.steady),
            mib(o.peak),
            o.amplification() * 100.0,
            mib(o.at_done),
            o.repair_secs,
            o.needing,
            args.groups,
            o.snapshots,
            mib(o.staged_peak),
            mib(o.sending_peak),
            mib(o.node_peak)
        ));
    }
    if let [a, b] = &outcomes[..] {
        if a.mode == Mode::Files && b.mode == Mode::RangeDelete {
            report.line(format_args!(
                "files vs range-delete: amplification {:.1}% vs {:.1}%, repair time {:+.1}%",
                a.amplification() * 100.0,
                b.amplification() * 100.0,
                (a.repair_secs / b.repair_secs.max(1e-9) - 1.0) * 100.0
            ));
        }
    }
    let modes: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "drop_mode": o.mode.arg(),
                "fill_secs": o.fill_secs,
                "bytes_before_kill": o.before_kill,
                "steady_bytes": o.steady,
                "peak_bytes": o.peak,
                "amplification": o.amplification(),
                "bytes_at_done": o.at_done,
                "node_dir_peak_bytes": o.node_peak,
                "staged_snapshots_peak_bytes": o.staged_peak,
                "senders_built_snapshots_peak_bytes": o.sending_peak,
                "keys_while_down": o.extra,
                "repair_secs": o.repair_secs,
                "groups_needing_snapshot": o.needing,
                "snapshots_installed": o.snapshots,
            })
        })
        .collect();
    report.summary(&serde_json::json!({
        "groups": args.groups,
        "keys": args.keys,
        "value_size": args.value_size,
        "extra_percent": args.extra_percent,
        "modes": modes,
    }))?;
    Ok(())
}

async fn one_mode(
    args: &Args,
    mode: Mode,
    dir: &Path,
    report: Report,
) -> Result<Outcome, BenchError> {
    let mut spec = ClusterSpec::ephemeral_nodes(dir, 3)?;
    let groups = args.groups.to_string();
    let memtable = args.memtable_mb.to_string();
    spec.server_args = groups_held_still(&groups, &memtable)
        .into_iter()
        .chain(["--drop-mode".to_string(), mode.arg().to_string()])
        .chain(args.server_args.iter().cloned())
        .collect();
    let mut cluster = LocalCluster::start(spec)?;
    let client = cluster.wait_ready(Duration::from_secs(180)).await?;
    let started = Instant::now();
    write_keys(&client, 0..args.keys, args).await?;
    let fill_secs = started.elapsed().as_secs_f64();
    report.line(format_args!(
        "filled {} keys in {fill_secs:.1} s ({:.0} keys/s)",
        args.keys,
        args.keys as f64 / fill_secs
    ));
    let node_dir = dir.join(format!("node-{VICTIM}"));
    let before_kill = settle(&node_dir, report).await?;
    // What node 3 can hold at most when it dies: each group's commit index now (nothing
    // is written until the kill).
    let before = status(&client).await?;
    cluster.nodes[VICTIM as usize - 1].kill();
    report.line(format_args!(
        "node {VICTIM} killed at {:.1} MiB",
        mib(before_kill)
    ));
    let step = ((args.keys as f64) * args.extra_percent / 100.0)
        .round()
        .max(1.0) as u64;
    let mut extra = 0;
    let mut needing = 0;
    for round in 0..5 {
        let n = if round == 0 { step } else { step.div_ceil(2) };
        let from = args.keys + extra;
        write_keys(&client, from..from + n, args).await?;
        extra += n;
        report.line(format_args!("{extra} more keys written while it is down"));
        needing = wait_truncated(&client, &before, report).await?;
        if needing == args.groups {
            break;
        }
    }
    let targets = commit_indexes(&status(&client).await?);
    let t0 = Instant::now();
    cluster.nodes[VICTIM as usize - 1].restart()?;
    let mut peak = state_bytes(&node_dir)?;
    let mut node_peak = du(&node_dir)?;
    let mut staged_peak = 0;
    let mut sending_peak = 0;
    let mut done_at: Option<(f64, u64, u64)> = None;
    let others = |dir: &Path| -> Result<u64, BenchError> {
        let a = state_bytes(&dir.join("node-1"))?;
        let b = state_bytes(&dir.join("node-2"))?;
        Ok((a + b) / 2)
    };
    let mut last_line = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let bytes = state_bytes(&node_dir)?;
        peak = peak.max(bytes);
        node_peak = node_peak.max(du(&node_dir)?);
        let staged = du(&node_dir.join("snap-recv"))?;
        staged_peak = staged_peak.max(staged);
        let sending =
            du(&dir.join("node-1").join("snap-send"))? + du(&dir.join("node-2").join("snap-send"))?;
        sending_peak = sending_peak.max(sending);
        let elapsed = t0.elapsed().as_secs_f64();
        if let Some((at, _, _)) = done_at {
            // A few seconds past the end: what the repair left behind is counted too
            // (compaction of a tombstoned range may still be running).
            if elapsed - at >= 10.0 {
                break;
            }
            continue;
        }
        let caught = match status(&client).await {
            Ok(s) => caught_up(&s, &targets),
            Err(_) => 0,
        };
        if caught == targets.len() {
            done_at = Some((elapsed, bytes, others(dir)?));
            report.line(format_args!(
                "repaired in {elapsed:.1} s; peak {:.1} MiB",
                mib(peak)
            ));
        } else if last_line.elapsed() >= Duration::from_secs(5) {
            last_line = Instant::now();
            report.line(format_args!(
                "t={elapsed:.0}s {caught} of {} groups caught up; {:.1} MiB, of which {:.1} \
                 received not installed (peak {:.1})",
                targets.len(),
                mib(bytes),
                mib(staged),
                mib(peak)
            ));
        }
        if t0.elapsed() > args.timeout {
            return Err(format!(
                "node {VICTIM} not repaired within {:?}; logs in {}",
                args.timeout,
                dir.display()
            )
            .into());
        }
    }
    let (repair_secs, at_done, steady) = done_at.unwrap_or_default();
    let log = std::fs::read_to_string(node_dir.join("server.log")).unwrap_or_default();
    let snapshots = log.matches("snapshot installed").count();
    cluster.stop();
    Ok(Outcome {
        mode,
        fill_secs,
        before_kill,
        steady,
        peak,
        at_done,
        node_peak,
        staged_peak,
        sending_peak,
        extra,
        repair_secs,
        needing,
        snapshots,
    })
}

/// The benchmark's key `i`: 4 bytes of a hash of `i` first (spreading the keys evenly
/// over groups bootstrapped with even split keys), then `i`.
pub(super) fn key(i: u64) -> Vec<u8> {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let mut k = (z as u32).to_be_bytes().to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

/// Writes keys `range` with `--clients` writers; a write that fails (a leader change
/// while node 3 dies) is retried for a while before the run fails.
async fn write_keys(
    client: &Client,
    range: std::ops::Range<u64>,
    args: &Args,
) -> Result<(), BenchError> {
    let next = Arc::new(AtomicU64::new(range.start));
    let value = Arc::new(vec![b'v'; args.value_size]);
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (client, next, value) = (client.clone(), Arc::clone(&next), Arc::clone(&value));
        let end = range.end;
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<(), String>(());
                }
                let k = key(i);
                let mut tries = 0;
                while let Err(e) = client.put(&k, &value).await {
                    tries += 1;
                    if tries >= 50 {
                        return Err(format!("put of key {i} failed {tries} times: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("writer task: {e}"))??;
    }
    Ok(())
}

pub(super) async fn status(client: &Client) -> Result<ClusterStatus, BenchError> {
    Ok(client.cluster_status().await?)
}

/// Waits until node `dir`'s state-machine bytes stay within 1% over 5 s (flushes and
/// compactions after the fill done), at most 120 s; returns them.
async fn settle(dir: &Path, report: Report) -> Result<u64, BenchError> {
    let start = Instant::now();
    let mut window: Vec<u64> = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = state_bytes(dir)?;
        window.push(b);
        if window.len() > 5 {
            window.remove(0);
        }
        let (lo, hi) = (
            window.iter().copied().min().unwrap_or(0),
            window.iter().copied().max().unwrap_or(0),
        );
        if window.len() == 5 && (hi - lo) as f64 <= hi as f64 * 0.01 {
            return Ok(b);
        }
        if start.elapsed() > Duration::from_secs(120) {
            report.line(format_args!(
                "node bytes still moving after 120 s ({:.1}..{:.1} MiB over 5 s): taking {:.1}",
                mib(lo),
                mib(hi),
                mib(b)
            ));
            return Ok(b);
        }
    }
}

/// Each group's leader commit index (by group id).
pub(super) fn commit_indexes(s: &ClusterStatus) -> Vec<(u64, u64)> {
    s.groups
        .iter()
        .map(|g| {
            let commit = g
                .replica_status
                .iter()
                .filter(|r| r.is_leader)
                .map(|r| r.commit_index)
                .max()
                .unwrap_or(0);
            (g.group_id, commit)
        })
        .collect()
}

/// Waits (at most 15 s) until every group's leader, on a live node, has cut its log past
/// what node 3 could hold when it died (`before`): each group then needs a snapshot.
/// Returns how many do.
pub(super) async fn wait_truncated(
    client: &Client,
    before: &ClusterStatus,
    report: Report,
) -> Result<usize, BenchError> {
    let held: std::collections::HashMap<u64, u64> = commit_indexes(before).into_iter().collect();
    let start = Instant::now();
    loop {
        let s = status(client).await?;
        let needing = s
            .groups
            .iter()
            .filter(|g| {
                let h = held.get(&g.group_id).copied().unwrap_or(u64::MAX);
                g.replica_status.iter().any(|r| {
                    r.is_leader && r.node_id != VICTIM && r.log_first_index > h.saturating_add(1)
                })
            })
            .count();
        if needing == s.groups.len() || start.elapsed() > Duration::from_secs(15) {
            report.line(format_args!(
                "{needing} of {} groups have cut their logs past node {VICTIM} (after {:.1} s)",
                s.groups.len(),
                start.elapsed().as_secs_f64()
            ));
            return Ok(needing);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How many groups' replica on node 3 is running and has applied its target index.
pub(super) fn caught_up(s: &ClusterStatus, targets: &[(u64, u64)]) -> usize {
    targets
        .iter()
        .filter(|(g, target)| {
            s.groups.iter().any(|gs| {
                gs.group_id == *g
                    && gs.replica_status.iter().any(|r| {
                        r.node_id == VICTIM && r.stopped.is_empty() && r.applied_index >= *target
                    })
            })
        })
        .count()
}

/// A node's state-machine bytes: its engine's files and the snapshot files it received
/// and has not installed yet.
fn state_bytes(node_dir: &Path) -> Result<u64, BenchError> {
    Ok(du(&node_dir.join("db"))? + du(&node_dir.join("snap-recv"))?)
}

/// Bytes `dir` takes on disk (allocated blocks), files below it included; 0 if absent.
pub(super) fn du(dir: &Path) -> Result<u64, BenchError> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            // A directory removed while walked (a snapshot's staging directory).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("read {}: {e}", d.display()).into()),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

pub(super) fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Server arguments of a bench that brings a node back from the dead: `groups` data
/// groups of `memtable` MiB memtables that never split, merge, scrub or move, and logs
/// cut to what is applied (the node back needs snapshots).
pub(super) fn groups_held_still(groups: &str, memtable: &str) -> Vec<String> {
    [
        "--initial-groups",
        groups,
        "--memtable-mb",
        memtable,
        "--log-keep-entries",
        "0",
        "--log-truncate-ms",
        "500",
        // The dead node's replicas are waited for, not replaced.
        "--down-after",
        "0s",
        "--split-size-mb",
        "0",
        "--split-size-keys",
        "0",
        "--split-qps",
        "0",
        "--merge-size-mb",
        "0",
        "--scrub-interval",
        "0s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys spread evenly over 256 groups cut on their first byte.
    #[test]
    fn keys_spread_over_groups() {
        let mut per = [0u32; 256];
        for i in 0..256_000u64 {
            per[key(i)[0] as usize] += 1;
        }
        let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
        assert!(*lo > 800 && *hi < 1200, "{lo}..{hi}");
    }
}
