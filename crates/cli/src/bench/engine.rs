//! `phoenix bench engine`: the LSM engine alone, driven like RocksDB's `db_bench` (same
//! flags, same key layout, same benchmark semantics, same output line) so the two can be
//! run side by side with one set of flags.
//!
//! Semantics (as db_bench 7.x):
//! - Keys: `key_size` bytes. With `--key_layout=db_bench`, exactly db_bench's: the key
//!   number as 8 bytes big-endian, padded with `'0'`. With the default
//!   `--key_layout=group`, PhoenixKV's layout at the same length: an 8-byte group id, then
//!   the key number big-endian in the remaining bytes (at most 8), padded with `'0'`; the
//!   `num` keys are split into `--groups` contiguous groups. (db_bench's layout makes every
//!   key its own replication group, which is not PhoenixKV's workload: the engine cuts
//!   files at group boundaries from L1 down.)
//! - Values: `value_size`-byte slices of a 1 MiB buffer that compresses to about
//!   `compression_ratio` (random printable runs, each repeated).
//! - Random keys: thread i of the run draws from `--seed` + i, salted per read
//!   benchmark, so a read run in a separate process does not seek exactly the keys a
//!   fill with the same seed wrote.
//! - Every thread runs the whole benchmark: `fill*`/`overwrite` write `num` keys per
//!   thread, reads do `reads` (default `num`) operations per thread.
//! - `fillseq`, `fillrandom`: start from an empty database (the directory is wiped unless
//!   `--use_existing_db`). `fillseq` writes keys 0..num in order; `fillrandom` and
//!   `overwrite` write uniformly random keys in 0..num, one key per write batch.
//! - `readrandom`: point reads of random keys; "found" counts hits.
//! - `readseq`: one iterator per thread from the first key, `reads` steps at most.
//! - `multireadrandom`: `multi_get` of `--batch_size` keys per operation, random ones or,
//!   with `--multiread_stride S`, S key numbers apart from a random first; "found" counts
//!   keys.
//! - `seekrandom`: a fresh iterator per operation seeks to a random key; "found" counts
//!   seeks landing exactly on it. With `--prefix_size P --keys_per_prefix K` (db_bench
//!   layout) every key starts with its prefix number in P bytes, and
//!   `--prefix_same_as_start` keeps each listing within the sought key's prefix. Then `--seek_nexts` steps forward while valid (a
//!   listing: seek, then N nexts; each key and value read counts in MB/s). With
//!   `--max_scan_distance D` the iterator's upper bound is the key D numbers past the
//!   sought one (capped at `num`), as db_bench sets `iterate_upper_bound`.
//! - Output: `name : X micros/op Y ops/sec T seconds N operations; Z MB/s (extra)` where
//!   micros/op is per thread (summed thread time / operations) and ops/sec is over the
//!   wall-clock span of all threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use phoenix_engine::table::{Compression, TableOptions};
use phoenix_engine::{
    Db, FlashCache, ObjectTableStore, Options, ReadOptions, SharedTableStore, TableStore, WalMode,
    WriteOptions,
};
use phoenix_storage::{LocalFs, SharedFs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::common::{latency_histogram, latency_json, latency_summary, progress};
use super::BenchError;
use crate::output::Report;

/// Flags of `phoenix bench engine` (db_bench's names and defaults).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Comma-separated benchmarks: fillseq, fillrandom, overwrite, readrandom, readseq,
    /// seekrandom, multireadrandom, compact (everything compacted down, as db_bench's),
    /// waitforcompaction (until flushes and due compactions are done, as db_bench's),
    /// stats.
    #[arg(
        long = "benchmarks",
        default_value = "fillseq,fillrandom,overwrite,readrandom,readseq,seekrandom"
    )]
    benchmarks: String,
    /// Keys per thread for writes, and the key space.
    #[arg(long = "num", default_value_t = 1_000_000)]
    num: u64,
    /// Operations per thread for reads (-1: num).
    #[arg(long = "reads", default_value_t = -1, allow_hyphen_values = true)]
    reads: i64,
    /// Threads running each benchmark at once.
    #[arg(long = "threads", default_value_t = 1)]
    threads: usize,
    /// Key length in bytes (at least 8).
    #[arg(long = "key_size", default_value_t = 16)]
    key_size: usize,
    /// Value length in bytes.
    #[arg(long = "value_size", default_value_t = 100)]
    value_size: usize,
    /// Sync the WAL on every write.
    #[arg(long = "sync", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    sync: bool,
    /// Write without a WAL (the engine runs in WAL-off mode).
    #[arg(long = "disable_wal", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    disable_wal: bool,
    /// Bloom filter bits per key (negative or 0: no filter).
    #[arg(long = "bloom_bits", default_value_t = -1, allow_hyphen_values = true)]
    bloom_bits: i64,
    /// Block cache bytes (0 or negative: none).
    #[arg(long = "cache_size", default_value_t = 8 << 20, allow_hyphen_values = true)]
    cache_size: i64,
    /// Memtable bytes before a flush.
    #[arg(long = "write_buffer_size", default_value_t = 64 << 20)]
    write_buffer_size: usize,
    /// Memtables held at most (mutable + immutable).
    #[arg(long = "max_write_buffer_number", default_value_t = 2)]
    max_write_buffer_number: usize,
    /// Background threads (flush + compaction).
    #[arg(long = "max_background_jobs", default_value_t = 2)]
    max_background_jobs: usize,
    /// Data block size in bytes.
    #[arg(long = "block_size", default_value_t = 4096)]
    block_size: usize,
    /// none, lz4 or zstd.
    #[arg(long = "compression_type", default_value = "none")]
    compression_type: String,
    /// How far values compress (fraction of their size kept).
    #[arg(long = "compression_ratio", default_value_t = 0.5)]
    compression_ratio: f64,
    /// Database directory.
    #[arg(long = "db", default_value = "/tmp/phoenixbench")]
    db: PathBuf,
    /// Keep the tables and manifest on an S3 server instead of in `--db` (which keeps the
    /// lock and the WAL): s3://bucket/prefix?endpoint=http://host:port, credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; `&added_latency_ms=1` delays every
    /// request (a store on loopback measured as one across a network).
    #[arg(long = "sst_store")]
    sst_store: Option<String>,
    /// Bytes of local flash cache (in `--db`, flash/) under the block cache for the tables
    /// on `--sst_store`; 0: none.
    #[arg(long = "flash_cache_size", default_value_t = 0, requires = "sst_store")]
    flash_cache_size: u64,
    /// Hand background compactions to a compaction worker (`phoenix compactor`,
    /// host:port) serving the bucket of `--sst_store`; it is called without a token.
    #[arg(long = "compactor", requires = "sst_store")]
    compactor: Option<String>,
    /// Keep the database found in `--db` for fill benchmarks instead of wiping it.
    #[arg(long = "use_existing_db", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    use_existing_db: bool,
    /// Key layout: `group` (8-byte group id, then the key number) or `db_bench` (the key
    /// number first, as db_bench writes it).
    #[arg(long = "key_layout", default_value = "group")]
    key_layout: String,
    /// Groups the key space is split into (contiguous ranges), with `--key_layout=group`.
    #[arg(long = "groups", default_value_t = 1)]
    groups: u64,
    /// The engine's `min_group_file_size` (bytes): from L1 down, a file is cut at a group
    /// boundary only once it holds this much. Default: 0 (every boundary) with
    /// `--key_layout=group`, 1 MiB with `--key_layout=db_bench` (every key is a group).
    #[arg(long = "min_group_file_size")]
    min_group_file_size: Option<u64>,
    /// The engine's `compaction_piece_bytes`: a compaction installs its work in pieces
    /// of about this many input bytes, freeing their inputs as it goes (0: one edit at
    /// its end). Default: the engine's (8 MiB).
    #[arg(long = "compaction_piece_bytes")]
    compaction_piece_bytes: Option<u64>,
    /// Seed of the key generators (thread i uses seed + i).
    #[arg(long = "seed", default_value_t = 301)]
    seed: u64,
    /// seekrandom: steps forward after each seek (while the iterator is valid).
    #[arg(long = "seek_nexts", default_value_t = 0)]
    seek_nexts: u64,
    /// multireadrandom: keys per `multi_get` call.
    #[arg(long = "batch_size", default_value_t = 10)]
    batch_size: usize,
    /// multireadrandom: the keys of a call are this many key numbers apart, from a
    /// random first (0: each key random).
    #[arg(long = "multiread_stride", default_value_t = 0)]
    multiread_stride: u64,
    /// Tables on the object store read side by side (`true`, the engine's default) or
    /// one after the other (`false`): multireadrandom's blocks of one table, seekrandom's
    /// tables of one seek.
    #[arg(long = "parallel_io", default_value_t = true, action = clap::ArgAction::Set)]
    parallel_io: bool,
    /// Iterators on the object store read ahead of a forward scan, more as it goes on,
    /// up to this many bytes per request (0: block by block). Default: the engine's
    /// (256 KiB).
    #[arg(long = "readahead_max")]
    readahead_max: Option<usize>,
    /// Compactions on the object store read their inputs this many bytes per request
    /// (0: block by block; RocksDB's `compaction_readahead_size`). Default: the
    /// engine's (2 MiB).
    #[arg(long = "compaction_readahead_size")]
    compaction_readahead_size: Option<usize>,
    /// seekrandom: upper bound of each iterator, in key numbers past the sought key
    /// (0: unbounded).
    #[arg(long = "max_scan_distance", default_value_t = 0)]
    max_scan_distance: u64,
    /// The prefix extractor's length in bytes (0: none); with `--bloom_bits`, tables
    /// carry prefix filters.
    #[arg(long = "prefix_size", default_value_t = 0)]
    prefix_size: usize,
    /// Keys per prefix, with `--key_layout=db_bench`: each key starts with its prefix
    /// number (key number modulo num / keys_per_prefix) in `--prefix_size` bytes
    /// (0: no prefix in the key).
    #[arg(long = "keys_per_prefix", default_value_t = 0)]
    keys_per_prefix: u64,
    /// seekrandom: each seek returns only keys with the sought key's prefix, skipping
    /// tables whose prefix filter rules it out (needs `--prefix_size`).
    #[arg(long = "prefix_same_as_start", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    prefix_same_as_start: bool,
    /// With `--prefix_size`, each memtable's prefix filter takes this fraction of
    /// `--write_buffer_size` (0: none).
    #[arg(long = "memtable_bloom_size_ratio", default_value_t = 0.0)]
    memtable_bloom_size_ratio: f64,
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("expected true/false/1/0, got {s}")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bench {
    FillSeq,
    FillRandom,
    Overwrite,
    ReadRandom,
    ReadSeq,
    SeekRandom,
    MultiReadRandom,
    Compact,
    WaitForCompaction,
    Stats,
}

