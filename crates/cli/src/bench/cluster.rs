//! `phoenix bench cluster`: a closed-loop key-value workload against a running cluster —
//! PhoenixKV through `phoenix-client`, or etcd through its v3 gRPC API (`--target etcd`)
//! — so both systems run the same workload.
//!
//! Each of `--clients` tasks issues one request at a time (read with probability
//! `--read_ratio`, else write) on keys drawn uniformly or zipfian from `--keys` keys. Every
//! second a line with that second's throughput and p50/p99 latency is printed (above a
//! progress bar on a terminal), and a summary at the end. `--clients` takes a list
//! (`1,4,16,64`) and `--target` too (`phoenix,phoenix-wal,etcd`): every combination runs
//! in turn and a table with throughput ratios closes the run. `--spawn DIR` starts each
//! target as a fresh 3-node cluster on loopback under DIR for its runs (PhoenixKV: three
//! `phoenix server` children; `phoenix-wal`: the same with the engine WAL on; etcd: three
//! `/usr/bin/etcd` members).
//!
//! Listings: with `--key-layout listing` keys are `bucket/dir<d>/obj<n>` over `--dirs`
//! directories of consecutive key indexes, and `--scan_ratio` of the operations list a
//! page: up to `--scan_limit` keys of a random directory from a random object on
//! (PhoenixKV: a paged scan; etcd: a range with a limit; both linearizable). Every page is
//! checked: keys in order, inside the range, values intact, and after `--fill` exactly as
//! many keys as the directory holds past the start, up to the limit.
//!
//! Values are self-describing: `key index (u64 BE) ‖ write seq (u64 BE) ‖ filler` where
//! the filler is a pure function of (index, seq). Every read checks the value it got
//! belongs to its key and is intact. With `--verify` writes to one key are serialised,
//! the bench remembers the last acknowledged write of each key (and any unacknowledged
//! ones after it, whose outcome is unknown) and reads every written key back at the end.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use phoenix_client::{Client, ClientOptions};
use phoenix_proto::security::Credentials;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution as _;

use super::common::{latency_histogram, progress};
use super::nemesis::{Fault, Nemesis};
use super::BenchError;
use crate::cmd::local_tls::LocalTls;
use crate::cmd::playground::{free_ports, ClusterSpec, LocalCluster, Proc};
use crate::output::Report;

/// Flags of `phoenix bench cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to drive: phoenix, phoenix-wal (only differs with --spawn: servers keep the
    /// engine WAL on), etcd; a comma list runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "phoenix")]
    pub target: Vec<TargetKind>,
    /// Client endpoints of a running cluster (`host:port`, comma separated); ignored
    /// with --spawn.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7001")]
    pub endpoints: Vec<String>,
    /// Start each target as a fresh 3-node loopback cluster under this directory (wiped)
    /// and stop it after its runs.
    #[arg(long)]
    pub spawn: Option<PathBuf>,
    /// Extra argument for every spawned `phoenix server` (repeatable). Spawned servers
    /// split or merge no group (`--split-qps 0 --split-size-mb 0 --merge-size-mb 0`)
    /// unless these name the flags.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Concurrent clients (requests in flight); a comma list runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub clients: Vec<usize>,
    /// Operations per run.
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    /// Stop a run after this many seconds even if --ops are not done.
    #[arg(long = "duration", alias = "duration_s")]
    pub duration_s: Option<u64>,
    /// Fraction of operations that are reads (0.0 = write only).
    #[arg(long = "read_ratio", alias = "read-ratio", default_value_t = 0.0)]
    pub read_ratio: f64,
    /// Bytes per key (at least 8).
    #[arg(long = "key_size", alias = "key-size", default_value_t = 16)]
    pub key_size: usize,
    /// Bytes per value (at least 16).
    #[arg(long = "value_size", alias = "value-size", default_value_t = 128)]
    pub value_size: usize,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Key popularity.
    #[arg(long, value_enum, default_value = "uniform")]
    pub distribution: Distribution,
    /// Key bytes: `plain` (`k` and the zero-padded index: neighbours share a group) or
    /// `hashed` (a 4-byte hash of the index first, so keys spread evenly over groups
    /// split evenly over the binary key space, as `phoenix server --initial-groups`
    /// splits it).
    #[arg(long = "key-layout", value_enum, default_value = "plain")]
    pub key_layout: KeyLayout,
    /// Fraction of operations that list a page of a directory (needs `--key-layout
    /// listing`); the others are reads and writes as `--read_ratio` says.
    #[arg(long = "scan_ratio", alias = "scan-ratio", default_value_t = 0.0)]
    pub scan_ratio: f64,
    /// Keys per listing page.
    #[arg(long = "scan_limit", alias = "scan-limit", default_value_t = 100)]
    pub scan_limit: u32,
    /// Directories of `--key-layout listing`: each holds ceil(keys / dirs) consecutive
    /// objects (the last ones fewer, or none).
    #[arg(long, default_value_t = 100)]
    pub dirs: u64,
    /// Zipf exponent (YCSB uses 0.99).
    #[arg(long = "zipf_s", alias = "zipf-s", default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Write every key once (64 clients, not measured) before the runs.
    #[arg(long, default_value_t = false)]
    pub fill: bool,
    /// Serialise writes per key, remember acknowledged values and read all back at the end.
    #[arg(long, default_value_t = false)]
    pub verify: bool,
    /// Deadline of each request in milliseconds.
    #[arg(long = "timeout_ms", alias = "timeout-ms", default_value_t = 5_000)]
    pub timeout_ms: u64,
    /// Seed of the workload's random choices (printed; reruns pick the same keys) and of
    /// the nemesis' schedule.
    #[arg(long, env = "PHOENIX_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Faults injected into the spawned cluster during each run, one node at a time
    /// (kill: SIGKILL then restart; pause: SIGSTOP then SIGCONT; partition: the node cut
    /// off from the others; diskerror: its writes and syncs fail, then work again (the
    /// node restarts its storage by itself); diskfull: its free space looks nil for 2–6 s, so it refuses client
    /// writes, then is back; powerloss: killed with its unsynced bytes lost — these four
    /// PhoenixKV only, its servers spawned with `--fault-injection` /
    /// `--unsynced-in-memory`);
    /// needs --spawn.
    #[arg(long, value_delimiter = ',')]
    pub nemesis: Vec<Fault>,
    /// How each operation reaches the cluster: `grpc` (long-lived clients in this
    /// process) or `cli` (one `phoenix get/put` or `etcdctl` process per operation, as a
    /// script would).
    #[arg(long = "client-mode", value_enum, default_value = "grpc")]
    pub client_mode: ClientMode,
    /// Spawned PhoenixKV clusters serve TLS and ask for a token (as `playground --tls`),
    /// and the clients present them: the cost of TLS. Needs --spawn and --client-mode
    /// grpc, no --nemesis; etcd targets stay plaintext.
    #[arg(long)]
    pub tls: bool,
}

/// How operations reach the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientMode {
    /// Long-lived clients: `phoenix-client`, or etcd's gRPC API.
    Grpc,
    /// A fresh process per operation: `phoenix get/put --hex` or `etcdctl get/put`.
    Cli,
}

/// A system the bench can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetKind {
    /// PhoenixKV (log-as-WAL: engine WAL off, the default server mode).
    Phoenix,
    /// PhoenixKV with the engine's own WAL on (spawned with `--engine-wal`).
    PhoenixWal,
    /// etcd v3.
    Etcd,
}

impl TargetKind {
    fn name(self) -> &'static str {
        match self {
            TargetKind::Phoenix => "phoenix",
            TargetKind::PhoenixWal => "phoenix-wal",
            TargetKind::Etcd => "etcd",
        }
    }
}

/// Key popularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Zipfian (rank r has weight 1/r^s), ranks scattered over the key space.
    Zipf,
}

