//! The database: open and recovery, the write path, flushes, reads, snapshots,
//! compaction scheduling, `drop_group` and `ingest`.
//!
//! Threads: callers write and read; one background thread flushes immutable memtables
//! strictly in the order they became immutable; `max_background_jobs - 1` threads
//! compact, several at once on disjoint files (the `busy` set). `compact_range`,
//! `drop_group` and `ingest` take `compaction_lock` exclusively; background compactions
//! share it.
//!
//! Write path (group commit): writers queue up; the writer at the front is the leader.
//! It merges the queued batches (same WAL setting, up to 1 MiB), makes room (switching
//! the memtable if full, stalling on too many memtables or L0 files), takes the next
//! sequence numbers, appends one WAL entry (fsynced if any writer of the group asked for
//! sync), inserts the group into the memtable, publishes the last sequence, and wakes
//! the group. Only a leader switches memtables, so one batch always lands in one memtable.
//!
//! Lock order: writer queue → state. No lock is held across table, manifest or WAL I/O:
//! a manifest write runs with the state lock released, one at a time
//! (`VersionSet::is_writing`), and `close` waits for one under way.
//!
//! Durability: a flush or compaction is visible only after its manifest edit is synced
//! (version_set.rs). With `WalMode::None` the persisted tables therefore always hold a
//! prefix of the writes (every batch up to some point), which is what an outside log
//! relies on (seed 000); `get_persisted` reads just them.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtOrd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use phoenix_storage::{FileLock, SharedFs};

use crate::compaction::{self, Compaction, Reason};
use crate::db_iter::DbIterator;
use crate::error::{Error, Result};
use crate::filename;
use crate::iter::{InternalIterator, ReadScope};
use crate::key::{
    compare_internal, encode_internal_key, group_range, parse_internal_key, RangeTombstone,
    SequenceNumber, ValueKind, MAX_SEQUENCE,
};
use crate::memtable::{MemGet, MemTable};
use crate::merge::{clone_error, BoxIter, LevelIter, MergingIterator};
use crate::options::{Options, ReadOptions, WalMode, WriteOptions, WRITE_GROUP_BYTES_MAX};
use crate::range_del::Fragments;
use crate::remote_compaction::{self, CompactionJob, CompactionService};
use crate::table::{BlockCache, Readahead, Table, TableCache};
use crate::table_store::{FsTableStore, Imported, SharedTableStore, StoredFile};
use crate::version::{TableGet, Version};
use crate::version_edit::{FileMeta, VersionEdit};
use crate::version_set::VersionSet;
use crate::wal::Wal;
use crate::write_batch::{BatchRecord, WriteBatch};

/// Times a waiting writer yields its CPU before it sleeps on its condition variable.
const WRITER_YIELDS: u32 = 16;

/// Shortest wait between two tries of failed background work, whatever the options say
/// (a zero would spin on an unavailable store).
const RETRY_BACKOFF_FLOOR: Duration = Duration::from_millis(1);

mod group_copy;
mod secondary;

pub use group_copy::{CopiedTables, GroupExport, RestEntry, SharedTable};
pub use secondary::Secondary;

/// A consistent set of sources for a read: the memtables and the version.
struct View {
    mem: Arc<MemTable>,
    /// Immutable memtables, newest first.
    imms: Vec<Arc<MemTable>>,
    version: Arc<Version>,
}

/// A manifest edit that failed, and whether the manifest may hold it (`false`: refused
/// before anything was written, so what the edit would have added can be taken back).
struct EditFailed {
    error: Error,
    maybe_written: bool,
}

/// Background work that is tried again on an unavailable table store (an index into
/// `State::retrying` and `State::retries`).
#[derive(Debug, Clone, Copy)]
enum Work {
    Flush = 0,
    Compaction = 1,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Flush => "flush",
            Work::Compaction => "compaction",
        }
    }
}

struct State {
    mem: Arc<MemTable>,
    /// Immutable memtables, oldest first (flush order).
    imm: VecDeque<Arc<MemTable>>,
    vset: VersionSet,
    /// The sources readers use, republished after every change; readers take only this
    /// lock (never the state mutex).
    published: Arc<RwLock<Arc<View>>>,
    next_mem_id: u64,
    bg_error: Option<String>,
    /// Whether `bg_error` came from the storage (a write, sync or read that failed), not
    /// from bytes that do not decode: reopening may then cure it (`Db::failure`).
    bg_error_io: bool,
    /// The object whose conditional write found another writer's, when that is what
    /// turned the engine read-only (`Error::is_fenced`).
    bg_fenced: Option<PathBuf>,
    /// For flushes and for compactions (by [`Work`]): the last failure on a table store
    /// that was unavailable, while the work waits to be tried again (cleared when it
    /// succeeds): the engine stays writable meanwhile, until its memtables fill (or L0
    /// reaches the stop trigger) and writers stall.
    retrying: [Option<Error>; 2],
    /// Failures tried again so far, by [`Work`].
    retries: [u64; 2],
    closed: bool,
    pointers: Vec<Vec<u8>>,
    /// Files that running compactions read.
    busy: std::collections::HashSet<u64>,
}

impl State {
    /// The error of `work`'s latest failure if it has failed again since the counts
    /// `before` were taken and still waits to be tried again.
    fn retried_since(&self, before: &[u64; 2], work: Work) -> Option<Error> {
        let w = work as usize;
        if self.retries[w] == before[w] {
            return None;
        }
        self.retrying[w].as_ref().map(crate::table::clone_error)
    }

    fn refresh_view(&mut self) {
        let v = Arc::new(View {
            mem: Arc::clone(&self.mem),
            imms: self.imm.iter().rev().cloned().collect(),
            version: self.vset.current(),
        });
        *self.published.write() = v;
    }

    /// Whether writes and background work have stopped ([`State::refused`] says why).
    fn stopped(&self) -> bool {
        self.bg_error.is_some() || self.vset.is_broken()
    }

    /// Why writes are refused once a background failure turned the engine read-only:
    /// a fenced writer's own error, or the failure's message.
    /// (Also once a manifest write failed in a foreground call, an ingest say, before
    /// any background work found out.)
    fn refused(&self) -> Option<Error> {
        let Some(m) = self.bg_error.as_ref() else {
            return self.vset.refusal();
        };
        Some(match &self.bg_fenced {
            Some(path) => Error::Storage(phoenix_storage::Error::Fenced { path: path.clone() }),
            None => Error::Background(m.clone()),
        })
    }
}

struct Slot {
    state: Mutex<SlotState>,
    /// Signalled (with the queue mutex) when this writer is done or becomes the leader:
    /// a wake-up goes only to the writers it concerns, not to every waiting writer.
    cv: Condvar,
    /// Set once `state.done` is: lets a waiting writer check without locks.
    done: AtomicBool,
}

struct SlotState {
    batch: Option<WriteBatch>,
    sync: bool,
    disable_wal: bool,
    force_switch: bool,
    done: bool,
    result: Option<Result<()>>,
}

/// Where a job handed to a worker with [`Remote::GivingWay`] stands.
enum JobSlot {
    Waiting,
    Answered(std::result::Result<remote_compaction::JobOutput, String>),
    /// The engine gave way: the job's thread cleans up after the answer.
    GivenUp,
}

/// A [`JobSlot`] and the wake-up of its waiter.
struct JobWait {
    slot: Mutex<JobSlot>,
    answered: Condvar,
}

/// Whether a compaction may go to a worker (`Options::compaction_service`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Remote {
    /// It runs here.
    No,
    /// It may; the caller waits for the worker's answer.
    Yes,
    /// It may, and gives way to an exclusive holder of `compaction_lock` while it
    /// waits (a background compaction: `Inner::compact_remotely`).
    GivingWay,
}

#[derive(Default)]
struct Counters {
    user_bytes: AtomicU64,
    flush_bytes: AtomicU64,
    flushes: AtomicU64,
    compaction_read: AtomicU64,
    compaction_written: AtomicU64,
    compactions: AtomicU64,
    trivial_moves: AtomicU64,
    compaction_pieces: AtomicU64,
    remote_compactions: AtomicU64,
    remote_fallbacks: AtomicU64,
    remote_given_way: AtomicU64,
    stalls: AtomicU64,
    stall_micros: AtomicU64,
    slowdowns: AtomicU64,
    wal_syncs: AtomicU64,
}

struct SnapshotList {
    seqs: Mutex<BTreeMap<SequenceNumber, usize>>,
}

/// A point-in-time view for reads; released when dropped.
pub struct Snapshot {
    seq: SequenceNumber,
    list: Arc<SnapshotList>,
}

impl Snapshot {
    /// The sequence number the snapshot reads at.
    pub fn sequence(&self) -> SequenceNumber {
        self.seq
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").field("seq", &self.seq).finish()
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut seqs = self.list.seqs.lock();
        if let Some(n) = seqs.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                seqs.remove(&self.seq);
            }
        }
    }
}

/// Figures of one level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelStats {
    /// Files at the level.
    pub files: usize,
    /// Bytes of those files.
    pub bytes: u64,
    /// Files holding point entries of more than one group (from L1 down, 0 unless
    /// `Options::min_group_file_size` is positive).
    pub mixed_group_files: usize,
}

/// A group's share of the tables ([`Db::group_sizes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupSize {
    /// Approximate bytes.
    pub bytes: u64,
    /// Approximate entries (point entries and range tombstones, all versions).
    pub entries: u64,
}

/// A table spanning more group ids than this is left out of [`Db::group_sizes`].
pub const GROUP_SIZE_SPAN_MAX: u64 = 4096;

/// Engine figures.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Per level, L0 first.
    pub levels: Vec<LevelStats>,
    /// Bytes in the mutable memtable.
    pub memtable_bytes: usize,
    /// Immutable memtables waiting for flush.
    pub immutable_memtables: usize,
    /// Key and value bytes written by users.
    pub user_bytes_written: u64,
    /// Bytes of L0 tables written by flushes.
    pub flush_bytes_written: u64,
    /// Flushes done.
    pub flushes: u64,
    /// Bytes read by compactions.
    pub compaction_bytes_read: u64,
    /// Bytes written by compactions.
    pub compaction_bytes_written: u64,
    /// Compactions done (trivial moves included).
    pub compactions: u64,
    /// Compactions that only moved a file down.
    pub trivial_moves: u64,
    /// Pieces compactions installed before they finished
    /// (`Options::compaction_piece_bytes`).
    pub compaction_pieces: u64,
    /// Compactions a worker ran (`Options::compaction_service`); counted in
    /// `compactions` too.
    pub remote_compactions: u64,
    /// Compactions handed to a worker that failed or answered wrongly, then run here.
    pub remote_compaction_fallbacks: u64,
    /// Background compactions whose wait for a worker gave way to a group drop, an
    /// ingest or `close` (nothing installed; picked again later).
    pub remote_compactions_given_way: u64,
    /// Of those, the ones the worker has not answered yet (while any, background
    /// compactions run here).
    pub remote_compactions_given_way_pending: u64,
    /// (flush + compaction bytes written) / user bytes written; the WAL is not counted.
    pub write_amplification: f64,
    /// Times a writer waited for a flush or an L0 compaction (stop conditions).
    pub stall_count: u64,
    /// Microseconds writers spent stalled or slowed down.
    pub stall_micros: u64,
    /// Times the write leader slept to hold writes to `delayed_write_rate` (L0 at the
    /// slowdown trigger).
    pub slowdown_count: u64,
    /// Bytes held by the block cache.
    pub block_cache_usage: usize,
    /// Last sequence number published.
    pub last_sequence: SequenceNumber,
    /// Live snapshots.
    pub snapshots: usize,
    /// Background flushes and compactions that failed on an unavailable table store
    /// and were tried again.
    pub background_retries: u64,
    /// The last such failure, while its work waits to be tried again.
    pub background_retrying: Option<String>,
}

struct Inner {
    /// Holds the lock and the WAL; ingested files are read from it.
    fs: SharedFs,
    dir: PathBuf,
    /// Tables and manifest.
    store: SharedTableStore,
    opts: Options,
    tables: Arc<TableCache>,
    block_cache: Option<Arc<BlockCache>>,
    state: Mutex<State>,
    /// Shared with `State::published`.
    published: Arc<RwLock<Arc<View>>>,
    /// Set by `close` (readers check it without the state mutex).
    closed: AtomicBool,
    /// Signalled on every background state change (flush done, compaction done, error,
    /// close, new immutable memtable).
    bg_cv: Condvar,
    queue: Mutex<VecDeque<Arc<Slot>>>,
    last_seq: AtomicU64,
    snapshots: Arc<SnapshotList>,
    compaction_lock: RwLock<()>,
    /// Callers waiting for `compaction_lock` exclusively (`Inner::compaction_exclusive`):
    /// a background compaction waiting on a worker gives way to them.
    exclusive_waiting: AtomicU64,
    /// Jobs given up on (`compact_remotely`) whose worker has not answered yet: while
    /// there are any, background compactions run here.
    given_up_pending: Arc<AtomicU64>,
    /// Held through a flush: in inline mode a writer and a `flush` caller may both
    /// flush, and one must not take the memtable the other is flushing (its manifest
    /// write runs without the state lock).
    flush_lock: Mutex<()>,
    /// Held shared by the write leader while it applies a group or switches memtables;
    /// held exclusively by an ingest that assigns a sequence number, so no write lands
    /// between its memtable check and its sequence.
    write_gate: RwLock<()>,
    /// Rate limiter of writes while L0 is at the slowdown trigger (write leader only).
    write_delay: Mutex<crate::write_delay::WriteDelay>,
    counters: Counters,
    wal: Option<Wal>,
    /// Next WAL entry index; only the write leader advances it.
    wal_next: AtomicU64,
    closing: AtomicBool,
    /// A write with `disable_wal` went into the memtables of an engine with a WAL: a
    /// clean close flushes them, as without a WAL.
    unlogged: AtomicBool,
    /// Set by `close`, which then waits for `write_gate`: no write or ingest begins
    /// after (a flush still does).
    writes_closed: AtomicBool,
    /// The directory's lock: released by `close`, not by the last handle's drop, so a
    /// handle still held somewhere (a task being torn down) does not keep a reopen out.
    lock: Mutex<Option<Box<dyn FileLock>>>,
}

