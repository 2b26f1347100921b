//! `phoenix-log`: one durable log for many streams.
//!
//! Each raft group's log is a stream (identified by a `u64`), and so is the engine's WAL
//! when it runs standalone. This crate owns the log's files, their format, the write path
//! (queues with group commit), the in-memory index of every stream, space reclamation and
//! recovery. See `docs/log.md` for the design and [`format`] for the byte grammar.
//!
//! Shape of the write path (seeds 002 and 003):
//! - N *queues*; each owns its segment files and a group-commit writer thread with two
//!   buffers: callers serialise their ops into the filling buffer while the writer thread
//!   writes and `fdatasync`s the other one; one write and one sync cover every op that
//!   was waiting. Streams are assigned to queues; the assignment is recorded in the log and
//!   can be changed at run time ([`LogStore::set_queue_count`]) without reordering any
//!   stream.
//! - Segments are preallocated (zero-filled, so later `fdatasync`s carry no metadata) and
//!   recycled; every group commit is one checksummed frame, so recovery needs no size
//!   metadata.
//! - An append returns a handle that completes once the op is durable (or, for non-durable
//!   appends, written to the file).
//!
//! Thread safety: [`LogStore`] is `Send + Sync`; every method may be called from any thread.
//! Ops on one stream are ordered by the order their calls took the stream's lock.

#![deny(missing_docs)]

mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzz;
mod gc;
mod handle;
mod queue;
mod recovery;
mod segment;
mod store;

use std::path::Path;
use std::sync::Arc;

pub use bytes::Bytes;
pub use error::{Error, Result};
pub use handle::AppendHandle;
use phoenix_storage::SharedFs;
pub use recovery::{scan_segment, ScanResult};

/// One log entry of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The entry's index in its stream.
    pub index: u64,
    /// The raft term it was written in (opaque to the log store).
    pub term: u64,
    /// The payload.
    pub data: Bytes,
}

impl LogEntry {
    /// Builds an entry.
    pub fn new(index: u64, term: u64, data: impl Into<Bytes>) -> LogEntry {
        LogEntry {
            index,
            term,
            data: data.into(),
        }
    }
}

/// The small per-stream state saved atomically with appends (raft's hard state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    /// Current term.
    pub term: u64,
    /// Candidate voted for in `term` (0 = none).
    pub vote: u64,
    /// Highest index known committed.
    pub commit: u64,
}

/// Bytes of a segment that were written but whose sync failed (or never came): from
/// `offset` to the segment's end. See [`LogStore::unsynced_tails`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsyncedTail {
    /// The segment's sequence number (its file name).
    pub segment: u64,
    /// Where its last successful sync ended.
    pub offset: u64,
}

/// Options of a [`LogStore`].
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// Number of queues (each with its own files and group-commit thread) at a fresh
    /// start. A reopened store keeps the count it had (see [`LogStore::set_queue_count`]).
    pub queues: usize,
    /// Size of a segment file. Ops larger than a segment get a segment of their own.
    pub segment_size: u64,
    /// Default durability of [`LogStore::append`]: `true` = acknowledged after `fdatasync`,
    /// `false` = acknowledged after the `write` to the file (like RocksDB's WAL with
    /// `sync=false`).
    pub sync: bool,
    /// Open segments with `O_DIRECT`; every write is then padded to 4 KiB.
    pub direct_io: bool,
    /// Fill new segment files with zeros instead of `fallocate`: an `fdatasync` into an
    /// `fallocate`d but never written range must also journal the extent conversion,
    /// which costs several times a plain data sync on ext4.
    pub zero_fill_segments: bool,
    /// When live bytes / total bytes of the log falls under this, the cold streams that pin
    /// the oldest segments are rewritten into the newest segments (seed 003's snapshot).
    pub gc_live_ratio: f64,
    /// Bytes of newest entries per stream kept in memory for reads.
    pub cache_bytes_per_stream: usize,
    /// Free segment files kept for reuse, per queue (at least 2).
    pub recycle_per_queue: usize,
    /// A filling buffer larger than this makes appenders wait for the writer (back
    /// pressure).
    pub max_batch_bytes: usize,
    /// Longest time a queue's writer waits, before a synced write, for the batch to reach
    /// the size of the previous one (zero: never wait). A sync costs hundreds of
    /// microseconds; waiting a little lets one sync cover every writer of a closed loop.
    pub group_commit_wait: std::time::Duration,
    /// Run a maintenance thread that prepares zero-filled segment files ahead of need and
    /// reclaims space after segment rolls. Deterministic tests turn it off: segment files
    /// are then created when needed and space is reclaimed only by [`LogStore::gc`].
    pub background_maintenance: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            queues: 1,
            segment_size: 64 << 20,
            sync: true,
            direct_io: false,
            zero_fill_segments: true,
            gc_live_ratio: 0.5,
            cache_bytes_per_stream: 256 << 10,
            recycle_per_queue: 2,
            max_batch_bytes: 32 << 20,
            group_commit_wait: std::time::Duration::from_micros(100),
            background_maintenance: true,
        }
    }
}

