//! `phoenix bench backup`: a backup of a running cluster under writes, restored into a
//! new cluster, and checked. A 3-node loopback cluster whose tables are on an S3 server
//! (`--sst-store`, each node under its own prefix) is filled with `--fill-mib` of
//! values that do not compress over `--groups` groups; writers go on writing new keys
//! (each once, its acknowledgement time kept) while `phoenix backup` copies the cluster
//! into a prefix of the same bucket (the groups' own tables copied by the store). A
//! second 3-node cluster on the same server is then restored from the backup. Checked:
//! every key acknowledged before the backup began reads back from the new cluster with
//! its value, and every key the new cluster holds was written with the value it holds.
//! Measured: the backup's time and bytes copied by the store and streamed through the
//! tool, the restore's time and rate. The run's objects are removed at its end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore as _;
use phoenix_client::Client;

use super::rebuild::value;
use super::repair::{key, mib};
use super::BenchError;
use crate::cmd::backup::{backup, restore};
use crate::cmd::playground::{ClusterSpec, LocalCluster};
use crate::output::Report;

/// Flags of `phoenix bench backup`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The S3 server: `s3://bucket/prefix?endpoint=…` (the run adds its own prefix
    /// below; credentials from `AWS_*` or the URL).
    #[arg(long)]
    pub sst_store: String,
    /// MiB of values written before the backup.
    #[arg(long, default_value_t = 256)]
    pub fill_mib: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 4096)]
    pub value_size: usize,
    /// Data groups of each cluster (`--initial-groups`).
    #[arg(long, default_value_t = 8)]
    pub groups: u64,
    /// Concurrent writers (of the fill, and during the backup).
    #[arg(long, default_value_t = 16)]
    pub clients: u64,
    /// The servers' memtable size in MiB.
    #[arg(long, default_value_t = 16)]
    pub memtable_mb: u64,
    /// Seconds of writes before the backup starts (they go on until it ends).
    #[arg(long, default_value_t = 3)]
    pub writes_before: u64,
    /// Groups backed up at once, and batches written at once by the restore.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Directory for the nodes (`<dir>/one`, `<dir>/two`); kept. Default: a temporary
    /// one, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra argument for every server (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    if args.fill_mib == 0 || args.value_size == 0 || args.groups == 0 {
        return Err("--fill-mib, --value-size and --groups must not be zero".into());
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
            std::env::temp_dir().join(format!("phoenix-bench-backup-{}", std::process::id())),
            true,
        ),
    };
    let _ = std::fs::remove_dir_all(&root);
    let (location, query) = args
        .sst_store
        .split_once('?')
        .unwrap_or((&args.sst_store, ""));
    let at = |what: &str| {
        format!(
            "{}/backup-bench-{}/{what}?{query}",
            location.trim_end_matches('/'),
            std::process::id()
        )
    };
    let r = rt.block_on(one_run(&args, &root, &at, report));
    if let Err(e) = rt.block_on(remove_objects(&at(""))) {
        report.line(format_args!("could not remove the run's objects: {e}"));
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    r
}

/// Removes every object under `url`'s prefix.
async fn remove_objects(url: &str) -> Result<(), BenchError> {
    use futures_util::StreamExt as _;
    let p = phoenix_engine::S3Prefix::from_url(url)?;
    let prefix = object_store::path::Path::from(p.prefix.as_str());
    let mut list = p.store.list(Some(&prefix));
    while let Some(meta) = list.next().await {
        p.store.delete(&meta?.location).await?;
    }
    Ok(())
}

async fn start(
    args: &Args,
    dir: &std::path::Path,
    sst_store: String,
) -> Result<(LocalCluster, Client), BenchError> {
    let mut spec = ClusterSpec::ephemeral_nodes(dir, 3)?;
    spec.sst_store = Some(sst_store);
    spec.server_args = vec![
        "--initial-groups".into(),
        args.groups.to_string(),
        "--memtable-mb".into(),
        args.memtable_mb.to_string(),
    ];
    spec.server_args.extend(args.server_args.iter().cloned());
    let mut cluster = LocalCluster::start(spec)?;
    let client = cluster.wait_ready(Duration::from_secs(180)).await?;
    Ok((cluster, client.with_timeout(Duration::from_secs(20))))
}

