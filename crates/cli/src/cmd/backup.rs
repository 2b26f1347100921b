//! `phoenix backup` and `phoenix restore`.
//!
//! A backup is a bucket prefix on an S3 server holding a consistent copy of every group
//! of a cluster, each at its own applied index, taken after a read barrier on its
//! leader once the backup began: every write acknowledged before `phoenix backup`
//! started is in it. Where the nodes' tables are in the same bucket (`--sst-store`),
//! a group's own tables are copied there by the store and only the rest passes through
//! the nodes; otherwise the whole group streams through this tool. Layout:
//!
//! ```text
//! <prefix>/BACKUP                          the manifest (BackupManifest), written last
//! <prefix>/g<group>-<run>-<try>/tables/…    tables copied by the store (engine tables)
//! <prefix>/g<group>-<run>-<try>/files/…     SST files streamed from the leader
//! ```
//!
//! The groups are walked in key order; the ranges kept tile the key space exactly
//! (a group that split or merged while the backup ran is taken again where a range is
//! missing), so no key is in two records. `BACKUP` is put only if absent: a prefix
//! holds one backup, and a backup without it is not whole. Once it is written, what
//! the tries it does not name left under `g…/` (failed tries, records a later split or
//! merge pushed out, a crashed backup's into the same prefix) is removed.
//!
//! A restore writes the backup's keys (and what is left of their expiries; keys
//! expired by then are left out) into a running cluster through its write path, so
//! the cluster may have any shape. A scratch engine reads each group: its tables
//! copied in by the store under `<prefix>/restore-<ms>/`, its files downloaded to a
//! local work directory; both are removed at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore as _, PutMode, PutOptions, PutPayload};
use phoenix_client::{Client, ClientError, Expiry, WriteOp};
use phoenix_engine::{Db, ObjectTableStore, Options, ReadOptions, S3Prefix, SharedTable};
use phoenix_proto as pb;
use phoenix_server::keys;
use prost::Message as _;
use serde_json::json;

use super::client::{options, unreachable_or, Conn};
use super::{BoxError, CmdError, Outcome};
use crate::output::{self, Format};

/// The manifest's object name under the backup's prefix.
pub const MANIFEST: &str = "BACKUP";
/// The manifest's format.
pub const FORMAT: u32 = 1;

/// Flags of `phoenix backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Where: `s3://bucket/prefix?endpoint=…` (credentials from `AWS_*`, as for
    /// `server --sst-store`). The prefix must not hold a backup already.
    #[arg(long)]
    pub to: String,
    /// Groups backed up at once.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Tries per group (a leader change or failure half way starts the group again).
    #[arg(long, default_value_t = 5)]
    pub attempts: u32,
    #[command(flatten)]
    pub conn: Conn,
}

/// Flags of `phoenix restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup: `s3://bucket/prefix?endpoint=…`, as given to `phoenix backup --to`.
    #[arg(long)]
    pub from: String,
    /// Write into a cluster that holds keys already (refused by default).
    #[arg(long, default_value_t = false)]
    pub into_non_empty: bool,
    /// Atomic batches written at once.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// Local directory for the scratch engine and the downloaded files (removed at the
    /// end). Default: under the system's temporary directory.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    #[command(flatten)]
    pub conn: Conn,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A multi-threaded runtime: the engine and the object store block on their own
/// threads while writes are in flight.
fn runtime() -> Result<tokio::runtime::Runtime, CmdError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CmdError::Failed(format!("start the async runtime: {e}").into()))
}

async fn connect(conn: &Conn, timeout: Duration) -> Result<Client, CmdError> {
    let mut opts = options(conn)?;
    opts.timeout = timeout;
    Client::connect(conn.endpoints.clone(), opts)
        .await
        .map_err(|e| unreachable_or(conn, e))
}

/// `phoenix backup`.
pub fn backup_cmd(args: BackupArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let client = connect(&args.conn, Duration::from_millis(args.conn.timeout_ms)).await?;
        let s = backup(&client, &args.to, args.parallel, args.attempts)
            .await
            .map_err(CmdError::Failed)?;
        match format {
            Format::Json => output::print_json(&s.json())?,
            Format::Text => output::note(format_args!(
                "backed up {} groups in {:.1} s: {} tables copied by the store ({} bytes), \
                 {} bytes streamed; every write acknowledged before {} ms is in it{}",
                s.groups,
                s.secs,
                s.tables,
                s.copied_bytes,
                s.streamed_bytes,
                s.started_ms,
                match (s.pruned, s.not_pruned) {
                    (0, 0) => String::new(),
                    (p, 0) => format!("; {p} objects of unused tries removed"),
                    (p, n) => format!(
                        "; {p} objects of unused tries removed, {n} not (see the log; the \
                         backup is whole)"
                    ),
                }
            )),
        }
        Ok(Outcome::Done)
    })
}

/// `phoenix restore`.
pub fn restore_cmd(args: RestoreArgs, format: Format) -> Result<Outcome, CmdError> {
    let work = args.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "phoenix-restore-{}-{}",
            std::process::id(),
            now_ms()
        ))
    });
    runtime()?.block_on(async {
        let client = connect(&args.conn, Duration::from_millis(args.conn.timeout_ms)).await?;
        let s = restore(
            &client,
            &args.from,
            &work,
            args.parallel,
            args.into_non_empty,
        )
        .await
        .map_err(CmdError::Failed)?;
        match format {
            Format::Json => output::print_json(&s.json())?,
            Format::Text => output::note(format_args!(
                "restored {} keys ({} bytes) of {} groups in {:.1} s; {} keys had expired",
                s.keys, s.bytes, s.groups, s.secs, s.expired
            )),
        }
        Ok(Outcome::Done)
    })
}

/// What a backup did.
#[derive(Debug, Clone, Default)]
pub struct BackupSummary {
    /// Groups in the manifest.
    pub groups: usize,
    /// Tables copied by the store, and their bytes.
    pub tables: usize,
    pub copied_bytes: u64,
    /// Bytes of the files streamed through this tool.
    pub streamed_bytes: u64,
    /// When it started (every write acknowledged before is in it).
    pub started_ms: u64,
    pub secs: f64,
    /// Objects of tries the manifest does not name, removed; and those whose removal
    /// failed (left in the bucket: the backup is whole all the same).
    pub pruned: usize,
    pub not_pruned: usize,
}