/// Figures of a running store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Segment files holding records (free files not counted).
    pub segments: usize,
    /// Free segment files kept for reuse.
    pub free_segments: usize,
    /// Bytes of frames in those segments.
    pub total_bytes: u64,
    /// Bytes of live entries in them.
    pub live_bytes: u64,
    /// Current number of queues.
    pub queues: usize,
    /// Number of live streams.
    pub streams: usize,
    /// Ops submitted (appends, truncations, assignments, removals, rewrites).
    pub appends: u64,
    /// Group-commit writes.
    pub writes: u64,
    /// `fdatasync` calls on segments.
    pub syncs: u64,
    /// Bytes written to segments (frames and padding).
    pub bytes_written: u64,
    /// Streams rewritten forward by space reclamation.
    pub rewrites: u64,
    /// Segments deleted or recycled by space reclamation.
    pub segments_reclaimed: u64,
}

/// The shared log store. Cheap to share via `Arc`; see the crate docs.
pub struct LogStore {
    inner: Arc<store::Inner>,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl LogStore {
    /// Opens (recovering) or creates the log store in `dir`.
    pub fn open(fs: SharedFs, dir: &Path, opts: LogOptions) -> Result<Arc<LogStore>> {
        let inner = store::Inner::open(fs, dir, opts, &[])?;
        Ok(Arc::new(LogStore { inner }))
    }

    /// [`LogStore::open`] in the process whose previous store in `dir` failed, with what
    /// that store's [`LogStore::unsynced_tails`] said: each of those segments is cut where
    /// its last successful sync ended (and sealed there, durably) instead of where its
    /// frames end. After a failed `fsync` the bytes it did not sync can still be read from
    /// the page cache, though the disk may not hold them, and nothing in them was
    /// acknowledged. A tail naming a segment that no longer exists is ignored.
    pub fn open_cutting(
        fs: SharedFs,
        dir: &Path,
        opts: LogOptions,
        unsynced: &[UnsyncedTail],
    ) -> Result<Arc<LogStore>> {
        let inner = store::Inner::open(fs, dir, opts, unsynced)?;
        Ok(Arc::new(LogStore { inner }))
    }

    /// Appends `entries` (consecutive indexes) and/or saves `hard_state`, durable per
    /// [`LogOptions::sync`]. If `entries[0].index <= last_index`, the overlapping suffix is
    /// replaced (raft conflict). The handle completes when the op is acknowledged.
    pub fn append(
        &self,
        stream: u64,
        entries: Vec<LogEntry>,
        hard_state: Option<HardState>,
    ) -> AppendHandle {
        let (handle, completion) = handle::pair();
        let durable = self.inner.opts.sync;
        self.inner
            .append(stream, entries, hard_state, durable, completion, false);
        handle
    }

    /// Like [`append`](Self::append), with a callback run (on the queue's writer thread,
    /// so keep it short) when the op is acknowledged.
    pub fn append_with(
        &self,
        stream: u64,
        entries: Vec<LogEntry>,
        hard_state: Option<HardState>,
        cb: impl FnOnce(Result<()>) + Send + 'static,
    ) {
        let durable = self.inner.opts.sync;
        self.inner.append(
            stream,
            entries,
            hard_state,
            durable,
            handle::Completion::Callback(Box::new(cb)),
            false,
        );
    }

    /// Like [`append`](Self::append) with a per-call durability: `durable = true` waits for
    /// `fdatasync`, `false` only for the write to the file. One store serves both kinds.
    pub fn append_durable(
        &self,
        stream: u64,
        entries: Vec<LogEntry>,
        hard_state: Option<HardState>,
        durable: bool,
    ) -> AppendHandle {
        let (handle, completion) = handle::pair();
        self.inner
            .append(stream, entries, hard_state, durable, completion, false);
        handle
    }

    /// Appends and returns once the op is written to its segment file (`write(2)`, not
    /// `fdatasync`, unless [`LogOptions::sync`] is set or a durable op shares the batch):
    /// a crash of the process then loses nothing, a crash of the machine may. The calling
    /// thread writes the queue's batch itself when the writer thread is idle (no thread
    /// hand-off), so this costs about one `write(2)`: RocksDB's WAL with `sync=false`.
    pub fn append_written(
        &self,
        stream: u64,
        entries: Vec<LogEntry>,
        hard_state: Option<HardState>,
    ) -> Result<()> {
        let (handle, completion) = handle::pair();
        if let Some(q) = self
            .inner
            .append(stream, entries, hard_state, false, completion, true)
        {
            q.write_inline(&self.inner);
        }
        handle.wait()
    }

    /// Reads the entries with indexes in `range`. Errors if the range starts below the
    /// first index ([`Error::Compacted`]) or ends past the last ([`Error::Unavailable`]).
    pub fn read(&self, stream: u64, range: std::ops::Range<u64>) -> Result<Vec<LogEntry>> {
        self.inner.read(stream, range)
    }

    /// The term of entry `index`, from memory: `Ok(None)` if the stream does not exist or
    /// `index` is past its last entry, [`Error::Compacted`] if below its first.
    pub fn term(&self, stream: u64, index: u64) -> Result<Option<u64>> {
        self.inner.term(stream, index)
    }

    /// First index of the stream (the stream is empty when it exceeds `last_index`).
    pub fn first_index(&self, stream: u64) -> Option<u64> {
        self.inner.bounds(stream).map(|(f, _)| f)
    }

    /// Last index of the stream (`first_index - 1` when empty).
    pub fn last_index(&self, stream: u64) -> Option<u64> {
        self.inner.bounds(stream).map(|(_, l)| l)
    }

    /// The stream's last saved hard state.
    pub fn hard_state(&self, stream: u64) -> Option<HardState> {
        self.inner.hard_state(stream)
    }

    /// Drops the entries below `upto`, durably (returns once the truncation is
    /// acknowledged). If `upto` is past the last index, the stream becomes empty with first
    /// index `upto` (raft snapshot install).
    pub fn truncate_prefix(&self, stream: u64, upto: u64) -> Result<()> {
        self.inner.truncate_prefix(stream, upto)
    }

    /// Drops the entries at `from` and above, durably.
    pub fn truncate_suffix(&self, stream: u64, from: u64) -> Result<()> {
        self.inner.truncate_suffix(stream, from)
    }

    /// Removes the stream with all its entries and its hard state, durably.
    pub fn remove_stream(&self, stream: u64) -> Result<()> {
        self.inner.remove_stream(stream)
    }

    /// The ids of the live streams, sorted.
    pub fn streams(&self) -> Vec<u64> {
        self.inner.stream_ids()
    }

    /// The queue a stream is assigned to.
    pub fn queue_of(&self, stream: u64) -> Option<usize> {
        self.inner.queue_of(stream)
    }

    /// Changes the number of queues while running. Streams are moved so that queues stay
    /// balanced; a moved stream's next ops go to its new queue only after everything it
    /// had in flight on the old one is durable, so no stream is ever reordered.
    pub fn set_queue_count(&self, n: usize) -> Result<()> {
        self.inner.set_queue_count(n)
    }

    /// Runs one round of space reclamation now: deletes or recycles segments nothing needs,
    /// and rewrites cold streams forward if the live ratio is under the threshold.
    pub fn gc(&self) -> Result<()> {
        gc::run(&self.inner)
    }

    /// Makes every acknowledged op durable (useful after non-durable appends).
    pub fn sync(&self) -> Result<()> {
        self.inner.sync_all_queues()
    }

    /// Current figures.
    pub fn stats(&self) -> LogStats {
        self.inner.stats()
    }

    /// The write or sync failure that stopped the store, if one did: it refuses every
    /// write from then on, and only reopening it (from what reached the disk) clears it.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    /// Where the store's failure left bytes written but never synced: for each segment
    /// being written when a write or sync failed, the offset its last successful sync
    /// reached. Empty while the store has not failed. Hand them to
    /// [`LogStore::open_cutting`] when reopening in this process: a plain reopen would
    /// read those bytes back from the page cache and take them as durable.
    pub fn unsynced_tails(&self) -> Vec<UnsyncedTail> {
        self.inner.unsynced_tails()
    }

    /// Flushes, syncs and stops the store's threads. Later calls fail with
    /// [`Error::Closed`]. Also done on drop (errors are then only logged).
    pub fn close(&self) -> Result<()> {
        self.inner.close()
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        if let Err(e) = self.inner.close() {
            tracing::warn!(dir = %self.inner.dir.display(), "closing log store: {e}");
        }
    }
}