impl Bench {
    fn parse(name: &str) -> Result<Bench, BenchError> {
        Ok(match name {
            "fillseq" => Bench::FillSeq,
            "fillrandom" => Bench::FillRandom,
            "overwrite" => Bench::Overwrite,
            "readrandom" => Bench::ReadRandom,
            "readseq" => Bench::ReadSeq,
            "seekrandom" => Bench::SeekRandom,
            "multireadrandom" => Bench::MultiReadRandom,
            "compact" => Bench::Compact,
            "waitforcompaction" => Bench::WaitForCompaction,
            "stats" => Bench::Stats,
            other => return Err(format!("unknown benchmark {other:?}").into()),
        })
    }

    fn fresh_db(self) -> bool {
        matches!(self, Bench::FillSeq | Bench::FillRandom)
    }
}

/// What one thread did.
#[derive(Debug, Default)]
struct ThreadStats {
    done: u64,
    bytes: u64,
    found: u64,
    start: Option<Instant>,
    finish: Option<Instant>,
    /// Each operation's latency, in nanoseconds (none before the first).
    latency: Option<hdrhistogram::Histogram<u64>>,
}

impl ThreadStats {
    /// Counts one operation begun at `began`.
    fn record(&mut self, began: Instant) {
        self.done += 1;
        let ns = began.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.latency
            .get_or_insert_with(latency_histogram)
            .saturating_record(ns.max(1));
    }
}