impl BackupSummary {
    fn json(&self) -> serde_json::Value {
        json!({
            "groups": self.groups,
            "tables": self.tables,
            "copied_bytes": self.copied_bytes,
            "streamed_bytes": self.streamed_bytes,
            "started_ms": self.started_ms,
            "secs": self.secs,
            "pruned": self.pruned,
            "not_pruned": self.not_pruned,
        })
    }
}

/// Backs up the cluster `client` reaches to `to` (see the module docs).
pub async fn backup(
    client: &Client,
    to: &str,
    parallel: usize,
    attempts: u32,
) -> Result<BackupSummary, BoxError> {
    let started = Instant::now();
    let dest = Arc::new(S3Prefix::from_url(to)?);
    if dest.prefix.is_empty() {
        return Err(format!("{to}: a backup needs a prefix of its own in the bucket").into());
    }
    let manifest = ObjectPath::from(format!("{}/{MANIFEST}", dest.prefix));
    match dest.store.head(&manifest).await {
        Ok(_) => return Err(format!("{to} holds a backup already ({manifest})").into()),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(format!("reading {manifest}: {e}").into()),
    }
    let started_ms = now_ms();
    // (After `started_ms`: each group's read barrier comes later still.)
    let run = format!("{started_ms:x}");
    let mut starts: Vec<Vec<u8>> = client
        .cached_routes()
        .into_iter()
        .map(|r| r.start)
        .collect();
    starts.push(Vec::new());
    starts.sort();
    starts.dedup();
    let by_start = Arc::new(tokio::sync::Mutex::new(BTreeMap::new()));
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for key in starts {
        let (client, dest, run, by_start) = (
            client.clone(),
            Arc::clone(&dest),
            run.clone(),
            Arc::clone(&by_start),
        );
        let permit = Arc::clone(&permits).acquire_owned().await?;
        tasks.spawn(async move {
            let r = backup_group(&client, &dest, &run, &key, attempts).await;
            drop(permit);
            let rec = r?;
            by_start.lock().await.insert(
                rec.head
                    .as_ref()
                    .map(|h| h.start_key.to_vec())
                    .unwrap_or_default(),
                rec,
            );
            Ok::<(), BoxError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let mut by_start = Arc::try_unwrap(by_start)
        .map_err(|_| "backup tasks still running")?
        .into_inner();
    // The ranges kept tile the key space: where none starts where the last ended (a
    // group split or merged meanwhile), the group there now is taken.
    let mut again = 0usize;
    let kept = loop {
        match tiling(&by_start) {
            Ok(kept) => break kept,
            Err(missing) => {
                again += 1;
                if again > 2 * by_start.len() + 16 {
                    return Err(format!(
                        "the groups kept splitting and merging: no backup tiles the key \
                         space after {again} more groups"
                    )
                    .into());
                }
                let rec = backup_group(client, &dest, &run, &missing, attempts).await?;
                take_in(&mut by_start, rec);
            }
        }
    };
    let mut summary = BackupSummary {
        groups: kept.len(),
        started_ms,
        ..BackupSummary::default()
    };
    for h in kept.iter().filter_map(|r| r.head.as_ref()) {
        summary.tables += h.tables.len();
        summary.copied_bytes += h.tables.iter().map(|t| t.size).sum::<u64>();
        summary.streamed_bytes += h.files.iter().map(|f| f.size).sum::<u64>();
    }
    let m = pb::BackupManifest {
        format: FORMAT,
        started_ms,
        finished_ms: now_ms(),
        groups: kept,
    };
    let put = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    let put = dest
        .store
        .put_opts(&manifest, PutPayload::from(m.encode_to_vec()), put)
        .await;
    match put {
        Ok(_) => {}
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {
            // Ours, if the client sent the put again after an answer that was lost.
            let there = dest.store.get(&manifest).await?.bytes().await?;
            if there != m.encode_to_vec() {
                return Err(format!("{to}: another backup wrote {manifest} meanwhile").into());
            }
        }
        Err(e) => return Err(format!("writing {manifest}: {e}").into()),
    }
    (summary.pruned, summary.not_pruned) = prune(&dest, &m).await;
    summary.secs = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Removes the objects under the backup's prefix that tries the manifest `m` does not
/// name left (a try's directory is `g<group>-<run>-<try>`); nothing else is touched.
/// Returns how many were removed and how many could not be (logged).
async fn prune(dest: &S3Prefix, m: &pb::BackupManifest) -> (usize, usize) {
    use futures_util::TryStreamExt as _;
    let named: std::collections::HashSet<&str> =
        m.groups.iter().map(|r| r.prefix.as_str()).collect();
    let root = ObjectPath::from(dest.prefix.as_str());
    let listed: Result<Vec<ObjectPath>, _> = dest
        .store
        .list(Some(&root))
        .map_ok(|o| o.location)
        .try_collect()
        .await;
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("listing {root} to remove what failed tries left: {e}");
            return (0, 1);
        }
    };
    let (mut pruned, mut not_pruned) = (0, 0);
    for at in listed {
        let Some(dir) = at
            .prefix_match(&root)
            .and_then(|mut parts| parts.next())
            .map(|p| p.as_ref().to_string())
        else {
            continue;
        };
        if !is_try_dir(&dir) || named.contains(dir.as_str()) {
            continue;
        }
        match dest.store.delete(&at).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => pruned += 1,
            Err(e) => {
                tracing::warn!("removing {at}, left by a try the backup does not use: {e}");
                not_pruned += 1;
            }
        }
    }
    (pruned, not_pruned)
}

/// Whether `dir` names a try's directory: `g<group>-<run>-<try>` (group and try in
/// decimal, the run in hex).
fn is_try_dir(dir: &str) -> bool {
    let mut parts = dir.strip_prefix('g').unwrap_or("").split('-');
    let (Some(g), Some(run), Some(t), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let digits = |s: &str, hex: bool| {
        !s.is_empty()
            && s.chars().all(|c| {
                if hex {
                    c.is_ascii_hexdigit()
                } else {
                    c.is_ascii_digit()
                }
            })
    };
    digits(g, false) && digits(run, true) && digits(t, false)
}

/// Keeps `rec`, taken again where no record started: the records it overlaps are
/// older views of its keys (a split or merge came between) and go; where that leaves a
/// hole, the group there now is taken in turn.
fn take_in(by_start: &mut BTreeMap<Vec<u8>, pb::BackupGroupRecord>, rec: pb::BackupGroupRecord) {
    let (start, end) = rec
        .head
        .as_ref()
        .map(|h| (h.start_key.to_vec(), h.end_key.to_vec()))
        .unwrap_or_default();
    by_start.retain(|s, r| {
        let e = r
            .head
            .as_ref()
            .map(|h| h.end_key.as_ref())
            .unwrap_or_default();
        let overlaps = (end.is_empty() || s.as_slice() < end.as_slice())
            && (e.is_empty() || e > start.as_slice());
        !overlaps
    });
    by_start.insert(start, rec);
}

/// The records that tile the key space from the empty key on, in order; else the
/// first key no record starts at.
fn tiling(
    by_start: &BTreeMap<Vec<u8>, pb::BackupGroupRecord>,
) -> Result<Vec<pb::BackupGroupRecord>, Vec<u8>> {
    let mut out = Vec::new();
    let mut at: Vec<u8> = Vec::new();
    loop {
        let Some(head) = by_start.get(&at).and_then(|r| r.head.as_ref()) else {
            return Err(at);
        };
        out.push(by_start[&at].clone());
        if head.end_key.is_empty() {
            return Ok(out);
        }
        at = head.end_key.to_vec();
    }
}

/// Numbers the tries of groups of this process's backups.
static TRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Backs up the group holding `key`, trying again (from scratch, under a new prefix) on
/// a failure.
async fn backup_group(
    client: &Client,
    dest: &S3Prefix,
    run: &str,
    key: &[u8],
    attempts: u32,
) -> Result<pb::BackupGroupRecord, BoxError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        // (Each try writes under a prefix no other try of this backup uses.)
        let n = TRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match backup_try(client, dest, run, key, n).await {
            Ok(r) => return Ok(r),
            Err(e) if attempt < attempts.max(1) => {
                tracing::warn!(key = ?String::from_utf8_lossy(key), attempt, "backing up a group failed; trying again: {e}");
                tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
            }
            Err(e) => {
                return Err(format!(
                    "backing up the group of key {:?} failed {attempt} times; last: {e}",
                    String::from_utf8_lossy(key)
                )
                .into())
            }
        }
    }
}

