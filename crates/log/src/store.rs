//! The store: streams and their in-memory index, queue assignment, and the operations of
//! the public API.
//!
//! Per stream, memory holds the index `entry index -> (segment, offset, length, crc, term)`
//! and the data of the newest entries (a small cache); older entries are read back from the
//! segments. Each stream also remembers the segment of its latest op and of its latest hard
//! state: those ops are *pinned* (recovery needs them, see `gc`).
//!
//! Locking order: stream map → stream → queue list → queue → segment registry. A stream's
//! lock is held while its op is serialised into its queue, which orders the ops of a
//! stream; `opseq` is drawn under that lock too, so it follows the same order.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use phoenix_storage::{FileLock, SharedFs, WritableFile, WriteOptions, DIRECT_IO_ALIGN};

use crate::error::{Error, Result};
use crate::format::{self, OpHead, OpKind, ENTRY_HEADER_LEN, HEADER_LEN};
use crate::handle::{self, Completion};
use crate::queue::{OpAccounting, Queue};
use crate::segment::{free_path, FreeFile, Release, Segment};
use crate::{gc, recovery, HardState, LogEntry, LogOptions, LogStats};

/// Most queues a store runs.
pub const QUEUES_MAX: usize = 256;
const QUEUES_FILE: &str = "QUEUES";
const QUEUES_MAGIC: &[u8; 8] = b"PHXLOGQ1";

/// One entry in a stream's index.
#[derive(Clone, Debug)]
pub(crate) struct EntryMeta {
    pub term: u64,
    pub seg: Arc<Segment>,
    /// File offset of the data.
    pub off: u64,
    pub len: u32,
    pub crc: u32,
    /// The data, while the entry is among the newest of its stream (or not yet written).
    pub cached: Option<Bytes>,
}

impl EntryMeta {
    /// Bytes this entry keeps live in its segment.
    pub fn live_size(&self) -> u64 {
        ENTRY_HEADER_LEN as u64 + u64::from(self.len)
    }

    fn written(&self) -> bool {
        self.seg.written.load(Ordering::Acquire) >= self.off + u64::from(self.len)
    }
}

/// The last op a stream put into a queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    pub queue_id: u32,
    pub queue_uid: u64,
    pub gen: u64,
}

/// A stream's state.
#[derive(Debug)]
pub(crate) struct StreamState {
    pub id: u64,
    pub queue: u32,
    pub first: u64,
    /// `first - 1` when the stream is empty.
    pub last: u64,
    /// Entry `first + i` is `entries[i]`.
    pub entries: VecDeque<EntryMeta>,
    pub hs: Option<HardState>,
    pub hs_seg: Option<Arc<Segment>>,
    pub latest_seg: Option<Arc<Segment>>,
    /// Segments holding any op of this stream (live or dead), oldest first, deduplicated
    /// against the previous element.
    pub rec_segs: Vec<Arc<Segment>>,
    pub ticket: Option<Ticket>,
    pub cached_bytes: usize,
    /// Entries below this index hold no cached data.
    pub cache_from: u64,
    /// Removed: a tombstone kept until no older op of the stream is left on disk.
    pub removed: bool,
}

impl StreamState {
    pub(crate) fn new(id: u64, queue: u32) -> StreamState {
        StreamState {
            id,
            queue,
            first: 1,
            last: 0,
            entries: VecDeque::new(),
            hs: None,
            hs_seg: None,
            latest_seg: None,
            rec_segs: Vec::new(),
            ticket: None,
            cached_bytes: 0,
            cache_from: 1,
            removed: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.last < self.first
    }

    fn meta(&self, index: u64) -> Option<&EntryMeta> {
        if index < self.first || index > self.last {
            return None;
        }
        self.entries.get((index - self.first) as usize)
    }

    /// Pops entries from the back while their index is `>= from`, adding releases.
    fn pop_back_from(&mut self, from: u64, releases: &mut Vec<Release>) {
        while self.last >= from && self.last >= self.first {
            let Some(m) = self.entries.pop_back() else {
                break;
            };
            self.forget(&m, releases);
            self.last -= 1;
        }
        self.cache_from = self.cache_from.min(self.last + 1).max(self.first);
    }

    /// Pops entries from the front while their index is `< upto`, adding releases.
    fn pop_front_below(&mut self, upto: u64, releases: &mut Vec<Release>) {
        while self.first < upto && self.first <= self.last {
            let Some(m) = self.entries.pop_front() else {
                break;
            };
            self.forget(&m, releases);
            self.first += 1;
        }
        self.cache_from = self.cache_from.max(self.first);
    }

    fn forget(&mut self, m: &EntryMeta, releases: &mut Vec<Release>) {
        if let Some(d) = &m.cached {
            self.cached_bytes -= d.len();
        }
        push_release(releases, &m.seg, m.live_size(), 0);
    }

    /// Drops cached data of the oldest cached entries beyond the budget; an entry whose
    /// bytes are not yet written stays cached (it is the only copy).
    fn evict(&mut self, budget: usize) {
        while self.cached_bytes > budget && self.cache_from <= self.last {
            let i = (self.cache_from - self.first) as usize;
            let Some(m) = self.entries.get_mut(i) else {
                break;
            };
            if m.cached.is_some() {
                if !m.written() {
                    break;
                }
                if let Some(d) = m.cached.take() {
                    self.cached_bytes -= d.len();
                }
            }
            self.cache_from += 1;
        }
    }

    fn note_segment(&mut self, seg: &Arc<Segment>) {
        if self.rec_segs.last().is_some_and(|s| Arc::ptr_eq(s, seg)) {
            return;
        }
        self.rec_segs.retain(|s| !s.deleted.load(Ordering::Acquire));
        self.rec_segs.push(seg.clone());
    }
}

/// Adds a release, merging with the previous one on the same segment.
pub(crate) fn push_release(releases: &mut Vec<Release>, seg: &Arc<Segment>, live: u64, pins: i64) {
    if let Some(r) = releases.last_mut() {
        if Arc::ptr_eq(&r.seg, seg) {
            r.live += live;
            r.pins += pins;
            return;
        }
    }
    releases.push(Release {
        seg: seg.clone(),
        live,
        pins,
    });
}

/// Counters for [`LogStats`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub appends: AtomicU64,
    pub writes: AtomicU64,
    pub syncs: AtomicU64,
    pub bytes_written: AtomicU64,
    pub rewrites: AtomicU64,
    pub segments_reclaimed: AtomicU64,
}