/// A db_bench-style value source: a 1 MiB buffer of runs that compress to about `ratio`.
struct ValueGen {
    data: Vec<u8>,
    pos: usize,
}

impl ValueGen {
    fn new(value_size: usize, ratio: f64, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let len = (1usize << 20).max(value_size * 2);
        let mut data = Vec::with_capacity(len + 100);
        while data.len() < len {
            // A 100-byte piece made of `ratio * 100` random printable bytes repeated.
            let raw = ((100.0 * ratio) as usize).clamp(1, 100);
            let piece: Vec<u8> = (0..raw).map(|_| rng.gen_range(b' '..=b'~')).collect();
            for i in 0..100 {
                data.push(piece[i % raw]);
            }
        }
        ValueGen { data, pos: 0 }
    }

    fn next(&mut self, len: usize) -> &[u8] {
        if self.pos + len > self.data.len() {
            self.pos = 0;
        }
        self.pos += len;
        &self.data[self.pos - len..self.pos]
    }
}

/// Writes key number `v` into `buf` the way db_bench does.
fn make_key(buf: &mut [u8], v: u64) {
    let n = buf.len().min(8);
    let be = v.to_be_bytes();
    buf[..n].copy_from_slice(&be[8 - n..]);
    for b in &mut buf[n..] {
        *b = b'0';
    }
}

/// How key numbers become keys.
#[derive(Clone, Copy, Debug)]
enum KeyLayout {
    /// db_bench's: the number first, after its prefix number (in `prefix_size` bytes)
    /// when keys have prefixes.
    DbBench { prefix_size: usize, num_prefix: u64 },
    /// PhoenixKV's: a group id over `groups` contiguous ranges of `num`, then the number.
    Group { groups: u64, num: u64 },
}