async fn backup_try(
    client: &Client,
    dest: &S3Prefix,
    run: &str,
    key: &[u8],
    try_number: u64,
) -> Result<pb::BackupGroupRecord, BoxError> {
    let group_prefix = |g: u64| format!("g{g}-{run}-{try_number}");
    let mut s = client
        .backup_group(key, &dest.shared_id, |g| {
            format!("{}/{}/tables", dest.prefix, group_prefix(g))
        })
        .await?;
    let addr = s.addr().to_string();
    let broken = |why: String| -> BoxError { format!("node {addr}: {why}").into() };
    let head = match s.next().await? {
        Some(pb::BackupGroupChunk { head: Some(h), .. }) => h,
        Some(_) => return Err(broken("a file chunk before the group's head".into())),
        None => return Err(broken("the stream ended before the group's head".into())),
    };
    check_head(&head).map_err(broken)?;
    let inside =
        key >= head.start_key.as_ref() && (head.end_key.is_empty() || key < head.end_key.as_ref());
    if !inside {
        return Err(broken(format!(
            "group {} does not hold the key asked for (its range moved)",
            head.group_id
        )));
    }
    let prefix = group_prefix(head.group_id);
    let mut data: Vec<u8> = Vec::new();
    for (i, f) in head.files.iter().enumerate() {
        data.clear();
        while (data.len() as u64) < f.size {
            let c = s
                .next()
                .await?
                .ok_or_else(|| broken(format!("the stream ended inside {}", f.name)))?;
            let chunk = c.file.ok_or_else(|| broken("a second head".to_string()))?;
            if chunk.file as usize != i || chunk.offset != data.len() as u64 {
                return Err(broken(format!(
                    "chunk of file {} at {} where file {i} at {} was due",
                    chunk.file,
                    chunk.offset,
                    data.len()
                )));
            }
            data.extend_from_slice(&chunk.data);
            if data.len() as u64 > f.size {
                return Err(broken(format!(
                    "{} is longer than its {} bytes",
                    f.name, f.size
                )));
            }
        }
        if crc32c::crc32c(&data) != f.crc32c {
            return Err(broken(format!("{} does not match its checksum", f.name)));
        }
        let object = ObjectPath::from(format!("{}/{prefix}/files/{}", dest.prefix, f.name));
        dest.store
            .put(&object, PutPayload::from(std::mem::take(&mut data)))
            .await
            .map_err(|e| format!("writing {object}: {e}"))?;
    }
    if s.next().await?.is_some() {
        return Err(broken("more than the files its head names".into()));
    }
    Ok(pb::BackupGroupRecord {
        head: Some(head),
        prefix,
    })
}

/// Bytes a streamed file may hold (the nodes cut them at 64 MiB; a key and value at
/// most past that).
const FILE_BYTES_MAX: u64 = 256 << 20;

/// Whether a name is one plain object or file name.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']) && name.len() <= 255
}