/// How key bytes are made from a key index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyLayout {
    /// `k` and the zero-padded decimal index.
    Plain,
    /// A 4-byte big-endian hash of the index, then `k` and the decimal index.
    Hashed,
    /// `bucket/dir<d>/obj<n>`, zero-padded to the key size: directory d holds the
    /// consecutive indexes d * per_dir .. (d + 1) * per_dir.
    Listing,
}

/// What the listing layout puts before a directory's number, and between it and the
/// object's.
const LISTING_BUCKET: &str = "bucket/dir";
const LISTING_OBJ: &str = "/obj";

/// Most keys a listing page may ask for.
const SCAN_LIMIT_MAX: u32 = 10_000;

/// One operation of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read the key.
    Read(u64),
    /// Write the key.
    Write(u64),
    /// List directory `dir` from its object `obj` on.
    List { dir: u64, obj: u64 },
}

/// Bytes the hashed key layout puts before the plain key.
const HASH_PREFIX: usize = 4;

/// Server flag that turns the engine WAL on (the seed 000 baseline).
const ENGINE_WAL_FLAG: &str = "--engine-wal";

// ---------------------------------------------------------------------------------------
// Workload: keys, values, choices.

/// What requests to make.
#[derive(Debug, Clone)]
pub struct Workload {
    keys: u64,
    key_size: usize,
    value_size: usize,
    read_ratio: f64,
    zipf: Option<rand_distr::Zipf<f64>>,
    layout: KeyLayout,
    scan_ratio: f64,
    scan_limit: u32,
    /// Listing layout: directories, objects per directory, and the digits of each.
    dirs: u64,
    per_dir: u64,
    dir_digits: usize,
    obj_digits: usize,
}

impl Workload {
    /// Validates the flags into a workload.
    pub fn new(args: &Args) -> Result<Self, BenchError> {
        if args.key_size < 8 {
            return Err("--key_size must be at least 8".into());
        }
        if args.value_size < 16 {
            return Err("--value_size must be at least 16 (index and sequence header)".into());
        }
        if args.keys == 0 {
            return Err("--keys must be positive".into());
        }
        if !(0.0..=1.0).contains(&args.read_ratio) {
            return Err("--read_ratio must be within [0, 1]".into());
        }
        if !(0.0..=1.0).contains(&args.scan_ratio) {
            return Err("--scan_ratio must be within [0, 1]".into());
        }
        if args.scan_ratio > 0.0 && args.key_layout != KeyLayout::Listing {
            return Err("--scan_ratio needs --key-layout listing".into());
        }
        if args.tls
            && (args.spawn.is_none()
                || args.client_mode != ClientMode::Grpc
                || !args.nemesis.is_empty())
        {
            return Err("--tls needs --spawn and --client-mode grpc, without --nemesis".into());
        }
        if args.scan_ratio > 0.0 && args.client_mode == ClientMode::Cli {
            return Err("--scan_ratio runs with --client-mode grpc only".into());
        }
        if !(1..=SCAN_LIMIT_MAX).contains(&args.scan_limit) {
            return Err(format!("--scan_limit must be within 1..={SCAN_LIMIT_MAX}").into());
        }
        if args.key_layout == KeyLayout::Listing && (args.dirs == 0 || args.dirs > args.keys) {
            return Err("--dirs must be within 1..=keys".into());
        }
        let digits = args.keys.to_string().len();
        let dirs = args.dirs.max(1);
        let per_dir = args.keys.div_ceil(dirs);
        let dir_digits = (dirs - 1).to_string().len();
        let obj_digits = args
            .key_size
            .saturating_sub(LISTING_BUCKET.len() + dir_digits + LISTING_OBJ.len());
        let fits = match args.key_layout {
            KeyLayout::Plain => digits < args.key_size,
            KeyLayout::Hashed => HASH_PREFIX + digits < args.key_size,
            KeyLayout::Listing => obj_digits >= (per_dir - 1).to_string().len(),
        };
        if !fits {
            return Err(format!(
                "--key_size {} cannot hold {} keys{}",
                args.key_size,
                args.keys,
                if args.key_layout == KeyLayout::Listing {
                    format!(" in {} directories", args.dirs)
                } else {
                    String::new()
                }
            )
            .into());
        }
        let zipf = match args.distribution {
            Distribution::Uniform => None,
            Distribution::Zipf => Some(
                rand_distr::Zipf::new(args.keys, args.zipf_s)
                    .map_err(|e| format!("--zipf_s {}: {e}", args.zipf_s))?,
            ),
        };
        Ok(Workload {
            keys: args.keys,
            key_size: args.key_size,
            value_size: args.value_size,
            read_ratio: args.read_ratio,
            zipf,
            layout: args.key_layout,
            scan_ratio: args.scan_ratio,
            scan_limit: args.scan_limit,
            dirs,
            per_dir,
            dir_digits,
            obj_digits,
        })
    }

    /// The next operation.
    pub fn next_op<R: Rng>(&self, rng: &mut R) -> Op {
        if self.scan_ratio > 0.0 && rng.gen_bool(self.scan_ratio) {
            let dir = rng.gen_range(0..self.dirs);
            let obj = rng.gen_range(0..self.dir_len(dir).max(1));
            return Op::List { dir, obj };
        }
        let idx = self.next_key(rng);
        if self.next_is_read(rng) {
            Op::Read(idx)
        } else {
            Op::Write(idx)
        }
    }

    /// Objects in directory `dir` (the last one may hold fewer).
    fn dir_len(&self, dir: u64) -> u64 {
        self.keys
            .saturating_sub(dir * self.per_dir)
            .min(self.per_dir)
    }

    /// A listing's range `[start, end)` and the number of keys it finds when every key
    /// was written: directory `dir` from object `obj` on, at most `scan_limit`.
    pub fn listing(&self, dir: u64, obj: u64) -> (Vec<u8>, Vec<u8>, u64) {
        let start = self.key(dir * self.per_dir + obj);
        let mut end = format!("{LISTING_BUCKET}{dir:0>w$}/", w = self.dir_digits).into_bytes();
        // The smallest key past every key of the directory: '/' + 1.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let found = self
            .dir_len(dir)
            .saturating_sub(obj)
            .min(u64::from(self.scan_limit));
        (start, end, found)
    }

    /// The key index a listing key stands for.
    pub fn index_of(&self, key: &[u8]) -> Option<u64> {
        let s = std::str::from_utf8(key).ok()?;
        let rest = s.strip_prefix(LISTING_BUCKET)?;
        let (dir, obj) = rest.split_once(LISTING_OBJ)?;
        let (dir, obj): (u64, u64) = (dir.parse().ok()?, obj.parse().ok()?);
        let idx = dir * self.per_dir + obj;
        // Only the key's own spelling (fixed width, no sign) stands for it.
        (dir < self.dirs && obj < self.dir_len(dir) && self.key(idx) == key).then_some(idx)
    }

    /// The next key index.
    pub fn next_key<R: Rng>(&self, rng: &mut R) -> u64 {
        match &self.zipf {
            None => rng.gen_range(0..self.keys),
            Some(z) => {
                // Rank 1 is the hottest; scatter ranks so hot keys are not neighbours
                // (which would put them all in one group).
                let rank = z.sample(rng) as u64;
                mix64(rank) % self.keys
            }
        }
    }

    /// Whether the next operation is a read.
    pub fn next_is_read<R: Rng>(&self, rng: &mut R) -> bool {
        self.read_ratio > 0.0 && rng.gen_bool(self.read_ratio)
    }

    /// Key bytes of index `idx`: `k` then the zero-padded decimal index, padded to size
    /// (after a 4-byte hash of the index with `--key-layout hashed`).
    pub fn key(&self, idx: u64) -> Vec<u8> {
        if self.layout == KeyLayout::Listing {
            let (dir, obj) = (idx / self.per_dir, idx % self.per_dir);
            return format!(
                "{LISTING_BUCKET}{dir:0>dw$}{LISTING_OBJ}{obj:0>ow$}",
                dw = self.dir_digits,
                ow = self.obj_digits
            )
            .into_bytes();
        }
        let mut k = Vec::with_capacity(self.key_size);
        if self.layout == KeyLayout::Hashed {
            // The high half of the scrambled index: uniform over the 4-byte space.
            k.extend_from_slice(&((mix64(idx) >> 32) as u32).to_be_bytes());
        }
        let width = self.key_size - 1 - k.len();
        k.extend_from_slice(format!("k{idx:0>width$}").as_bytes());
        k.truncate(self.key_size);
        k
    }

