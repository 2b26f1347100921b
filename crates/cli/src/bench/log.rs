//! `phoenix bench log`: durable appends to the shared log store from many writers, with
//! db_bench-like flags and output so that figures line up with
//! `db_bench --benchmarks=fillrandom --sync=1 --disable_wal=0`.
//!
//! Each writer thread appends one entry per op (key_size + value_size bytes) to one of the
//! streams it owns (streams are dealt to writers round-robin; with fewer streams than
//! writers, writers share streams and take the next index under a per-stream lock) and
//! waits for the append to be acknowledged. `--naive` replaces the store with the seed 002
//! baseline: one file, every append followed by its own `fdatasync`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use phoenix_log::{Bytes, LogEntry, LogOptions, LogStore};
use phoenix_storage::{LocalFs, SharedFs, WritableFile, WriteOptions};

use super::common::{latency_histogram, latency_json, latency_summary, progress};
use super::BenchError;
use crate::output::Report;

/// Flags of `phoenix bench log`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory for the log (on the disk to measure; it is wiped first).
    #[arg(long, default_value = "/work/bench-tmp/phoenix-log")]
    pub dir: PathBuf,
    /// Number of streams (raft groups) written.
    #[arg(long, default_value_t = 16)]
    pub streams: u64,
    /// Number of queues (group-commit writers with their own files).
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Number of writer threads.
    #[arg(long, default_value_t = 16)]
    pub writers: usize,
    /// Bytes of value per entry.
    #[arg(long = "value_size", alias = "value-size", default_value_t = 128)]
    pub value_size: usize,
    /// Bytes of key per entry (added to the value, like a WAL record of a put).
    #[arg(long = "key_size", alias = "key-size", default_value_t = 16)]
    pub key_size: usize,
    /// Appends per writer (db_bench's --num is per thread too).
    #[arg(long, default_value_t = 20_000)]
    pub num: u64,
    /// Acknowledge after fdatasync (true) or after the write (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub sync: bool,
    /// Segment size in MiB.
    #[arg(long = "segment_mb", alias = "segment-mb", default_value_t = 64)]
    pub segment_mb: u64,
    /// Open segments with O_DIRECT.
    #[arg(long = "direct_io", alias = "direct-io", default_value_t = false, action = clap::ArgAction::Set)]
    pub direct_io: bool,
    /// Change the queue count to this when half of the appends are done (the store keeps
    /// running); with --verify, shows that no stream is reordered.
    #[arg(long = "resize_to", alias = "resize-to")]
    pub resize_to: Option<usize>,
    /// After the run, reopen the store and check every stream holds its entries in order.
    #[arg(long, default_value_t = false)]
    pub verify: bool,
    /// Baseline instead of the store: one file, each append then its own fdatasync.
    #[arg(long, default_value_t = false)]
    pub naive: bool,
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    if args.writers == 0 || args.streams == 0 || args.num == 0 {
        return Err("--writers, --streams and --num must be positive".into());
    }
    if args.key_size < 16 {
        return Err("--key_size must be at least 16 (it carries stream and index)".into());
    }
    let fs: SharedFs = Arc::new(LocalFs::new());
    wipe(&args.dir)?;
    let total = args.num * args.writers as u64;
    let entry_bytes = args.key_size + args.value_size;
    report.line(format_args!(
        "phoenix bench log: {} writers, {} streams, {} queues, {} B entries, {} appends, sync={}{}",
        args.writers,
        args.streams,
        args.queues,
        entry_bytes,
        total,
        args.sync,
        if args.naive {
            ", naive append+fdatasync"
        } else {
            ""
        }
    ));
    let result = if args.naive {
        run_naive(&args, &fs)?
    } else {
        run_store(&args, &fs, report)?
    };
    let secs = result.elapsed.as_secs_f64();
    let ops = total as f64 / secs;
    let mb = ops * entry_bytes as f64 / (1 << 20) as f64;
    let name = if args.naive { "naive" } else { "logappend" };
    report.line(format_args!(
        "{name:<12}: {:>10.3} micros/op {:>10.0} ops/sec {:>8.1} MB/s ({:.2} s)",
        1e6 / ops,
        ops,
        mb,
        secs
    ));
    report.line(format_args!(
        "latency     : {}",
        latency_summary(&result.hist)
    ));
    if let Some(extra) = &result.extra {
        report.text(extra);
    }
    report.summary(&serde_json::json!({
        "benchmark": "log",
        "name": name,
        "writers": args.writers,
        "streams": args.streams,
        "queues": args.queues,
        "entry_bytes": entry_bytes,
        "appends": total,
        "sync": args.sync,
        "seconds": secs,
        "micros_per_op": 1e6 / ops,
        "ops_per_sec": ops,
        "mb_per_sec": mb,
        "latency": latency_json(&result.hist),
    }))?;
    Ok(())
}