/// Checks what a head says of itself: a known key layout, a range that is one, plain
/// and distinct names, files of a bounded size.
fn check_head(h: &pb::BackupGroupHead) -> Result<(), String> {
    if h.key_format != phoenix_server::backup::KEY_FORMAT {
        return Err(format!(
            "group {}: key format {}; this binary reads {}",
            h.group_id,
            h.key_format,
            phoenix_server::backup::KEY_FORMAT
        ));
    }
    if !h.end_key.is_empty() && h.end_key <= h.start_key {
        return Err(format!(
            "group {}: its range ends before it starts",
            h.group_id
        ));
    }
    // (Tables and files are in directories of their own.)
    let tables: Vec<&String> = h.tables.iter().map(|t| &t.name).collect();
    let files: Vec<&String> = h.files.iter().map(|f| &f.name).collect();
    for names in [tables, files] {
        let mut seen = std::collections::HashSet::new();
        if let Some(n) = names
            .iter()
            .find(|n| !plain_name(n) || !seen.insert(n.as_str()))
        {
            return Err(format!("group {}: object name {n:?}", h.group_id));
        }
    }
    if let Some(f) = h.files.iter().find(|f| f.size > FILE_BYTES_MAX) {
        return Err(format!(
            "group {}: file {} of {} bytes (at most {FILE_BYTES_MAX})",
            h.group_id, f.name, f.size
        ));
    }
    Ok(())
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreSummary {
    pub groups: usize,
    /// Keys written, and their keys' and values' bytes.
    pub keys: u64,
    pub bytes: u64,
    /// Keys left out: their expiry had passed.
    pub expired: u64,
    pub secs: f64,
}

impl RestoreSummary {
    fn json(&self) -> serde_json::Value {
        json!({
            "groups": self.groups,
            "keys": self.keys,
            "bytes": self.bytes,
            "expired": self.expired,
            "secs": self.secs,
        })
    }
}

/// Reads the manifest of the backup at `from`.
pub async fn read_manifest(src: &S3Prefix) -> Result<pb::BackupManifest, BoxError> {
    let at = ObjectPath::from(format!("{}/{MANIFEST}", src.prefix));
    let bytes = match src.store.get(&at).await {
        Ok(r) => r.bytes().await.map_err(|e| format!("reading {at}: {e}"))?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(format!("no backup at {at} (none, or one that did not finish)").into())
        }
        Err(e) => return Err(format!("reading {at}: {e}").into()),
    };
    let m = pb::BackupManifest::decode(bytes).map_err(|e| format!("decoding {at}: {e}"))?;
    if m.format != FORMAT {
        return Err(format!(
            "{at} is of format {}; this binary reads format {FORMAT}",
            m.format
        )
        .into());
    }
    // The groups tile the key space once, from the empty key on, in order.
    let mut at_key: &[u8] = b"";
    for (n, r) in m.groups.iter().enumerate() {
        let h = r
            .head
            .as_ref()
            .ok_or_else(|| format!("{at}: a group without its head"))?;
        check_head(h).map_err(|e| format!("{at}: {e}"))?;
        if !plain_name(&r.prefix) || h.start_key.as_ref() != at_key {
            return Err(format!(
                "{at}: group {} (prefix {:?}) does not start where the one before ended",
                h.group_id, r.prefix
            )
            .into());
        }
        if h.end_key.is_empty() != (n + 1 == m.groups.len()) {
            return Err(format!("{at}: the groups do not end with the key space").into());
        }
        at_key = &h.end_key;
    }
    if m.groups.is_empty() {
        return Err(format!("{at}: no groups").into());
    }
    Ok(m)
}

/// A key to write: key, value, and its expiry (ms since the epoch) if it has one.
type Pair = (Vec<u8>, Vec<u8>, Option<u64>);

/// Keys per atomic batch, and bytes at most.
const BATCH_KEYS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;

/// Restores the backup at `from` into the cluster `client` reaches (see the module
/// docs); `work` is the local work directory.
pub async fn restore(
    client: &Client,
    from: &str,
    work: &Path,
    parallel: usize,
    into_non_empty: bool,
) -> Result<RestoreSummary, BoxError> {
    let started = Instant::now();
    let src = S3Prefix::from_url(from)?;
    let m = read_manifest(&src).await?;
    if !into_non_empty {
        let page = client.scan_page(b"", b"", 1).await?;
        if !page.pairs.is_empty() {
            return Err(
                "the cluster holds keys already; restore into an empty one (or \
                        pass --into-non-empty)"
                    .into(),
            );
        }
    }
    let run = format!("restore-{}-{}", std::process::id(), now_ms());
    let scratch_prefix = format!("{}/{run}", src.prefix);
    let scratch_url = with_prefix(from, &scratch_prefix)?;
    let store = Arc::new(ObjectTableStore::from_url(&scratch_url)?);
    // (A directory of its own under `work`: only it is removed at the end.)
    let work = &work.join(&run);
    let db_dir = work.join("engine");
    let db = {
        let (store, dir) = (Arc::clone(&store), db_dir.clone());
        tokio::task::spawn_blocking(move || {
            let opts = Options {
                create_if_missing: true,
                ..Options::default()
            };
            Db::open_with_store(Arc::new(phoenix_storage::LocalFs::new()), &dir, store, opts)
        })
        .await??
    };
    let src = Arc::new(src);
    let result = restore_groups(client, &src, &db, &m, work, parallel).await;
    // The scratch engine and its objects go, whatever happened (a failed close does not
    // keep them: nothing in them is needed).
    let closing = tokio::task::spawn_blocking(move || {
        let closed = db.close();
        drop(db);
        (closed, store.destroy())
    })
    .await;
    let _ = std::fs::remove_dir_all(work);
    let mut cleanup = Vec::new();
    match closing {
        Ok((closed, destroyed)) => {
            if let Err(e) = closed {
                cleanup.push(format!("its scratch engine did not close: {e}"));
            }
            if let Err(e) = destroyed {
                cleanup.push(format!(
                    "its scratch objects under {scratch_prefix:?} were not all removed: {e}"
                ));
            }
        }
        Err(e) => cleanup.push(format!(
            "its scratch engine and objects under {scratch_prefix:?} may remain: {e}"
        )),
    }
    let cleanup = cleanup.join("; ");
    let mut summary = match result {
        Ok(summary) if cleanup.is_empty() => summary,
        Ok(_) => return Err(format!("the restore is done, but {cleanup}").into()),
        Err(e) if cleanup.is_empty() => return Err(e),
        Err(e) => return Err(format!("{e} (and {cleanup})").into()),
    };
    summary.groups = m.groups.len();
    summary.secs = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// `url` with its prefix replaced by `prefix`.
fn with_prefix(url: &str, prefix: &str) -> Result<String, BoxError> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url}: only s3://<bucket>/<prefix> is understood"))?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let bucket = location.split('/').next().unwrap_or_default();
    Ok(if query.is_empty() {
        format!("s3://{bucket}/{prefix}")
    } else {
        format!("s3://{bucket}/{prefix}?{query}")
    })
}

async fn restore_groups(
    client: &Client,
    src: &Arc<S3Prefix>,
    db: &Arc<Db>,
    m: &pb::BackupManifest,
    work: &Path,
    parallel: usize,
) -> Result<RestoreSummary, BoxError> {
    let mut summary = RestoreSummary::default();
    for rec in &m.groups {
        let (k, b, expired) = restore_group(client, src, db, rec, work, parallel).await?;
        summary.keys += k;
        summary.bytes += b;
        summary.expired += expired;
    }
    Ok(summary)
}

