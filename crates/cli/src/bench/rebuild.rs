//! `phoenix bench rebuild`: seed 004's replica rebuild (§6.2, "~50 min → < 1 min") on
//! this machine. A 3-node loopback cluster whose tables are on an S3 server
//! (`--sst-store`, each node under its own prefix) holds one group, filled to each of
//! `--sizes` MiB with values that do not compress; node 3 is killed -9, a few more keys
//! are written while every log is cut past it, and node 3 is restarted: its replica
//! needs a snapshot of the whole group. Measured per size and per way (`copy`: the
//! leader names its tables and the receiver copies them on the store, only the rest is
//! streamed; `stream`: the whole group streamed through both nodes, `--snapshot-no-copy`):
//! the time until node 3 applied the group's commit index, the snapshot bytes the
//! leader streamed and had copied (`phoenix_snapshot_bytes_total`), and the CPU seconds
//! of the nodes meanwhile (the leader's and the other follower's from the restart on,
//! node 3's whole run, its start included).
//!
//! Node 3 comes back with its old state (as in `bench repair`): the install swaps all of
//! it for the snapshot either way. Each run's objects are removed from the bucket at its
//! end.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use phoenix_client::Client;

use super::repair::{
    caught_up, commit_indexes, groups_held_still, key, mib, status, wait_truncated, VICTIM,
};
use super::BenchError;
use crate::cmd::playground::{node_sst_store, ClusterSpec, LocalCluster};
use crate::output::Report;

/// Flags of `phoenix bench rebuild`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The S3 server the nodes keep their tables on: `s3://bucket/prefix?endpoint=…`
    /// (each run adds its own prefix below; credentials from `AWS_*` or the URL).
    #[arg(long)]
    pub sst_store: String,
    /// Group sizes to measure, in MiB of values.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    pub sizes: Vec<u64>,
    /// Ways to measure, in turn, for each size (`copy`, `stream`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "copy,stream")]
    pub how: Vec<How>,
    /// Bytes per value.
    #[arg(long, default_value_t = 16 << 10)]
    pub value_size: usize,
    /// Concurrent writers of the fill.
    #[arg(long, default_value_t = 16)]
    pub clients: u64,
    /// The servers' memtable size in MiB. What is not yet below L0 when the snapshot is
    /// taken (memtables and L0, a few memtables' worth) is streamed either way.
    #[arg(long, default_value_t = 4)]
    pub memtable_mb: u64,
    /// The snapshot streaming rate limit (`--snapshot-mb-per-sec` of the servers): high
    /// by default, so the streamed way is not held back by it.
    #[arg(long, default_value_t = 4096)]
    pub snapshot_mb_per_sec: u64,
    /// Directory for the nodes (`<dir>/<size>-<how>/node-N`); kept. Default: a temporary
    /// one, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra argument for every server (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Give up on a rebuild that takes longer (e.g. 30m).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// How the snapshot travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum How {
    /// The receiver copies the leader's tables on the store; the rest is streamed.
    Copy,
    /// The whole group is streamed through the nodes.
    Stream,
}

impl How {
    fn name(self) -> &'static str {
        match self {
            How::Copy => "copy",
            How::Stream => "stream",
        }
    }
}