    /// The value written by write `seq` to key `idx`.
    pub fn value(&self, idx: u64, seq: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.value_size);
        v.extend_from_slice(&idx.to_be_bytes());
        v.extend_from_slice(&seq.to_be_bytes());
        let mut state = mix64(idx ^ seq.rotate_left(32));
        while v.len() < self.value_size {
            state = mix64(state);
            let take = (self.value_size - v.len()).min(8);
            v.extend_from_slice(&state.to_le_bytes()[..take]);
        }
        v
    }

    /// Checks a value read from key `idx`; returns its write seq.
    pub fn check_value(&self, idx: u64, v: &[u8]) -> Result<u64, String> {
        if v.len() != self.value_size {
            return Err(format!(
                "key {idx}: value of {} bytes, expected {}",
                v.len(),
                self.value_size
            ));
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&v[..8]);
        let got_idx = u64::from_be_bytes(b);
        b.copy_from_slice(&v[8..16]);
        let seq = u64::from_be_bytes(b);
        if got_idx != idx {
            return Err(format!(
                "key {idx}: holds the value of key {got_idx} (seq {seq})"
            ));
        }
        if self.value(idx, seq) != v {
            return Err(format!("key {idx}: value of seq {seq} is corrupt"));
        }
        Ok(seq)
    }
}

/// splitmix64's finaliser: a cheap bijective scrambler.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------
// Targets.

/// A connected system under test.
#[derive(Clone)]
enum Target {
    Phoenix(Client),
    Etcd(super::etcd::KvClient),
    /// One process per operation (`--client-mode cli`).
    Cli(CliTarget),
}

/// How to run one operation as a process: this binary's `get`/`put` or `etcdctl`.
#[derive(Clone)]
struct CliTarget {
    kind: TargetKind,
    endpoints: Vec<String>,
    /// The `phoenix` binary (this one) or `etcdctl`.
    program: PathBuf,
}

/// Why an operation did not complete.
#[derive(Debug)]
struct OpError {
    msg: String,
    /// A write that may or may not have taken effect (as opposed to a definite failure).
    unknown: bool,
}

impl OpError {
    fn failed(msg: impl Into<String>) -> Self {
        OpError {
            msg: msg.into(),
            unknown: false,
        }
    }

    fn unknown(msg: impl Into<String>) -> Self {
        OpError {
            msg: msg.into(),
            unknown: true,
        }
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()))
        .collect()
}

impl CliTarget {
    /// Runs one operation; `Ok((exit code, stdout))`, or `Err` if it could not be run
    /// or outlived the deadline (plus a grace for process start-up).
    async fn exec(&self, args: &[String], timeout: Duration) -> Result<(i32, String), String> {
        let mut cmd = tokio::process::Command::new(&self.program);
        match self.kind {
            TargetKind::Etcd => {
                cmd.env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", self.endpoints.join(",")))
                    .arg(format!("--command-timeout={}ms", timeout.as_millis()));
            }
            TargetKind::Phoenix | TargetKind::PhoenixWal => {
                cmd.env_remove("PHOENIX_ENDPOINTS");
            }
        }
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(timeout + Duration::from_secs(5), cmd.output())
            .await
            .map_err(|_| format!("{} did not exit in time", self.program.display()))?
            .map_err(|e| format!("run {}: {e}", self.program.display()))?;
        let code = out.status.code().unwrap_or(-1);
        if code != 0 && code != 1 {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").trim().to_string();
            return Err(format!("exit {code}: {last}"));
        }
        Ok((
            code,
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }

    fn phoenix_args(&self, op: &str, timeout: Duration) -> Vec<String> {
        vec![
            op.to_string(),
            "--hex".into(),
            "--endpoints".into(),
            self.endpoints.join(","),
            "--timeout-ms".into(),
            timeout.as_millis().to_string(),
        ]
    }

    async fn get(&self, key: &[u8], timeout: Duration) -> Result<Option<Vec<u8>>, OpError> {
        let args = match self.kind {
            TargetKind::Etcd => vec![
                "get".into(),
                String::from_utf8_lossy(key).into_owned(),
                "--print-value-only".into(),
            ],
            _ => {
                let mut a = self.phoenix_args("get", timeout);
                a.push(hex(key));
                a
            }
        };
        let (code, out) = self.exec(&args, timeout).await.map_err(OpError::failed)?;
        match (self.kind, code) {
            (_, 1) => Ok(None),
            (TargetKind::Etcd, _) if out.is_empty() => Ok(None),
            _ => unhex(&out)
                .map(Some)
                .ok_or_else(|| OpError::failed(format!("get printed {out:?}, not hex"))),
        }
    }

    async fn put(&self, key: &[u8], value: &[u8], timeout: Duration) -> Result<(), OpError> {
        let args = match self.kind {
            TargetKind::Etcd => vec![
                "put".into(),
                String::from_utf8_lossy(key).into_owned(),
                hex(value),
            ],
            _ => {
                let mut a = self.phoenix_args("put", timeout);
                a.push(hex(key));
                a.push(hex(value));
                a
            }
        };
        // A process that failed may have sent the write: its outcome is unknown.
        match self.exec(&args, timeout).await.map_err(OpError::unknown)? {
            (0, _) => Ok(()),
            (code, out) => Err(OpError::unknown(format!("put exited {code}: {out}"))),
        }
    }
}

impl Target {
    async fn connect(
        kind: TargetKind,
        endpoints: &[String],
        timeout: Duration,
        credentials: Credentials,
    ) -> Result<Self, BenchError> {
        match kind {
            TargetKind::Phoenix | TargetKind::PhoenixWal => {
                let opts = ClientOptions {
                    timeout,
                    credentials,
                    ..ClientOptions::default()
                };
                let client = Client::connect(endpoints.to_vec(), opts)
                    .await
                    .map_err(|e| format!("connect to PhoenixKV at {endpoints:?}: {e}"))?;
                Ok(Target::Phoenix(client))
            }
            TargetKind::Etcd => {
                let urls: Vec<String> = endpoints
                    .iter()
                    .map(|e| {
                        if e.contains("://") {
                            e.clone()
                        } else {
                            format!("http://{e}")
                        }
                    })
                    .collect();
                let client = super::etcd::KvClient::new(&urls, Duration::from_secs(3), timeout)?;
                Ok(Target::Etcd(client))
            }
        }
    }

    /// A target whose every operation is a process (`--client-mode cli`).
    fn cli(kind: TargetKind, endpoints: &[String]) -> Result<Self, BenchError> {
        let program = match kind {
            TargetKind::Etcd => PathBuf::from("etcdctl"),
            _ => std::env::current_exe().map_err(|e| format!("locate the phoenix binary: {e}"))?,
        };
        Ok(Target::Cli(CliTarget {
            kind,
            endpoints: endpoints.to_vec(),
            program,
        }))
    }

    async fn get(&mut self, key: &[u8], timeout: Duration) -> Result<Option<Vec<u8>>, OpError> {
        match self {
            Target::Phoenix(c) => c.get(key).await.map_err(|e| OpError::failed(e.to_string())),
            Target::Etcd(kv) => {
                // etcd's Range is linearizable unless `serializable` is set: the same
                // guarantee as PhoenixKV's ReadIndex reads.
                let deadline = tokio::time::Instant::now() + timeout;
                etcd_retrying(deadline, false, || {
                    let mut kv = kv.clone();
                    let key = key.to_vec();
                    async move { kv.get(&key).await }
                })
                .await
                .map_err(OpError::failed)
            }
            Target::Cli(c) => c.get(key, timeout).await,
        }
    }

    /// At most `limit` pairs of `[start, end)` in key order (linearizable on both).
    async fn list(
        &mut self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        timeout: Duration,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, OpError> {
        match self {
            // Pages across group boundaries, all within one deadline.
            Target::Phoenix(c) => c
                .scan(start, end, limit as usize)
                .await
                .map_err(|e| OpError::failed(e.to_string())),
            Target::Etcd(kv) => {
                let deadline = tokio::time::Instant::now() + timeout;
                etcd_retrying(deadline, false, || {
                    let mut kv = kv.clone();
                    let (start, end) = (start.to_vec(), end.to_vec());
                    async move { kv.range(&start, &end, limit).await }
                })
                .await
                .map(|kvs| kvs.into_iter().map(|kv| (kv.key, kv.value)).collect())
                .map_err(OpError::failed)
            }
            Target::Cli(_) => Err(OpError::failed("listings run with --client-mode grpc only")),
        }
    }

    async fn put(&mut self, key: &[u8], value: &[u8], timeout: Duration) -> Result<(), OpError> {
        match self {
            Target::Phoenix(c) => c.put(key, value).await.map_err(|e| OpError {
                unknown: matches!(e, phoenix_client::ClientError::Ambiguous { .. }),
                msg: e.to_string(),
            }),
            Target::Etcd(kv) => {
                // The etcd client cannot tell a refused write from a lost answer.
                let deadline = tokio::time::Instant::now() + timeout;
                etcd_retrying(deadline, true, || {
                    let mut kv = kv.clone();
                    let (key, value) = (key.to_vec(), value.to_vec());
                    async move { kv.put(&key, &value).await }
                })
                .await
                .map_err(OpError::unknown)
            }
            Target::Cli(c) => c.put(key, value, timeout).await,
        }
    }
}

/// Runs an etcd call until it succeeds, fails in a way etcd's own client would not
/// retry ([`super::etcd::retryable`]), or the deadline passes; retries are paced as
/// clientv3 paces them (25 ms, jittered).
async fn etcd_retrying<T, F, Fut>(
    deadline: tokio::time::Instant,
    write: bool,
    mut call: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, super::etcd::Error>>,
{
    loop {
        match tokio::time::timeout_at(deadline, call()).await {
            Err(_) => return Err("deadline exceeded".into()),
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if super::etcd::retryable(&e, write) => {
                let pause = Duration::from_millis(rand::thread_rng().gen_range(20..30));
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(format!("deadline exceeded (last: {e})"));
                }
                tokio::time::sleep(pause).await;
            }
            Ok(Err(e)) => return Err(e.to_string()),
        }
    }
}

/// A spawned cluster of one target, stopped on drop.
enum Spawned {
    Phoenix(Box<LocalCluster>),
    Etcd(Vec<Proc>),
}

impl Spawned {
    /// Hands the node processes to the nemesis for a run.
    fn take_procs(&mut self) -> Vec<Proc> {
        match self {
            Spawned::Phoenix(c) => std::mem::take(&mut c.nodes),
            Spawned::Etcd(p) => std::mem::take(p),
        }
    }

    /// Takes them back after the run.
    fn put_procs(&mut self, procs: Vec<Proc>) {
        match self {
            Spawned::Phoenix(c) => c.nodes = procs,
            Spawned::Etcd(p) => *p = procs,
        }
    }
}

fn wipe(dir: &std::path::Path) -> Result<(), BenchError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("wipe {}: {e}", dir.display()).into()),
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()).into())
}