impl KeyLayout {
    fn write(self, buf: &mut [u8], v: u64) {
        match self {
            KeyLayout::DbBench { prefix_size: 0, .. } => make_key(buf, v),
            KeyLayout::DbBench {
                prefix_size,
                num_prefix,
            } => {
                // As db_bench: the prefix number big-endian in the first min(size, 8)
                // bytes, '0' after that, then the key number.
                let (head, tail) = buf.split_at_mut(prefix_size);
                let n = prefix_size.min(8);
                head[..n].copy_from_slice(&(v % num_prefix.max(1)).to_be_bytes()[8 - n..]);
                head[n..].fill(b'0');
                make_key(tail, v);
            }
            KeyLayout::Group { groups, num } => {
                // Widened so that v * groups cannot overflow.
                let g = (u128::from(v) * u128::from(groups) / u128::from(num.max(1))) as u64;
                let (head, tail) = buf.split_at_mut(8);
                head.copy_from_slice(&(g + 1).to_be_bytes());
                make_key(tail, v);
            }
        }
    }
}

struct Ctx<'a> {
    args: &'a Args,
    layout: KeyLayout,
    db: Arc<Db>,
    wo: WriteOptions,
    reads: u64,
}

fn run_thread(
    ctx: &Ctx<'_>,
    bench: Bench,
    tid: u64,
    bar: &ProgressBar,
) -> Result<ThreadStats, BenchError> {
    let args = ctx.args;
    // `tid` counts threads over the whole run (as db_bench's seeds do), and reads salt
    // the seed with the benchmark, so a read does not replay the key sequence of the fill
    // before it, in this run or in an earlier one with the same `--seed`.
    let salt: u64 = match bench {
        Bench::ReadRandom => 0x7265_6164,
        Bench::SeekRandom => 0x7365_656b,
        Bench::MultiReadRandom => 0x6d67_6574,
        _ => 0,
    };
    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(tid) ^ (salt << 32));
    let mut values = ValueGen::new(
        args.value_size,
        args.compression_ratio,
        args.seed ^ 0x5eed ^ tid,
    );
    let mut key = vec![0u8; args.key_size];
    let mut st = ThreadStats {
        start: Some(Instant::now()),
        ..ThreadStats::default()
    };
    const TICK: u64 = 1024;
    let ro = ReadOptions {
        prefix_same_as_start: args.prefix_same_as_start,
        parallel_io: args.parallel_io,
        readahead_max: args
            .readahead_max
            .unwrap_or(ReadOptions::default().readahead_max),
        ..ReadOptions::default()
    };
    match bench {
        Bench::FillSeq | Bench::FillRandom | Bench::Overwrite => {
            for i in 0..args.num {
                let k = if bench == Bench::FillSeq {
                    i
                } else {
                    rng.gen_range(0..args.num)
                };
                ctx.layout.write(&mut key, k);
                let v = values.next(args.value_size);
                let began = Instant::now();
                ctx.db.put(&ctx.wo, &key, v)?;
                st.record(began);
                st.bytes += (key.len() + v.len()) as u64;
                if st.done.is_multiple_of(TICK) {
                    bar.inc(TICK);
                }
            }
        }
        Bench::ReadRandom => {
            for _ in 0..ctx.reads {
                ctx.layout.write(&mut key, rng.gen_range(0..args.num));
                let began = Instant::now();
                if let Some(v) = ctx.db.get(&ro, &key)? {
                    st.found += 1;
                    st.bytes += (key.len() + v.len()) as u64;
                }
                st.record(began);
                if st.done.is_multiple_of(TICK) {
                    bar.inc(TICK);
                }
            }
        }
        Bench::ReadSeq => {
            let mut it = ctx.db.iter(&ro)?;
            it.seek_to_first();
            while it.valid() && st.done < ctx.reads {
                st.bytes += (it.key().len() + it.value().len()) as u64;
                st.done += 1;
                if st.done.is_multiple_of(TICK) {
                    bar.inc(TICK);
                }
                it.next();
            }
            it.status()?;
        }
        Bench::SeekRandom => {
            let mut bound = vec![0u8; args.key_size];
            for _ in 0..ctx.reads {
                let at = rng.gen_range(0..args.num);
                ctx.layout.write(&mut key, at);
                let began = Instant::now();
                let mut it = if args.max_scan_distance > 0 {
                    let end = args.num.min(at.saturating_add(args.max_scan_distance));
                    ctx.layout.write(&mut bound, end);
                    let bounded = ReadOptions {
                        upper_bound: Some(bound.clone()),
                        ..ro.clone()
                    };
                    ctx.db.iter(&bounded)?
                } else {
                    ctx.db.iter(&ro)?
                };
                it.seek(&key);
                if it.valid() && it.key() == key.as_slice() {
                    st.found += 1;
                }
                // As db_bench: `seek_nexts` steps, each reading the entry it leaves.
                for _ in 0..args.seek_nexts {
                    if !it.valid() {
                        break;
                    }
                    st.bytes += (it.key().len() + it.value().len()) as u64;
                    it.next();
                }
                it.status()?;
                drop(it);
                st.record(began);
                if st.done.is_multiple_of(TICK) {
                    bar.inc(TICK);
                }
            }
        }
        Bench::MultiReadRandom => {
            // `batch_size` keys a call: random ones, or with `multiread_stride` a run
            // of keys that far apart from a random first.
            let batch = args.batch_size.max(1) as u64;
            let mut keys = vec![vec![0u8; args.key_size]; batch as usize];
            for _ in 0..ctx.reads {
                let first = rng.gen_range(0..args.num);
                for (i, k) in keys.iter_mut().enumerate() {
                    let n = if args.multiread_stride > 0 {
                        first.wrapping_add((i as u64).wrapping_mul(args.multiread_stride))
                            % args.num
                    } else {
                        rng.gen_range(0..args.num)
                    };
                    ctx.layout.write(k, n);
                }
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let began = Instant::now();
                let got = ctx.db.multi_get(&ro, &refs)?;
                st.record(began);
                for (k, v) in refs.iter().zip(&got) {
                    if let Some(v) = v {
                        st.found += 1;
                        st.bytes += (k.len() + v.len()) as u64;
                    }
                }
                if st.done.is_multiple_of(TICK) {
                    bar.inc(TICK);
                }
            }
        }
        Bench::Compact | Bench::WaitForCompaction | Bench::Stats => {}
    }
    st.finish = Some(Instant::now());
    Ok(st)
}