async fn one_run(
    args: &Args,
    root: &std::path::Path,
    at: &dyn Fn(&str) -> String,
    report: Report,
) -> Result<(), BenchError> {
    let (mut one, c1) = start(args, &root.join("one"), at("one")).await?;
    let fill = (args.fill_mib << 20).div_ceil(args.value_size as u64);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    write(&c1, &next, fill, args).await?;
    let fill_secs = started.elapsed().as_secs_f64();
    report.line(format_args!(
        "filled {fill} keys ({} MiB) in {fill_secs:.1} s",
        args.fill_mib
    ));

    // Writes go on, each key once, while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let during = {
        let (c, next, stop, args_clients, size) = (
            c1.clone(),
            Arc::clone(&next),
            Arc::clone(&stop),
            args.clients,
            args.value_size,
        );
        tokio::spawn(async move { write_until(&c, &next, &stop, args_clients, size).await })
    };
    tokio::time::sleep(Duration::from_secs(args.writes_before)).await;
    let backup_url = at("backup");
    let b = backup(&c1, &backup_url, args.parallel, 5).await?;
    stop.store(true, Ordering::Relaxed);
    let acked = during.await.map_err(|e| format!("writer task: {e}"))??;
    report.line(format_args!(
        "backed up {} groups in {:.1} s: {} tables ({:.1} MiB) copied by the store, {:.1} MiB streamed; {} writes acknowledged meanwhile",
        b.groups,
        b.secs,
        b.tables,
        mib(b.copied_bytes),
        mib(b.streamed_bytes),
        acked.len()
    ));
    one.stop();

    let (mut two, c2) = start(args, &root.join("two"), at("two")).await?;
    let r = restore(
        &c2,
        &backup_url,
        &root.join("work"),
        args.parallel * 4,
        false,
    )
    .await?;
    report.line(format_args!(
        "restored {} keys ({:.1} MiB) in {:.1} s: {:.0} keys/s, {:.1} MiB/s",
        r.keys,
        mib(r.bytes),
        r.secs,
        r.keys as f64 / r.secs,
        mib(r.bytes) / r.secs
    ));

    // The check: what the new cluster holds against what was acknowledged.
    let mut held: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut cursor = Vec::new();
    loop {
        let page = c2.scan_page(&cursor, b"", 1000).await?;
        held.extend(page.pairs);
        match page.next {
            Some(n) => cursor = n,
            None => break,
        }
    }
    two.stop();
    // Every key numbered below `attempted` was written (or tried: a write whose
    // outcome was unknown may be there); a key ends with its number.
    let attempted = next.load(Ordering::Relaxed);
    for (k, v) in &held {
        let i = k
            .get(k.len().saturating_sub(8)..)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .filter(|&i| i < attempted && key(i) == *k)
            .ok_or_else(|| format!("the restored cluster holds key {k:?}, never written"))?;
        if *v != value(i, args.value_size) {
            return Err(format!("key {i} holds a value it was never given").into());
        }
    }
    let missing_fill = (0..fill).filter(|&i| !held.contains_key(&key(i))).count();
    let before: Vec<u64> = acked
        .iter()
        .filter(|&&(_, t)| t < b.started_ms)
        .map(|&(i, _)| i)
        .collect();
    let missing = before
        .iter()
        .filter(|&&i| !held.contains_key(&key(i)))
        .count();
    let later = acked.len() - before.len();
    let later_in = acked
        .iter()
        .filter(|&&(i, t)| t >= b.started_ms && held.contains_key(&key(i)))
        .count();
    report.line(format_args!(
        "checked: {} of {fill} fill keys and {} of {} keys acknowledged before the backup \
         began are there with their values; {later_in} of {later} acknowledged after it are \
         there too; {} keys held, none unknown",
        fill as usize - missing_fill,
        before.len() - missing,
        before.len(),
        held.len()
    ));
    report.summary(&serde_json::json!({
        "fill_keys": fill,
        "fill_secs": fill_secs,
        "value_size": args.value_size,
        "groups": b.groups,
        "backup_secs": b.secs,
        "tables_copied": b.tables,
        "copied_bytes": b.copied_bytes,
        "streamed_bytes": b.streamed_bytes,
        "acked_during": acked.len(),
        "acked_before_start": before.len(),
        "restore_secs": r.secs,
        "restored_keys": r.keys,
        "restored_bytes": r.bytes,
        "missing_before_start": missing + missing_fill,
    }))?;
    if missing + missing_fill > 0 {
        return Err(format!(
            "{} acknowledged writes from before the backup are missing",
            missing + missing_fill
        )
        .into());
    }
    Ok(())
}

/// Writes keys from `next` up to `end` with `--clients` writers (a failed write is
/// tried again for a while).
async fn write(
    client: &Client,
    next: &Arc<AtomicU64>,
    end: u64,
    args: &Args,
) -> Result<(), BenchError> {
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (client, next, size) = (client.clone(), Arc::clone(next), args.value_size);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<(), String>(());
                }
                let (k, v) = (key(i), value(i, size));
                let mut tries = 0;
                while let Err(e) = client.put(&k, &v).await {
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

/// Writes new keys until `stop`; returns each acknowledged key's number and when it
/// was acknowledged (ms since the epoch). A failed write is not tried again (its key
/// may or may not be there: it is not checked either way).
async fn write_until(
    client: &Client,
    next: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
    clients: u64,
    size: usize,
) -> Result<Vec<(u64, u64)>, BenchError> {
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (client, next, stop) = (client.clone(), Arc::clone(next), Arc::clone(stop));
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if client.put(&key(i), &value(i, size)).await.is_ok() {
                    acked.push((i, now_ms()));
                }
            }
            acked
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await.map_err(|e| format!("writer task: {e}"))?);
    }
    Ok(out)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