async fn spawn_target(
    kind: TargetKind,
    root: &std::path::Path,
    args: &Args,
) -> Result<(Spawned, Vec<String>), BenchError> {
    let dir = root.join(kind.name());
    wipe(&dir)?;
    match kind {
        TargetKind::Phoenix | TargetKind::PhoenixWal => {
            let mut spec = ClusterSpec::ephemeral(&dir)?;
            spec.server_args = args.server_args.clone();
            let injected = args
                .nemesis
                .iter()
                .any(|f| matches!(f, Fault::Partition | Fault::DiskError | Fault::DiskFull));
            for (on, flag) in [
                (injected, "--fault-injection"),
                (
                    args.nemesis.contains(&Fault::PowerLoss),
                    "--unsynced-in-memory",
                ),
            ] {
                if on && !spec.server_args.iter().any(|a| a == flag) {
                    spec.server_args.push(flag.to_string());
                }
            }
            if kind == TargetKind::PhoenixWal {
                spec.server_args.push(ENGINE_WAL_FLAG.to_string());
            }
            if args.tls {
                spec.tls = Some(LocalTls::load_or_create(&dir)?);
            }
            // The groups measured stay the groups spawned (a comparison with etcd's one
            // range must not split it half way).
            no_splits_unless_asked(&mut spec.server_args);
            let endpoints = spec.endpoints();
            let mut cluster = LocalCluster::start(spec)?;
            cluster.wait_ready(Duration::from_secs(60)).await?;
            Ok((Spawned::Phoenix(Box::new(cluster)), endpoints))
        }
        TargetKind::Etcd => {
            let client_ports = free_ports(3)?;
            let peer_ports = free_ports(3)?;
            let initial: Vec<String> = peer_ports
                .iter()
                .enumerate()
                .map(|(i, p)| format!("e{}=http://{p}", i + 1))
                .collect();
            let mut procs = Vec::new();
            for i in 0..3 {
                let name = format!("e{}", i + 1);
                let mut cmd = std::process::Command::new("etcd");
                cmd.arg("--name")
                    .arg(&name)
                    .arg("--data-dir")
                    .arg(dir.join(&name))
                    .arg("--listen-client-urls")
                    .arg(format!("http://{}", client_ports[i]))
                    .arg("--advertise-client-urls")
                    .arg(format!("http://{}", client_ports[i]))
                    .arg("--listen-peer-urls")
                    .arg(format!("http://{}", peer_ports[i]))
                    .arg("--initial-advertise-peer-urls")
                    .arg(format!("http://{}", peer_ports[i]))
                    .arg("--initial-cluster")
                    .arg(initial.join(","))
                    .arg("--initial-cluster-token")
                    .arg("phoenix-bench")
                    .arg("--initial-cluster-state")
                    .arg("new");
                procs.push(Proc::spawn(
                    format!("etcd {}", i + 1),
                    cmd,
                    dir.join(format!("{name}.log")),
                )?);
            }
            let endpoints: Vec<String> = client_ports.iter().map(|p| p.to_string()).collect();
            let start = Instant::now();
            loop {
                let probe = async {
                    let mut t = Target::connect(
                        kind,
                        &endpoints,
                        Duration::from_secs(2),
                        Credentials::default(),
                    )
                    .await?;
                    t.put(b"phoenix-bench-probe", b"1", Duration::from_secs(2))
                        .await
                        .map_err(|e| e.msg)?;
                    Ok::<(), BenchError>(())
                };
                match probe.await {
                    Ok(()) => break,
                    Err(e) if start.elapsed() > Duration::from_secs(60) => {
                        return Err(format!(
                            "etcd did not become ready within 60 s: {e}; logs in {}",
                            dir.display()
                        )
                        .into())
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                }
                for p in &mut procs {
                    if let Some(status) = p.exited() {
                        return Err(format!(
                            "{} exited ({status}); see {}",
                            p.name,
                            p.log.display()
                        )
                        .into());
                    }
                }
            }
            Ok((Spawned::Etcd(procs), endpoints))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Measurement.

#[derive(Debug)]
struct Window {
    reads: Histogram<u64>,
    writes: Histogram<u64>,
    /// Listings (one page each).
    scans: Histogram<u64>,
    /// Keys the listings returned.
    listed: u64,
    /// Operations that definitely did not take effect (failed reads, refused writes).
    failed: u64,
    /// Writes whose outcome is unknown.
    unknown: u64,
    first_error: Option<String>,
}

impl Window {
    fn new() -> Self {
        Window {
            reads: latency_histogram(),
            writes: latency_histogram(),
            scans: latency_histogram(),
            listed: 0,
            failed: 0,
            unknown: 0,
            first_error: None,
        }
    }

    fn errors(&self) -> u64 {
        self.failed + self.unknown
    }

    fn ops(&self) -> u64 {
        self.reads.len() + self.writes.len() + self.scans.len()
    }

    /// Every operation's latency.
    fn all(&self) -> Histogram<u64> {
        // The histograms have the same bounds, so adding cannot fail.
        let mut all = self.reads.clone();
        let _ = all.add(&self.writes);
        let _ = all.add(&self.scans);
        all
    }

    fn merge(&mut self, other: &Window) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.reads.add(&other.reads);
        let _ = self.writes.add(&other.writes);
        let _ = self.scans.add(&other.scans);
        self.listed += other.listed;
        self.failed += other.failed;
        self.unknown += other.unknown;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

/// Per-key record for --verify: the last acknowledged write and the writes after it
/// whose outcome is unknown (error or timeout: they may or may not have applied).
#[derive(Debug, Default)]
struct KeyState {
    acked: Option<u64>,
    unknown: Vec<u64>,
}

/// Outcome of one run.
#[derive(Debug, Clone)]
pub struct RunResult {
    target: TargetKind,
    clients: usize,
    ops: u64,
    elapsed: Duration,
    failed: u64,
    unknown: u64,
    /// The longest time in which no operation completed.
    longest_gap: Duration,
    p50_us: f64,
    p99_us: f64,
    read_p99_us: f64,
    write_p99_us: f64,
    /// Listings done and their p99.
    scans: u64,
    scan_p99_us: f64,
}

impl RunResult {
    fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Failed plus unknown operations, as a share of all attempted.
    fn error_share(&self) -> f64 {
        let errors = self.failed + self.unknown;
        errors as f64 / (self.ops + errors).max(1) as f64
    }
}

/// Windows without a completion: the clock of the last completion and the gaps seen.
struct Gaps {
    start: Instant,
    /// Nanoseconds from `start` to the latest completion.
    last_ns: AtomicU64,
    /// Gaps of at least [`GAP_REPORTED`]: (start ns, length ns).
    long: Mutex<Vec<(u64, u64)>>,
}

/// Windows without a completion at least this long are listed in the report.
const GAP_REPORTED: Duration = Duration::from_millis(500);

impl Gaps {
    fn new(start: Instant) -> Self {
        Gaps {
            start,
            last_ns: AtomicU64::new(0),
            long: Mutex::new(Vec::new()),
        }
    }

    /// Notes a completion now.
    fn completed(&self) {
        let now = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.note(now);
    }

    fn note(&self, now: u64) {
        let prev = self.last_ns.fetch_max(now, Ordering::AcqRel);
        if now > prev && now - prev >= GAP_REPORTED.as_nanos() as u64 {
            if let Ok(mut l) = self.long.lock() {
                l.push((prev, now - prev));
            }
        }
    }

    /// The gaps at least [`GAP_REPORTED`] long, the one up to `end` included.
    fn finish(&self, end: Instant) -> Vec<(u64, u64)> {
        self.note(end.duration_since(self.start).as_nanos() as u64);
        let mut l = self.long.lock().map(|l| l.clone()).unwrap_or_default();
        l.sort_unstable();
        l
    }
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(q) as f64 / 1e3
}

/// One run's shape.
#[derive(Debug, Clone, Copy)]
struct RunSpec {
    clients: usize,
    ops: u64,
    /// The unmeasured fill phase: key i written by op i.
    fill: bool,
}

struct Shared {
    workload: Workload,
    /// Every key was written before the run, so a listing finds a known number of keys.
    filled: bool,
    timeout: Duration,
    next_op: AtomicU64,
    total_ops: u64,
    next_seq: AtomicU64,
    stop: AtomicBool,
    window: Mutex<Window>,
    verify: Option<Vec<tokio::sync::Mutex<KeyState>>>,
    bad_reads: Mutex<Vec<String>>,
    gaps: Gaps,
}

async fn client_task(
    shared: Arc<Shared>,
    mut target: Target,
    mut rng: ChaCha8Rng,
    force_write_key: Option<()>,
) {
    let w = &shared.workload;
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let n = shared.next_op.fetch_add(1, Ordering::Relaxed);
        if n >= shared.total_ops {
            return;
        }
        // The fill phase writes keys in order; runs draw them from the distribution.
        let op = match force_write_key {
            Some(()) => Op::Write(n),
            None => w.next_op(&mut rng),
        };
        let (idx, read) = match op {
            Op::Read(i) => (i, true),
            Op::Write(i) => (i, false),
            Op::List { dir, obj } => {
                let started = Instant::now();
                let outcome = list_and_check(&shared, &mut target, dir, obj).await;
                let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                record(&shared, outcome.map(|n| (Kind::Scan, n)), ns);
                continue;
            }
        };
        let key = w.key(idx);
        let started = Instant::now();
        let outcome = if read {
            match target.get(&key, shared.timeout).await {
                Ok(Some(v)) => {
                    if let Err(e) = w.check_value(idx, &v) {
                        if let Ok(mut bad) = shared.bad_reads.lock() {
                            bad.push(e);
                        }
                    }
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
            let value = w.value(idx, seq);
            match &shared.verify {
                None => target.put(&key, &value, shared.timeout).await,
                Some(states) => {
                    let slot = usize::try_from(idx).ok().and_then(|i| states.get(i));
                    match slot {
                        None => target.put(&key, &value, shared.timeout).await,
                        Some(slot) => {
                            let mut st = slot.lock().await;
                            let r = target.put(&key, &value, shared.timeout).await;
                            match &r {
                                Ok(()) => {
                                    st.acked = Some(seq);
                                    st.unknown.clear();
                                }
                                Err(e) if e.unknown => st.unknown.push(seq),
                                Err(_) => {}
                            }
                            r
                        }
                    }
                }
            }
        };
        let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let kind = if read { Kind::Read } else { Kind::Write };
        record(&shared, outcome.map(|()| (kind, 0)), ns);
    }
}

/// What a completed operation was.
#[derive(Clone, Copy)]
enum Kind {
    Read,
    Write,
    Scan,
}

/// Counts an operation's outcome (with the keys a listing returned) and latency.
fn record(shared: &Shared, outcome: Result<(Kind, u64), OpError>, ns: u64) {
    if outcome.is_ok() {
        shared.gaps.completed();
    }
    if let Ok(mut win) = shared.window.lock() {
        match outcome {
            Ok((kind, listed)) => {
                let h = match kind {
                    Kind::Read => &mut win.reads,
                    Kind::Write => &mut win.writes,
                    Kind::Scan => &mut win.scans,
                };
                let _ = h.record(ns.max(1));
                win.listed += listed;
            }
            Err(e) => {
                if e.unknown {
                    win.unknown += 1;
                } else {
                    win.failed += 1;
                }
                if win.first_error.is_none() {
                    win.first_error = Some(e.msg);
                }
            }
        }
    }
}

/// Lists a page of directory `dir` from object `obj` and checks it: keys in order and in
/// the range, values intact, and after a fill exactly the keys the directory holds
/// there. Returns the keys listed; a wrong page is a bad read.
async fn list_and_check(
    shared: &Shared,
    target: &mut Target,
    dir: u64,
    obj: u64,
) -> Result<u64, OpError> {
    let w = &shared.workload;
    let (start, end, expected) = w.listing(dir, obj);
    let pairs = target
        .list(&start, &end, w.scan_limit, shared.timeout)
        .await?;
    let mut bad = None;
    let mut prev: Option<&[u8]> = None;
    for (k, v) in &pairs {
        if k.as_slice() < start.as_slice() || k.as_slice() >= end.as_slice() {
            bad = Some(format!(
                "listing of dir {dir} returned {} outside its range",
                hex(k)
            ));
        } else if prev.is_some_and(|p| p >= k.as_slice()) {
            bad = Some(format!(
                "listing of dir {dir} is out of order at {}",
                hex(k)
            ));
        } else {
            match w.index_of(k) {
                None => bad = Some(format!("listing returned a foreign key {}", hex(k))),
                Some(idx) => {
                    if let Err(e) = w.check_value(idx, v) {
                        bad = Some(e);
                    }
                }
            }
        }
        if bad.is_some() {
            break;
        }
        prev = Some(k);
    }
    if bad.is_none() && shared.filled {
        // Every key exists: the page is exactly the next keys of the directory.
        let first = dir * w.per_dir + obj;
        if let Some((i, (k, _))) = pairs
            .iter()
            .enumerate()
            .find(|(i, (k, _))| *k != w.key(first + *i as u64))
        {
            bad = Some(format!(
                "listing of dir {dir} from object {obj}: key {i} is {}, expected {}",
                hex(k),
                hex(&w.key(first + i as u64))
            ));
        }
    }
    if bad.is_none() && shared.filled && pairs.len() as u64 != expected {
        bad = Some(format!(
            "listing of dir {dir} from object {obj} returned {} keys, the directory holds {expected} there",
            pairs.len()
        ));
    }
    if let Some(e) = bad {
        if let Ok(mut b) = shared.bad_reads.lock() {
            b.push(e);
        }
    }
    Ok(pairs.len() as u64)
}

async fn run_once(
    target: &Target,
    kind: TargetKind,
    workload: &Workload,
    args: &Args,
    run: RunSpec,
    verify: Option<Vec<tokio::sync::Mutex<KeyState>>>,
    report: Report,
) -> Result<(RunResult, Option<Vec<tokio::sync::Mutex<KeyState>>>), BenchError> {
    let RunSpec { clients, ops, fill } = run;
    let label = if fill { "fill" } else { kind.name() };
    let shared = Arc::new(Shared {
        workload: workload.clone(),
        timeout: Duration::from_millis(args.timeout_ms),
        next_op: AtomicU64::new(0),
        total_ops: ops,
        filled: args.fill && !fill,
        next_seq: AtomicU64::new(1 + args.seed.wrapping_mul(1 << 40)),
        stop: AtomicBool::new(false),
        window: Mutex::new(Window::new()),
        verify,
        bad_reads: Mutex::new(Vec::new()),
        gaps: Gaps::new(Instant::now()),
    });
    let listings = if fill || args.scan_ratio == 0.0 {
        String::new()
    } else {
        format!(
            ", scan ratio {} (pages of {} over {} directories)",
            args.scan_ratio, args.scan_limit, args.dirs
        )
    };
    report.line(format_args!(
        "-- {label}: {clients} clients, {ops} ops, read ratio {}{listings}, {} B keys, {} B values, {} keys {:?}, seed {}",
        if fill { 0.0 } else { args.read_ratio },
        args.key_size,
        args.value_size,
        args.keys,
        args.distribution,
        args.seed
    ));
    let bar = progress(ops, label);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let rng = ChaCha8Rng::seed_from_u64(args.seed ^ mix64(c as u64 + 1));
        tasks.spawn(client_task(
            shared.clone(),
            target.clone(),
            rng,
            fill.then_some(()),
        ));
    }
    let mut total = Window::new();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    // The fill writes every key whatever --duration says: listings count on it.
    let deadline = args
        .duration_s
        .filter(|_| !fill)
        .map(|s| start + Duration::from_secs(s));
    let mut stopped_at = None;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            joined = tasks.join_next() => {
                match joined {
                    None => break,
                    Some(Err(e)) => return Err(format!("a client task failed: {e}").into()),
                    Some(Ok(())) => {}
                }
            }
            _ = tick.tick() => {
                let win = match shared.window.lock() {
                    Ok(mut w) => std::mem::replace(&mut *w, Window::new()),
                    Err(_) => return Err("statistics lock poisoned".into()),
                };
                let now = Instant::now();
                let secs = now.duration_since(last).as_secs_f64();
                last = now;
                let all = win.all();
                let line = format!(
                    "[{:>4}s] {:>9.0} ops/s  p50 {:>8.0} us  p99 {:>8.0} us  failed {} unknown {}{}",
                    start.elapsed().as_secs(),
                    win.ops() as f64 / secs,
                    us(&all, 0.5),
                    us(&all, 0.99),
                    win.failed,
                    win.unknown,
                    win.first_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
                );
                if bar.is_hidden() { report.line(format_args!("{line}")); } else { bar.println(line); }
                total.merge(&win);
                bar.set_position((total.ops() + total.errors()).min(ops));
                if deadline.is_some_and(|d| now >= d) && stopped_at.is_none() {
                    shared.stop.store(true, Ordering::Relaxed);
                    stopped_at = Some(now);
                }
            }
        }
    }
    let end = Instant::now();
    let elapsed = end.duration_since(start);
    // The window that ends the run is measured to when operations stopped being
    // started, not to when the last ones in flight came back.
    let gaps = shared.gaps.finish(stopped_at.unwrap_or(end));
    if let Ok(mut w) = shared.window.lock() {
        total.merge(&w);
        *w = Window::new();
    }
    bar.finish_and_clear();
    let all = total.all();
    let result = RunResult {
        target: kind,
        clients,
        ops: total.ops(),
        elapsed,
        failed: total.failed,
        unknown: total.unknown,
        longest_gap: Duration::from_nanos(gaps.iter().map(|g| g.1).max().unwrap_or(0)),
        p50_us: us(&all, 0.5),
        p99_us: us(&all, 0.99),
        read_p99_us: us(&total.reads, 0.99),
        write_p99_us: us(&total.writes, 0.99),
        scans: total.scans.len(),
        scan_p99_us: us(&total.scans, 0.99),
    };
    report.line(format_args!(
        "   {label}: {} ops in {:.2} s = {:.0} ops/s; all p50 {:.0} us p99 {:.0} us p999 {:.0} us; reads {} (p99 {:.0} us), writes {} (p99 {:.0} us); failed {}, unknown {} ({:.2}% of attempts){}",
        result.ops,
        elapsed.as_secs_f64(),
        result.throughput(),
        result.p50_us,
        result.p99_us,
        us(&all, 0.999),
        total.reads.len(),
        result.read_p99_us,
        total.writes.len(),
        result.write_p99_us,
        total.failed,
        total.unknown,
        100.0 * result.error_share(),
        total.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default()
    ));
    if result.scans > 0 {
        report.line(format_args!(
            "   listings: {} = {:.0}/s, p50 {:.0} us p99 {:.0} us, {:.1} keys each",
            result.scans,
            result.scans as f64 / elapsed.as_secs_f64().max(1e-9),
            us(&total.scans, 0.5),
            result.scan_p99_us,
            total.listed as f64 / result.scans as f64
        ));
    }
    if gaps.is_empty() {
        report.line(format_args!(
            "   no window without a completion of {} ms or more",
            GAP_REPORTED.as_millis()
        ));
    } else {
        let list: Vec<String> = gaps
            .iter()
            .map(|(at, len)| format!("{:.2}s at {:.1}s", *len as f64 / 1e9, *at as f64 / 1e9))
            .collect();
        report.line(format_args!(
            "   windows without a completion (>= {} ms): {}; longest {:.2} s",
            GAP_REPORTED.as_millis(),
            list.join(", "),
            result.longest_gap.as_secs_f64()
        ));
    }
    let bad = shared
        .bad_reads
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default();
    if !bad.is_empty() {
        return Err(format!(
            "{} reads returned a wrong value, e.g. {}",
            bad.len(),
            bad[0]
        )
        .into());
    }
    let verify = Arc::try_unwrap(shared).ok().and_then(|s| s.verify);
    Ok((result, verify))
}

async fn verify_all(
    target: &mut Target,
    workload: &Workload,
    states: &[tokio::sync::Mutex<KeyState>],
    timeout: Duration,
) -> Result<u64, BenchError> {
    let mut checked = 0u64;
    let mut wrong = Vec::new();
    for (i, st) in states.iter().enumerate() {
        let st = st.lock().await;
        if st.acked.is_none() && st.unknown.is_empty() {
            continue;
        }
        let idx = i as u64;
        let key = workload.key(idx);
        let mut got = Err(OpError::failed("not read"));
        for _ in 0..3 {
            got = target.get(&key, timeout).await;
            if got.is_ok() {
                break;
            }
        }
        let got = got.map_err(|e| format!("verify: read key {idx}: {}", e.msg))?;
        let seq = match got {
            None => None,
            Some(v) => Some(workload.check_value(idx, &v)?),
        };
        let ok = seq == st.acked || seq.is_some_and(|s| st.unknown.contains(&s));
        if !ok {
            wrong.push(format!(
                "key {idx}: read seq {seq:?}, last acknowledged {:?}, unknown {:?}",
                st.acked, st.unknown
            ));
        }
        checked += 1;
    }
    if !wrong.is_empty() {
        return Err(format!(
            "verify: {} of {checked} keys wrong, e.g. {}",
            wrong.len(),
            wrong[0]
        )
        .into());
    }
    Ok(checked)
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    let workload = Workload::new(&args)?;
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err("--clients must list positive numbers".into());
    }
    if args.ops == 0 {
        return Err("--ops must be positive".into());
    }
    if args.target.contains(&TargetKind::PhoenixWal) && args.spawn.is_none() {
        return Err(
            "--target phoenix-wal needs --spawn (the engine WAL is a server option)".into(),
        );
    }
    if !args.nemesis.is_empty() && args.spawn.is_none() {
        return Err("--nemesis needs --spawn (it kills and pauses the spawned nodes)".into());
    }
    let phoenix_only = [
        Fault::Partition,
        Fault::DiskError,
        Fault::DiskFull,
        Fault::PowerLoss,
    ];
    if args.nemesis.iter().any(|f| phoenix_only.contains(f))
        && args.target.contains(&TargetKind::Etcd)
    {
        return Err(
            "--nemesis partition, diskerror, diskfull and powerloss work on PhoenixKV targets only \
             (fault-injection service, unsynced bytes in memory); run etcd with kill,pause"
                .into(),
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    rt.block_on(run_all(args, workload, report))
}

async fn run_all(args: Args, workload: Workload, report: Report) -> Result<(), BenchError> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut results = Vec::new();
    for &kind in &args.target {
        let (spawned, endpoints) = match &args.spawn {
            Some(root) => {
                report.line(format_args!(
                    "== starting a 3-node {} cluster under {}",
                    kind.name(),
                    root.display()
                ));
                let (s, e) = spawn_target(kind, root, &args).await?;
                (Some(s), e)
            }
            None => (None, args.endpoints.clone()),
        };
        let credentials = match (&args.spawn, kind) {
            (Some(root), TargetKind::Phoenix | TargetKind::PhoenixWal) if args.tls => {
                LocalTls::load_or_create(&root.join(kind.name()))?.credentials()?
            }
            _ => Credentials::default(),
        };
        report.line(format_args!(
            "== {} at {}",
            kind.name(),
            endpoints.join(",")
        ));
        let mut target = Target::connect(kind, &endpoints, timeout, credentials).await?;
        let run_target = match args.client_mode {
            ClientMode::Grpc => target.clone(),
            ClientMode::Cli => Target::cli(kind, &endpoints)?,
        };
        let mut spawned = spawned;
        let mut verify: Option<Vec<tokio::sync::Mutex<KeyState>>> = if args.verify {
            let n = usize::try_from(args.keys).map_err(|_| "--keys too large for --verify")?;
            Some(
                (0..n)
                    .map(|_| tokio::sync::Mutex::new(KeyState::default()))
                    .collect(),
            )
        } else {
            None
        };
        if args.fill {
            let (filled, v) = run_once(
                &target,
                kind,
                &workload,
                &args,
                RunSpec {
                    clients: 64,
                    ops: args.keys,
                    fill: true,
                },
                verify.take(),
                report,
            )
            .await?;
            verify = v;
            if args.scan_ratio > 0.0 && filled.failed + filled.unknown > 0 {
                // Listings check pages against a complete key set.
                return Err(format!(
                    "the fill did not write every key ({} failed, {} unknown): listings cannot be checked",
                    filled.failed, filled.unknown
                )
                .into());
            }
        }
        for &clients in &args.clients {
            let nemesis = match (&mut spawned, args.nemesis.is_empty()) {
                (Some(sp), false) => {
                    let links = matches!(sp, Spawned::Phoenix(_)).then(|| endpoints.clone());
                    let n =
                        Nemesis::start(sp.take_procs(), args.nemesis.clone(), args.seed, links)?;
                    report.line(format_args!(
                        "   nemesis: {:?}, one node at a time, seed {}",
                        args.nemesis, args.seed
                    ));
                    Some(n)
                }
                _ => None,
            };
            let ran = run_once(
                &run_target,
                kind,
                &workload,
                &args,
                RunSpec {
                    clients,
                    ops: args.ops,
                    fill: false,
                },
                verify.take(),
                report,
            )
            .await;
            if let Some(n) = nemesis {
                let (procs, events) = n.finish()?;
                if let Some(sp) = &mut spawned {
                    sp.put_procs(procs);
                }
                report.line(format_args!("   nemesis: {} faults", events.len()));
                for e in &events {
                    report.line(format_args!("     {e}"));
                }
            }
            let (r, v) = ran?;
            verify = v;
            results.push(r);
        }
        if let Some(states) = &verify {
            let n = verify_all(&mut target, &workload, states, timeout).await?;
            report.line(format_args!(
                "   verify: all {n} written keys read back with their last acknowledged value"
            ));
        }
        drop(target);
        match spawned {
            Some(Spawned::Phoenix(mut c)) => c.stop(),
            Some(Spawned::Etcd(mut procs)) => {
                for p in &mut procs {
                    p.stop(Duration::from_secs(10));
                }
            }
            None => {}
        }
    }
    report.text(&summary_table(&results));
    report.summary(&summary_json(&results))?;
    Ok(())
}

/// The runs as one JSON object (`--output json`).
fn summary_json(results: &[RunResult]) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "target": r.target.name(),
                "clients": r.clients,
                "ops": r.ops,
                "seconds": r.elapsed.as_secs_f64(),
                "ops_per_sec": r.throughput(),
                "failed": r.failed,
                "unknown": r.unknown,
                "error_share": r.error_share(),
                "longest_gap_s": r.longest_gap.as_secs_f64(),
                "p50_us": r.p50_us,
                "p99_us": r.p99_us,
                "read_p99_us": r.read_p99_us,
                "write_p99_us": r.write_p99_us,
                "scans": r.scans,
                "scan_p99_us": r.scan_p99_us,
            })
        })
        .collect();
    serde_json::json!({ "benchmark": "cluster", "runs": runs })
}