fn engine_options(args: &Args) -> Result<Options, BenchError> {
    let compression = match args.compression_type.as_str() {
        "none" | "None" | "no" => Compression::None,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => {
            return Err(
                format!("compression_type {other:?} is not supported (none, lz4, zstd)").into(),
            );
        }
    };
    Ok(Options {
        create_if_missing: true,
        write_buffer_size: args.write_buffer_size,
        max_write_buffer_number: args.max_write_buffer_number,
        max_background_jobs: args.max_background_jobs,
        table: TableOptions {
            block_size: args.block_size,
            bloom_bits_per_key: u32::try_from(args.bloom_bits.max(0)).unwrap_or(0),
            compression,
            prefix_len: args.prefix_size,
            ..TableOptions::default()
        },
        block_cache_size: usize::try_from(args.cache_size.max(0)).unwrap_or(0),
        memtable_prefix_bloom_size_ratio: args.memtable_bloom_size_ratio,
        wal: if args.disable_wal {
            WalMode::None
        } else {
            WalMode::Log
        },
        min_group_file_size: args
            .min_group_file_size
            .unwrap_or(if args.key_layout == "db_bench" {
                1 << 20
            } else {
                0
            }),
        compaction_piece_bytes: args
            .compaction_piece_bytes
            .unwrap_or(Options::default().compaction_piece_bytes),
        compaction_readahead_bytes: args
            .compaction_readahead_size
            .unwrap_or(Options::default().compaction_readahead_bytes),
        ..Options::default()
    })
}

/// Where the database lives: its directory, and the store of its tables when not there.
struct Target<'a> {
    fs: SharedFs,
    dir: &'a Path,
    store: Option<Arc<ObjectTableStore>>,
    flash_cache_size: u64,
    /// The store's flash cache, once opened (in the directory, after a wipe).
    flash: std::sync::OnceLock<Arc<FlashCache>>,
}

impl Target<'_> {
    fn open(&self, opts: &Options) -> Result<Arc<Db>, BenchError> {
        if let (Some(store), true) = (&self.store, self.flash_cache_size > 0) {
            if self.flash.get().is_none() {
                let cache = FlashCache::open(
                    Arc::clone(&self.fs),
                    &self.dir.join("flash"),
                    self.flash_cache_size,
                )?;
                store.set_flash_cache(Arc::clone(&cache))?;
                let _ = self.flash.set(cache);
            }
        }
        Ok(match &self.store {
            None => Db::open(Arc::clone(&self.fs), self.dir, opts.clone())?,
            Some(store) => Db::open_with_store(
                Arc::clone(&self.fs),
                self.dir,
                Arc::clone(store) as SharedTableStore,
                opts.clone(),
            )?,
        })
    }

    /// Removes the database (its directory, and what the store holds of it). The flash
    /// cache stays (it is open): its pages of removed tables age out. A table made
    /// again with the same bytes has the same ETag (an MD5) and finds its pages there:
    /// right bytes, but a "cold" read is then warm; start from a fresh `--db` for one.
    fn wipe(&self) -> Result<(), BenchError> {
        let wipe_err = |e: std::io::Error| format!("wiping {}: {e}", self.dir.display());
        let entries = match std::fs::read_dir(self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return self.destroy_store(),
            Err(e) => return Err(wipe_err(e).into()),
        };
        for entry in entries {
            let entry = entry.map_err(wipe_err)?;
            if self.store.is_some() && entry.file_name() == "flash" {
                continue;
            }
            let path = entry.path();
            let removed = if entry.file_type().map_err(wipe_err)?.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(wipe_err)?;
        }
        self.destroy_store()
    }

    fn destroy_store(&self) -> Result<(), BenchError> {
        if let Some(store) = &self.store {
            store.destroy()?;
        }
        Ok(())
    }
}