/// Restores one group: its keys and bytes written, and the keys left out as expired.
async fn restore_group(
    client: &Client,
    src: &Arc<S3Prefix>,
    db: &Arc<Db>,
    rec: &pb::BackupGroupRecord,
    work: &Path,
    parallel: usize,
) -> Result<(u64, u64, u64), BoxError> {
    let (mut keys_n, mut bytes) = (0u64, 0u64);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Pair>>(parallel.max(1) * 2);
    let reader = {
        let (db, src, rec, dir) = (
            Arc::clone(db),
            Arc::clone(src),
            rec.clone(),
            work.join("files"),
        );
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || read_group(&rt, &db, &src, &rec, &dir, &tx))
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut writes = tokio::task::JoinSet::new();
    let mut failed: Option<BoxError> = None;
    while failed.is_none() {
        let Some(batch) = rx.recv().await else {
            break;
        };
        let permit = Arc::clone(&permits).acquire_owned().await?;
        let client = client.clone();
        writes.spawn(async move {
            let r = write_batch(&client, batch).await;
            drop(permit);
            r
        });
        while let Some(r) = writes.try_join_next() {
            match r.map_err(BoxError::from).and_then(|r| r) {
                Ok((k, b)) => {
                    keys_n += k;
                    bytes += b;
                }
                Err(e) => failed = Some(e),
            }
        }
    }
    // (On a failure the reader stops at its next batch; it is waited for either way,
    // so nothing of this group runs once this returns.)
    drop(rx);
    while let Some(r) = writes.join_next().await {
        match r.map_err(BoxError::from).and_then(|r| r) {
            Ok((k, b)) => {
                keys_n += k;
                bytes += b;
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    let read = reader.await.map_err(BoxError::from).and_then(|r| r);
    if let Some(e) = failed {
        return Err(e);
    }
    let expired = read?;
    Ok((keys_n, bytes, expired))
}

/// Installs a group of the backup in the scratch engine and sends its keys in batches
/// (a key that expires on its own; the others by key order), then drops it. Returns how
/// many keys had expired.
fn read_group(
    rt: &tokio::runtime::Handle,
    db: &Db,
    src: &S3Prefix,
    rec: &pb::BackupGroupRecord,
    dir: &Path,
    tx: &tokio::sync::mpsc::Sender<Vec<Pair>>,
) -> Result<u64, BoxError> {
    let head = rec.head.as_ref().ok_or("a group without its head")?;
    let g = head.group_id;
    let base = format!("{}/{}", src.prefix, rec.prefix);
    let copies = if head.tables.is_empty() {
        None
    } else {
        let tables: Vec<SharedTable> = head
            .tables
            .iter()
            .map(|t| SharedTable {
                level: t.level,
                object: format!("{base}/tables/{}", t.name),
                size: t.size,
            })
            .collect();
        let id = db.shared_store_id().unwrap_or_default();
        Some(db.copy_in_group(g, &id, &tables)?)
    };
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut paths = Vec::with_capacity(head.files.len());
    for f in &head.files {
        let at = ObjectPath::from(format!("{base}/files/{}", f.name));
        let store = Arc::clone(&src.store);
        let a = at.clone();
        let data = rt
            .block_on(async move { store.get(&a).await?.bytes().await })
            .map_err(|e| format!("reading {at}: {e}"))?;
        if data.len() as u64 != f.size || crc32c::crc32c(&data) != f.crc32c {
            return Err(format!(
                "{at}: {} bytes that do not match the manifest's size {} or checksum",
                data.len(),
                f.size
            )
            .into());
        }
        let p = dir.join(&f.name);
        std::fs::write(&p, &data).map_err(|e| format!("writing {}: {e}", p.display()))?;
        paths.push(p);
    }
    match copies {
        Some(c) => db.replace_group_with_copies(g, c, &paths)?,
        None => db.replace_group(g, &paths)?,
    }
    let _ = std::fs::remove_dir_all(dir);
    // What was installed is the group as backed up: its sentinel says the same index.
    let ro = ReadOptions::default();
    let sentinel = db
        .get(&ro, &keys::applied_key(g))?
        .as_deref()
        .and_then(keys::decode_applied);
    if sentinel != Some((head.applied_index, head.applied_term)) {
        return Err(format!(
            "group {g} of the backup reads back at (index, term) {sentinel:?}, its head \
             says ({}, {})",
            head.applied_index, head.applied_term
        )
        .into());
    }
    let expired = send_keys(db, head, tx);
    db.drop_group(g)?;
    expired
}

/// Sends group `head`'s keys (data namespace, with their expiries) in batches.
fn send_keys(
    db: &Db,
    head: &pb::BackupGroupHead,
    tx: &tokio::sync::mpsc::Sender<Vec<Pair>>,
) -> Result<u64, BoxError> {
    let g = head.group_id;
    let bound = |ns_end: Vec<u8>, key_of: fn(u64, &[u8]) -> Vec<u8>| {
        (
            key_of(g, &head.start_key),
            if head.end_key.is_empty() {
                ns_end
            } else {
                key_of(g, &head.end_key)
            },
        )
    };
    let (lo, hi) = bound(keys::data_end(g), keys::data_key);
    let (elo, ehi) = bound(keys::expiry_end(g), keys::expiry_key);
    let ro = ReadOptions {
        lower_bound: Some(lo),
        upper_bound: Some(hi),
        fill_cache: false,
        ..ReadOptions::default()
    };
    let eo = ReadOptions {
        lower_bound: Some(elo),
        upper_bound: Some(ehi),
        fill_cache: false,
        ..ReadOptions::default()
    };
    let mut it = db.iter(&ro)?;
    let mut exp = db.iter(&eo)?;
    it.seek_to_first();
    exp.seek_to_first();
    let now = now_ms();
    let mut expired = 0u64;
    let mut batch: Vec<Pair> = Vec::new();
    let mut bytes = 0usize;
    while it.valid() {
        let user = &it.key()[9..];
        // The expiry iterator walks the same user keys in the same order.
        while exp.valid() && &exp.key()[9..] < user {
            exp.next();
        }
        let expiry = if exp.valid() && &exp.key()[9..] == user {
            Some(keys::decode_expiry(exp.value()).ok_or_else(|| {
                format!(
                    "group {g}: a malformed expiry for key {:?}",
                    String::from_utf8_lossy(user)
                )
            })?)
        } else {
            None
        };
        // (Expired as a read sees it: before now.)
        if expiry.is_some_and(|at| at < now) {
            expired += 1;
        } else {
            bytes += user.len() + it.value().len();
            batch.push((user.to_vec(), it.value().to_vec(), expiry));
            if batch.len() >= BATCH_KEYS || bytes >= BATCH_BYTES {
                bytes = 0;
                tx.blocking_send(std::mem::take(&mut batch))
                    .map_err(|_| "the writes stopped")?;
            }
        }
        it.next();
    }
    it.status()?;
    exp.status()?;
    if !batch.is_empty() {
        tx.blocking_send(batch).map_err(|_| "the writes stopped")?;
    }
    Ok(expired)
}

/// Writes one batch: the keys without an expiry as atomic batches (halved where they
/// span groups of the cluster), the others one by one with what is left of their
/// expiry. Writes whose outcome is unknown are sent again (they are puts). Returns the
/// keys and bytes written.
async fn write_batch(client: &Client, batch: Vec<Pair>) -> Result<(u64, u64), BoxError> {
    let (keys_n, bytes) = (
        batch.len() as u64,
        batch
            .iter()
            .map(|(k, v, _)| (k.len() + v.len()) as u64)
            .sum(),
    );
    let mut plain = Vec::new();
    for (k, v, expiry) in batch {
        match expiry {
            None => plain.push(WriteOp::Put(k, v)),
            Some(at) => {
                // (What is left is measured again at each try.)
                again(|| {
                    let left = Duration::from_millis(at.saturating_sub(now_ms()).max(1));
                    client.put_with(&k, &v, Expiry::After(left))
                })
                .await?;
            }
        }
    }
    let mut stack = vec![plain];
    while let Some(mut ops) = stack.pop() {
        if ops.is_empty() {
            continue;
        }
        match again(|| client.batch_write(&ops)).await {
            Ok(()) => {}
            Err(ClientError::CrossGroup { .. }) if ops.len() > 1 => {
                let upper = ops.split_off(ops.len() / 2);
                stack.push(upper);
                stack.push(ops);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((keys_n, bytes))
}

/// Runs `call` again (up to 5 times) while its outcome is unknown or its deadline
/// passed: a restore's writes are puts, the same however often they apply.
async fn again<F, Fut>(mut call: F) -> Result<(), ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ClientError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match call().await {
            Err(ClientError::Ambiguous { .. } | ClientError::DeadlineExceeded { .. })
                if tries < 5 =>
            {
                tokio::time::sleep(Duration::from_millis(200 * tries)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};

    use phoenix_client::ClientOptions;
    use phoenix_server::{Config, MetaMember};

    use super::*;
    use crate::cmd::minio::Minio;
    use crate::cmd::playground::free_ports;

    /// A cluster of `n` in-process nodes (replication `n`), groups split at `splits`,
    /// tables on `sst_store(node)` if given; stopped when dropped.
    struct Cluster {
        stops: Vec<tokio::sync::oneshot::Sender<()>>,
        endpoints: Vec<String>,
    }

    impl Cluster {
        fn start(
            dir: &Path,
            n: u64,
            splits: &[&str],
            sst_store: Option<&dyn Fn(u64) -> String>,
        ) -> Cluster {
            let addrs: Vec<String> = free_ports(n as usize)
                .unwrap()
                .into_iter()
                .map(|a| a.to_string())
                .collect();
            let meta: Vec<MetaMember> = addrs
                .iter()
                .enumerate()
                .map(|(i, a)| MetaMember {
                    id: i as u64 + 1,
                    addr: a.clone(),
                })
                .collect();
            let mut stops = Vec::new();
            for id in 1..=n {
                let addr = &addrs[id as usize - 1];
                let mut c = Config::new(id, addr, dir.join(format!("node-{id}")), meta.clone());
                c.replication = n as usize;
                c.split_keys = splits.iter().map(|s| s.as_bytes().to_vec()).collect();
                c.tick = Duration::from_millis(10);
                c.election_ticks = 20;
                c.heartbeat_interval = Duration::from_millis(200);
                c.reserve_space = 0;
                c.group_split_bytes = 0;
                c.group_split_keys = 0;
                c.group_split_qps = 0;
                c.group_merge_bytes = 0;
                c.scrub_interval = Duration::ZERO;
                // Small memtables: the groups' data reaches the levels below L0, whose
                // tables a backup copies.
                c.memtable_bytes = 256 << 10;
                c.sst_store = sst_store.map(|f| f(id));
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                tokio::spawn(phoenix_server::run(c, async move {
                    let _ = rx.await;
                }));
                stops.push(tx);
            }
            Cluster {
                stops,
                endpoints: addrs,
            }
        }

        async fn client(&self) -> Client {
            let opts = ClientOptions {
                timeout: Duration::from_secs(10),
                ..ClientOptions::default()
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(c) = Client::connect(self.endpoints.clone(), opts.clone()).await {
                    if c.put(b"!probe", b"").await.is_ok() && c.delete(b"!probe").await.is_ok() {
                        return c;
                    }
                }
                assert!(Instant::now() < deadline, "the cluster did not serve");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    impl Drop for Cluster {
        fn drop(&mut self) {
            for s in self.stops.drain(..) {
                let _ = s.send(());
            }
        }
    }

    fn record(g: u64, start: &str, end: &str) -> pb::BackupGroupRecord {
        pb::BackupGroupRecord {
            head: Some(pb::BackupGroupHead {
                group_id: g,
                start_key: start.as_bytes().to_vec().into(),
                end_key: end.as_bytes().to_vec().into(),
                ..Default::default()
            }),
            prefix: format!("g{g}"),
        }
    }

    fn groups(t: &[pb::BackupGroupRecord]) -> Vec<u64> {
        t.iter()
            .map(|r| r.head.as_ref().unwrap().group_id)
            .collect()
    }

    /// The records kept tile the key space once: a group taken again after a merge and
    /// a split (it starts before the hole it was asked for) pushes out the older
    /// records it overlaps, and the holes that leaves are taken in turn.
    #[test]
    fn the_records_kept_tile_the_key_space_once() {
        let mut by: BTreeMap<Vec<u8>, pb::BackupGroupRecord> = BTreeMap::new();
        for r in [record(1, "", "k3"), record(3, "k6", "")] {
            take_in(&mut by, r);
        }
        // Group 2 [k3, k6) merged into 1, which then split at k2: asked for k3, the
        // group there now is 4 [k2, k6).
        assert_eq!(tiling(&by).unwrap_err(), b"k3".to_vec());
        take_in(&mut by, record(4, "k2", "k6"));
        assert_eq!(tiling(&by).unwrap_err(), b"".to_vec());
        take_in(&mut by, record(1, "", "k2"));
        assert_eq!(groups(&tiling(&by).unwrap()), vec![1, 4, 3]);
        // A group taken twice (two tries, two start keys) is kept once.
        take_in(&mut by, record(4, "k2", "k6"));
        assert_eq!(groups(&tiling(&by).unwrap()), vec![1, 4, 3]);
        assert_eq!(by.len(), 3);
    }

    #[test]
    fn only_a_try_s_directory_is_pruned() {
        for dir in ["g1-18f0a-1", "g12345-abcdef0123-99"] {
            assert!(is_try_dir(dir), "{dir}");
        }
        for dir in [
            "BACKUP",
            "g1",
            "g1-2",
            "g-1a-1",
            "g1-zz-1",
            "g1-1a-1-2",
            "g1-1a-",
            "restore-12-34",
            "notes",
            "x1-1a-1",
        ] {
            assert!(!is_try_dir(dir), "{dir}");
        }
    }

    /// A head that names objects outside its directories, twice, or of no known
    /// layout, or a range that is none, is refused; so is a manifest whose groups do not
    /// tile the key space.
    #[tokio::test]
    async fn malformed_heads_and_manifests_are_refused() {
        let good = || {
            let mut r = record(5, "a", "b");
            let h = r.head.as_mut().unwrap();
            h.key_format = phoenix_server::backup::KEY_FORMAT;
            h.files = vec![pb::BackupFile {
                name: "000001.sst".into(),
                size: 10,
                crc32c: 0,
            }];
            h.tables = vec![pb::BackupTable {
                name: "000001.sst".into(),
                level: 1,
                size: 10,
            }];
            r
        };
        assert_eq!(check_head(good().head.as_ref().unwrap()), Ok(()));
        type Change = Box<dyn Fn(&mut pb::BackupGroupHead)>;
        let bad: Vec<(&str, Change)> = vec![
            ("key format", Box::new(|h| h.key_format += 1)),
            (
                "ends before",
                Box::new(|h| h.end_key = "a".as_bytes().to_vec().into()),
            ),
            ("object name", Box::new(|h| h.files[0].name = "../x".into())),
            ("object name", Box::new(|h| h.files[0].name = "a/b".into())),
            (
                "object name",
                Box::new(|h| h.tables[0].name = String::new()),
            ),
            (
                "object name",
                Box::new(|h| h.files.push(h.files[0].clone())),
            ),
            (
                "at most",
                Box::new(|h| h.files[0].size = FILE_BYTES_MAX + 1),
            ),
        ];
        for (why, change) in bad {
            let mut r = good();
            change(r.head.as_mut().unwrap());
            let e = check_head(r.head.as_ref().unwrap()).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }

        let src = S3Prefix {
            store: Arc::new(object_store::memory::InMemory::new()),
            shared_id: "memory".into(),
            prefix: "b".into(),
        };
        let with = |groups: Vec<(&str, &str)>| pb::BackupManifest {
            format: FORMAT,
            groups: groups
                .into_iter()
                .enumerate()
                .map(|(i, (s, e))| {
                    let mut r = good();
                    let h = r.head.as_mut().unwrap();
                    h.group_id = i as u64 + 1;
                    h.start_key = s.as_bytes().to_vec().into();
                    h.end_key = e.as_bytes().to_vec().into();
                    r
                })
                .collect(),
            ..Default::default()
        };
        let at = ObjectPath::from("b/BACKUP");
        for (m, want) in [
            (with(vec![("", "k"), ("k", "")]), None),
            (
                with(vec![("", "k"), ("j", "")]),
                Some("does not start where"),
            ),
            (with(vec![("", "k")]), Some("do not end with")),
            (with(vec![("a", "")]), Some("does not start where")),
            (with(vec![]), Some("no groups")),
        ] {
            src.store
                .put(&at, PutPayload::from(m.encode_to_vec()))
                .await
                .unwrap();
            match (read_manifest(&src).await, want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{w}: {e}"),
                (r, w) => panic!("{w:?}: {:?}", r.map(|m| m.groups.len())),
            }
        }
    }

    fn value(i: u64) -> Vec<u8> {
        let mut v = format!("value-{i}-").into_bytes();
        v.resize(700, b'a' + (i % 26) as u8);
        v
    }

    /// A 3-node cluster on MinIO under writes is backed up (its tables copied by the
    /// store) and restored into a new single node on local disk: every write
    /// acknowledged before the backup started is there with its value, nothing that was
    /// never written is, deleted and expired keys are not, an expiry is kept. That
    /// node, on local disk, is backed up in turn (all of it streamed) and restored into
    /// a third one, which then holds exactly what the second does. A prefix holding a
    /// backup is not written again, and a non-empty cluster is not restored into.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "needs minio"]
    async fn backup_under_writes_restores_every_acknowledged_write_minio() {
        let dir = tempfile::tempdir().unwrap();
        let minio = {
            let d = dir.path().to_path_buf();
            tokio::task::spawn_blocking(move || {
                Minio::start(&d, std::env::var_os("PHOENIX_MINIO").map(PathBuf::from))
            })
            .await
            .unwrap()
            .unwrap()
        };
        let env = minio.client_env();
        let creds = format!("&access_key_id={}&secret_access_key={}", env[0].1, env[1].1);
        let url = |prefix: &str| format!("{}{creds}", minio.table_store_url(prefix));
        let node_store = |id: u64| url(&format!("cluster/node-{id}"));
        let one = Cluster::start(&dir.path().join("one"), 3, &["k3", "k6"], Some(&node_store));
        let c1 = one.client().await;

        // Deleted before the backup; one expired by the restore; one with an hour left.
        for i in 0..20u64 {
            c1.put(format!("gone{i}").as_bytes(), b"x").await.unwrap();
        }
        c1.delete_range(b"gone", b"gonf").await.unwrap();
        c1.put_with(b"short", b"x", Expiry::After(Duration::from_millis(300)))
            .await
            .unwrap();
        c1.put_with(b"long", b"y", Expiry::After(Duration::from_secs(3600)))
            .await
            .unwrap();

        // Writers: each key written once, its acknowledgement time kept.
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..4u64 {
            let (c, stop) = (c1.clone(), Arc::clone(&stop));
            writers.spawn(async move {
                let mut acked = Vec::new();
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("k{:07}", i * 7919 % 10_000_000);
                    if c.put(key.as_bytes(), &value(i)).await.is_ok() {
                        acked.push((key, i, now_ms()));
                    }
                    i += 4;
                }
                acked
            });
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        // In the backup, expired by the restore.
        let brief_until = Instant::now() + Duration::from_secs(8);
        c1.put_with(b"brief", b"z", Expiry::After(Duration::from_secs(8)))
            .await
            .unwrap();
        let backup_url = url("backups/one");
        // What a crashed backup into the same prefix left, and an object not of a try.
        let bucket = S3Prefix::from_url(&backup_url).unwrap();
        let stray = ObjectPath::from(format!("{}/g99-1a2b-7/files/000001.sst", bucket.prefix));
        let other = ObjectPath::from(format!("{}/notes/keep", bucket.prefix));
        for at in [&stray, &other] {
            bucket
                .store
                .put(at, PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        let s = backup(&c1, &backup_url, 4, 5).await.unwrap();
        assert!(s.pruned >= 1 && s.not_pruned == 0, "{s:?}");
        assert!(matches!(
            bucket.store.head(&stray).await,
            Err(object_store::Error::NotFound { .. })
        ));
        bucket.store.head(&other).await.unwrap();
        assert!(
            brief_until > Instant::now(),
            "the backup took too long: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let mut acked: Vec<(String, u64, u64)> = Vec::new();
        while let Some(r) = writers.join_next().await {
            acked.extend(r.unwrap());
        }
        assert!(s.groups >= 3, "{s:?}");
        assert!(
            s.tables > 0 && s.copied_bytes > 0,
            "no table was copied: {s:?}"
        );
        let before = acked.iter().filter(|a| a.2 < s.started_ms).count();
        let after = acked.len() - before;
        assert!(
            before > 1000 && after > 0,
            "{before} writes before, {after} after"
        );
        // The prefix holds a backup: not written again.
        let again = backup(&c1, &backup_url, 4, 1)
            .await
            .unwrap_err()
            .to_string();
        assert!(again.contains("holds a backup already"), "{again}");

        let two = Cluster::start(&dir.path().join("two"), 1, &[], None);
        let c2 = two.client().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::time::sleep_until((brief_until + Duration::from_millis(100)).into()).await;
        let work = dir.path().join("work");
        let r = restore(&c2, &backup_url, &work, 8, false).await.unwrap();
        assert_eq!(r.expired, 1, "{r:?}");
        // Only what the restore made under the work directory is gone, and its scratch
        // engine's objects.
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
        let scratch: Vec<String> = {
            use futures_util::TryStreamExt as _;
            bucket
                .store
                .list(Some(&ObjectPath::from(bucket.prefix.as_str())))
                .map_ok(|m| m.location.to_string())
                .try_filter(|p| std::future::ready(p.contains("/restore-")))
                .try_collect()
                .await
                .unwrap()
        };
        assert!(scratch.is_empty(), "the restore left {scratch:?}");
        let written: HashMap<String, u64> = acked.iter().map(|a| (a.0.clone(), a.1)).collect();
        let restored = c2.scan(b"", b"", 0).await.unwrap();
        let mut found = HashMap::new();
        for (k, v) in &restored {
            let k = String::from_utf8(k.clone()).unwrap();
            match k.as_str() {
                "long" => assert_eq!(v, b"y"),
                _ => {
                    let i = written
                        .get(&k)
                        .unwrap_or_else(|| panic!("{k} was never written"));
                    assert_eq!(v, &value(*i), "{k}");
                }
            }
            found.insert(k, ());
        }
        for (k, _, at) in &acked {
            if *at < s.started_ms {
                assert!(
                    found.contains_key(k),
                    "{k}, acknowledged before the backup, is missing"
                );
            }
        }
        assert_eq!(r.keys as usize, restored.len());
        match c2.ttl(b"long").await.unwrap() {
            phoenix_client::KeyTtl::At { left_ms, .. } => {
                assert!(left_ms > 3_000_000, "{left_ms} ms left")
            }
            other => panic!("the expiry was not restored: {other:?}"),
        }
        let refused = restore(&c2, &backup_url, &work, 8, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("holds keys already"), "{refused}");

        // The node on local disk: everything streams.
        let url2 = url("backups/two");
        let s2 = backup(&c2, &url2, 4, 5).await.unwrap();
        assert_eq!((s2.tables, s2.copied_bytes), (0, 0), "{s2:?}");
        assert!(s2.streamed_bytes > 0, "{s2:?}");
        let three = Cluster::start(&dir.path().join("three"), 1, &["k5"], None);
        let c3 = three.client().await;
        restore(&c3, &url2, &work, 8, false).await.unwrap();
        assert_eq!(c3.scan(b"", b"", 0).await.unwrap(), restored);

        // A file whose bytes changed is refused by its checksum, before any write.
        let src = S3Prefix::from_url(&url2).unwrap();
        let m = read_manifest(&src).await.unwrap();
        let rec = &m.groups[0];
        let f = &rec.head.as_ref().unwrap().files[0];
        let at = ObjectPath::from(format!("{}/{}/files/{}", src.prefix, rec.prefix, f.name));
        let mut bytes = src
            .store
            .get(&at)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        bytes[f.size as usize / 2] ^= 1;
        src.store.put(&at, PutPayload::from(bytes)).await.unwrap();
        let corrupt = restore(&c3, &url2, &work, 8, true)
            .await
            .unwrap_err()
            .to_string();
        assert!(corrupt.contains("do not match"), "{corrupt}");
        // A manifest of a later format is refused, and a prefix with none is no backup.
        let later = S3Prefix::from_url(&url("backups/later")).unwrap();
        let m2 = pb::BackupManifest {
            format: FORMAT + 1,
            ..m.clone()
        };
        let at = ObjectPath::from(format!("{}/{MANIFEST}", later.prefix));
        later
            .store
            .put(&at, PutPayload::from(m2.encode_to_vec()))
            .await
            .unwrap();
        let e = read_manifest(&later).await.unwrap_err().to_string();
        assert!(e.contains("this binary reads format 1"), "{e}");
        let none = S3Prefix::from_url(&url("backups/none")).unwrap();
        let e = read_manifest(&none).await.unwrap_err().to_string();
        assert!(e.contains("no backup at"), "{e}");
        drop((one, two, three));
    }
}