fn summary_table(results: &[RunResult]) -> String {
    let mut out = String::from("\n| target | clients | ops/s | p50 (us) | p99 (us) | failed + unknown | longest gap (s) | vs first target |\n|---|---|---|---|---|---|---|---|\n");
    let first = results.first().map(|r| r.target);
    for r in results {
        let base = results
            .iter()
            .find(|b| Some(b.target) == first && b.clients == r.clients)
            .map(RunResult::throughput);
        let ratio = base.map_or("-".to_string(), |b| {
            format!("{:.2}x", r.throughput() / b.max(1e-9))
        });
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} + {} ({:.2}%) | {:.2} | {} |",
            r.target.name(),
            r.clients,
            r.throughput(),
            r.p50_us,
            r.p99_us,
            r.failed,
            r.unknown,
            100.0 * r.error_share(),
            r.longest_gap.as_secs_f64(),
            ratio
        );
    }
    out
}

/// Adds `--split-qps 0 --split-size-mb 0 --merge-size-mb 0` to spawned servers' `args`
/// unless they name those flags: a measurement or a check drives the groups it spawned
/// (splits and merges come only where it asks for them).
pub(crate) fn no_splits_unless_asked(args: &mut Vec<String>) {
    for flag in ["--split-qps", "--split-size-mb", "--merge-size-mb"] {
        if !args.iter().any(|a| a.starts_with(flag)) {
            args.extend([flag.to_string(), "0".to_string()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["t"];
        v.extend_from_slice(extra);
        T::parse_from(v).args
    }

    #[test]
    fn keys_and_values_have_their_sizes_and_check() {
        let a = args(&["--key_size", "12", "--value_size", "40", "--keys", "1000"]);
        let w = Workload::new(&a).unwrap();
        assert_eq!(w.key(7), b"k00000000007".to_vec());
        let v = w.value(7, 99);
        assert_eq!(v.len(), 40);
        assert_eq!(w.check_value(7, &v), Ok(99));
        assert!(w.check_value(8, &v).is_err(), "value of another key");
        let mut bad = v.clone();
        bad[30] ^= 1;
        assert!(w.check_value(7, &bad).is_err(), "flipped filler byte");
        assert!(w.check_value(7, &v[..39]).is_err(), "short value");
        assert_ne!(w.value(7, 99), w.value(7, 100));
    }

    /// Hashed keys keep their size and index, differ in their first bytes, and fall
    /// evenly into 16 slices of the 4-byte space (an even split of 16 groups).
    #[test]
    fn hashed_keys_spread_over_the_key_space() {
        let a = args(&[
            "--key_size",
            "16",
            "--keys",
            "100000",
            "--key-layout",
            "hashed",
        ]);
        let w = Workload::new(&a).unwrap();
        let k = w.key(7);
        assert_eq!(k.len(), 16);
        assert_eq!(&k[4..], b"k00000000007");
        let mut slices = [0u32; 16];
        for i in 0..16_000 {
            slices[usize::from(w.key(i)[0] >> 4)] += 1;
        }
        for (s, n) in slices.iter().enumerate() {
            assert!((800..1_200).contains(n), "slice {s} got {n} of 16000 keys");
        }
        let too_small = [
            "--key_size",
            "10",
            "--keys",
            "100000",
            "--key-layout",
            "hashed",
        ];
        assert!(Workload::new(&args(&too_small)).is_err());
    }

    #[test]
    fn listing_keys_pages_and_indexes_agree() {
        let listing = |keys: &str, dirs: &str, extra: &[&str]| {
            let mut v = vec![
                "--key-layout",
                "listing",
                "--key_size",
                "24",
                "--keys",
                keys,
                "--dirs",
                dirs,
            ];
            v.extend_from_slice(extra);
            Workload::new(&args(&v)).unwrap()
        };
        let w = listing("1050", "10", &["--scan_ratio", "1", "--scan_limit", "100"]);
        // 105 objects a directory; the last (9) holds 105 too (1050 = 10 * 105).
        assert_eq!(w.key(0), b"bucket/dir0/obj000000000".to_vec());
        assert_eq!(w.key(106), b"bucket/dir1/obj000000001".to_vec());
        for idx in [0, 104, 105, 106, 1049] {
            assert_eq!(w.key(idx).len(), 24);
            assert_eq!(w.index_of(&w.key(idx)), Some(idx));
        }
        assert_eq!(
            w.index_of(b"bucket/dir1/obj000000105"),
            None,
            "past the directory"
        );
        assert_eq!(w.index_of(b"other"), None);
        assert_eq!(
            w.index_of(b"bucket/dir1/obj1"),
            None,
            "not the key's own spelling"
        );
        assert_eq!(w.index_of(b"bucket/dir1/obj+00000001"), None);
        let (start, end, n) = w.listing(1, 0);
        assert_eq!(
            (start, end.as_slice(), n),
            (w.key(105), &b"bucket/dir10"[..], 100)
        );
        assert!(
            w.key(209) < end && w.key(210) >= end,
            "the range ends with the directory"
        );
        assert_eq!(w.listing(1, 100).2, 5);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..100 {
            match w.next_op(&mut rng) {
                Op::List { dir, obj } => assert!(dir < 10 && obj < 105),
                other => panic!("scan_ratio 1 made {other:?}"),
            }
        }
        // Uneven directories: 1000 keys over 3 directories of 334, the last holds 332.
        let w = listing("1000", "3", &[]);
        assert_eq!(w.listing(2, 300).2, 32);
        assert_eq!(w.index_of(&w.key(999)), Some(999));
    }

    #[test]
    fn bad_flags_are_refused() {
        let listing = |extra: &[&str]| {
            let mut v = vec!["--key-layout", "listing", "--key_size", "24"];
            v.extend_from_slice(extra);
            Workload::new(&args(&v))
        };
        assert!(listing(&[]).is_ok());
        assert!(
            Workload::new(&args(&["--scan_ratio", "0.5"])).is_err(),
            "needs listing"
        );
        assert!(listing(&["--scan_ratio", "2"]).is_err());
        assert!(listing(&["--scan_limit", "0"]).is_err());
        assert!(listing(&["--dirs", "0"]).is_err());
        assert!(
            Workload::new(&args(&["--key-layout", "listing", "--key_size", "12"])).is_err(),
            "no room for object numbers"
        );
        assert!(listing(&["--scan_ratio", "0.5", "--client-mode", "cli"]).is_err());
        assert!(Workload::new(&args(&["--key_size", "4"])).is_err());
        assert!(Workload::new(&args(&["--value_size", "8"])).is_err());
        assert!(Workload::new(&args(&["--read_ratio", "1.5"])).is_err());
        assert!(Workload::new(&args(&["--key_size", "8", "--keys", "100000000"])).is_err());
    }

    #[test]
    fn zipf_is_skewed_uniform_is_not() {
        let seed = 11;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let count_top = |w: &Workload, rng: &mut ChaCha8Rng| {
            let mut counts = vec![0u32; 1000];
            for _ in 0..100_000 {
                counts[w.next_key(rng) as usize] += 1;
            }
            counts.sort_unstable_by(|a, b| b.cmp(a));
            counts[..10].iter().sum::<u32>()
        };
        let u = Workload::new(&args(&["--keys", "1000"])).unwrap();
        let z = Workload::new(&args(&["--keys", "1000", "--distribution", "zipf"])).unwrap();
        let top_u = count_top(&u, &mut rng);
        let top_z = count_top(&z, &mut rng);
        // Uniform: top 10 of 1000 keys get ~1% (+ noise); zipf(0.99): ~35%.
        assert!(top_u < 2_000, "seed {seed}: uniform top-10 share {top_u}");
        assert!(top_z > 20_000, "seed {seed}: zipf top-10 share {top_z}");
    }

    #[test]
    fn read_ratio_is_respected() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let w = Workload::new(&args(&["--read_ratio", "0.9"])).unwrap();
        let reads = (0..10_000).filter(|_| w.next_is_read(&mut rng)).count();
        assert!((8_700..9_300).contains(&reads), "{reads}");
        let w = Workload::new(&args(&["--read_ratio", "0"])).unwrap();
        assert!((0..1000).all(|_| !w.next_is_read(&mut rng)));
    }

    #[test]
    fn lists_parse() {
        let a = args(&["--clients", "1,4,16,64", "--target", "phoenix,etcd"]);
        assert_eq!(a.clients, vec![1, 4, 16, 64]);
        assert_eq!(a.target, vec![TargetKind::Phoenix, TargetKind::Etcd]);
    }

    #[test]
    fn table_ratios_against_first_target() {
        let r = |target, ops| RunResult {
            target,
            clients: 4,
            ops,
            elapsed: Duration::from_secs(1),
            failed: 0,
            unknown: 0,
            longest_gap: Duration::ZERO,
            p50_us: 1.0,
            p99_us: 2.0,
            read_p99_us: 0.0,
            write_p99_us: 2.0,
            scans: 0,
            scan_p99_us: 0.0,
        };
        let t = summary_table(&[r(TargetKind::Phoenix, 2000), r(TargetKind::Etcd, 1000)]);
        assert!(
            t.contains("| phoenix | 4 | 2000 | 1 | 2 | 0 + 0 (0.00%) | 0.00 | 1.00x |"),
            "{t}"
        );
        assert!(
            t.contains("| etcd | 4 | 1000 | 1 | 2 | 0 + 0 (0.00%) | 0.00 | 0.50x |"),
            "{t}"
        );
    }
}