/// Prints db_bench's line for one benchmark and returns the same figures as JSON.
fn report(out: Report, name: &str, stats: &[ThreadStats]) -> serde_json::Value {
    let done: u64 = stats.iter().map(|s| s.done).sum();
    let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
    let found: u64 = stats.iter().map(|s| s.found).sum();
    let thread_secs: f64 = stats
        .iter()
        .filter_map(|s| Some(s.finish?.duration_since(s.start?).as_secs_f64()))
        .sum();
    let start = stats.iter().filter_map(|s| s.start).min();
    let finish = stats.iter().filter_map(|s| s.finish).max();
    let elapsed = match (start, finish) {
        (Some(s), Some(f)) => f.duration_since(s),
        _ => Duration::ZERO,
    }
    .as_secs_f64()
    .max(1e-9);
    let micros = if done > 0 {
        thread_secs * 1e6 / done as f64
    } else {
        0.0
    };
    let rate = if bytes > 0 {
        format!(" {:6.1} MB/s", bytes as f64 / 1048576.0 / elapsed)
    } else {
        String::new()
    };
    let extra = match name {
        "readrandom" | "seekrandom" => format!(" ({found} of {done} found)"),
        "multireadrandom" => format!(" ({found} keys found)"),
        _ => String::new(),
    };
    let mut latency = latency_histogram();
    for h in stats.iter().filter_map(|s| s.latency.as_ref()) {
        // (Same bounds: adding cannot fail.)
        let _ = latency.add(h);
    }
    let ops_per_sec = (done as f64 / elapsed) as u64;
    out.line(format_args!(
        "{name:<12} : {micros:11.3} micros/op {ops_per_sec} ops/sec {elapsed:.3} seconds {done} operations;{rate}{extra}"
    ));
    if !latency.is_empty() {
        out.line(format_args!(
            "{:<12}   latency {}",
            "",
            latency_summary(&latency)
        ));
    }
    let mut v = serde_json::json!({
        "name": name,
        "micros_per_op": micros,
        "ops_per_sec": ops_per_sec,
        "seconds": elapsed,
        "operations": done,
    });
    if bytes > 0 {
        v["mb_per_sec"] = (bytes as f64 / 1048576.0 / elapsed).into();
    }
    if !latency.is_empty() {
        v["latency"] = latency_json(&latency);
    }
    if matches!(name, "readrandom" | "seekrandom" | "multireadrandom") {
        v["found"] = found.into();
    }
    v
}