struct Outcome {
    elapsed: Duration,
    hist: Histogram<u64>,
    extra: Option<String>,
}

fn wipe(dir: &Path) -> Result<(), BenchError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("wiping {}: {e}", dir.display()).into()),
    }
}

/// Entry payload: stream and index first (checked by --verify), then filler.
fn payload(stream: u64, index: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    v[0..8].copy_from_slice(&stream.to_le_bytes());
    v[8..16].copy_from_slice(&index.to_le_bytes());
    for (i, b) in v.iter_mut().enumerate().skip(16) {
        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_add(index) as u8;
    }
    Bytes::from(v)
}

fn run_store(args: &Args, fs: &SharedFs, report: Report) -> Result<Outcome, BenchError> {
    let opts = LogOptions {
        queues: args.queues,
        segment_size: args.segment_mb << 20,
        sync: args.sync,
        direct_io: args.direct_io,
        ..LogOptions::default()
    };
    let log = LogStore::open(fs.clone(), &args.dir, opts.clone())?;
    // Give the maintenance thread a moment to prepare zero-filled segments, as a running
    // store would have.
    let warm = Instant::now();
    while log.stats().free_segments < 2 * args.queues && warm.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let streams: Vec<Mutex<u64>> = (0..args.streams).map(|_| Mutex::new(1)).collect();
    let streams = Arc::new(streams);
    let total = args.num * args.writers as u64;
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress(total, "log");
    let entry_len = args.key_size + args.value_size;
    let start = Instant::now();
    let mut threads = Vec::new();
    for w in 0..args.writers {
        let log = log.clone();
        let streams = streams.clone();
        let done = done.clone();
        let bar = bar.clone();
        let (writers, nstreams, num) = (args.writers as u64, args.streams, args.num);
        threads.push(std::thread::spawn(
            move || -> Result<Histogram<u64>, String> {
                let mut hist = latency_histogram();
                // Streams owned by this writer (or shared, when there are fewer streams).
                let mine: Vec<u64> = if nstreams >= writers {
                    (0..nstreams).filter(|s| s % writers == w as u64).collect()
                } else {
                    vec![w as u64 % nstreams]
                };
                for i in 0..num {
                    let s = mine[(i % mine.len() as u64) as usize];
                    let t0 = Instant::now();
                    let handle = {
                        let mut next = streams[s as usize]
                            .lock()
                            .map_err(|_| "stream lock poisoned".to_string())?;
                        let index = *next;
                        *next += 1;
                        log.append(
                            s,
                            vec![LogEntry::new(index, 1, payload(s, index, entry_len))],
                            None,
                        )
                    };
                    handle
                        .wait()
                        .map_err(|e| format!("append to stream {s}: {e}"))?;
                    let ns = t0.elapsed().as_nanos() as u64;
                    hist.record(ns.max(1)).map_err(|e| e.to_string())?;
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d.is_multiple_of(1024) {
                        bar.set_position(d);
                    }
                }
                Ok(hist)
            },
        ));
    }
    if let Some(n) = args.resize_to {
        while done.load(Ordering::Relaxed) < total / 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        log.set_queue_count(n)?;
        report.line(format_args!(
            "resized queues {} -> {n} at {} appends in {:.1} ms",
            args.queues,
            done.load(Ordering::Relaxed),
            t.elapsed().as_secs_f64() * 1e3
        ));
    }
    let mut hist = latency_histogram();
    for t in threads {
        let h = t.join().map_err(|_| "writer thread panicked")??;
        hist.add(&h)?;
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let st = log.stats();
    let mut extra = format!(
        "store       : {} writes, {} fdatasyncs ({:.1} appends per sync), {:.1} MiB written, {} segments",
        st.writes,
        st.syncs,
        st.appends as f64 / st.syncs.max(1) as f64,
        st.bytes_written as f64 / (1 << 20) as f64,
        st.segments
    );
    log.close()?;
    drop(log);
    if args.verify {
        let t = Instant::now();
        let log = LogStore::open(fs.clone(), &args.dir, opts)?;
        let mut checked = 0u64;
        for (s, next) in streams.iter().enumerate() {
            let s = s as u64;
            let last = *next.lock().map_err(|_| "stream lock poisoned")? - 1;
            if last == 0 {
                continue;
            }
            let got = log.read(s, 1..last + 1)?;
            if got.len() as u64 != last {
                return Err(format!("stream {s}: {} entries, expected {last}", got.len()).into());
            }
            for (i, e) in got.iter().enumerate() {
                let index = i as u64 + 1;
                if e.index != index || e.data != payload(s, index, entry_len) {
                    return Err(
                        format!("stream {s}: entry {index} is wrong or out of order").into(),
                    );
                }
            }
            checked += last;
        }
        extra.push_str(&format!(
            "\nverify      : reopened in {:.0} ms, {checked} entries of {} streams in order",
            t.elapsed().as_secs_f64() * 1e3,
            args.streams
        ));
    }
    Ok(Outcome {
        elapsed,
        hist,
        extra: Some(extra),
    })
}

fn run_naive(args: &Args, fs: &SharedFs) -> Result<Outcome, BenchError> {
    fs.create_dir_all(&args.dir)?;
    let file: Box<dyn WritableFile> =
        fs.create(&args.dir.join("naive.log"), WriteOptions::default())?;
    let file = Arc::new(Mutex::new(file));
    let total = args.num * args.writers as u64;
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress(total, "naive");
    let entry_len = args.key_size + args.value_size;
    let start = Instant::now();
    let mut threads = Vec::new();
    for w in 0..args.writers {
        let file = file.clone();
        let done = done.clone();
        let bar = bar.clone();
        let (num, sync) = (args.num, args.sync);
        threads.push(std::thread::spawn(
            move || -> Result<Histogram<u64>, String> {
                let mut hist = latency_histogram();
                for i in 0..num {
                    let data = payload(w as u64, i, entry_len);
                    let mut rec = Vec::with_capacity(4 + data.len());
                    rec.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    rec.extend_from_slice(&data);
                    let t0 = Instant::now();
                    {
                        let mut f = file.lock().map_err(|_| "file lock poisoned".to_string())?;
                        f.append(&rec).map_err(|e| e.to_string())?;
                        if sync {
                            f.sync_data().map_err(|e| e.to_string())?;
                        }
                    }
                    hist.record((t0.elapsed().as_nanos() as u64).max(1))
                        .map_err(|e| e.to_string())?;
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d.is_multiple_of(256) {
                        bar.set_position(d);
                    }
                }
                Ok(hist)
            },
        ));
    }
    let mut hist = latency_histogram();
    for t in threads {
        let h = t.join().map_err(|_| "writer thread panicked")??;
        hist.add(&h)?;
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(Outcome {
        elapsed,
        hist,
        extra: None,
    })
}