/// The maintenance thread's wake-up flag.
#[derive(Default)]
struct Kick {
    pending: bool,
    stop: bool,
}

/// The store's shared state.
pub(crate) struct Inner {
    me: Weak<Inner>,
    pub fs: SharedFs,
    pub dir: PathBuf,
    pub opts: LogOptions,
    pub streams: RwLock<HashMap<u64, Arc<Mutex<StreamState>>>>,
    pub queues: RwLock<Vec<Arc<Queue>>>,
    active_queues: AtomicUsize,
    queue_uid: AtomicU64,
    /// Segments with records, by sequence number.
    pub segments: Mutex<std::collections::BTreeMap<u64, Arc<Segment>>>,
    pub next_seq: AtomicU64,
    pub next_opseq: AtomicU64,
    pub free: Mutex<Vec<FreeFile>>,
    pub stats: Stats,
    poisoned: Mutex<Option<Error>>,
    poisoned_flag: AtomicBool,
    /// Per segment written when a write or sync failed: the offset from which its bytes
    /// were never synced ([`crate::UnsyncedTail`]).
    unsynced: Mutex<std::collections::BTreeMap<u64, u64>>,
    closed: AtomicBool,
    resize_lock: Mutex<()>,
    pub gc_lock: Mutex<()>,
    kick: Mutex<Kick>,
    kick_cv: Condvar,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    _lock: Mutex<Option<Box<dyn FileLock>>>,
}