/// Runs the benchmark.
pub fn run(args: Args, out: Report) -> Result<(), BenchError> {
    let layout = match args.key_layout.as_str() {
        "db_bench" if args.keys_per_prefix > 0 => {
            if args.prefix_size == 0 || args.key_size <= args.prefix_size {
                return Err(
                    "keys_per_prefix needs 0 < prefix_size < key_size (db_bench layout)".into(),
                );
            }
            KeyLayout::DbBench {
                prefix_size: args.prefix_size,
                num_prefix: (args.num / args.keys_per_prefix).max(1),
            }
        }
        "db_bench" if args.key_size >= 8 => KeyLayout::DbBench {
            prefix_size: 0,
            num_prefix: 0,
        },
        _ if args.keys_per_prefix > 0 => {
            return Err("keys_per_prefix needs --key_layout=db_bench".into())
        }
        "group" if args.key_size >= 9 && args.groups > 0 => KeyLayout::Group {
            groups: args.groups,
            num: args.num,
        },
        "db_bench" | "group" => return Err(
            "key_size must be at least 8 (db_bench layout) or 9 (group layout), groups positive"
                .into(),
        ),
        other => return Err(format!("unknown key_layout {other:?} (group, db_bench)").into()),
    };
    if args.threads == 0 || args.num == 0 {
        return Err("threads and num must be positive".into());
    }
    if args.prefix_same_as_start && args.prefix_size == 0 {
        return Err("prefix_same_as_start needs --prefix_size".into());
    }
    let benches = args
        .benchmarks
        .split(',')
        .filter(|s| !s.is_empty())
        .map(Bench::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let mut opts = engine_options(&args)?;
    if let (Some(addr), Some(url)) = (&args.compactor, &args.sst_store) {
        opts.compaction_service = Some(Arc::new(phoenix_server::compactor::RemoteCompactor::new(
            addr,
            url,
            phoenix_proto::security::Credentials::default(),
            Duration::from_secs(30 * 60),
        )?));
    }
    let reads = if args.reads < 0 {
        args.num
    } else {
        args.reads as u64
    };
    let target = Target {
        fs: Arc::new(LocalFs::new()),
        dir: &args.db,
        store: match &args.sst_store {
            Some(url) => Some(Arc::new(ObjectTableStore::from_url(url)?)),
            None => None,
        },
        flash_cache_size: args.flash_cache_size,
        flash: std::sync::OnceLock::new(),
    };
    out.line(format_args!("PhoenixKV engine benchmark"));
    out.line(format_args!("Keys:       {} bytes each", args.key_size));
    out.line(format_args!("Values:     {} bytes each", args.value_size));
    out.line(format_args!("Entries:    {}", args.num));
    out.line(format_args!(
        "Key layout: {}{}",
        args.key_layout,
        if matches!(layout, KeyLayout::Group { .. }) {
            format!(" ({} groups)", args.groups)
        } else {
            String::new()
        }
    ));
    if args.prefix_size > 0 {
        out.line(format_args!(
            "Prefix:     {} bytes, {} keys per prefix{}",
            args.prefix_size,
            args.keys_per_prefix,
            if args.prefix_same_as_start {
                ", seeks stay in their prefix"
            } else {
                ""
            }
        ));
    }
    out.line(format_args!("Threads:    {}", args.threads));
    out.line(format_args!(
        "WAL:        {}{}",
        if args.disable_wal { "off" } else { "on" },
        if args.sync { ", sync" } else { "" }
    ));
    out.line(format_args!(
        "Bloom bits: {}, block cache: {} bytes, write buffer: {} bytes, compression: {}",
        args.bloom_bits, args.cache_size, args.write_buffer_size, args.compression_type
    ));
    out.line(format_args!("DB path:    [{}]", args.db.display()));
    if let Some(store) = &target.store {
        out.line(format_args!("Tables in:  [{}]", store.location().display()));
    }
    if let Some(addr) = &args.compactor {
        out.line(format_args!("Compactor:  [{addr}]"));
    }
    out.line(format_args!(
        "------------------------------------------------"
    ));

    let wo = WriteOptions {
        sync: args.sync,
        disable_wal: args.disable_wal,
    };
    let mut db: Option<Arc<Db>> = None;
    let mut threads_started = 0u64;
    let mut summaries = Vec::new();
    for (i, bench) in benches.iter().enumerate() {
        let name = args
            .benchmarks
            .split(',')
            .filter(|s| !s.is_empty())
            .nth(i)
            .unwrap_or("?");
        if *bench == Bench::Compact {
            let d = match &db {
                Some(d) => Arc::clone(d),
                None => {
                    let d = target.open(&opts)?;
                    db = Some(Arc::clone(&d));
                    d
                }
            };
            let t = Instant::now();
            d.compact_range(None, None)?;
            let seconds = t.elapsed().as_secs_f64();
            out.line(format_args!(
                "compact      : {seconds:.3} seconds (every file compacted down to one level)"
            ));
            summaries.push(serde_json::json!({ "name": "compact", "seconds": seconds }));
            continue;
        }
        if *bench == Bench::WaitForCompaction {
            let d = match &db {
                Some(d) => Arc::clone(d),
                None => {
                    let d = target.open(&opts)?;
                    db = Some(Arc::clone(&d));
                    d
                }
            };
            let (t, cpu0) = (Instant::now(), super::common::cpu_secs("self")?);
            d.wait_for_background_work()?;
            let seconds = t.elapsed().as_secs_f64();
            let cpu = super::common::cpu_secs("self")? - cpu0;
            out.line(format_args!(
                "waitforcompaction : {seconds:.3} seconds ({cpu:.2} CPU seconds in this process)"
            ));
            summaries.push(
                serde_json::json!({ "name": "waitforcompaction", "seconds": seconds, "cpu_secs": cpu }),
            );
            continue;
        }
        if *bench == Bench::Stats {
            if db.is_none() {
                db = Some(target.open(&opts)?);
            }
            if let Some(d) = &db {
                print_stats(out, d);
            }
            if let Some(f) = target.flash.get() {
                let s = f.stats();
                out.line(format_args!(
                    "  flash cache: {:.1} MiB held, {} hits, {} misses, {} pages written, {} corrupt",
                    s.bytes as f64 / 1048576.0,
                    s.hits,
                    s.misses,
                    s.inserts,
                    s.corrupt
                ));
            }
            continue;
        }
        if bench.fresh_db() && !args.use_existing_db {
            if let Some(d) = db.take() {
                d.close()?;
            }
            target.wipe()?;
        }
        let handle = match &db {
            Some(d) => Arc::clone(d),
            None => {
                let d = target.open(&opts)?;
                db = Some(Arc::clone(&d));
                d
            }
        };
        let per_thread = match bench {
            Bench::FillSeq | Bench::FillRandom | Bench::Overwrite => args.num,
            _ => reads,
        };
        let bar = progress(per_thread * args.threads as u64, name);
        let ctx = Ctx {
            args: &args,
            layout,
            db: handle,
            wo,
            reads,
        };
        let cpu0 = super::common::cpu_secs("self")?;
        let first_tid = threads_started;
        threads_started += args.threads as u64;
        let results: Vec<Result<ThreadStats, BenchError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..args.threads as u64)
                .map(|t| {
                    let ctx = &ctx;
                    let bar = &bar;
                    s.spawn(move || run_thread(ctx, *bench, first_tid + t, bar))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("benchmark thread panicked".into()))
                })
                .collect()
        });
        bar.finish_and_clear();
        let stats = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        let mut summary = report(out, name, &stats);
        // Everything this process spent meanwhile: the benchmark's threads and the
        // engine's flushes and compactions (those a worker ran are not here).
        let cpu = super::common::cpu_secs("self")? - cpu0;
        out.line(format_args!(
            "{:<12} : {cpu:.2} CPU seconds in this process",
            ""
        ));
        if let Some(o) = summary.as_object_mut() {
            o.insert("cpu_secs".into(), serde_json::json!(cpu));
        }
        summaries.push(summary);
    }
    if let Some(d) = db {
        d.close()?;
    }
    out.summary(&serde_json::json!({
        "benchmark": "engine",
        "key_bytes": args.key_size,
        "value_bytes": args.value_size,
        "entries": args.num,
        "threads": args.threads,
        "db": args.db.display().to_string(),
        "results": summaries,
    }))?;
    Ok(())
}