/// One run's figures.
#[derive(Debug)]
struct Outcome {
    size_mib: u64,
    how: How,
    keys: u64,
    fill_secs: f64,
    rebuild_secs: f64,
    streamed: u64,
    copied: u64,
    /// CPU seconds during the rebuild: nodes 1 and 2 (from the restart), node 3 (its run).
    cpu: [f64; 3],
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    if args.sizes.is_empty() || args.how.is_empty() || args.value_size == 0 {
        return Err("--sizes, --how and --value-size must not be empty or zero".into());
    }
    if !args.sst_store.starts_with("s3://") {
        return Err("--sst-store must be an s3:// URL".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    let (root, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("phoenix-bench-rebuild-{}", std::process::id())),
            true,
        ),
    };
    let mut outcomes = Vec::new();
    for &size in &args.sizes {
        for &how in &args.how {
            let name = format!("{size}-{}", how.name());
            let dir = root.join(&name);
            let _ = std::fs::remove_dir_all(&dir);
            // (A prefix of its own: runs never meet each other's objects.)
            let (location, query) = args
                .sst_store
                .split_once('?')
                .unwrap_or((&args.sst_store, ""));
            let base = format!(
                "{}/rebuild-{}-{name}?{query}",
                location.trim_end_matches('/'),
                std::process::id()
            );
            report.line(format_args!(
                "== {size} MiB by {} ({})",
                how.name(),
                dir.display()
            ));
            let o = rt.block_on(one_run(&args, size, how, &dir, &base, report));
            remove_objects(&base, report);
            if temporary {
                // (Each run's directories hold its flash caches and logs: gigabytes.)
                let _ = std::fs::remove_dir_all(&dir);
            }
            outcomes.push(o?);
        }
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    report.line(format_args!(
        "| group MiB | how | keys | fill s | rebuild s | streamed MiB | copied MiB | CPU s: nodes 1+2 | CPU s: node 3 |"
    ));
    report.line(format_args!("|---|---|---|---|---|---|---|---|---|"));
    for o in &outcomes {
        report.line(format_args!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            o.size_mib,
            o.how.name(),
            o.keys,
            o.fill_secs,
            o.rebuild_secs,
            mib(o.streamed),
            mib(o.copied),
            o.cpu[0] + o.cpu[1],
            o.cpu[2]
        ));
    }
    let runs: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "group_mib": o.size_mib,
                "how": o.how.name(),
                "keys": o.keys,
                "fill_secs": o.fill_secs,
                "rebuild_secs": o.rebuild_secs,
                "streamed_bytes": o.streamed,
                "copied_bytes": o.copied,
                "cpu_secs": o.cpu,
            })
        })
        .collect();
    report.summary(&serde_json::json!({
        "value_size": args.value_size,
        "runs": runs,
    }))?;
    Ok(())
}

async fn one_run(
    args: &Args,
    size: u64,
    how: How,
    dir: &Path,
    base: &str,
    report: Report,
) -> Result<Outcome, BenchError> {
    let mut spec = ClusterSpec::ephemeral_nodes(dir, 3)?;
    spec.status_pages = true;
    spec.sst_store = Some(base.to_string());
    let memtable = args.memtable_mb.to_string();
    let rate = args.snapshot_mb_per_sec.to_string();
    let mut server_args = groups_held_still("1", &memtable);
    server_args.extend(["--snapshot-mb-per-sec".to_string(), rate]);
    if how == How::Stream {
        server_args.push("--snapshot-no-copy".into());
    }
    server_args.extend(args.server_args.iter().cloned());
    spec.server_args = server_args;
    let mut cluster = LocalCluster::start(spec)?;
    let client = cluster.wait_ready(Duration::from_secs(180)).await?;
    let keys = (size << 20).div_ceil(args.value_size as u64);
    let started = Instant::now();
    write_keys(&client, 0..keys, args).await?;
    let fill_secs = started.elapsed().as_secs_f64();
    report.line(format_args!(
        "filled {keys} keys ({size} MiB) in {fill_secs:.1} s"
    ));
    // Flushes and compactions of the fill settle first (they are not the rebuild's).
    settle_cpu(&cluster, &[0, 1, 2], report).await?;
    let before = status(&client).await?;
    cluster.nodes[VICTIM as usize - 1].kill();
    // Enough to fill a memtable: the logs are cut only once the writes are flushed.
    let step = (keys / 100).max(2 * (args.memtable_mb << 20) / args.value_size as u64 + 1);
    let mut extra = 0;
    for _ in 0..5 {
        write_keys(&client, keys + extra..keys + extra + step, args).await?;
        extra += step;
        if wait_truncated(&client, &before, report).await? == 1 {
            break;
        }
    }
    settle_cpu(&cluster, &[0, 1], report).await?;
    let targets = commit_indexes(&status(&client).await?);
    let metrics = |i: usize| cluster.metrics[i];
    let sent_before = [
        snapshot_bytes(metrics(0)).await?,
        snapshot_bytes(metrics(1)).await?,
    ];
    let cpu_before = [cpu_secs(&cluster, 0)?, cpu_secs(&cluster, 1)?];
    let t0 = Instant::now();
    cluster.nodes[VICTIM as usize - 1].restart()?;
    let rebuild_secs = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(s) = status(&client).await {
            if caught_up(&s, &targets) == targets.len() {
                break t0.elapsed().as_secs_f64();
            }
        }
        if cluster.nodes[VICTIM as usize - 1].exited().is_some() {
            return Err(format!("node {VICTIM} exited; its log: {}", dir.display()).into());
        }
        if t0.elapsed() > args.timeout {
            return Err(format!(
                "node {VICTIM} not rebuilt within {:?}; logs in {}",
                args.timeout,
                dir.display()
            )
            .into());
        }
    };
    let cpu = [
        cpu_secs(&cluster, 0)? - cpu_before[0],
        cpu_secs(&cluster, 1)? - cpu_before[1],
        cpu_secs(&cluster, 2)?,
    ];
    let sent_after = [
        snapshot_bytes(metrics(0)).await?,
        snapshot_bytes(metrics(1)).await?,
    ];
    let streamed = sent_after[0].0 + sent_after[1].0 - sent_before[0].0 - sent_before[1].0;
    let copied = sent_after[0].1 + sent_after[1].1 - sent_before[0].1 - sent_before[1].1;
    if streamed + copied == 0 {
        return Err(format!(
            "node {VICTIM} caught up from the log: no snapshot was sent (logs in {})",
            dir.display()
        )
        .into());
    }
    report.line(format_args!(
        "rebuilt in {rebuild_secs:.1} s: {:.1} MiB streamed, {:.1} MiB copied; CPU {:.2} + {:.2} s (nodes 1, 2), {:.2} s (node {VICTIM})",
        mib(streamed),
        mib(copied),
        cpu[0],
        cpu[1],
        cpu[2]
    ));
    cluster.stop();
    Ok(Outcome {
        size_mib: size,
        how,
        keys,
        fill_secs,
        rebuild_secs,
        streamed,
        copied,
        cpu,
    })
}