impl Inner {
    pub(crate) fn open(
        fs: SharedFs,
        dir: &Path,
        opts: LogOptions,
        cut: &[crate::UnsyncedTail],
    ) -> Result<Arc<Inner>> {
        if opts.queues == 0 || opts.queues > QUEUES_MAX {
            return Err(Error::InvalidArgument(format!(
                "queues must be in 1..={QUEUES_MAX}, got {}",
                opts.queues
            )));
        }
        let min_seg = HEADER_LEN * 2;
        if opts.segment_size < min_seg || opts.segment_size > u64::from(format::FRAME_LEN_MAX) {
            return Err(Error::InvalidArgument(format!(
                "segment_size must be in {min_seg}..={}, got {}",
                format::FRAME_LEN_MAX,
                opts.segment_size
            )));
        }
        if opts.direct_io && !opts.segment_size.is_multiple_of(DIRECT_IO_ALIGN as u64) {
            return Err(Error::InvalidArgument(
                "with direct_io, segment_size must be a multiple of 4096".into(),
            ));
        }
        if !(0.0..1.0).contains(&opts.gc_live_ratio) {
            return Err(Error::InvalidArgument(format!(
                "gc_live_ratio must be in [0, 1), got {}",
                opts.gc_live_ratio
            )));
        }
        fs.create_dir_all(dir)?;
        let lock = fs.lock(&dir.join("LOCK"))?;
        let queues_path = dir.join(QUEUES_FILE);
        let n = if fs.exists(&queues_path)? {
            decode_queues_file(&queues_path, &fs.read_all(&queues_path)?)?
        } else {
            fs.write_atomic(&queues_path, &encode_queues_file(opts.queues))?;
            opts.queues
        };
        let rec = recovery::recover(&fs, dir, n, cut)?;
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            fs,
            dir: dir.to_path_buf(),
            opts,
            streams: RwLock::new(
                rec.streams
                    .into_iter()
                    .map(|(id, s)| (id, Arc::new(Mutex::new(s))))
                    .collect(),
            ),
            queues: RwLock::new(Vec::new()),
            active_queues: AtomicUsize::new(n),
            queue_uid: AtomicU64::new(1),
            segments: Mutex::new(rec.segments),
            next_seq: AtomicU64::new(rec.max_seq + 1),
            next_opseq: AtomicU64::new(rec.max_opseq + 1),
            free: Mutex::new(rec.free),
            stats: Stats::default(),
            poisoned: Mutex::new(None),
            poisoned_flag: AtomicBool::new(false),
            unsynced: Mutex::new(std::collections::BTreeMap::new()),
            closed: AtomicBool::new(false),
            resize_lock: Mutex::new(()),
            gc_lock: Mutex::new(()),
            kick: Mutex::new(Kick::default()),
            kick_cv: Condvar::new(),
            maintenance: Mutex::new(None),
            _lock: Mutex::new(Some(lock)),
        });
        {
            let mut qs = inner.queues.write();
            for id in 0..n {
                qs.push(Queue::start(&inner, id as u32, inner.new_queue_uid())?);
            }
        }
        if inner.opts.background_maintenance {
            let weak = Arc::downgrade(&inner);
            let t = std::thread::Builder::new()
                .name("phoenix-log-maint".into())
                .spawn(move || maintenance_loop(weak))
                .map_err(|e| {
                    Error::InvalidArgument(format!("cannot start maintenance thread: {e}"))
                })?;
            *inner.maintenance.lock() = Some(t);
            inner.kick_maintenance();
        }
        Ok(inner)
    }

    fn arc(&self) -> Result<Arc<Inner>> {
        self.me.upgrade().ok_or(Error::Closed)
    }

    pub(crate) fn new_queue_uid(&self) -> u64 {
        self.queue_uid.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.poisoned_flag.load(Ordering::Acquire) {
            let p = self.poisoned.lock();
            if let Some(e) = p.as_ref() {
                return Err(Error::Poisoned(e.to_string()));
            }
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// See [`crate::LogStore::failure`].
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.poisoned_flag.load(Ordering::Acquire) {
            return None;
        }
        self.poisoned.lock().as_ref().map(|e| e.to_string())
    }

    /// Records that segment `seq`'s bytes from `offset` on were written but not synced when
    /// a write or sync of them failed.
    pub(crate) fn note_unsynced(&self, seq: u64, offset: u64) {
        let mut u = self.unsynced.lock();
        let at = u.entry(seq).or_insert(offset);
        *at = (*at).min(offset);
    }

    pub(crate) fn unsynced_tails(&self) -> Vec<crate::UnsyncedTail> {
        self.unsynced
            .lock()
            .iter()
            .map(|(&segment, &offset)| crate::UnsyncedTail { segment, offset })
            .collect()
    }

    /// Records the first write/sync failure; the store refuses work from now on.
    pub(crate) fn poison(&self, e: &Error) {
        let mut p = self.poisoned.lock();
        if p.is_none() {
            tracing::error!(dir = %self.dir.display(), "log store failed: {e}");
            *p = Some(e.clone());
            self.poisoned_flag.store(true, Ordering::Release);
        }
    }

    pub(crate) fn kick_maintenance(&self) {
        let mut k = self.kick.lock();
        k.pending = true;
        self.kick_cv.notify_one();
    }

    fn write_options(&self) -> WriteOptions {
        WriteOptions {
            direct_io: self.opts.direct_io,
        }
    }

    /// Turns a free file (or a new one) into segment `seg` and returns it open for frames
    /// at `HEADER_LEN`. Runs on the queue's writer thread.
    pub(crate) fn activate_segment(
        &self,
        seg: &Segment,
        queue: u32,
    ) -> Result<Box<dyn WritableFile>> {
        let free = self.free.lock().pop();
        let (path, prev_seq, mut f) = match free {
            Some(ff) => {
                let f = self.fs.reopen(&ff.path, 0, self.write_options())?;
                (ff.path, ff.prev_seq, f)
            }
            None => {
                // Nothing prepared: fallocate now (slower syncs until recycled) and let the
                // maintenance thread prepare zero-filled files for the next rolls.
                let id = self.next_seq.fetch_add(1, Ordering::AcqRel);
                let path = free_path(&self.dir, id);
                let mut f = self.fs.create(&path, self.write_options())?;
                f.preallocate(self.opts.segment_size)?;
                (path, 0, f)
            }
        };
        self.kick_maintenance();
        let header = format::SegmentHeader {
            queue,
            seq: seg.seq,
            prev_seq,
            opseq_base: self.next_opseq.load(Ordering::Acquire),
        };
        let mut block = vec![0u8; HEADER_LEN as usize + DIRECT_IO_ALIGN];
        let shift = block.as_ptr().align_offset(DIRECT_IO_ALIGN);
        let slot = &mut block[shift..shift + HEADER_LEN as usize];
        slot[..format::HEADER_USED].copy_from_slice(&header.encode());
        f.append(slot)?;
        f.sync_data()?;
        self.fs.rename(&path, &seg.path)?;
        self.fs.sync_dir(&self.dir)?;
        Ok(f)
    }

    /// Creates one zero-filled free file (maintenance thread).
    fn prepare_free_file(&self) -> Result<()> {
        let id = self.next_seq.fetch_add(1, Ordering::AcqRel);
        let path = free_path(&self.dir, id);
        let mut f = self.fs.create(&path, WriteOptions::default())?;
        if self.opts.zero_fill_segments {
            let chunk = vec![0u8; 1 << 20];
            let mut left = self.opts.segment_size;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                f.append(&chunk[..n])?;
                left -= n as u64;
            }
            f.sync_all()?;
        } else {
            f.preallocate(self.opts.segment_size)?;
        }
        self.free.lock().push(FreeFile { path, prev_seq: 0 });
        Ok(())
    }

    fn free_target(&self) -> usize {
        self.active_queues.load(Ordering::Acquire)
    }

    pub(crate) fn free_cap(&self) -> usize {
        self.active_queues.load(Ordering::Acquire) * self.opts.recycle_per_queue.max(2)
    }

    fn queue_by_id(&self, id: u32) -> Option<Arc<Queue>> {
        self.queues.read().get(id as usize).cloned()
    }

    /// The stream, created (or revived from a tombstone) for writing.
    fn stream_for_write(&self, id: u64) -> Arc<Mutex<StreamState>> {
        if let Some(s) = self.streams.read().get(&id) {
            return s.clone();
        }
        let mut map = self.streams.write();
        let n = self.active_queues.load(Ordering::Acquire) as u64;
        map.entry(id)
            .or_insert_with(|| Arc::new(Mutex::new(StreamState::new(id, (id % n) as u32))))
            .clone()
    }

    fn stream(&self, id: u64) -> Option<Arc<Mutex<StreamState>>> {
        self.streams.read().get(&id).cloned()
    }

    /// Serialises one op of stream `st` into its queue. On failure the store is dead
    /// (closed or poisoned), so the in-memory state is not rolled back.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        st: &mut StreamState,
        kind: OpKind,
        base: u64,
        entries: Vec<(u64, Bytes, u32)>,
        hs: Option<HardState>,
        first: u64,
        last: u64,
        mut releases: Vec<Release>,
        completion: Completion,
        durable: bool,
        wake_writer: bool,
    ) -> Option<Arc<Queue>> {
        let q = match self.queue_by_id(st.queue) {
            Some(q) => q,
            None => {
                completion.complete(Err(Error::InvalidArgument(format!(
                    "stream {} assigned to missing queue {}",
                    st.id, st.queue
                ))));
                return None;
            }
        };
        // A stream that changed queue: its ops on the old queue must be durable before
        // any op on the new one is written, or a crash could keep the later op alone.
        if let Some(t) = st.ticket {
            if t.queue_id != q.id || t.queue_uid != q.uid {
                if let Some(old) = self.queue_by_id(t.queue_id) {
                    if old.uid == t.queue_uid {
                        if let Err(e) = old.wait_synced(t.gen) {
                            completion.complete(Err(e));
                            return None;
                        }
                    }
                }
                // A queue no longer in the list was drained and synced when it stopped.
            }
        }
        let opseq = self.next_opseq.fetch_add(1, Ordering::AcqRel);
        // The op that establishes the stream's hard state (or its absence after a removal)
        // is pinned, so that a deleted segment cannot bring an older hard state back.
        let clears_hs =
            hs.is_none() && (kind == OpKind::Remove || (st.hs.is_none() && st.hs_seg.is_some()));
        let sets_hs = hs.is_some() || clears_hs;
        let head = OpHead {
            kind,
            stream: st.id,
            opseq,
            first,
            last,
            hard_state: hs,
            clears_hard_state: clears_hs,
        };
        let append = kind == OpKind::Append;
        let size = format::op_size(hs.is_some(), entries.iter().map(|e| e.1.len()), append);
        if let Some(old) = st.latest_seg.take() {
            push_release(&mut releases, &old, 0, 1);
        }
        if sets_hs {
            if let Some(old) = st.hs_seg.take() {
                push_release(&mut releases, &old, 0, 1);
            }
        }
        let live: u64 = entries
            .iter()
            .map(|e| ENTRY_HEADER_LEN as u64 + e.1.len() as u64)
            .sum();
        let pins = 1 + i64::from(sets_hs);
        let placed = q.enqueue(
            self,
            size,
            |buf, pos| {
                format::encode_op(
                    buf,
                    &head,
                    base,
                    entries.iter().map(|(t, d, c)| (*t, &d[..], *c)),
                    pos,
                )
            },
            OpAccounting { live, pins },
            releases,
            completion,
            durable,
            wake_writer,
        );
        let placed = match placed {
            Ok(p) => p,
            Err((e, completion)) => {
                completion.complete(Err(e));
                return None;
            }
        };
        self.stats.appends.fetch_add(1, Ordering::Relaxed);
        st.latest_seg = Some(placed.seg.clone());
        if sets_hs {
            st.hs = hs;
            st.hs_seg = Some(placed.seg.clone());
        }
        st.note_segment(&placed.seg);
        debug_assert_eq!(placed.data_offs.len(), entries.len());
        for ((term, data, crc), off) in entries.into_iter().zip(placed.data_offs) {
            st.cached_bytes += data.len();
            st.entries.push_back(EntryMeta {
                term,
                seg: placed.seg.clone(),
                off,
                len: data.len() as u32,
                crc,
                cached: Some(data),
            });
        }
        st.first = first;
        st.last = last;
        st.cache_from = st.cache_from.max(first);
        debug_assert_eq!(
            st.entries.len() as u64,
            st.last + 1 - st.first,
            "stream {} index out of step",
            st.id
        );
        st.ticket = Some(Ticket {
            queue_id: q.id,
            queue_uid: q.uid,
            gen: placed.gen,
        });
        st.evict(self.opts.cache_bytes_per_stream);
        Some(q)
    }

    /// Enqueues an append; returns the queue it went to. With `inline` the writer thread
    /// is not woken: the caller writes the batch itself ([`Queue::write_inline`]).
    pub(crate) fn append(
        &self,
        stream: u64,
        entries: Vec<LogEntry>,
        hs: Option<HardState>,
        durable: bool,
        completion: Completion,
        inline: bool,
    ) -> Option<Arc<Queue>> {
        if let Err(e) = self.check_open() {
            completion.complete(Err(e));
            return None;
        }
        if let Err(e) = check_entries(&entries) {
            completion.complete(Err(e));
            return None;
        }
        if entries.is_empty() && hs.is_none() {
            completion.complete(Ok(()));
            return None;
        }
        let first_index = entries.first().map_or(0, |e| e.index);
        // Checksums outside every lock.
        let prepared: Vec<(u64, Bytes, u32)> = entries
            .into_iter()
            .map(|e| {
                let crc = crc32c::crc32c(&e.data);
                (e.term, e.data, crc)
            })
            .collect();
        let handle = self.stream_for_write(stream);
        let mut st = handle.lock();
        if st.removed {
            revive(&mut st, self.active_queues.load(Ordering::Acquire));
        }
        let mut releases = Vec::new();
        let (base, first, last) = match prepared.len() {
            0 => (st.last + 1, st.first, st.last),
            n => {
                let b = first_index;
                let Some(new_last) = b.checked_add(n as u64 - 1) else {
                    drop(st);
                    completion.complete(Err(Error::InvalidArgument("entry index overflow".into())));
                    return None;
                };
                if b < st.first {
                    let e = Error::Compacted {
                        stream,
                        index: b,
                        first: st.first,
                    };
                    drop(st);
                    completion.complete(Err(e));
                    return None;
                }
                if st.is_empty() {
                    // An empty stream may restart at any index at or above its first.
                    (b, b, new_last)
                } else if b > st.last + 1 {
                    let e = Error::Gap {
                        stream,
                        index: b,
                        last: st.last,
                    };
                    drop(st);
                    completion.complete(Err(e));
                    return None;
                } else {
                    st.pop_back_from(b, &mut releases);
                    (b, st.first, new_last)
                }
            }
        };
        self.submit(
            &mut st,
            OpKind::Append,
            base,
            prepared,
            hs,
            first,
            last,
            releases,
            completion,
            durable,
            !inline,
        )
    }

    /// Submits a non-append op and waits for it.
    fn submit_and_wait(
        &self,
        st: parking_lot::MutexGuard<'_, StreamState>,
        kind: OpKind,
        first: u64,
        last: u64,
        releases: Vec<Release>,
    ) -> Result<()> {
        let mut st = st;
        let (h, completion) = handle::pair();
        self.submit(
            &mut st,
            kind,
            0,
            Vec::new(),
            None,
            first,
            last,
            releases,
            completion,
            self.opts.sync,
            true,
        );
        drop(st);
        h.wait()
    }

    pub(crate) fn truncate_prefix(&self, stream: u64, upto: u64) -> Result<()> {
        self.check_open()?;
        let Some(handle) = self.stream(stream) else {
            return Ok(());
        };
        let mut st = handle.lock();
        if st.removed || upto <= st.first {
            return Ok(());
        }
        let mut releases = Vec::new();
        st.pop_front_below(upto, &mut releases);
        let first = upto;
        let last = st.last.max(upto - 1);
        if st.is_empty() {
            st.first = first;
            st.last = last;
            st.cache_from = first;
        }
        self.submit_and_wait(st, OpKind::TruncatePrefix, first, last, releases)
    }

    pub(crate) fn truncate_suffix(&self, stream: u64, from: u64) -> Result<()> {
        self.check_open()?;
        let Some(handle) = self.stream(stream) else {
            return Ok(());
        };
        let mut st = handle.lock();
        if st.removed || from > st.last {
            return Ok(());
        }
        let from = from.max(st.first);
        let mut releases = Vec::new();
        st.pop_back_from(from, &mut releases);
        let (first, last) = (st.first, st.last);
        self.submit_and_wait(st, OpKind::TruncateSuffix, first, last, releases)
    }

    pub(crate) fn remove_stream(&self, stream: u64) -> Result<()> {
        self.check_open()?;
        let Some(handle) = self.stream(stream) else {
            return Ok(());
        };
        let mut st = handle.lock();
        if st.removed {
            return Ok(());
        }
        let mut releases = Vec::new();
        let first = st.first;
        st.pop_back_from(first, &mut releases);
        st.hs = None;
        st.removed = true;
        let first = st.first;
        self.submit_and_wait(st, OpKind::Remove, first, first - 1, releases)
    }

    /// Rewrites a stream's live entries and hard state into its queue's newest segment so
    /// that its older segments can go (seed 003's snapshot). Returns the handle of the op,
    /// or `None` if there was nothing to do.
    pub(crate) fn rewrite_stream(&self, stream: u64) -> Result<Option<crate::AppendHandle>> {
        self.check_open()?;
        let Some(handle) = self.stream(stream) else {
            return Ok(None);
        };
        let mut st = handle.lock();
        if st.removed {
            return Ok(None);
        }
        let (first, last) = (st.first, st.last);
        // Read the live entries under the stream's lock, so no truncation interleaves.
        let metas: Vec<EntryMeta> = st.entries.iter().cloned().collect();
        let data = self.resolve(metas.iter().map(|m| (m.clone(), 0)).collect())?;
        let prepared: Vec<(u64, Bytes, u32)> = metas
            .iter()
            .zip(data)
            .map(|(m, d)| (m.term, d, m.crc))
            .collect();
        let mut releases = Vec::new();
        st.pop_back_from(first, &mut releases);
        st.cache_from = first;
        let hs = st.hs;
        let (h, completion) = handle::pair();
        self.submit(
            &mut st,
            OpKind::Append,
            first,
            prepared,
            hs,
            first,
            last,
            releases,
            completion,
            true,
            true,
        );
        self.stats.rewrites.fetch_add(1, Ordering::Relaxed);
        Ok(Some(h))
    }

    pub(crate) fn read(&self, stream: u64, range: std::ops::Range<u64>) -> Result<Vec<LogEntry>> {
        self.check_open()?;
        if range.start > range.end {
            return Err(Error::InvalidArgument(format!(
                "read range {}..{} is reversed",
                range.start, range.end
            )));
        }
        let Some(handle) = self.stream(stream) else {
            if range.is_empty() {
                return Ok(Vec::new());
            }
            return Err(Error::Unavailable {
                stream,
                index: range.start,
                last: 0,
            });
        };
        let metas: Vec<(EntryMeta, u64)> = {
            let st = handle.lock();
            if st.removed {
                if range.is_empty() {
                    return Ok(Vec::new());
                }
                return Err(Error::Unavailable {
                    stream,
                    index: range.start,
                    last: 0,
                });
            }
            if range.is_empty() {
                return Ok(Vec::new());
            }
            if range.start < st.first {
                return Err(Error::Compacted {
                    stream,
                    index: range.start,
                    first: st.first,
                });
            }
            if range.end > st.last + 1 {
                return Err(Error::Unavailable {
                    stream,
                    index: range.end - 1,
                    last: st.last,
                });
            }
            range
                .clone()
                .filter_map(|i| st.meta(i).map(|m| (m.clone(), i)))
                .collect()
        };
        let terms: Vec<(u64, u64)> = metas.iter().map(|(m, i)| (*i, m.term)).collect();
        let data = self.resolve(metas)?;
        Ok(terms
            .into_iter()
            .zip(data)
            .map(|((index, term), data)| LogEntry { index, term, data })
            .collect())
    }

    /// The data of entries: cached ones directly, others read from their segments, with
    /// neighbouring entries of one segment read in one go.
    fn resolve(&self, metas: Vec<(EntryMeta, u64)>) -> Result<Vec<Bytes>> {
        const GAP_MAX: u64 = 4096;
        let mut out: Vec<Option<Bytes>> = vec![None; metas.len()];
        let mut i = 0;
        while i < metas.len() {
            let m = &metas[i].0;
            if let Some(d) = &m.cached {
                out[i] = Some(d.clone());
                i += 1;
                continue;
            }
            // Extend the span while the next entry is uncached, in the same segment and close.
            let mut j = i + 1;
            let mut end = m.off + u64::from(m.len);
            while j < metas.len() {
                let n = &metas[j].0;
                if n.cached.is_some()
                    || !Arc::ptr_eq(&n.seg, &m.seg)
                    || n.off < end
                    || n.off - end > GAP_MAX
                    || n.off + u64::from(n.len) - m.off > (8 << 20)
                {
                    break;
                }
                end = n.off + u64::from(n.len);
                j += 1;
            }
            let span = m.seg.read_span(&self.fs, m.off, (end - m.off) as usize)?;
            let span = Bytes::from(span);
            for (k, slot) in out.iter_mut().enumerate().take(j).skip(i) {
                let e = &metas[k].0;
                let lo = (e.off - m.off) as usize;
                let d = span.slice(lo..lo + e.len as usize);
                e.seg.verify(e.off, &d, e.crc)?;
                *slot = Some(d);
            }
            i = j;
        }
        out.into_iter()
            .enumerate()
            .map(|(k, d)| {
                d.ok_or_else(|| {
                    Error::InvalidArgument(format!("entry {k} of a read was not resolved"))
                })
            })
            .collect()
    }

    pub(crate) fn term(&self, stream: u64, index: u64) -> Result<Option<u64>> {
        self.check_open()?;
        let Some(handle) = self.stream(stream) else {
            return Ok(None);
        };
        let st = handle.lock();
        if st.removed || index > st.last {
            return Ok(None);
        }
        if index < st.first {
            return Err(Error::Compacted {
                stream,
                index,
                first: st.first,
            });
        }
        Ok(st.meta(index).map(|m| m.term))
    }

    pub(crate) fn bounds(&self, stream: u64) -> Option<(u64, u64)> {
        let handle = self.stream(stream)?;
        let st = handle.lock();
        if st.removed {
            return None;
        }
        Some((st.first, st.last))
    }

    pub(crate) fn hard_state(&self, stream: u64) -> Option<HardState> {
        let handle = self.stream(stream)?;
        let st = handle.lock();
        if st.removed {
            return None;
        }
        st.hs
    }

    pub(crate) fn stream_ids(&self) -> Vec<u64> {
        let handles: Vec<(u64, Arc<Mutex<StreamState>>)> = self
            .streams
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut ids: Vec<u64> = handles
            .into_iter()
            .filter(|(_, h)| !h.lock().removed)
            .map(|(k, _)| k)
            .collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn queue_of(&self, stream: u64) -> Option<usize> {
        let handle = self.stream(stream)?;
        let st = handle.lock();
        if st.removed {
            return None;
        }
        Some(st.queue as usize)
    }

    pub(crate) fn set_queue_count(&self, n: usize) -> Result<()> {
        if n == 0 || n > QUEUES_MAX {
            return Err(Error::InvalidArgument(format!(
                "queue count must be in 1..={QUEUES_MAX}, got {n}"
            )));
        }
        let _g = self.resize_lock.lock();
        self.check_open()?;
        let me = self.arc()?;
        let old_n = self.active_queues.load(Ordering::Acquire);
        if n == old_n {
            return Ok(());
        }
        {
            let mut qs = self.queues.write();
            while qs.len() < n {
                let id = qs.len() as u32;
                qs.push(Queue::start(&me, id, self.new_queue_uid())?);
            }
        }
        // New streams go to the new set from here on; the snapshot below holds every
        // stream created before.
        let handles: Vec<Arc<Mutex<StreamState>>> = {
            let map = self.streams.write();
            self.active_queues.store(n, Ordering::Release);
            map.values().cloned().collect()
        };
        for h in handles {
            let mut st = h.lock();
            let target = (st.id % n as u64) as u32;
            if st.removed {
                st.queue = target;
                continue;
            }
            if st.queue == target {
                continue;
            }
            st.queue = target;
            let (first, last) = (st.first, st.last);
            let (wh, completion) = handle::pair();
            // `submit` waits for the stream's ops on its old queue to be durable first.
            self.submit(
                &mut st,
                OpKind::Assign,
                0,
                Vec::new(),
                None,
                first,
                last,
                Vec::new(),
                completion,
                true,
                true,
            );
            // One at a time: a resize is rare, and it keeps the file operations of a
            // seeded test in a reproducible order.
            wh.wait()?;
        }
        if n < old_n {
            let removed: Vec<Arc<Queue>> = self.queues.write().drain(n..).collect();
            for q in removed {
                q.stop();
            }
        }
        self.fs
            .write_atomic(&self.dir.join(QUEUES_FILE), &encode_queues_file(n))?;
        self.kick_maintenance();
        Ok(())
    }

    pub(crate) fn sync_all_queues(&self) -> Result<()> {
        self.check_open()?;
        let qs: Vec<Arc<Queue>> = self.queues.read().clone();
        for q in qs {
            q.sync_now()?;
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> LogStats {
        let (segments, total_bytes, live_bytes) = {
            let segs = self.segments.lock();
            let mut total = 0u64;
            let mut live = 0u64;
            for s in segs.values() {
                total += s.written.load(Ordering::Acquire).saturating_sub(HEADER_LEN);
                live += s.live.load(Ordering::Acquire);
            }
            (segs.len(), total, live)
        };
        LogStats {
            segments,
            free_segments: self.free.lock().len(),
            total_bytes,
            live_bytes,
            queues: self.active_queues.load(Ordering::Acquire),
            streams: self.stream_ids().len(),
            appends: self.stats.appends.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
            syncs: self.stats.syncs.load(Ordering::Relaxed),
            bytes_written: self.stats.bytes_written.load(Ordering::Relaxed),
            rewrites: self.stats.rewrites.load(Ordering::Relaxed),
            segments_reclaimed: self.stats.segments_reclaimed.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        {
            let mut k = self.kick.lock();
            k.stop = true;
            self.kick_cv.notify_all();
        }
        if let Some(t) = self.maintenance.lock().take() {
            if t.join().is_err() {
                tracing::error!("log maintenance thread panicked");
            }
        }
        let qs: Vec<Arc<Queue>> = self.queues.write().drain(..).collect();
        for q in qs {
            q.stop();
        }
        *self._lock.lock() = None;
        match self.poisoned.lock().as_ref() {
            Some(e) => Err(Error::Poisoned(e.to_string())),
            None => Ok(()),
        }
    }
}

fn revive(st: &mut StreamState, active: usize) {
    st.removed = false;
    st.first = 1;
    st.last = 0;
    st.queue = (st.id % active as u64) as u32;
}

/// Entries must have consecutive indexes, starting at 1 or above.
fn check_entries(entries: &[LogEntry]) -> Result<()> {
    if let Some(e) = entries.first() {
        if e.index == 0 {
            return Err(Error::InvalidArgument("entry indexes start at 1".into()));
        }
    }
    for w in entries.windows(2) {
        if w[1].index != w[0].index.wrapping_add(1) {
            return Err(Error::InvalidArgument(format!(
                "entries must have consecutive indexes: {} follows {}",
                w[1].index, w[0].index
            )));
        }
    }
    for e in entries {
        if e.data.len() > (format::FRAME_LEN_MAX / 2) as usize {
            return Err(Error::InvalidArgument(format!(
                "entry {} of {} bytes is too large",
                e.index,
                e.data.len()
            )));
        }
    }
    Ok(())
}

fn encode_queues_file(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(QUEUES_MAGIC);
    b.extend_from_slice(&(n as u32).to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn decode_queues_file(path: &Path, b: &[u8]) -> Result<usize> {
    let bad = |reason: &str| Error::Corruption {
        path: path.to_path_buf(),
        offset: 0,
        reason: reason.to_string(),
    };
    if b.len() != 16 || &b[0..8] != QUEUES_MAGIC {
        return Err(bad("bad QUEUES file"));
    }
    let mut n4 = [0u8; 4];
    n4.copy_from_slice(&b[8..12]);
    let mut c4 = [0u8; 4];
    c4.copy_from_slice(&b[12..16]);
    if crc32c::crc32c(&b[0..12]) != u32::from_le_bytes(c4) {
        return Err(bad("QUEUES checksum mismatch"));
    }
    let n = u32::from_le_bytes(n4) as usize;
    if n == 0 || n > QUEUES_MAX {
        return Err(bad("QUEUES holds an invalid queue count"));
    }
    Ok(n)
}

fn maintenance_loop(inner: Weak<Inner>) {
    loop {
        let Some(me) = inner.upgrade() else {
            return;
        };
        let kicked = {
            let mut k = me.kick.lock();
            if !k.pending && !k.stop {
                me.kick_cv.wait_for(&mut k, Duration::from_millis(500));
            }
            if k.stop {
                return;
            }
            std::mem::take(&mut k.pending)
        };
        // Hysteresis: refill to twice the target only once the pool fell under it, so that
        // the rolls of a burst take prepared files without zero-filling racing them.
        let low = me.free.lock().len() < me.free_target();
        while low && me.free.lock().len() < 2 * me.free_target() && !me.kick.lock().stop {
            if let Err(e) = me.prepare_free_file() {
                tracing::warn!(dir = %me.dir.display(), "preparing a segment file: {e}");
                break;
            }
        }
        // Reclamation after a roll or a resize (a kick), not on every idle wake-up.
        if kicked && me.check_open().is_ok() {
            if let Err(e) = gc::run(&me) {
                tracing::warn!(dir = %me.dir.display(), "log space reclamation: {e}");
            }
        }
    }
}