fn print_stats(out: Report, db: &Db) {
    let s = db.stats();
    out.line(format_args!("Engine stats:"));
    for (i, l) in s.levels.iter().enumerate() {
        if l.files > 0 {
            out.line(format_args!(
                "  L{i}: {} files, {:.1} MiB",
                l.files,
                l.bytes as f64 / 1048576.0
            ));
        }
    }
    out.line(format_args!(
        "  flushes {}, compactions {} ({} trivial moves, {} on a worker, {} failed there), write amplification {:.2}",
        s.flushes,
        s.compactions,
        s.trivial_moves,
        s.remote_compactions,
        s.remote_compaction_fallbacks,
        s.write_amplification
    ));
    out.line(format_args!(
        "  stalls {} ({:.1} ms), slowdowns {}, block cache {:.1} MiB",
        s.stall_count,
        s.stall_micros as f64 / 1000.0,
        s.slowdown_count,
        s.block_cache_usage as f64 / 1048576.0
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_db_bench_layout() {
        let mut k = vec![0u8; 16];
        make_key(&mut k, 0x0102);
        assert_eq!(&k, b"\0\0\0\0\0\0\x01\x0200000000");
        let mut a = vec![0u8; 16];
        let mut b = vec![0u8; 16];
        make_key(&mut a, 255);
        make_key(&mut b, 256);
        assert!(a < b, "key order follows the key number");
    }

    #[test]
    fn group_layout_keeps_order_and_splits_groups() {
        let l = KeyLayout::Group {
            groups: 4,
            num: 100,
        };
        let mut prev = vec![0u8; 16];
        for v in 0..100u64 {
            let mut k = vec![0u8; 16];
            l.write(&mut k, v);
            assert!(k > prev);
            let g = u64::from_be_bytes(k[..8].try_into().unwrap());
            assert_eq!(g, 1 + v / 25);
            assert_eq!(&k[8..], &v.to_be_bytes());
            prev = k;
        }
    }

    #[test]
    fn values_compress_about_as_asked() {
        let mut g = ValueGen::new(100, 0.5, 1);
        let v = g.next(100).to_vec();
        let distinct: std::collections::HashSet<_> = v.chunks(50).collect();
        assert_eq!(
            distinct.len(),
            1,
            "each 100-byte piece repeats a 50-byte run"
        );
        assert_eq!(g.next(100).len(), 100);
    }
}