/// The LSM engine. `Send + Sync`; shared as `Arc<Db>`.
pub struct Db {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("dir", &self.inner.dir).finish()
    }
}

/// Whether `e` is the storage's failure (what reopening may cure), not corruption or a
/// broken invariant.
fn is_io(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage(
            phoenix_storage::Error::Io { .. } | phoenix_storage::Error::Unavailable { .. }
        ) | Error::Wal(_)
    )
}

/// See [`Db::failure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What failed.
    pub message: String,
    /// Whether the storage failed (reopening may cure it), not the data.
    pub io: bool,
}

impl Db {
    /// Opens (recovering) or creates the database in `dir`, its tables and manifest
    /// there too.
    pub fn open(fs: SharedFs, dir: &Path, opts: Options) -> Result<Arc<Db>> {
        // (The store touches nothing until the open below has made the directory.)
        let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), dir));
        Db::open_with_store(fs, dir, store, opts)
    }

    /// Opens (recovering) or creates the database whose tables and manifest live in
    /// `store`; `dir` of `fs` holds its lock and its WAL (if any), and the files given
    /// to ingest are read from `fs`.
    pub fn open_with_store(
        fs: SharedFs,
        dir: &Path,
        store: SharedTableStore,
        opts: Options,
    ) -> Result<Arc<Db>> {
        opts.validate()?;
        if opts.create_if_missing {
            fs.create_dir_all(dir)?;
        }
        let lock = fs.lock(&filename::lock_path(dir))?;
        let mut vset =
            VersionSet::open(Arc::clone(&store), opts.num_levels, opts.create_if_missing)?;
        vset.set_deletion_delay(opts.obsolete_table_delay);
        vset.set_reader_leases(store.supports_reader_leases());
        let version = vset.current();

        // Files not in the manifest are half-written flush or compaction outputs (or
        // leftovers of deletions that were not yet durable): remove them.
        let live: std::collections::HashSet<u64> = version.live_files().collect();
        let mut removed = false;
        for file in store.list()? {
            let stale = match &file {
                StoredFile::Table(n) => !live.contains(n),
                StoredFile::Manifest(n) => *n != vset.manifest_number(),
                StoredFile::Temp(_) => true,
            };
            if stale {
                if let (StoredFile::Table(n), false) = (&file, opts.obsolete_table_delay.is_zero())
                {
                    // A follower may still read it (a table of a version before the
                    // crash): it waits out the delay as any replaced table does.
                    if vset.defer_delete(*n) {
                        continue;
                    }
                }
                tracing::warn!(file = ?file, store = %store.location().display(), "deleting a file the manifest does not reference");
                store.remove(&file)?;
                removed = true;
            }
        }
        if removed {
            store.sync()?;
        }

        let block_cache =
            (opts.block_cache_size > 0).then(|| BlockCache::new(opts.block_cache_size));
        let tables = Arc::new(TableCache::new(
            Arc::clone(&store),
            opts.max_open_files,
            block_cache.clone(),
        ));

        let mut last_seq = vset.last_sequence();
        let mut mems: Vec<Arc<MemTable>> = vec![Arc::new(new_memtable(&opts, 1))];
        let mut next_mem_id = 2;
        let wal_path = filename::wal_dir(dir);
        if opts.wal == WalMode::None && fs.exists(&wal_path)? {
            // Writes acknowledged through a WAL must not be dropped silently.
            let w = Wal::open(Arc::clone(&fs), &wal_path, opts.wal_segment_size)?;
            let pending = w.next_index() > vset.log_number().max(1);
            w.close()?;
            if pending {
                return Err(Error::InvalidArgument(format!(
                    "{} holds WAL entries that are not in tables; open with WalMode::Log",
                    wal_path.display()
                )));
            }
        }
        let wal = match opts.wal {
            WalMode::None => None,
            WalMode::Log => Some(Wal::open(
                Arc::clone(&fs),
                &filename::wal_dir(dir),
                opts.wal_segment_size,
            )?),
        };
        let mut wal_next = 1;
        let mut replayed = false;
        if let Some(w) = &wal {
            let wal_path = filename::wal_dir(dir);
            let from = vset.log_number().max(1);
            w.replay(from, &mut |index, data| {
                let batch = WriteBatch::decode(data, &wal_path, index)?;
                let cur = mems
                    .last()
                    .cloned()
                    .unwrap_or_else(|| Arc::new(MemTable::new(0)));
                if cur.approximate_memory_usage() >= opts.write_buffer_size {
                    mems.push(Arc::new(new_memtable(&opts, next_mem_id)));
                    next_mem_id += 1;
                }
                let mem = mems.last().cloned().unwrap_or(cur);
                mem.set_wal_first(index);
                let seq = batch.sequence();
                insert_batch(&mem, &batch, seq);
                replayed = true;
                last_seq = last_seq.max(seq + u64::from(batch.count()).saturating_sub(1));
                wal_next = index + 1;
                Ok(())
            })?;
            if w.next_index() < from {
                // Entries below the log number are in tables; the log lost its unsynced
                // tail of them. Move the stream past them so appends stay consecutive.
                w.truncate_prefix(from)?;
            }
            wal_next = wal_next.max(w.next_index()).max(from);
        }
        let mem = mems.pop().unwrap_or_else(|| Arc::new(MemTable::new(0)));
        let imm: VecDeque<Arc<MemTable>> = mems.into_iter().collect();
        let num_levels = opts.num_levels;
        let published = Arc::new(RwLock::new(Arc::new(View {
            mem: Arc::new(MemTable::new(0)),
            imms: Vec::new(),
            version: Arc::new(Version::empty(num_levels)),
        })));
        let mut state = State {
            mem,
            imm,
            vset,
            published: Arc::clone(&published),
            next_mem_id,
            bg_error: None,
            bg_error_io: false,
            retrying: [None, None],
            retries: [0; 2],
            bg_fenced: None,
            closed: false,
            pointers: vec![Vec::new(); num_levels],
            busy: std::collections::HashSet::new(),
        };
        state.refresh_view();

        let inner = Arc::new(Inner {
            fs,
            dir: dir.to_path_buf(),
            store,
            opts,
            tables,
            block_cache,
            state: Mutex::new(state),
            published,
            closed: AtomicBool::new(false),
            bg_cv: Condvar::new(),
            queue: Mutex::new(VecDeque::new()),
            last_seq: AtomicU64::new(last_seq),
            snapshots: Arc::new(SnapshotList {
                seqs: Mutex::new(BTreeMap::new()),
            }),
            compaction_lock: RwLock::new(()),
            exclusive_waiting: AtomicU64::new(0),
            given_up_pending: Arc::new(AtomicU64::new(0)),
            flush_lock: Mutex::new(()),
            write_gate: RwLock::new(()),
            write_delay: Mutex::new(crate::write_delay::WriteDelay::default()),
            counters: Counters::default(),
            wal,
            wal_next: AtomicU64::new(wal_next),
            closing: AtomicBool::new(false),
            writes_closed: AtomicBool::new(false),
            unlogged: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
        });
        let mut threads = Vec::new();
        let background = !inner.opts.inline_background;
        let spawn = |name: &str, f: fn(&Inner), inner: &Arc<Inner>| {
            let inner = Arc::clone(inner);
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || f(&inner))
        };
        if background {
            threads.push(
                spawn("phoenix-flush", Inner::flush_loop, &inner).map_err(|e| {
                    Error::Background(format!("cannot start the flush thread: {e}"))
                })?,
            );
            for _ in 1..inner.opts.max_background_jobs.max(2) {
                threads.push(
                    spawn("phoenix-compact", Inner::compaction_loop, &inner).map_err(|e| {
                        Error::Background(format!("cannot start a compaction thread: {e}"))
                    })?,
                );
            }
        }
        let db = Arc::new(Db {
            inner,
            threads: Mutex::new(threads),
        });
        // Recovered memtables beyond the first are flushed in the background.
        db.inner.bg_cv.notify_all();
        if !background {
            db.inner.run_background_inline()?;
        }
        if replayed && !db.inner.opts.avoid_flush_during_recovery {
            // As RocksDB by default: what the WAL replayed goes to L0 now, so reads of it
            // walk sorted blocks instead of a memtable filled in random order, and the
            // WAL behind it can be dropped.
            db.inner.flush()?;
        }
        Ok(db)
    }

    /// Sets `key` to `value`.
    pub fn put(&self, wo: &WriteOptions, key: &[u8], value: &[u8]) -> Result<()> {
        // Kind byte, two varint32 lengths (5 bytes at most each), key and value.
        let mut b = WriteBatch::with_capacity(11 + key.len() + value.len());
        b.put(key, value);
        self.write(wo, b)
    }

    /// Deletes `key`.
    pub fn delete(&self, wo: &WriteOptions, key: &[u8]) -> Result<()> {
        let mut b = WriteBatch::new();
        b.delete(key);
        self.write(wo, b)
    }

    /// Deletes every key in `[start, end)`.
    pub fn delete_range(&self, wo: &WriteOptions, start: &[u8], end: &[u8]) -> Result<()> {
        let mut b = WriteBatch::new();
        b.delete_range(start, end);
        self.write(wo, b)
    }

    /// Applies `batch` atomically.
    pub fn write(&self, wo: &WriteOptions, batch: WriteBatch) -> Result<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        self.inner.write_slot(SlotState {
            batch: Some(batch),
            sync: wo.sync,
            disable_wal: wo.disable_wal,
            force_switch: false,
            done: false,
            result: None,
        })
    }

    /// Reads `key`.
    pub fn get(&self, ro: &ReadOptions<'_>, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let view = self.inner.view()?;
        let snap = self.inner.read_seq(ro);
        self.inner.get_in(&view, key, snap, ro.fill_cache)
    }

    /// Reads several keys from one consistent view.
    pub fn multi_get(&self, ro: &ReadOptions<'_>, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let view = self.inner.view()?;
        let snap = self.inner.read_seq(ro);
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(keys.len());
        // The keys the memtables do not settle go to the tables together.
        let mut to_tables: Vec<usize> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match self.inner.get_in_memtables(&view, k, snap) {
                Some(v) => out.push(v),
                None => {
                    out.push(None);
                    to_tables.push(i);
                }
            }
        }
        if !to_tables.is_empty() {
            let ks: Vec<&[u8]> = to_tables.iter().map(|&i| keys[i]).collect();
            let got = view.version.multi_get(
                &self.inner.tables,
                &ks,
                snap,
                ro.fill_cache,
                ro.parallel_io,
            )?;
            for (i, g) in to_tables.into_iter().zip(got) {
                if let TableGet::Value(v) = g {
                    out[i] = Some(v);
                }
            }
        }
        Ok(out)
    }

    /// Reads `key` from the persisted tables only (what survives a crash with the WAL
    /// off).
    pub fn get_persisted(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let view = self.inner.view()?;
        match view
            .version
            .get(&self.inner.tables, key, MAX_SEQUENCE, 0, true)?
        {
            TableGet::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// A cursor over the user keys visible at the read's snapshot, within its bounds.
    pub fn iter(&self, ro: &ReadOptions<'_>) -> Result<DbIterator> {
        self.inner.iter(ro)
    }

    /// Takes a snapshot of the current state.
    pub fn snapshot(&self) -> Snapshot {
        let mut seqs = self.inner.snapshots.seqs.lock();
        let seq = self.inner.last_seq.load(AtOrd::Acquire);
        *seqs.entry(seq).or_insert(0) += 1;
        Snapshot {
            seq,
            list: Arc::clone(&self.inner.snapshots),
        }
    }

    /// Writes every memtable to L0 and waits until that is durable.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// Waits until the background work has nothing left to do: every immutable
    /// memtable flushed, no compaction running and none due (RocksDB's
    /// `WaitForCompact`). An engine stopped by a background error says so; with
    /// `disable_auto_compactions` only the flushes are waited for.
    pub fn wait_for_background_work(&self) -> Result<()> {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        loop {
            if let Some(e) = st.refused() {
                return Err(e);
            }
            if st.closed {
                return Err(Error::Closed);
            }
            let idle = st.imm.is_empty()
                && st.busy.is_empty()
                && (inner.opts.disable_auto_compactions
                    || compaction::pick(&st.vset.current(), &inner.opts, &st.pointers, &st.busy)
                        .is_none());
            if idle {
                return Ok(());
            }
            if inner.opts.inline_background {
                MutexGuard::unlocked(&mut st, || inner.run_background_inline())?;
                continue;
            }
            inner.bg_cv.wait_for(&mut st, Duration::from_millis(100));
        }
    }

    /// Compacts every file overlapping `[start, end]` down level by level.
    pub fn compact_range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<()> {
        self.inner.flush()?;
        let _c = self.inner.compaction_exclusive();
        self.inner.refuse_once_closing()?;
        // (A compaction asked for: it reads with background work's patience.)
        let _background = crate::io_class::Background::enter();
        self.inner.compact_range_locked(start, end)
    }

    /// Drops every key of group `g` and frees its files at once: writes a range
    /// tombstone over the group, flushes, compacts the group's L0 data into L1 (where
    /// output files never mix groups), rewrites any file that mixes `g` with other
    /// groups, then deletes every file holding only `g`. Files of other groups are not
    /// touched. Meant for a group that is no longer written; snapshots taken before do
    /// not keep the dropped data.
    pub fn drop_group(&self, g: u64) -> Result<()> {
        self.inner.drop_groups(&[g])
    }

    /// [`drop_group`](Self::drop_group) for several groups at once: one write of their
    /// range tombstones, one flush, one compaction of L0 and one manifest edit deleting
    /// their files, so dropping many groups costs about what dropping one does. Each
    /// step is crash-safe on its own as in `drop_group`; a crash part way leaves every
    /// group either whole-but-tombstoned or dropped, and calling again finishes.
    pub fn drop_groups(&self, groups: &[u64]) -> Result<()> {
        self.inner.drop_groups(groups)
    }

    /// Adds tables built with [`crate::SstWriter`] (entries at sequence 0, files not
    /// overlapping each other), atomically. Where their key ranges hold nothing (no
    /// entry or tombstone in a memtable or table, e.g. a group dropped with
    /// `drop_group`), the files are moved (renamed) in as they are, each at the deepest
    /// level where no file's range overlaps it; snapshots taken before also see them.
    /// Otherwise writes are held off, overlapping memtables are flushed, and the files
    /// are copied in with one new sequence number so they shadow the older data; then
    /// snapshots taken before do not see them. The source files are gone once it
    /// returns `Ok` (after an error, see [`Db::replace_group`]).
    pub fn ingest(&self, paths: &[PathBuf]) -> Result<()> {
        self.inner.ingest(paths)
    }

    /// Replaces every key of group `g` with the contents of `paths` (tables built with
    /// [`crate::SstWriter`] holding keys of `g` only), atomically: after a crash at any
    /// point the group holds either all its old keys or exactly the files' keys (a raft
    /// snapshot install). The memtables are flushed and L0 compacted if it holds `g`
    /// (semantically neutral); then ONE manifest edit removes the files of `g` alone,
    /// replaces each file sharing `g` with other groups by a copy without g's keys, and
    /// adds the new files, moved in as they are (sequence 0, each at the deepest level
    /// with room). The caller must not write to `g` meanwhile. The source files are gone
    /// once it returns `Ok`; an error before the manifest edit, or an edit refused by an
    /// unavailable store ([`Error::is_retryable`]), leaves them in place to try again
    /// with. Snapshots taken before do not keep the old keys.
    pub fn replace_group(&self, g: u64, paths: &[PathBuf]) -> Result<()> {
        self.inner.replace_group(g, paths)
    }

    /// Replaces every key of group `g` with the contents of `paths` the way stock RocksDB
    /// does it (a range tombstone over the group, then an ingest), atomically: one
    /// manifest edit adds a table holding only a range tombstone over `g` and copies of
    /// the files, all at one new sequence number (the tombstone hides only what is older
    /// than it, so the files' keys stay visible). The old keys stay on disk until
    /// compaction drops them: the baseline [`replace_group`](Self::replace_group) is
    /// measured against (space taken while old and new state are both on disk). The
    /// memtables are flushed first; the caller must not write to `g` meanwhile.
    pub fn replace_group_by_tombstone(&self, g: u64, paths: &[PathBuf]) -> Result<()> {
        self.inner.replace_group_by_tombstone(g, paths)
    }

    /// Approximate bytes and entries of every group's data in the tables (memtables are
    /// not counted): a table holding one group counts for it whole; one holding several
    /// (L0, or small groups sharing a file) is shared out evenly over the group ids it
    /// spans, or left out if it spans more than [`GROUP_SIZE_SPAN_MAX`] ids. Cheap: file
    /// metadata only.
    pub fn group_sizes(&self) -> Result<BTreeMap<u64, GroupSize>> {
        let view = self.inner.view()?;
        let v = &view.version;
        let mut out: BTreeMap<u64, GroupSize> = BTreeMap::new();
        for level in 0..v.num_levels() {
            for f in v.files(level) {
                let Some(span) = f.max_group.checked_sub(f.min_group).map(|d| d + 1) else {
                    continue;
                };
                if span > GROUP_SIZE_SPAN_MAX {
                    continue;
                }
                for g in f.min_group..=f.max_group {
                    let e = out.entry(g).or_default();
                    e.bytes += f.size / span;
                    e.entries += f.num_entries / span;
                }
            }
        }
        Ok(out)
    }

    /// Engine figures.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// The failure that turned the engine read-only, if one did: a background flush,
    /// compaction or WAL append that failed, or a manifest write (also a group's
    /// replacement or an ingest). Writes are refused from then on, and only reopening the
    /// engine (from its manifest) clears it. `io` says the storage failed (a write,
    /// sync or read), which reopening may cure once the disk works again; otherwise the
    /// engine found bytes that do not decode or an invariant broken, which it will not.
    pub fn failure(&self) -> Option<Failure> {
        let st = self.inner.state.lock();
        if let Some(m) = &st.bg_error {
            return Some(Failure {
                message: m.clone(),
                io: st.bg_error_io,
            });
        }
        st.vset.broken_by().map(|why| Failure {
            message: if st.vset.is_fenced() {
                format!("fenced: another writer took the table store over ({why})")
            } else {
                format!("a manifest write failed: {why}")
            },
            // Reopening takes the store back from the writer that took it over.
            io: !st.vset.is_fenced(),
        })
    }

    /// The last sequence number published.
    pub fn latest_sequence(&self) -> SequenceNumber {
        self.inner.last_seq.load(AtOrd::Acquire)
    }

    /// Stops the background threads. Writes, ingests and compactions asked for that are
    /// under way end first, and later ones are refused (`Closed`). With `WalMode::None`,
    /// or after a write with `disable_wal`, the memtables are then flushed, so a clean
    /// close loses nothing acknowledged. Later calls return `Closed`.
    pub fn close(&self) -> Result<()> {
        let mut first_err = None;
        if self.inner.closing.swap(true, AtOrd::AcqRel) {
            return Err(Error::Closed);
        }
        // Writes and ingests under way hold the gate: they end first (a write stalled
        // on a full engine is refused, as are writes and ingests that begin now: each
        // checks `writes_closed` under the gate). A write landing after the flush below
        // would be acknowledged and lost without a WAL; an ingest refused as closed
        // after taking its files in would give them back (delete or rename table
        // numbers) after close returned, when a reopened engine may own those numbers.
        self.inner.writes_closed.store(true, AtOrd::Release);
        self.inner.bg_cv.notify_all();
        drop(self.inner.write_gate.write());
        // So do the compactions asked for (`compact_range`, a drop's, an install's):
        // refused at their manifest edit once closed, they would delete their output
        // tables after close returned. (Not held through the flush below, which may wait
        // on compactions.)
        drop(self.inner.compaction_exclusive());
        if self.inner.opts.wal == WalMode::None || self.inner.unlogged.load(AtOrd::Acquire) {
            if let Err(e) = self.inner.flush() {
                first_err = Some(e);
            }
        }
        {
            let mut st = self.inner.state.lock();
            st.closed = true;
            // A manifest write under way (a flush's, a drop's) ends before close
            // returns: nothing of this engine writes to the store afterwards, and no
            // later one begins (`log_and_apply` refuses once closed).
            while st.vset.is_writing() {
                self.inner.bg_cv.wait(&mut st);
            }
        }
        self.inner.closed.store(true, AtOrd::Release);
        self.inner.bg_cv.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        if let Some(w) = &self.inner.wal {
            if let Err(e) = w.close() {
                first_err.get_or_insert(e);
            }
        }
        // Closed: nothing writes to the directory any more (writes are refused, the
        // background threads are joined).
        drop(self.inner.lock.lock().take());
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A cursor over `view` at `snap` (see [`Db::iter`]); `reads_at_once`: the store serves
/// concurrent reads, so seeks go to the tables in parallel when asked.
fn iter_over(
    view: Arc<View>,
    tables: &Arc<TableCache>,
    reads_at_once: bool,
    table_prefix_len: usize,
    ro: &ReadOptions<'_>,
    snap: SequenceNumber,
) -> Result<DbIterator> {
    let prefix_len = match (ro.prefix_same_as_start, table_prefix_len) {
        (false, _) => None,
        (true, 0) => {
            return Err(Error::InvalidArgument(
                "prefix_same_as_start needs a prefix extractor (table.prefix_len)".into(),
            ))
        }
        (true, len) => Some(len),
    };
    let lower = ro.lower_bound.clone();
    let upper = ro.upper_bound.clone();
    let mut children: Vec<BoxIter> = Vec::new();
    let mut tombstones = Vec::new();
    for m in std::iter::once(&view.mem).chain(view.imms.iter()) {
        children.push(Box::new(m.iter()));
        tombstones.extend(m.range_tombstones());
    }
    let in_bounds = |f: &FileMeta| {
        !(upper.as_deref().is_some_and(|u| f.smallest_user_key() >= u)
            || lower.as_deref().is_some_and(|l| f.largest_user_key() < l))
    };
    let readahead = match ro.readahead_max {
        0 => Readahead::Off,
        max => Readahead::Adaptive { max },
    };
    for f in view.version.files(0) {
        if !in_bounds(f) {
            continue;
        }
        let t = tables.get(f.number, f.size)?;
        tombstones.extend_from_slice(t.range_tombstones());
        children.push(Box::new(
            t.iter_with(ro.fill_cache).with_readahead(readahead),
        ));
    }
    for level in 1..view.version.num_levels() {
        let files = &view.version.levels[level];
        if files.is_empty() {
            continue;
        }
        for f in files.iter() {
            if f.num_range_deletions > 0 && in_bounds(f) {
                let t = tables.get(f.number, f.size)?;
                tombstones.extend_from_slice(t.range_tombstones());
            }
        }
        children.push(Box::new(
            LevelIter::new(Arc::clone(tables), Arc::clone(files), ro.fill_cache)
                .with_readahead(readahead),
        ));
    }
    let frags = Fragments::new(&tombstones, snap);
    let pin: Arc<dyn std::any::Any + Send + Sync> = view;
    Ok(DbIterator::new(
        MergingIterator::new(children).with_parallel_seeks(ro.parallel_io && reads_at_once),
        snap,
        frags,
        ReadScope {
            lower,
            upper,
            prefix: None,
        },
        prefix_len,
        vec![pin],
    ))
}

impl Drop for Db {
    fn drop(&mut self) {
        if !self.inner.state.lock().closed {
            if let Err(e) = self.close() {
                tracing::warn!(error = %e, "closing the engine on drop failed");
            }
        }
    }
}

/// A new memtable, with a prefix filter when the options ask for one.
fn new_memtable(opts: &Options, id: u64) -> MemTable {
    let bytes = (opts.write_buffer_size as f64 * opts.memtable_prefix_bloom_size_ratio) as usize;
    if opts.table.prefix_len > 0 && bytes > 0 {
        MemTable::with_prefix_filter(id, opts.table.prefix_len, bytes)
    } else {
        MemTable::new(id)
    }
}

/// Inserts every record of `batch` (first sequence `seq`) into `mem`.
fn insert_batch(mem: &MemTable, batch: &WriteBatch, seq: SequenceNumber) {
    for (i, rec) in batch.iter().enumerate() {
        let s = seq + i as u64;
        match rec {
            BatchRecord::Put(k, v) => mem.add(s, ValueKind::Put, k, v),
            BatchRecord::Delete(k) => mem.add(s, ValueKind::Delete, k, &[]),
            BatchRecord::RangeDelete(a, b) => mem.add(s, ValueKind::RangeDelete, a, b),
        }
    }
}

impl Inner {
    /// Refuses an ingest or a compaction asked for once `close` began (call with
    /// `write_gate` or `compaction_lock` held exclusively: `close` waits for both).
    fn refuse_once_closing(&self) -> Result<()> {
        if self.writes_closed.load(AtOrd::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn view(&self) -> Result<Arc<View>> {
        if self.closed.load(AtOrd::Acquire) {
            return Err(Error::Closed);
        }
        Ok(Arc::clone(&self.published.read()))
    }

    fn read_seq(&self, ro: &ReadOptions<'_>) -> SequenceNumber {
        match ro.snapshot {
            Some(s) => s.seq,
            None => self.last_seq.load(AtOrd::Acquire),
        }
    }

    fn get_in(
        &self,
        view: &View,
        key: &[u8],
        snap: SequenceNumber,
        fill_cache: bool,
    ) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.get_in_memtables(view, key, snap) {
            return Ok(v);
        }
        match view.version.get(&self.tables, key, snap, 0, fill_cache)? {
            TableGet::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// What the memtables of `view` settle about `key` as of `snap` (its value, or
    /// `Some(None)` for a deletion); `None`: the tables are to be asked.
    fn get_in_memtables(
        &self,
        view: &View,
        key: &[u8],
        snap: SequenceNumber,
    ) -> Option<Option<Vec<u8>>> {
        let mut tomb = 0;
        for m in std::iter::once(&view.mem).chain(view.imms.iter()) {
            if m.has_range_tombstones() {
                tomb = tomb.max(m.max_covering_tombstone(key, snap));
            }
            match m.get(key, snap) {
                MemGet::Value(v, seq) => return Some((seq > tomb).then_some(v)),
                MemGet::Deleted(_) => return Some(None),
                MemGet::Absent if tomb > 0 => return Some(None),
                MemGet::Absent => {}
            }
        }
        None
    }

    fn iter(&self, ro: &ReadOptions<'_>) -> Result<DbIterator> {
        let view = self.view()?;
        let snap = self.read_seq(ro);
        iter_over(
            view,
            &self.tables,
            self.store.reads_at_once(),
            self.opts.table.prefix_len,
            ro,
            snap,
        )
    }

    // ---- write path ----

    fn write_slot(&self, slot_state: SlotState) -> Result<()> {
        let slot = Arc::new(Slot {
            state: Mutex::new(slot_state),
            cv: Condvar::new(),
            done: AtomicBool::new(false),
        });
        let mut q = self.queue.lock();
        q.push_back(Arc::clone(&slot));
        let mut yields = 0;
        loop {
            if slot.done.load(AtOrd::Acquire) {
                return slot.state.lock().result.take().unwrap_or(Ok(()));
            }
            if q.front().is_some_and(|f| Arc::ptr_eq(f, &slot)) {
                break;
            }
            if yields < WRITER_YIELDS {
                // A group usually completes within microseconds: yielding a few times
                // is cheaper than a futex sleep and wake-up (RocksDB's writers do the same).
                yields += 1;
                MutexGuard::unlocked(&mut q, std::thread::yield_now);
                continue;
            }
            slot.cv.wait(&mut q);
        }
        // Leader: gather the group.
        let mut group: Vec<Arc<Slot>> = vec![Arc::clone(&slot)];
        let (mut batch, mut sync, disable_wal, force) = {
            let mut s = slot.state.lock();
            (s.batch.take(), s.sync, s.disable_wal, s.force_switch)
        };
        if let Some(b) = batch.as_mut() {
            let mut bytes = b.approximate_size();
            let mut merged: Option<WriteBatch> = None;
            for other in q.iter().skip(1) {
                let mut o = other.state.lock();
                if o.force_switch || o.disable_wal != disable_wal || bytes >= WRITE_GROUP_BYTES_MAX
                {
                    break;
                }
                let Some(ob) = o.batch.take() else { break };
                bytes += ob.approximate_size();
                sync |= o.sync;
                merged.get_or_insert_with(|| b.clone()).append(&ob);
                drop(o);
                group.push(Arc::clone(other));
            }
            if let Some(m) = merged {
                *b = m;
            }
        }
        drop(q);

        let gate = self.write_gate.read();
        let result = match batch {
            Some(_) if self.writes_closed.load(AtOrd::Acquire) => Err(Error::Closed),
            Some(b) => self.apply_group(b, sync, disable_wal),
            None => self.make_room(force, 0).map(|_| ()),
        };
        drop(gate);

        let mut q = self.queue.lock();
        for member in &group {
            let front = q.pop_front();
            debug_assert!(front.is_some_and(|f| Arc::ptr_eq(&f, member)));
            let mut s = member.state.lock();
            s.done = true;
            s.result = Some(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(clone_error(e)),
            });
            drop(s);
            member.done.store(true, AtOrd::Release);
            member.cv.notify_one();
        }
        if let Some(next) = q.front() {
            next.cv.notify_one();
        }
        drop(q);
        let mut s = slot.state.lock();
        s.result.take().unwrap_or(Ok(()))
    }

    fn apply_group(&self, mut batch: WriteBatch, sync: bool, disable_wal: bool) -> Result<()> {
        let mem = self.make_room(false, batch.approximate_size() as u64)?;
        let seq = self.last_seq.load(AtOrd::Acquire) + 1;
        let count = u64::from(batch.count());
        if seq + count > MAX_SEQUENCE {
            return Err(Error::InvalidArgument("sequence numbers exhausted".into()));
        }
        batch.set_sequence(seq);
        if let (Some(wal), false) = (&self.wal, disable_wal) {
            let index = self.wal_next.load(AtOrd::SeqCst);
            // Before the append, so a concurrent flush never computes a log number past
            // an entry whose memtable it has not seen yet.
            mem.set_wal_first(index);
            self.wal_next.store(index + 1, AtOrd::SeqCst);
            if let Err(e) = wal.append(index, batch.data().to_vec(), sync) {
                self.set_bg_error("WAL append", &e);
                return Err(e);
            }
            if sync {
                self.counters.wal_syncs.fetch_add(1, AtOrd::Relaxed);
            }
        } else if self.wal.is_some() {
            self.unlogged.store(true, AtOrd::Release);
        }
        insert_batch(&mem, &batch, seq);
        self.counters
            .user_bytes
            .fetch_add(batch.approximate_size() as u64, AtOrd::Relaxed);
        self.last_seq.store(seq + count - 1, AtOrd::Release);
        Ok(())
    }

    fn set_bg_error(&self, what: &str, e: &Error) {
        let msg = format!("{what}: {e}");
        let mut st = self.state.lock();
        // Once a manifest write failed (in this work or before it, in a foreground call
        // too), that failure is the one `failure` reports (with its `io`): work refused
        // because of it would hide it under a refusal's.
        if st.vset.is_broken() {
            tracing::error!(error = %msg, "engine is read-only after a manifest write failed");
        } else if st.bg_error.is_none() {
            st.bg_error_io = is_io(e);
            if let Error::Storage(phoenix_storage::Error::Fenced { path }) = e {
                st.bg_fenced = Some(path.clone());
            }
            tracing::error!(error = %msg, "engine turns read-only");
            st.bg_error = Some(msg);
        }
        drop(st);
        self.bg_cv.notify_all();
    }

    /// Returns the memtable to write into, switching it if full (or if `force` and it is
    /// not empty) and stalling when too much waits for flush or compaction. Called only
    /// by the write leader.
    fn make_room(&self, mut force: bool, bytes: u64) -> Result<Arc<MemTable>> {
        let a_write = !force;
        let mut slowed = false;
        let mut stalled = false;
        let mut st = self.state.lock();
        let retries_before = st.retries;
        loop {
            // (A write stalled here would hold `close` up, which waits for writes under
            // way; a flush asked for goes on.)
            if st.closed || a_write && self.writes_closed.load(AtOrd::Acquire) {
                return Err(Error::Closed);
            }
            if let Some(e) = st.refused() {
                return Err(e);
            }
            if let Some(f) = self.wal.as_ref().and_then(|w| w.failure()) {
                st.bg_error = Some(f.clone());
                st.bg_error_io = true;
                return Err(Error::Background(f));
            }
            let l0 = st.vset.current().files(0).len();
            let auto = !self.opts.disable_auto_compactions;
            if auto && !slowed && !force && l0 >= self.opts.level0_slowdown_writes_trigger {
                slowed = true;
                let t = Instant::now();
                let pause = self
                    .write_delay
                    .lock()
                    .charge(t, bytes, self.opts.delayed_write_rate);
                if !pause.is_zero() {
                    self.counters.slowdowns.fetch_add(1, AtOrd::Relaxed);
                    MutexGuard::unlocked(&mut st, || std::thread::sleep(pause));
                    self.counters
                        .stall_micros
                        .fetch_add(t.elapsed().as_micros() as u64, AtOrd::Relaxed);
                }
                continue;
            } else if !slowed && l0 < self.opts.level0_slowdown_writes_trigger {
                self.write_delay.lock().reset();
            }
            let full = st.mem.approximate_memory_usage() >= self.opts.write_buffer_size;
            if !(full || force && !st.mem.is_empty()) {
                return Ok(Arc::clone(&st.mem));
            }
            let too_many_imm = st.imm.len() + 1 >= self.opts.max_write_buffer_number;
            let too_many_l0 = auto && l0 >= self.opts.level0_stop_writes_trigger;
            if (too_many_imm || too_many_l0) && self.opts.inline_background {
                // No thread flushes for us: what is left over from a try that failed
                // (an unavailable store) is flushed here, or the write fails again.
                MutexGuard::unlocked(&mut st, || self.run_background_inline())?;
                continue;
            }
            if too_many_imm || too_many_l0 {
                // A flush asked for (`force`) does not wait out an unavailable store: it
                // fails once one more try of the work it waits on (flushes for the
                // memtables, compactions for L0) has failed, as `wait_immutables_flushed`
                // does. Writes wait: that is the back-pressure.
                if force {
                    let waits_on = [(too_many_imm, Work::Flush), (too_many_l0, Work::Compaction)];
                    for (waits, work) in waits_on {
                        if let (true, Some(e)) = (waits, st.retried_since(&retries_before, work)) {
                            return Err(e);
                        }
                    }
                }
                if !stalled {
                    stalled = true;
                    self.counters.stalls.fetch_add(1, AtOrd::Relaxed);
                }
                let t = Instant::now();
                self.bg_cv.notify_all();
                self.bg_cv.wait_for(&mut st, Duration::from_millis(100));
                self.counters
                    .stall_micros
                    .fetch_add(t.elapsed().as_micros() as u64, AtOrd::Relaxed);
                continue;
            }
            let id = st.next_mem_id;
            st.next_mem_id += 1;
            let old = std::mem::replace(&mut st.mem, Arc::new(new_memtable(&self.opts, id)));
            st.imm.push_back(old);
            st.refresh_view();
            force = false;
            self.bg_cv.notify_all();
            if self.opts.inline_background {
                MutexGuard::unlocked(&mut st, || self.run_background_inline())?;
            }
        }
    }

    /// Inline mode: flushes every immutable memtable, then compacts while needed.
    fn run_background_inline(&self) -> Result<()> {
        let _background = crate::io_class::Background::enter();
        loop {
            let front = self.state.lock().imm.front().cloned();
            let Some(mem) = front else { break };
            if let Err(e) = self.flush_one(&mem) {
                // (Unavailable: the next write that switches memtables tries again.)
                if !e.is_retryable() {
                    self.set_bg_error("flush", &e);
                }
                return Err(e);
            }
        }
        if self.opts.disable_auto_compactions {
            return Ok(());
        }
        let _c = self.compaction_exclusive();
        loop {
            let c = {
                let st = self.state.lock();
                compaction::pick(&st.vset.current(), &self.opts, &st.pointers, &st.busy)
            };
            let Some(c) = c else { return Ok(()) };
            if let Err(e) = self.run_compaction(&c, Remote::Yes) {
                if !e.is_retryable() {
                    self.set_bg_error("compaction", &e);
                }
                return Err(e);
            }
        }
    }

    fn flush(&self) -> Result<()> {
        self.write_slot(SlotState {
            batch: None,
            sync: false,
            disable_wal: false,
            force_switch: true,
            done: false,
            result: None,
        })?;
        self.wait_immutables_flushed()
    }

    /// Waits until every memtable that is immutable now has been flushed. While the
    /// table store is unavailable, it waits for one more try of the background flush
    /// and returns that try's error if it fails too (the flush goes on being tried).
    fn wait_immutables_flushed(&self) -> Result<()> {
        let mut st = self.state.lock();
        let target = st.next_mem_id;
        let retries_before = st.retries;
        loop {
            if let Some(e) = st.refused() {
                return Err(e);
            }
            if let Some(e) = st.retried_since(&retries_before, Work::Flush) {
                return Err(e);
            }
            if st.imm.front().is_none_or(|m| m.id() >= target) {
                return Ok(());
            }
            if st.closed {
                return Err(Error::Closed);
            }
            if self.opts.inline_background {
                // No thread flushes: a memtable left by a try that failed (an
                // unavailable store) is flushed here, or this flush fails again.
                MutexGuard::unlocked(&mut st, || self.run_background_inline())?;
                continue;
            }
            self.bg_cv.wait_for(&mut st, Duration::from_millis(100));
        }
    }

    // ---- background: flush ----

    fn env<'a>(&'a self, alloc: &'a dyn Fn() -> Result<u64>) -> compaction::Env<'a> {
        compaction::Env {
            store: &*self.store,
            table: &self.opts.table,
            tables: &self.tables,
            target_file_size: self.opts.target_file_size_base,
            min_group_file_size: self.opts.min_group_file_size,
            piece_bytes: self.opts.compaction_piece_bytes,
            readahead: self.whole_table_readahead(),
            new_file_number: alloc,
        }
    }

    /// How a compaction or a rewrite reads its input tables (whole, in order).
    fn whole_table_readahead(&self) -> Readahead {
        match self.opts.compaction_readahead_bytes {
            0 => Readahead::Off,
            n => Readahead::Fixed(n),
        }
    }

    fn retry_backoff_min(&self) -> Duration {
        self.opts.retry_backoff_min.max(RETRY_BACKOFF_FLOOR)
    }

    fn flush_loop(&self) {
        let _background = crate::io_class::Background::enter();
        let mut backoff = self.retry_backoff_min();
        loop {
            let mem = {
                let mut st = self.state.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    // Readers' leases are read when a due table waits on them, flushes
                    // waiting or not (a busy engine must not keep its tables forever).
                    if st
                        .vset
                        .reader_leases_due()
                        .is_some_and(|due| due <= Instant::now())
                    {
                        // (Read without the lock: requests to the store.) A failed read
                        // leaves the last floor: tables wait.
                        let read = MutexGuard::unlocked(&mut st, || {
                            let (ms, at) = (crate::reader_lease::now_ms(), Instant::now());
                            self.store.reader_leases().map(|l| (l, ms, at))
                        });
                        match read {
                            Ok((leases, ms, at)) => st
                                .vset
                                .set_reader_floor(crate::reader_lease::Floor::of(&leases, ms, at)),
                            Err(e) => {
                                // (Looked at again a second later.)
                                st.vset.set_reader_floor_failed();
                                tracing::warn!(error = %e, "could not read the readers' leases; obsolete tables wait")
                            }
                        }
                        if st.closed {
                            return;
                        }
                        self.delete_due_tables(&mut st);
                        continue;
                    }
                    if !st.stopped() {
                        if let Some(m) = st.imm.front() {
                            break Arc::clone(m);
                        }
                    }
                    // Tables waiting out `obsolete_table_delay` go when it has passed.
                    // (`take_deletable` moves the due time past now: no spin.)
                    match st.vset.next_deletion_due() {
                        Some(due) if due <= Instant::now() => self.delete_due_tables(&mut st),
                        Some(due) => {
                            self.bg_cv.wait_until(&mut st, due);
                        }
                        None => self.bg_cv.wait(&mut st),
                    }
                }
            };
            match self.flush_one(&mem) {
                Ok(()) => self.background_done(Work::Flush, &mut backoff),
                Err(e) => self.background_failed(Work::Flush, &e, &mut backoff),
            }
        }
    }

    /// Deletes the tables that may go now ([`VersionSet::take_deletable`]), without
    /// the lock: no version holds them and their numbers are never handed out again.
    fn delete_due_tables(&self, st: &mut MutexGuard<'_, State>) {
        let gone = st.vset.take_deletable();
        MutexGuard::unlocked(st, || {
            for n in gone {
                crate::version_set::delete_table(&self.store, n);
                self.tables.evict(n);
            }
        });
    }

    /// Background work (`what`) failed: on a table store that was unavailable it is
    /// tried again after `backoff` (doubled for the next time, up to
    /// `Options::retry_backoff_max`) while the engine stays writable; any other failure turns
    /// the engine read-only.
    fn background_failed(&self, work: Work, e: &Error, backoff: &mut Duration) {
        let what = work.name();
        if matches!(e, Error::Closed) {
            // Closing: with the WAL on, the next open replays it; with it off, `close`
            // flushed first (a write racing `close` itself is not waited for).
            return;
        }
        if !e.is_retryable() {
            self.set_bg_error(what, e);
            return;
        }
        let mut st = self.state.lock();
        st.retries[work as usize] += 1;
        st.retrying[work as usize] = Some(crate::table::clone_error(e));
        tracing::warn!(error = %e, retry_in = ?*backoff, "{what} failed on an unavailable table store; trying again");
        self.bg_cv.notify_all();
        // (Elapsed time, not a deadline: a backoff of any length cannot overflow.)
        let start = Instant::now();
        while !st.closed {
            let waited = start.elapsed();
            if waited >= *backoff {
                break;
            }
            self.bg_cv.wait_for(&mut st, *backoff - waited);
        }
        *backoff = backoff
            .saturating_mul(2)
            .min(self.opts.retry_backoff_max.max(self.retry_backoff_min()));
    }

    /// Background work (`what`) succeeded: a retry pending is over.
    fn background_done(&self, work: Work, backoff: &mut Duration) {
        *backoff = self.retry_backoff_min();
        let mut st = self.state.lock();
        if let Some(e) = st.retrying[work as usize].take() {
            tracing::info!(after = %e, "{} succeeded again: background work resumed", work.name());
        }
    }

    fn flush_one(&self, mem: &Arc<MemTable>) -> Result<()> {
        let _flushing = self.flush_lock.lock();
        if self.state.lock().imm.front().map(|m| m.id()) != Some(mem.id()) {
            // Flushed meanwhile by another (inline mode).
            return Ok(());
        }
        let alloc = || Ok(self.state.lock().vset.new_file_number());
        let env = self.env(&alloc);
        let meta = compaction::build_l0(&env, mem)?;
        // Read the WAL position before looking at the memtables (see apply_group).
        let wal_next = self.wal_next.load(AtOrd::SeqCst);
        let truncate_to;
        {
            let mut st = self.state.lock();
            let front = st.imm.front().map(|m| m.id());
            debug_assert_eq!(front, Some(mem.id()), "memtables flush in order");
            let log_number = st
                .imm
                .iter()
                .skip(1)
                .chain(std::iter::once(&st.mem))
                .map(|m| m.wal_first())
                .find(|&w| w != 0)
                .unwrap_or(wal_next);
            let mut edit = VersionEdit {
                last_sequence: Some(st.vset.last_sequence().max(mem.largest_seq())),
                log_number: self.wal.as_ref().map(|_| log_number),
                ..Default::default()
            };
            if let Some(m) = &meta {
                edit.new_files.push((0, Arc::clone(m)));
            }
            self.log_and_apply(&mut st, edit)?;
            // The memtable this edit holds leaves, and no other (flushes go one at a
            // time: see `flush_lock`).
            if st.imm.front().map(|m| m.id()) != Some(mem.id()) {
                return Err(Error::Background(format!(
                    "memtable {} was flushed while another flush was under way",
                    mem.id()
                )));
            }
            st.imm.pop_front();
            st.refresh_view();
            for n in st.vset.delete_obsolete_files() {
                self.tables.evict(n);
            }
            truncate_to = log_number;
        }
        if let Some(m) = &meta {
            self.counters.flush_bytes.fetch_add(m.size, AtOrd::Relaxed);
        }
        self.counters.flushes.fetch_add(1, AtOrd::Relaxed);
        self.bg_cv.notify_all();
        if let Some(w) = &self.wal {
            w.truncate_prefix(truncate_to)?;
        }
        Ok(())
    }

    // ---- background: compaction ----

    fn compaction_loop(&self) {
        let _background = crate::io_class::Background::enter();
        let mut backoff = self.retry_backoff_min();
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    if !st.stopped()
                        && !self.opts.disable_auto_compactions
                        && compaction::pick(&st.vset.current(), &self.opts, &st.pointers, &st.busy)
                            .is_some()
                    {
                        break;
                    }
                    self.bg_cv.wait(&mut st);
                }
            }
            // Shared: other background compactions run beside this one on other files;
            // manual operations wait.
            let shared = self.compaction_lock.read();
            let c = {
                let mut st = self.state.lock();
                if st.closed || st.stopped() {
                    continue;
                }
                let c = compaction::pick(&st.vset.current(), &self.opts, &st.pointers, &st.busy);
                if let Some(c) = &c {
                    for f in c.inputs.iter().chain(c.next_inputs.iter()) {
                        st.busy.insert(f.number);
                    }
                }
                c
            };
            if let Some(c) = c {
                // A closing engine, or one whose worker has not answered a job it gave
                // up on, sends it no more: what is left compacts here.
                let remote = match self.closing.load(AtOrd::SeqCst)
                    || self.given_up_pending.load(AtOrd::SeqCst) > 0
                {
                    true => Remote::No,
                    false => Remote::GivingWay,
                };
                let r = self.run_compaction(&c, remote);
                {
                    let mut st = self.state.lock();
                    for f in c.inputs.iter().chain(c.next_inputs.iter()) {
                        st.busy.remove(&f.number);
                    }
                }
                // (Not held through a back-off: manual compactions and group drops go
                // on meanwhile.)
                drop(shared);
                self.bg_cv.notify_all();
                match r {
                    Ok(()) => self.background_done(Work::Compaction, &mut backoff),
                    Err(e) => self.background_failed(Work::Compaction, &e, &mut backoff),
                }
            }
        }
    }

    /// `compaction_lock`, exclusively. A background compaction waiting on a worker
    /// meanwhile gives way (`compact_remotely`): a group drop, an ingest or `close`
    /// does not wait out a slow or hung worker.
    fn compaction_exclusive(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.exclusive_waiting.fetch_add(1, AtOrd::SeqCst);
        let held = self.compaction_lock.write();
        self.exclusive_waiting.fetch_sub(1, AtOrd::SeqCst);
        held
    }

    fn live_snapshots(&self) -> Vec<SequenceNumber> {
        self.snapshots.seqs.lock().keys().copied().collect()
    }

    /// Executes `c` and installs its result, in pieces as it goes
    /// (`Options::compaction_piece_bytes`). Caller holds `compaction_lock`.
    /// `remote`: whether the compaction may go to `Options::compaction_service`
    /// (background and asked-for compactions; a drop's and a group replacement's run
    /// here: they hold up writes or the group's install).
    fn run_compaction(&self, c: &Compaction, remote: Remote) -> Result<()> {
        let mut edit = VersionEdit::default();
        // Inputs a piece already replaced.
        let mut gone = std::collections::HashSet::new();
        if c.is_trivial_move() && c.level != c.output_level {
            edit.new_files
                .push((c.output_level, Arc::clone(&c.inputs[0])));
            self.counters.trivial_moves.fetch_add(1, AtOrd::Relaxed);
        } else {
            let service = self
                .opts
                .compaction_service
                .as_ref()
                .filter(|_| remote != Remote::No);
            let remote = match service {
                // (The reservation is this engine's own manifest write: its failure is
                // the engine's to report, not the worker's to fall back from.)
                Some(service) => {
                    match self.compact_remotely(c, service, self.reserve_job(c)?, remote) {
                        Ok(Some(files)) => Some(files),
                        // Given way to an exclusive operation: picked again after it.
                        Ok(None) => return Ok(()),
                        Err(e) if matches!(e, Error::Closed) || e.is_fenced() => return Err(e),
                        Err(e) => {
                            tracing::warn!(error = %e, level = c.level, "a compaction worker failed; compacting here");
                            self.counters.remote_fallbacks.fetch_add(1, AtOrd::Relaxed);
                            None
                        }
                    }
                }
                None => None,
            };
            let files = match remote {
                Some(files) => files,
                None => self.compact_here(c, &mut gone)?,
            };
            for f in files {
                edit.new_files.push((c.output_level, f));
            }
        }
        for f in &c.inputs {
            if !gone.contains(&f.number) {
                edit.deleted_files.push((c.level, f.number));
            }
        }
        for f in &c.next_inputs {
            if !gone.contains(&f.number) {
                edit.deleted_files.push((c.output_level, f.number));
            }
        }
        self.counters.compactions.fetch_add(1, AtOrd::Relaxed);
        let mut st = self.state.lock();
        if let Some(last) = c
            .inputs
            .iter()
            .map(|f| &f.largest)
            .max_by(|a, b| compare_internal(a, b))
        {
            st.pointers[c.level] = last.clone();
        }
        self.install_edit(st, edit)
    }

    /// Merges the inputs of `c` here, installing pieces on the way (their consumed
    /// inputs go to `gone`); the outputs left to install.
    fn compact_here(
        &self,
        c: &Compaction,
        gone: &mut std::collections::HashSet<u64>,
    ) -> Result<Vec<Arc<FileMeta>>> {
        let snaps = self.live_snapshots();
        let alloc = || Ok(self.state.lock().vset.new_file_number());
        let env = self.env(&alloc);
        let mut install = |p: compaction::Piece| -> Result<()> {
            let mut edit = VersionEdit::default();
            for (level, f) in &p.consumed {
                edit.deleted_files.push((*level, f.number));
                gone.insert(f.number);
            }
            for f in p.files {
                edit.new_files.push((c.output_level, f));
            }
            self.install_edit(self.state.lock(), edit)?;
            self.counters.compaction_pieces.fetch_add(1, AtOrd::Relaxed);
            Ok(())
        };
        let out = compaction::run(&env, c, &snaps, &mut install)?;
        self.counters
            .compaction_read
            .fetch_add(out.bytes_read, AtOrd::Relaxed);
        self.counters
            .compaction_written
            .fetch_add(out.bytes_written, AtOrd::Relaxed);
        Ok(out.files)
    }

    /// The job that has a worker merge the inputs of `c`, with file numbers reserved
    /// for its outputs.
    fn reserve_job(&self, c: &Compaction) -> Result<CompactionJob> {
        // Every job's numbers together stay far below the gap a newer writer of the
        // store leaves above this one's durable counter: numbers this engine takes
        // after a takeover it has not yet noticed never reach the newer writer's.
        let cap = match self.store.file_number_gap() {
            0 => remote_compaction::JOB_FILE_NUMBERS_MAX,
            gap => gap / (4 * self.opts.max_background_jobs.max(2) as u64),
        };
        let count =
            remote_compaction::file_numbers_for(c, self.opts.target_file_size_base).min(cap);
        // The counter past the job's numbers is durable before the job leaves: after a
        // crash this engine never writes a table a worker may still write.
        let first = {
            let mut st = self.state.lock();
            let first = st
                .vset
                .reserve_file_numbers(count)
                .ok_or_else(|| Error::InvalidArgument("file numbers run out".into()))?;
            self.log_and_apply(&mut st, VersionEdit::default())?;
            first
        };
        Ok(CompactionJob {
            level: c.level,
            output_level: c.output_level,
            inputs: c.inputs.clone(),
            next_inputs: c.next_inputs.clone(),
            bottommost: c.bottommost,
            snapshots: self.live_snapshots(),
            first_file_number: first,
            file_numbers: count,
            target_file_size: self.opts.target_file_size_base,
            min_group_file_size: self.opts.min_group_file_size,
            readahead_bytes: self.opts.compaction_readahead_bytes as u64,
            table: self.opts.table.clone(),
        })
    }

    /// Has `service` run `job` (`remote_compaction`), the merge of the inputs of `c`;
    /// the outputs, read back and checked, to install.
    /// With [`Remote::GivingWay`] (the caller holds `compaction_lock` shared), the wait
    /// for the worker ends as soon as someone wants the lock exclusively or the engine
    /// closes: `None`, nothing installed. The job's thread waits on: what the worker
    /// wrote under the numbers reserved for the job it deletes when the answer comes (a
    /// crash first leaves them as strays for the next open).
    fn compact_remotely(
        &self,
        c: &Compaction,
        service: &Arc<dyn CompactionService>,
        job: CompactionJob,
        remote: Remote,
    ) -> Result<Option<Vec<Arc<FileMeta>>>> {
        let (first, count) = (job.first_file_number, job.file_numbers);
        let out = match remote {
            Remote::GivingWay => {
                let wait = Arc::new(JobWait {
                    slot: Mutex::new(JobSlot::Waiting),
                    answered: Condvar::new(),
                });
                let (service, sent, store) =
                    (Arc::clone(service), job.clone(), Arc::clone(&self.store));
                let (theirs, pending) = (Arc::clone(&wait), Arc::clone(&self.given_up_pending));
                std::thread::Builder::new()
                    .name("phoenix-remote-job".into())
                    .spawn(move || {
                        let answer = service.compact(&sent);
                        let mut slot = theirs.slot.lock();
                        if matches!(*slot, JobSlot::GivenUp) {
                            // Nobody installs these: the numbers were reserved for this
                            // job alone (durably), so they are removed here, not left
                            // to the next open.
                            if let Ok(out) = &answer {
                                let range = sent.first_file_number
                                    ..sent.first_file_number + sent.file_numbers;
                                for &(n, _) in out.files.iter().filter(|f| range.contains(&f.0)) {
                                    let _ = store.delete_table(n);
                                }
                            }
                            pending.fetch_sub(1, AtOrd::SeqCst);
                        } else {
                            *slot = JobSlot::Answered(answer);
                            theirs.answered.notify_all();
                        }
                    })
                    .map_err(|e| Error::Remote(format!("starting the job's thread: {e}")))?;
                let mut slot = wait.slot.lock();
                loop {
                    if matches!(*slot, JobSlot::Answered(_)) {
                        if let JobSlot::Answered(answer) =
                            std::mem::replace(&mut *slot, JobSlot::Waiting)
                        {
                            break answer;
                        }
                    }
                    if self.exclusive_waiting.load(AtOrd::SeqCst) > 0
                        || self.closing.load(AtOrd::SeqCst)
                    {
                        // Until the worker answers, compactions run here (see
                        // `given_up_pending`).
                        *slot = JobSlot::GivenUp;
                        self.given_up_pending.fetch_add(1, AtOrd::SeqCst);
                        self.counters.remote_given_way.fetch_add(1, AtOrd::Relaxed);
                        tracing::info!(
                            level = c.level,
                            "a compaction waiting on its worker gives way"
                        );
                        return Ok(None);
                    }
                    wait.answered
                        .wait_for(&mut slot, std::time::Duration::from_millis(20));
                }
            }
            Remote::Yes | Remote::No => service.compact(&job),
        };
        let out = out.map_err(Error::Remote)?;
        let checked =
            remote_compaction::check_outputs(&job, &out, &self.tables).and_then(|files| {
                // The edit must apply to the tree as it is now (no output overlapping a file
                // of the output level beside the inputs): refused here, it is a fallback,
                // not an edit the manifest refuses.
                let edit = VersionEdit {
                    deleted_files: c
                        .inputs
                        .iter()
                        .map(|f| (c.level, f.number))
                        .chain(c.next_inputs.iter().map(|f| (c.output_level, f.number)))
                        .collect(),
                    new_files: files
                        .iter()
                        .map(|f| (c.output_level, Arc::clone(f)))
                        .collect(),
                    ..Default::default()
                };
                self.state
                    .lock()
                    .vset
                    .current()
                    .apply(&edit)
                    .map_err(|why| {
                        Error::InvalidArgument(format!("compaction worker's output: {why}"))
                    })?;
                Ok(files)
            });
        match checked {
            Ok(files) => {
                self.counters
                    .compaction_read
                    .fetch_add(out.bytes_read, AtOrd::Relaxed);
                self.counters
                    .compaction_written
                    .fetch_add(files.iter().map(|f| f.size).sum(), AtOrd::Relaxed);
                self.counters
                    .remote_compactions
                    .fetch_add(1, AtOrd::Relaxed);
                Ok(Some(files))
            }
            Err(e) => {
                // None of them is installed: take back what the worker says it wrote.
                for &(n, _) in &out.files {
                    if (first..first + count).contains(&n) {
                        self.tables.evict(n);
                        let _ = self.store.delete_table(n);
                    }
                }
                Err(e)
            }
        }
    }

    /// Makes `edit` durable in the manifest and installs its version (see
    /// [`VersionSet::begin`]). The manifest's I/O runs without the state lock: a store
    /// slow to answer (its client retries a request for minutes) holds up neither
    /// writers nor `stats`, `failure` or `close`. Manifest writes go one at a time; one
    /// that finds another out waits for it.
    fn log_and_apply(&self, st: &mut MutexGuard<'_, State>, edit: VersionEdit) -> Result<()> {
        self.log_and_apply_tracked(st, edit).map_err(|f| f.error)
    }

    /// [`Db::log_and_apply`], saying of a failure whether the manifest may hold the edit.
    fn log_and_apply_tracked(
        &self,
        st: &mut MutexGuard<'_, State>,
        edit: VersionEdit,
    ) -> std::result::Result<(), EditFailed> {
        while st.vset.is_writing() {
            self.bg_cv.wait(st);
        }
        let refused = |error| EditFailed {
            error,
            maybe_written: false,
        };
        if st.closed {
            return Err(refused(Error::Closed));
        }
        let mut w = st.vset.begin(edit).map_err(refused)?;
        MutexGuard::unlocked(st, || w.run());
        let r = st.vset.finish(w);
        self.bg_cv.notify_all();
        r.map_err(|error| EditFailed {
            error,
            maybe_written: true,
        })
    }

    /// Logs `edit` to the manifest (durable before anything sees it), publishes the new
    /// view, deletes the files no version needs any more and wakes the background work.
    fn install_edit(&self, st: MutexGuard<'_, State>, edit: VersionEdit) -> Result<()> {
        self.install_edit_tracked(st, edit).map_err(|f| f.error)
    }

    /// [`Db::install_edit`], saying of a failure whether the manifest may hold the edit.
    fn install_edit_tracked(
        &self,
        mut st: MutexGuard<'_, State>,
        edit: VersionEdit,
    ) -> std::result::Result<(), EditFailed> {
        self.log_and_apply_tracked(&mut st, edit)?;
        st.refresh_view();
        for n in st.vset.delete_obsolete_files() {
            self.tables.evict(n);
        }
        drop(st);
        self.bg_cv.notify_all();
        Ok(())
    }

    /// Compacts `[start, end]` down through the levels. Caller holds `compaction_lock`.
    fn compact_range_locked(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<()> {
        let last = self.opts.num_levels - 1;
        for level in 0..last {
            let v = self.state.lock().vset.current();
            let inputs = if level == 0 {
                if v.overlapping(0, start, end).is_empty() {
                    Vec::new()
                } else {
                    // Every L0 file: no older L0 data may stay above newer data in L1.
                    v.files(0).to_vec()
                }
            } else {
                v.overlapping(level, start, end)
            };
            if inputs.is_empty() {
                continue;
            }
            let c = compaction::complete(&v, level, inputs, Reason::Manual);
            drop(v);
            self.run_compaction(&c, Remote::Yes)?;
        }
        self.purge_obsolete();
        Ok(())
    }

    /// Deletes the table files no live version references any more.
    fn purge_obsolete(&self) {
        let mut st = self.state.lock();
        for n in st.vset.delete_obsolete_files() {
            self.tables.evict(n);
        }
    }

    fn drop_groups(&self, groups: &[u64]) -> Result<()> {
        // Maintenance, not a user's read: its table reads wait as a compaction's do.
        let _background = crate::io_class::Background::enter();
        let mut groups = groups.to_vec();
        groups.sort_unstable();
        groups.dedup();
        if groups.is_empty() {
            return Ok(());
        }
        // (group, first key, last key of the group) for each.
        let bounds: Vec<(u64, Vec<u8>, Vec<u8>)> = groups
            .iter()
            .map(|&g| {
                let gs = compaction::group_key_range(g).0;
                let mut last = group_range(g).0;
                last.extend_from_slice(&[0xff; 16]);
                (g, gs, last)
            })
            .collect();
        let mut b = WriteBatch::new();
        for &g in &groups {
            let (gs, ge) = compaction::group_key_range(g);
            let ge_key = ge.unwrap_or_else(|| vec![0xff; crate::options::KEY_LEN_MAX]);
            b.delete_range(&gs, &ge_key);
        }
        self.write_slot(SlotState {
            batch: Some(b),
            sync: true,
            disable_wal: false,
            force_switch: false,
            done: false,
            result: None,
        })?;
        self.flush()?;
        let _c = self.compaction_exclusive();
        self.refuse_once_closing()?;
        // L0 data of the groups goes to L1, where files are cut at group boundaries.
        let v = self.state.lock().vset.current();
        if bounds
            .iter()
            .any(|(_, gs, last)| !v.overlapping(0, Some(gs), Some(last)).is_empty())
        {
            let c = compaction::complete(&v, 0, v.files(0).to_vec(), Reason::Manual);
            drop(v);
            self.run_compaction(&c, Remote::No)?;
        }
        // Files mixing a group with other groups (ingested or tombstone-only ones):
        // rewrite them down so the group's data meets the tombstone and is dropped or
        // cut out. Tombstone-only files spanning groups count too: their tombstones
        // over a group would hide what is later ingested there.
        for (g, gs, last) in &bounds {
            let v = self.state.lock().vset.current();
            let mixed = (1..v.num_levels()).any(|l| {
                v.files(l).iter().any(|f| {
                    f.overlaps_exactly(gs, last) && !(f.min_group == *g && f.max_group == *g)
                })
            });
            drop(v);
            if mixed {
                self.compact_range_locked(Some(gs), Some(last))?;
            }
        }
        let st = self.state.lock();
        let v = st.vset.current();
        let mut edit = VersionEdit::default();
        for &g in &groups {
            for (level, f) in v.group_only_files(g) {
                edit.deleted_files.push((level, f.number));
            }
        }
        drop(v);
        if edit.deleted_files.is_empty() {
            drop(st);
            self.purge_obsolete();
            return Ok(());
        }
        self.install_edit(st, edit)
    }

    fn ingest(&self, paths: &[PathBuf]) -> Result<()> {
        // Maintenance, not a user's read: its table reads wait as a compaction's do.
        let _background = crate::io_class::Background::enter();
        if paths.is_empty() {
            return Ok(());
        }
        let prepared = self.prepare_ingest(paths)?;
        // Writes are held off for the whole ingest (RocksDB blocks them too): a write
        // landing in a range between the check below and the manifest edit could reach
        // L0 through a flush and be shadowed by an ingested file placed in L0 after it.
        let _gate = self.write_gate.write();
        self.refuse_once_closing()?;
        let in_memtables = {
            let _c = self.compaction_exclusive();
            let view = self.view()?;
            let in_memtables = prepared.iter().any(|p| memtables_overlap_file(&view, p));
            if !in_memtables && !self.tables_hold_data_in(&view, &prepared)? {
                return self.ingest_moved(&view, &prepared);
            }
            in_memtables
        };
        self.ingest_sequenced(&prepared, in_memtables, None)
    }

    fn prepare_ingest(&self, paths: &[PathBuf]) -> Result<Vec<Prepared>> {
        prepare_ingest(&self.fs, paths)
    }

    fn prepare_group_ingest(&self, g: u64, paths: &[PathBuf]) -> Result<Vec<Prepared>> {
        prepare_group_ingest(&self.fs, g, paths)
    }

    /// See [`Db::replace_group_by_tombstone`].
    fn replace_group_by_tombstone(&self, g: u64, paths: &[PathBuf]) -> Result<()> {
        // Maintenance, not a user's read: its table reads wait as a compaction's do.
        let _background = crate::io_class::Background::enter();
        let prepared = self.prepare_group_ingest(g, paths)?;
        let (start, Some(end)) = group_range(g) else {
            return Err(Error::InvalidArgument(format!(
                "group {g} has no end key to bound a range tombstone"
            )));
        };
        self.flush()?;
        let _gate = self.write_gate.write();
        self.refuse_once_closing()?;
        // Anything of the group's written since the flush goes to the tables first: the
        // tombstone table lands in L0 above every table, and a write flushed after it
        // would sit in a newer L0 file although older than the tombstone.
        // (Inclusive bound: the first key past the group counts too, which can only make
        // the check say "holds" needlessly.)
        let in_memtables = memtables_overlap(&*self.view()?, &start, &end);
        let tombstone = RangeTombstone { start, end, seq: 0 };
        self.ingest_sequenced(&prepared, in_memtables, Some(tombstone))
    }

    /// See [`Db::replace_group`].
    fn replace_group(&self, g: u64, paths: &[PathBuf]) -> Result<()> {
        self.replace_group_with(g, paths, None)
    }

    /// [`Db::replace_group`] with the files at `paths`, and with the tables `copied` in
    /// too if given ([`Db::replace_group_with_copies`]: the files then go to L0 above
    /// them at one new sequence number).
    fn replace_group_with(
        &self,
        g: u64,
        paths: &[PathBuf],
        mut copied: Option<group_copy::CopiedTables>,
    ) -> Result<()> {
        // Maintenance, not a user's read: its table reads wait as a compaction's do.
        let _background = crate::io_class::Background::enter();
        let prepared = self.prepare_group_ingest(g, paths)?;
        let (gs, ge) = group_range(g);
        // Inclusive bound for the overlap checks: the first key past the group counts
        // too, which can only make a check say "holds" needlessly.
        let last_key_of_group = ge
            .clone()
            .unwrap_or_else(|| vec![0xff; crate::options::KEY_LEN_MAX]);
        // 1. Semantically neutral preparation, safe to crash in: g's writes leave the
        //    memtables, and L0 (whose files mix groups) is compacted into L1 if it holds
        //    g, so the switch below rewrites at most a few files of L1 and below.
        self.flush()?;
        {
            let _c = self.compaction_exclusive();
            self.refuse_once_closing()?;
            self.compact_l0_holding(g, &gs, &last_key_of_group)?;
        }
        // 2. The switch. Writes are held off so none lands between the checks and the
        //    edit; then ONE manifest edit removes g's own files, replaces each file that
        //    shares g with other groups by a copy without g's keys (same level, same
        //    sequence numbers), and adds the new files.
        let _gate = self.write_gate.write();
        self.refuse_once_closing()?;
        if memtables_overlap(&*self.view()?, &gs, &last_key_of_group) {
            // Written (or a range deletion spanning g) since the flush: flush again.
            self.make_room(true, 0)?;
            self.wait_immutables_flushed()?;
        }
        let _c = self.compaction_exclusive();
        self.compact_l0_holding(g, &gs, &last_key_of_group)?;
        let view = self.view()?;
        let mut edit = VersionEdit::default();
        let mut written: Vec<u64> = Vec::new();
        let mut imported: Vec<(&Path, u64, Imported)> = Vec::new();
        let result = (|| -> Result<()> {
            for level in 0..view.version.num_levels() {
                for f in view.version.files(level) {
                    if f.min_group == g && f.max_group == g {
                        edit.deleted_files.push((level, f.number));
                    } else if f.overlaps_exactly(&gs, &last_key_of_group)
                        && self.table_has_data_in(f, &gs, &last_key_of_group)?
                    {
                        if level == 0 {
                            return Err(Error::Background(format!(
                                "replacing group {g}: L0 file {} still holds the group",
                                f.number
                            )));
                        }
                        edit.deleted_files.push((level, f.number));
                        let number = self.state.lock().vset.new_file_number();
                        written.push(number);
                        if let Some(m) = self.rewrite_without(f, number, &gs, ge.as_deref())? {
                            edit.new_files.push((level, m));
                        }
                    }
                }
            }
            // Levels for the new files are chosen as if the edit's deletions were done.
            let remaining = {
                let mut e = VersionEdit::default();
                e.deleted_files.clone_from(&edit.deleted_files);
                e.new_files.clone_from(&edit.new_files);
                view.version
                    .apply(&e)
                    .map_err(|why| Error::Background(format!("replacing group {g}: {why}")))?
            };
            let Some(copied) = &copied else {
                return self.import_prepared(&remaining, &prepared, &mut edit, &mut imported);
            };
            // The copies keep their levels and sequence numbers (the source engine's);
            // the files go above them, at a sequence past every copied entry and every
            // one of this engine's, which the edit records as the last.
            let copied_seq = self.place_copies(g, &remaining, copied, &mut edit)?;
            let seq = self.last_seq.load(AtOrd::Acquire).max(copied_seq) + 1;
            if seq > MAX_SEQUENCE {
                return Err(Error::InvalidArgument("sequence numbers exhausted".into()));
            }
            for p in &prepared {
                let number = self.state.lock().vset.new_file_number();
                written.push(number);
                let meta = self.rewrite_with_sequence(p, number, seq)?;
                edit.new_files.push((0, meta));
            }
            edit.last_sequence = Some(seq);
            self.store.sync()
        })();
        if let Err(e) = result {
            self.undo_ingest(&written, &imported);
            return Err(e);
        }
        let seq = edit.last_sequence;
        let mut st = self.state.lock();
        let installed = self.log_and_apply_tracked(&mut st, edit);
        if let (Some(seq), Some(c)) = (seq, copied.as_mut()) {
            if installed.is_ok() || installed.as_ref().is_err_and(|f| f.maybe_written) {
                // The manifest may name the copies now: they are the engine's. And `seq`
                // is spent either way (see `ingest_sequenced`). (No write is in flight:
                // the gate is held.)
                group_copy::disarm(c);
                // The sequence before the view: a reader takes the view, then the
                // sequence, so one that meets the copies reads the rest above them; one
                // with the old view reads the group as it was, at any sequence.
                self.last_seq.fetch_max(seq, AtOrd::AcqRel);
            }
        }
        if installed.is_ok() {
            fail::fail_point!("engine::replace_group::published_half");
            st.refresh_view();
        }
        if let Err(f) = installed {
            drop(st);
            if !f.maybe_written {
                // Refused before anything was written (closing, a broken version set):
                // the sources go back, to install from again.
                self.undo_ingest(&written, &imported);
            }
            return Err(f.error);
        }
        for n in st.vset.delete_obsolete_files() {
            self.tables.evict(n);
        }
        drop(st);
        self.bg_cv.notify_all();
        self.remove_copied_sources(&imported);
        Ok(())
    }

    /// Takes each prepared file in as a new table (sequence numbers as they are) at the
    /// deepest level of `version` with room for it (a file may span a range without
    /// holding anything in it: any level whose files leave room will do), adding it to
    /// `edit` and to `imported`; then makes the imports durable.
    fn import_prepared<'p>(
        &self,
        version: &Version,
        prepared: &'p [Prepared],
        edit: &mut VersionEdit,
        imported: &mut Vec<(&'p Path, u64, Imported)>,
    ) -> Result<()> {
        for p in prepared {
            let level = ingest_level(version, &p.props_meta, false);
            let number = self.state.lock().vset.new_file_number();
            let how = self.store.import_table(&*self.fs, &p.path, number)?;
            imported.push((&p.path, number, how));
            let mut m = (*p.props_meta).clone();
            m.number = number;
            edit.new_files.push((level, Arc::new(m)));
        }
        self.store.sync()
    }

    /// Takes back the tables an ingest wrote and imported when it fails before its
    /// manifest edit: written ones are deleted, imported ones given back to their
    /// sources (a moved file renamed back), so the caller can try again with the same
    /// files. Best effort; a leftover table is removed at the next open as not in the
    /// manifest.
    fn undo_ingest(&self, written: &[u64], imported: &[(&Path, u64, Imported)]) {
        for &n in written {
            let _ = self.store.delete_table(n);
        }
        for &(src, n, how) in imported {
            if let Err(e) = self.store.unimport_table(&*self.fs, src, n, how) {
                tracing::warn!(file = %src.display(), table = n, error = %e, "could not give an ingested file back");
            }
        }
    }

    /// Removes the sources an ingest copied in, once a durable edit names their copies
    /// (after a failed edit they stay, to try again with).
    fn remove_copied_sources(&self, imported: &[(&Path, u64, Imported)]) {
        for &(src, _, how) in imported {
            if how == Imported::Copied {
                if let Err(e) = self.fs.delete(src) {
                    tracing::warn!(file = %src.display(), error = %e, "could not remove an ingested source file");
                }
            }
        }
    }

    /// Compacts every L0 file into L1 if one holds a key or tombstone of group `g`.
    /// Caller holds `compaction_lock`.
    fn compact_l0_holding(&self, g: u64, gs: &[u8], last_key_of_group: &[u8]) -> Result<()> {
        let v = self.state.lock().vset.current();
        let mut holds = false;
        for f in v.files(0) {
            if f.overlaps_exactly(gs, last_key_of_group)
                && (f.min_group == g && f.max_group == g
                    || self.table_has_data_in(f, gs, last_key_of_group)?)
            {
                holds = true;
                break;
            }
        }
        if holds {
            let c = compaction::complete(&v, 0, v.files(0).to_vec(), Reason::Manual);
            drop(v);
            self.run_compaction(&c, Remote::No)?;
        }
        Ok(())
    }

    /// Copies table `f` to table `number` without the keys in `[lo, hi)` (`hi`
    /// `None`: unbounded) and with its range tombstones cut around that range; entries
    /// keep their sequence numbers. `None` (and no file) if nothing is left.
    fn rewrite_without(
        &self,
        f: &FileMeta,
        number: u64,
        lo: &[u8],
        hi: Option<&[u8]>,
    ) -> Result<Option<Arc<FileMeta>>> {
        let inside = |k: &[u8]| k >= lo && hi.is_none_or(|h| k < h);
        let table = self.tables.get(f.number, f.size)?;
        let mut tombstones = Vec::new();
        for t in table.range_tombstones() {
            if t.start.as_slice() < lo {
                let end = t.end.as_slice().min(lo);
                tombstones.push(crate::key::RangeTombstone {
                    start: t.start.clone(),
                    end: end.to_vec(),
                    seq: t.seq,
                });
            }
            if let Some(h) = hi {
                if t.end.as_slice() > h {
                    tombstones.push(crate::key::RangeTombstone {
                        start: t.start.as_slice().max(h).to_vec(),
                        end: t.end.clone(),
                        seq: t.seq,
                    });
                }
            }
        }
        let mut it = table
            .iter_with(false)
            .with_readahead(self.whole_table_readahead());
        it.seek_to_first();
        let mut kept = Vec::new();
        while it.valid() {
            if !inside(crate::key::user_key(it.key())) {
                kept.push((it.key().to_vec(), it.value().to_vec()));
            }
            it.next();
        }
        it.status()?;
        if kept.is_empty() && tombstones.is_empty() {
            return Ok(None);
        }
        let out = self.store.create_table(number)?;
        let mut b = crate::table::TableBuilder::new(out, &self.opts.table);
        for (k, v) in &kept {
            b.add(k, v)?;
        }
        for t in &tombstones {
            b.add_range_tombstone(t)?;
        }
        let summary = b.finish()?;
        Ok(Some(compaction::meta_from(number, &summary)))
    }

    /// Whether a table holds an entry or a range tombstone in any prepared file's range.
    fn tables_hold_data_in(&self, view: &View, prepared: &[Prepared]) -> Result<bool> {
        for p in prepared {
            let lo = p.props_meta.smallest_user_key();
            let hi = p.props_meta.largest_user_key();
            for level in 0..view.version.num_levels() {
                for f in view.version.files(level) {
                    if f.overlaps_exactly(lo, hi) && self.table_has_data_in(f, lo, hi)? {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// Ingest into empty key ranges: the files keep sequence 0 and are moved in as they
    /// are, each at the deepest level with room. Caller holds the write gate and the
    /// compaction lock.
    fn ingest_moved(&self, view: &View, prepared: &[Prepared]) -> Result<()> {
        let mut edit = VersionEdit::default();
        let mut imported: Vec<(&Path, u64, Imported)> = Vec::new();
        let result = self.import_prepared(&view.version, prepared, &mut edit, &mut imported);
        if let Err(e) = result {
            self.undo_ingest(&[], &imported);
            return Err(e);
        }
        let mut st = self.state.lock();
        if let Err(f) = self.log_and_apply_tracked(&mut st, edit) {
            drop(st);
            if !f.maybe_written {
                self.undo_ingest(&[], &imported);
            }
            return Err(f.error);
        }
        st.refresh_view();
        drop(st);
        self.remove_copied_sources(&imported);
        self.bg_cv.notify_all();
        Ok(())
    }

    /// Ingest over existing data (RocksDB's global sequence number): writes are held
    /// off, memtables holding keys of the files' ranges are flushed, then every file is
    /// rewritten with one new sequence number `S` for all its entries, so it shadows
    /// what was there and snapshots taken before do not see it. Each file goes to the
    /// deepest level above every table overlapping its range (L0 if L0 overlaps); the
    /// manifest edit that adds the files also records `S` as the last sequence. Caller
    /// holds the write gate (no write group is in flight), not the compaction lock;
    /// `in_memtables` says whether a memtable holds keys of the ranges.
    fn ingest_sequenced(
        &self,
        prepared: &[Prepared],
        in_memtables: bool,
        tombstone: Option<RangeTombstone>,
    ) -> Result<()> {
        if in_memtables {
            self.make_room(true, 0)?;
            self.wait_immutables_flushed()?;
        }
        let _c = self.compaction_exclusive();
        let view = self.view()?;
        debug_assert!(
            !prepared.iter().any(|p| memtables_overlap_file(&view, p)),
            "ingest over unflushed writes"
        );
        let seq = self.last_seq.load(AtOrd::Acquire) + 1;
        if seq > MAX_SEQUENCE {
            return Err(Error::InvalidArgument("sequence numbers exhausted".into()));
        }
        let mut edit = VersionEdit {
            last_sequence: Some(seq),
            ..Default::default()
        };
        let mut written: Vec<u64> = Vec::new();
        let result = (|| -> Result<()> {
            if let Some(t) = &tombstone {
                // In L0, above everything it hides; the files go to L0 too, in newer
                // files (reads take L0 newest first and stop at a covering tombstone).
                // Their keys at `seq` are not hidden by it: a tombstone covers older
                // sequences only.
                let number = self.state.lock().vset.new_file_number();
                written.push(number);
                let out = self.store.create_table(number)?;
                let mut b = crate::table::TableBuilder::new(out, &self.opts.table);
                b.add_range_tombstone(&RangeTombstone { seq, ..t.clone() })?;
                let summary = b.finish()?;
                edit.new_files
                    .push((0, compaction::meta_from(number, &summary)));
            }
            for p in prepared {
                // Its data is newer than any table's: above every overlapping one.
                let level = if tombstone.is_some() {
                    0
                } else {
                    ingest_level(&view.version, &p.props_meta, true)
                };
                let number = self.state.lock().vset.new_file_number();
                written.push(number);
                let meta = self.rewrite_with_sequence(p, number, seq)?;
                edit.new_files.push((level, meta));
            }
            self.store.sync()?;
            Ok(())
        })();
        if let Err(e) = result {
            self.undo_ingest(&written, &[]);
            return Err(e);
        }
        let mut st = self.state.lock();
        if let Err(e) = self.log_and_apply(&mut st, edit) {
            // The edit may have landed all the same (an answer lost): `seq` is spent
            // either way, so no later write takes it — after a crash that recovers the
            // edit, a write at `seq` and the files' entries would be one internal key's
            // two versions. (No write is in flight: the caller holds the write gate.)
            self.last_seq.fetch_max(seq, AtOrd::AcqRel);
            return Err(e);
        }
        // The view with the files first, then the sequence that makes them visible: a
        // reader never holds `seq` with a view that lacks them.
        st.refresh_view();
        self.last_seq.store(seq, AtOrd::Release);
        drop(st);
        for p in prepared {
            // The files were copied in; the originals go, as a moved file would.
            if let Err(e) = self.fs.delete(&p.path) {
                tracing::warn!(file = %p.path.display(), error = %e, "could not remove an ingested source file");
            }
        }
        self.bg_cv.notify_all();
        Ok(())
    }

    /// Copies prepared table `src` to table `number` with every entry and range
    /// tombstone at sequence `seq`.
    fn rewrite_with_sequence(
        &self,
        src: &Prepared,
        number: u64,
        seq: SequenceNumber,
    ) -> Result<Arc<FileMeta>> {
        let table = &src.table;
        let out = self.store.create_table(number)?;
        let mut b = crate::table::TableBuilder::new(out, &self.opts.table);
        let mut it = table
            .iter_with(false)
            .with_readahead(self.whole_table_readahead());
        it.seek_to_first();
        let mut key = Vec::new();
        while it.valid() {
            let p = parse_internal_key(it.key())
                .ok_or_else(|| Error::corruption(&src.path, 0, "malformed internal key"))?;
            key.clear();
            encode_internal_key(&mut key, p.user_key, seq, p.kind);
            b.add(&key, it.value())?;
            it.next();
        }
        it.status()?;
        for t in table.range_tombstones() {
            let mut t = t.clone();
            t.seq = seq;
            b.add_range_tombstone(&t)?;
        }
        let summary = b.finish()?;
        Ok(compaction::meta_from(number, &summary))
    }

    /// Whether table `f` holds an entry or a range tombstone for a key in `[lo, hi]`.
    fn table_has_data_in(&self, f: &FileMeta, lo: &[u8], hi: &[u8]) -> Result<bool> {
        let t = self.tables.get(f.number, f.size)?;
        if t.range_tombstones()
            .iter()
            .any(|r| r.start.as_slice() <= hi && lo < r.end.as_slice())
        {
            return Ok(true);
        }
        let mut it = t.iter();
        it.seek(&crate::key::internal_key(
            lo,
            MAX_SEQUENCE,
            ValueKind::RangeDelete,
        ));
        let found = it.valid() && crate::key::user_key(it.key()) <= hi;
        it.status()?;
        Ok(found)
    }

    fn stats(&self) -> Stats {
        let st = self.state.lock();
        let v = st.vset.current();
        let levels = (0..v.num_levels())
            .map(|l| LevelStats {
                files: v.files(l).len(),
                bytes: v.level_bytes(l),
                mixed_group_files: v
                    .files(l)
                    .iter()
                    .filter(|f| f.min_group != f.max_group && f.num_entries > f.num_range_deletions)
                    .count(),
            })
            .collect();
        let c = &self.counters;
        let user = c.user_bytes.load(AtOrd::Relaxed);
        let flush = c.flush_bytes.load(AtOrd::Relaxed);
        let comp_w = c.compaction_written.load(AtOrd::Relaxed);
        Stats {
            levels,
            memtable_bytes: st.mem.approximate_memory_usage(),
            immutable_memtables: st.imm.len(),
            user_bytes_written: user,
            flush_bytes_written: flush,
            flushes: c.flushes.load(AtOrd::Relaxed),
            compaction_bytes_read: c.compaction_read.load(AtOrd::Relaxed),
            compaction_bytes_written: comp_w,
            compactions: c.compactions.load(AtOrd::Relaxed),
            trivial_moves: c.trivial_moves.load(AtOrd::Relaxed),
            compaction_pieces: c.compaction_pieces.load(AtOrd::Relaxed),
            remote_compactions: c.remote_compactions.load(AtOrd::Relaxed),
            remote_compaction_fallbacks: c.remote_fallbacks.load(AtOrd::Relaxed),
            remote_compactions_given_way: c.remote_given_way.load(AtOrd::Relaxed),
            remote_compactions_given_way_pending: self.given_up_pending.load(AtOrd::SeqCst),
            write_amplification: if user == 0 {
                0.0
            } else {
                (flush + comp_w) as f64 / user as f64
            },
            stall_count: c.stalls.load(AtOrd::Relaxed),
            stall_micros: c.stall_micros.load(AtOrd::Relaxed),
            slowdown_count: c.slowdowns.load(AtOrd::Relaxed),
            block_cache_usage: self.block_cache.as_ref().map_or(0, |b| b.usage()),
            last_sequence: self.last_seq.load(AtOrd::Acquire),
            snapshots: self.snapshots.seqs.lock().values().sum(),
            background_retries: st.retries.iter().sum(),
            background_retrying: st.retrying.iter().flatten().next().map(|e| e.to_string()),
        }
    }
}

/// A file checked for ingestion, with the metadata its properties give.
struct Prepared {
    path: PathBuf,
    props_meta: Arc<FileMeta>,
    /// The open, validated table (the sequenced path copies from it).
    table: Arc<Table>,
}

/// The level an ingested file goes to: L0 if it holds several groups (below L0 files hold
/// one group each; compaction will cut it), else the deepest level where no file
/// overlaps its range; with `above_overlaps`, also none in any level above (its data is
/// newer than theirs). L0 if there is no such level.
fn ingest_level(version: &Version, m: &FileMeta, above_overlaps: bool) -> usize {
    if m.min_group != m.max_group {
        return 0;
    }
    let (lo, hi) = (m.smallest_user_key(), m.largest_user_key());
    let overlaps = |l: usize| version.files(l).iter().any(|f| f.overlaps_exactly(lo, hi));
    if above_overlaps {
        if overlaps(0) {
            return 0;
        }
        (1..version.num_levels())
            .take_while(|&l| !overlaps(l))
            .last()
            .unwrap_or(0)
    } else {
        (1..version.num_levels())
            .rev()
            .find(|&l| !overlaps(l))
            .unwrap_or(0)
    }
}

fn memtables_overlap_file(view: &View, p: &Prepared) -> bool {
    memtables_overlap(
        view,
        p.props_meta.smallest_user_key(),
        p.props_meta.largest_user_key(),
    )
}

fn memtables_overlap(view: &View, lo: &[u8], hi: &[u8]) -> bool {
    for m in std::iter::once(&view.mem).chain(view.imms.iter()) {
        let mut it = m.iter();
        it.seek(&crate::key::internal_key(
            lo,
            MAX_SEQUENCE,
            ValueKind::RangeDelete,
        ));
        if it.valid() && crate::key::user_key(it.key()) <= hi {
            return true;
        }
        if m.range_tombstones()
            .iter()
            .any(|t| t.start.as_slice() <= hi && lo < t.end.as_slice())
        {
            return true;
        }
    }
    false
}

/// Opens and checks files to ingest: each built with `SstWriter` (sequence 0, keys in
/// order), not empty; the files must not overlap each other. Sorted by smallest key.
fn prepare_ingest(fs: &SharedFs, paths: &[PathBuf]) -> Result<Vec<Prepared>> {
    let mut prepared = Vec::new();
    for path in paths {
        let file = fs.open(path)?;
        let size = file.size();
        let table = Arc::new(Table::open(file, 0, size, None)?);
        validate_ingest_table(&table, path)?;
        let p = table.properties();
        if p.num_entries == 0 && p.num_range_deletions == 0 {
            return Err(Error::InvalidArgument(format!(
                "{} holds no entries",
                path.display()
            )));
        }
        // (Sequence 0 throughout: `validate_ingest_table` checked every entry.)
        let meta = Arc::new(FileMeta {
            smallest_seq: 0,
            largest_seq: 0,
            ..FileMeta::from_properties(0, size, p)
        });
        prepared.push(Prepared {
            path: path.clone(),
            props_meta: meta,
            table,
        });
    }
    prepared.sort_by(|a, b| compare_internal(&a.props_meta.smallest, &b.props_meta.smallest));
    for w in prepared.windows(2) {
        if compare_internal(&w[0].props_meta.largest, &w[1].props_meta.smallest).is_ge() {
            return Err(Error::InvalidArgument(format!(
                "ingested files {} and {} overlap",
                w[0].path.display(),
                w[1].path.display()
            )));
        }
    }
    Ok(prepared)
}

/// Files to ingest (see `prepare_ingest`) that hold keys of group `g` only.
fn prepare_group_ingest(fs: &SharedFs, g: u64, paths: &[PathBuf]) -> Result<Vec<Prepared>> {
    let prepared = prepare_ingest(fs, paths)?;
    if let Some(p) = prepared
        .iter()
        .find(|p| p.props_meta.min_group != g || p.props_meta.max_group != g)
    {
        return Err(Error::InvalidArgument(format!(
            "{} holds keys outside group {g} (groups {}..={})",
            p.path.display(),
            p.props_meta.min_group,
            p.props_meta.max_group
        )));
    }
    Ok(prepared)
}

/// Checks files meant to replace group `g` (`Db::replace_group`) as the ingest will,
/// without a database: each a whole table built with `SstWriter` (every block's
/// checksum, sequence 0, keys in order, every key in group `g`), not empty, no two
/// overlapping. Lets a caller refuse files received from elsewhere before it commits to
/// ingesting them.
pub fn check_group_files(fs: &SharedFs, g: u64, paths: &[PathBuf]) -> Result<()> {
    prepare_group_ingest(fs, g, paths).map(drop)
}

fn validate_ingest_table(table: &Arc<Table>, path: &Path) -> Result<()> {
    let props = table.properties();
    // (The group properties decide where the file may go: they must not lie.)
    let in_groups = |user_key: &[u8]| {
        let g = crate::key::group_of(user_key);
        g >= props.min_group && g <= props.max_group
    };
    let mut it = table.iter();
    it.seek_to_first();
    let mut prev: Option<Vec<u8>> = None;
    while it.valid() {
        let k = it.key();
        let p = parse_internal_key(k)
            .ok_or_else(|| Error::corruption(path, 0, "malformed internal key"))?;
        if !in_groups(p.user_key) {
            return Err(Error::corruption(
                path,
                0,
                "a key lies outside the groups the file's properties name",
            ));
        }
        if p.seq != 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: entries must carry sequence 0 (build the file with SstWriter)",
                path.display()
            )));
        }
        if let Some(pk) = &prev {
            if compare_internal(pk, k).is_ge() {
                return Err(Error::corruption(path, 0, "keys out of order"));
            }
        }
        prev = Some(k.to_vec());
        it.next();
    }
    it.status()?;
    if table.range_tombstones().iter().any(|t| t.seq != 0) {
        return Err(Error::InvalidArgument(format!(
            "{}: range tombstones must carry sequence 0",
            path.display()
        )));
    }
    let (_, groups_end) = crate::key::group_range(props.max_group);
    if table.range_tombstones().iter().any(|t| {
        !in_groups(&t.start)
            || groups_end
                .as_ref()
                .is_some_and(|e| t.end.as_slice() > e.as_slice())
    }) {
        return Err(Error::corruption(
            path,
            0,
            "a range tombstone reaches outside the groups the file's properties name",
        ));
    }
    Ok(())
}