/// Writes keys `range` (values of `--value-size` bytes that do not compress) with
/// `--clients` writers, retrying a failed write for a while.
async fn write_keys(
    client: &Client,
    range: std::ops::Range<u64>,
    args: &Args,
) -> Result<(), BenchError> {
    let next = Arc::new(AtomicU64::new(range.start));
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (client, next) = (client.clone(), Arc::clone(&next));
        let (end, size) = (range.end, args.value_size);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<(), String>(());
                }
                let value = value(i, size);
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

/// Key `i`'s value: `size` pseudo-random bytes (xorshift seeded by `i`).
pub(super) fn value(i: u64, size: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(size + 8);
    while v.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(size);
    v
}

/// Node `i`'s CPU seconds (user + system) so far.
fn cpu_secs(cluster: &LocalCluster, i: usize) -> Result<f64, BenchError> {
    let pid = cluster.nodes[i]
        .pid()
        .ok_or_else(|| format!("node {} is not running", i + 1))?;
    Ok(super::common::cpu_secs(&pid.to_string())?)
}

/// Waits until the nodes `which` (indexes) use less than 5% of a core together over
/// three seconds in a row, at most 300 s.
async fn settle_cpu(
    cluster: &LocalCluster,
    which: &[usize],
    report: Report,
) -> Result<(), BenchError> {
    let total = || -> Result<f64, BenchError> { which.iter().map(|&i| cpu_secs(cluster, i)).sum() };
    let start = Instant::now();
    let mut last = total()?;
    let mut quiet = 0;
    while quiet < 3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = total()?;
        quiet = if now - last < 0.05 { quiet + 1 } else { 0 };
        last = now;
        if start.elapsed() > Duration::from_secs(300) {
            report.line(format_args!("nodes still busy after 300 s; going on"));
            return Ok(());
        }
    }
    report.line(format_args!(
        "nodes idle after {:.0} s",
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// A node's `phoenix_snapshot_bytes_total` (streamed, copied) from its metrics port.
async fn snapshot_bytes(addr: Option<std::net::SocketAddr>) -> Result<(u64, u64), BenchError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = addr.ok_or("a node has no metrics port")?;
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("metrics of {addr}: {e}"))?;
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("metrics of {addr}: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .await
        .map_err(|e| format!("metrics of {addr}: {e}"))?;
    let sample = |how: &str| {
        let name = format!("phoenix_snapshot_bytes_total{{how=\"{how}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    Ok((sample("streamed"), sample("copied")))
}

/// Removes a run's objects (every node's prefix under `base`); reported, not fatal.
fn remove_objects(base: &str, report: Report) {
    for id in 1..=3 {
        let url = node_sst_store(base, id);
        let removed =
            phoenix_engine::ObjectTableStore::from_url(&url).and_then(|store| store.destroy());
        if let Err(e) = removed {
            report.line(format_args!(
                "could not remove the objects of node {id}: {e}"
            ));
        }
    }
}
