//! A queue: one submission buffer, one group-commit writer thread, its own segments.
//!
//! Double buffering (seed 003): callers serialise their ops straight into the *filling*
//! batch under the queue's mutex (so the op's file position is known at once); the writer
//! thread swaps the filling batch for an empty one, then writes the swapped batch with one
//! `append` per segment it touches and makes it durable with one `fdatasync`, while callers
//! fill the other buffer. Every op of a batch is acknowledged together.
//!
//! Invariants:
//! 1. A batch's bytes for one segment form one frame (one checksum), at an offset that is a
//!    multiple of 8 (4096 with direct I/O).
//! 2. Before the first frame goes into a new segment, the previous segment of the queue is
//!    synced: a frame in a newer segment implies every older frame of the queue is
//!    durable, so only the newest segment of a queue can end in a torn frame.
//! 3. Generations: the filling batch has generation `gen`; `written_gen`/`synced_gen` are
//!    the last generation written/synced. Releases of a batch are applied once it is
//!    synced (never just written), so space accounting only ever trusts durable ops.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use phoenix_storage::{WritableFile, DIRECT_IO_ALIGN};

use crate::error::{Error, Result};
use crate::format::{
    self, align_up, FRAME_ALIGN, FRAME_BATCH, FRAME_HEADER_LEN, FRAME_PAD, HEADER_LEN,
};
use crate::handle::Completion;
use crate::segment::{Release, Segment};
use crate::store::Inner;

/// One segment's part of a batch: a frame.
struct Chunk {
    seg: Arc<Segment>,
    /// File offset of the frame header.
    file_off: u64,
    /// Position of the frame header in the batch buffer.
    start: usize,
    /// End of the frame payload in the buffer (set when the chunk is closed).
    end: usize,
    /// A pad frame after it (buffer position, length incl. header), for direct I/O.
    pad: Option<(usize, usize)>,
    /// End of the bytes to write (after alignment and padding; set on close).
    wend: usize,
}

/// The ops of one group commit.
#[derive(Default)]
pub(crate) struct Batch {
    buf: Vec<u8>,
    chunks: Vec<Chunk>,
    completions: Vec<Completion>,
    releases: Vec<Release>,
    durable: bool,
    ops: u64,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    fn clear(&mut self) {
        // Keep the allocation unless a huge batch grew it.
        if self.buf.capacity() > 64 << 20 {
            self.buf = Vec::new();
        }
        self.buf.clear();
        self.chunks.clear();
        self.completions.clear();
        self.releases.clear();
        self.durable = false;
        self.ops = 0;
    }
}

struct QState {
    fill: Batch,
    spare: Option<Batch>,
    gen: u64,
    written_gen: u64,
    synced_gen: u64,
    /// The segment the filling side appends to, and the next frame offset in it.
    seg: Option<Arc<Segment>>,
    off: u64,
    /// Releases of written but not yet synced batches, by generation.
    pending_releases: Vec<(u64, Vec<Release>)>,
    sync_requested: bool,
    stop: bool,
    failed: Option<Error>,
}

/// A queue; see the module docs.
pub(crate) struct Queue {
    pub id: u32,
    /// Unique across the store's life (ids are reused after a shrink and regrow).
    pub uid: u64,
    state: Mutex<QState>,
    work_cv: Condvar,
    done_cv: Condvar,
    /// The open segment file; whoever holds it writes the next batch (the writer thread,
    /// or an appender writing its own batch inline, see [`Queue::write_inline`]). Lock
    /// order: `writer` before `state`.
    writer: Mutex<Writer>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Where an enqueued op landed.
pub(crate) struct Placed {
    pub gen: u64,
    pub seg: Arc<Segment>,
    /// File offsets of the entries' data.
    pub data_offs: Vec<u64>,
}

/// What an op adds to its segment's accounting as soon as it is placed.
pub(crate) struct OpAccounting {
    pub live: u64,
    pub pins: i64,
}

impl Queue {
    /// Creates a queue and starts its writer thread.
    pub(crate) fn start(inner: &Arc<Inner>, id: u32, uid: u64) -> Result<Arc<Queue>> {
        let q = Arc::new(Queue {
            id,
            uid,
            state: Mutex::new(QState {
                fill: Batch::default(),
                spare: Some(Batch::default()),
                gen: 1,
                written_gen: 0,
                synced_gen: 0,
                seg: None,
                off: 0,
                pending_releases: Vec::new(),
                sync_requested: false,
                stop: false,
                failed: None,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            writer: Mutex::new(Writer {
                cur: None,
                dirty: false,
                synced_to: 0,
            }),
            thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(inner);
        let q2 = q.clone();
        let t = std::thread::Builder::new()
            .name(format!("phoenix-log-q{id}"))
            .spawn(move || writer_loop(weak, q2))
            .map_err(|e| Error::InvalidArgument(format!("cannot start queue thread: {e}")))?;
        *q.thread.lock() = Some(t);
        Ok(q)
    }

    /// Serialises one op into the filling batch. `encode` appends the op's bytes to the
    /// buffer and pushes the buffer positions of its entries' data; `size` is its exact
    /// length. The accounting is added to the op's segment before the writer can see it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue(
        &self,
        inner: &Inner,
        size: usize,
        encode: impl FnOnce(&mut Vec<u8>, &mut Vec<usize>),
        acct: OpAccounting,
        releases: Vec<Release>,
        completion: Completion,
        durable: bool,
        wake_writer: bool,
    ) -> std::result::Result<Placed, (Error, Completion)> {
        let mut guard = self.state.lock();
        loop {
            if let Some(e) = &guard.failed {
                return Err((e.clone(), completion));
            }
            if guard.stop {
                return Err((Error::Closed, completion));
            }
            if guard.fill.buf.len() <= inner.opts.max_batch_bytes {
                break;
            }
            self.done_cv.wait(&mut guard);
        }
        let seg_size = inner.opts.segment_size;
        let st = &mut *guard;
        let open_chunk = match (st.fill.chunks.last(), &st.seg) {
            (Some(c), Some(s)) => c.end == 0 && Arc::ptr_eq(&c.seg, s),
            _ => false,
        };
        let need = size as u64
            + if open_chunk {
                0
            } else {
                FRAME_HEADER_LEN as u64
            };
        let roll = match &st.seg {
            None => true,
            // A segment that holds nothing yet takes any op, however large.
            Some(_) => st.off > HEADER_LEN && st.off + need > seg_size,
        };
        if roll {
            if open_chunk {
                close_chunk(st, inner.opts.direct_io);
            }
            let seq = inner.next_seq.fetch_add(1, Ordering::AcqRel);
            let seg = Arc::new(Segment::new(&inner.dir, seq, self.id, HEADER_LEN));
            inner.segments.lock().insert(seq, seg.clone());
            st.seg = Some(seg);
            st.off = HEADER_LEN;
        }
        let Some(seg) = st.seg.clone() else {
            unreachable!("a segment was just assigned");
        };
        if !open_chunk || roll {
            let start = st.fill.buf.len();
            st.fill.buf.resize(start + FRAME_HEADER_LEN, 0);
            st.fill.chunks.push(Chunk {
                seg: seg.clone(),
                file_off: st.off,
                start,
                end: 0,
                pad: None,
                wend: 0,
            });
            st.off += FRAME_HEADER_LEN as u64;
        }
        let op_start = st.fill.buf.len();
        let mut positions = Vec::new();
        encode(&mut st.fill.buf, &mut positions);
        assert_eq!(
            st.fill.buf.len() - op_start,
            size,
            "op encoded to an unexpected size"
        );
        let op_file_off = st.off;
        st.off += size as u64;
        let data_offs = positions
            .into_iter()
            .map(|p| op_file_off + (p - op_start) as u64)
            .collect();
        seg.live.fetch_add(acct.live, Ordering::AcqRel);
        seg.pins.fetch_add(acct.pins, Ordering::AcqRel);
        st.fill.completions.push(completion);
        st.fill.releases.extend(releases);
        st.fill.durable |= durable;
        st.fill.ops += 1;
        let gen = st.gen;
        drop(guard);
        if wake_writer {
            self.work_cv.notify_one();
        }
        Ok(Placed {
            gen,
            seg,
            data_offs,
        })
    }

    /// Blocks until generation `gen` is synced (asking the writer to sync if it would not).
    pub(crate) fn wait_synced(&self, gen: u64) -> Result<()> {
        let mut st = self.state.lock();
        loop {
            if st.synced_gen >= gen {
                return Ok(());
            }
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            st.sync_requested = true;
            self.work_cv.notify_one();
            self.done_cv.wait(&mut st);
        }
    }

    /// Syncs everything enqueued so far.
    pub(crate) fn sync_now(&self) -> Result<()> {
        let gen = {
            let st = self.state.lock();
            if st.fill.is_empty() {
                st.written_gen
            } else {
                st.gen
            }
        };
        self.wait_synced(gen)
    }

    /// Number of written batches whose releases wait for a sync.
    pub(crate) fn pending_release_count(&self) -> usize {
        self.state.lock().pending_releases.len()
    }

    /// Drains, syncs, seals and stops the writer thread.
    pub(crate) fn stop(&self) {
        {
            let mut st = self.state.lock();
            st.stop = true;
        }
        self.work_cv.notify_all();
        self.done_cv.notify_all();
        if let Some(t) = self.thread.lock().take() {
            if t.join().is_err() {
                tracing::error!(queue = self.id, "queue writer thread panicked");
            }
        }
    }
}

/// Ends the open chunk of the filling batch: aligns the next frame and, with direct I/O,
/// pads to a block boundary with a pad frame.
fn close_chunk(st: &mut QState, direct_io: bool) {
    let Some(c) = st.fill.chunks.last_mut() else {
        return;
    };
    if c.end != 0 {
        return;
    }
    c.end = st.fill.buf.len();
    let aligned = align_up(st.off, FRAME_ALIGN);
    st.fill
        .buf
        .resize(st.fill.buf.len() + (aligned - st.off) as usize, 0);
    st.off = aligned;
    if direct_io {
        let block = DIRECT_IO_ALIGN as u64;
        let mut target = align_up(st.off, block);
        if target != st.off && target - st.off < FRAME_HEADER_LEN as u64 {
            target += block;
        }
        if target != st.off {
            let len = (target - st.off) as usize;
            let at = st.fill.buf.len();
            st.fill.buf.resize(at + len, 0);
            c.pad = Some((at, len));
            st.off = target;
        }
    }
    c.wend = st.fill.buf.len();
}

/// The writer's state: the open segment file.
struct Writer {
    cur: Option<(Arc<Segment>, Box<dyn WritableFile>)>,
    dirty: bool,
    /// The offset in `cur` up to which a sync succeeded: should a later write or sync fail,
    /// the bytes past it may be in the page cache only (a failed `fsync` leaves them
    /// there, marked clean), so a reopen in this process must not trust them.
    synced_to: u64,
}

impl Writer {
    /// Records, on a write or sync failure, where the open segment's doubtful bytes start.
    fn note_failure(&self, inner: &Inner) {
        if let Some((seg, _)) = &self.cur {
            inner.note_unsynced(seg.seq, self.synced_to);
        }
    }
}

/// What the holder of the writer lock found to do.
enum Work {
    /// Write the filling batch (generation `gen`).
    Batch(Batch, u64),
    /// Nothing to write, but a sync was asked for.
    SyncOnly,
    /// Stopping and drained.
    Stop,
    Nothing,
}

/// Takes the filling batch out of the queue (caller holds the writer lock, so batches are
/// written in generation order).
fn take_work(st: &mut QState, direct_io: bool, inline: bool) -> Work {
    if st.fill.is_empty() {
        if inline {
            return Work::Nothing;
        }
        if st.stop {
            st.sync_requested = false;
            return Work::Stop;
        }
        if st.sync_requested {
            st.sync_requested = false;
            return Work::SyncOnly;
        }
        return Work::Nothing;
    }
    if !inline {
        st.sync_requested = false;
    }
    close_chunk(st, direct_io);
    let gen = st.gen;
    st.gen += 1;
    let spare = st.spare.take().unwrap_or_default();
    Work::Batch(std::mem::replace(&mut st.fill, spare), gen)
}

impl Queue {
    /// Writes the filling batch now on the calling thread, if there is one, instead of
    /// handing it to the writer thread (RocksDB's leader-writes group commit): an appender
    /// that waits for its `write(2)` saves two thread hand-offs. If the writer thread is
    /// busy writing, this waits for it and then writes what has accumulated since.
    pub(crate) fn write_inline(&self, inner: &Inner) {
        let mut w = self.writer.lock();
        let work = {
            let mut st = self.state.lock();
            take_work(&mut st, inner.opts.direct_io, true)
        };
        if let Work::Batch(batch, gen) = work {
            self.done_cv.notify_all();
            run_batch(inner, self, &mut w, Some((batch, gen)));
        }
    }
}

fn writer_loop(inner: std::sync::Weak<Inner>, q: Arc<Queue>) {
    let (coalesce, always_sync) = match inner.upgrade() {
        Some(i) => (i.opts.group_commit_wait, i.opts.sync),
        None => return,
    };
    // Ops in the previous batch: in a closed loop, the writers acknowledged by one sync
    // come back within microseconds; waiting briefly for as many keeps them in one batch
    // instead of splitting them over two syncs.
    let mut last_ops = 0u64;
    loop {
        {
            let mut st = q.state.lock();
            loop {
                if !st.fill.is_empty() || st.sync_requested || st.stop {
                    break;
                }
                q.work_cv.wait(&mut st);
            }
            if !coalesce.is_zero()
                && !st.stop
                && !st.sync_requested
                && (always_sync || st.fill.durable)
                && st.fill.ops < last_ops
            {
                let deadline = std::time::Instant::now() + coalesce;
                while st.fill.ops < last_ops && !st.stop && !st.sync_requested {
                    if q.work_cv.wait_until(&mut st, deadline).timed_out() {
                        break;
                    }
                }
            }
            last_ops = st.fill.ops;
        }
        let Some(inner) = inner.upgrade() else {
            let batch = std::mem::take(&mut q.state.lock().fill);
            fail_batch(batch, &Error::Closed);
            return;
        };
        let mut w = q.writer.lock();
        let work = {
            let mut st = q.state.lock();
            take_work(&mut st, inner.opts.direct_io, false)
        };
        match work {
            Work::Nothing => continue,
            Work::Stop => {
                finish(&inner, &q, &mut w);
                return;
            }
            Work::SyncOnly => {
                q.done_cv.notify_all();
                run_batch(&inner, &q, &mut w, None);
            }
            Work::Batch(batch, gen) => {
                q.done_cv.notify_all();
                run_batch(&inner, &q, &mut w, Some((batch, gen)));
            }
        }
    }
}

/// Writes (and syncs, if asked) one taken batch, or only syncs with `None`; then
/// acknowledges its ops. The caller holds the writer lock.
fn run_batch(inner: &Inner, q: &Queue, w: &mut Writer, taken: Option<(Batch, u64)>) {
    let sync_only = taken.is_none();
    let (mut batch, gen) = taken.unwrap_or_default();
    let failed = q.state.lock().failed.clone();
    let result = match failed {
        Some(e) => Err(e),
        None if sync_only => sync_cur(inner, w),
        None => write_batch(inner, q, w, &mut batch),
    };
    if result.is_err() {
        w.note_failure(inner);
    }
    let synced = match &result {
        Ok(s) => *s,
        Err(_) => false,
    };
    let mut releases_now = Vec::new();
    {
        let mut st = q.state.lock();
        match &result {
            Ok(_) => {
                if !sync_only {
                    st.written_gen = gen;
                }
                let releases = std::mem::take(&mut batch.releases);
                if synced {
                    st.synced_gen = st.written_gen;
                    for (_, r) in st.pending_releases.drain(..) {
                        releases_now.extend(r);
                    }
                    releases_now.extend(releases);
                } else if !releases.is_empty() {
                    st.pending_releases.push((gen, releases));
                }
            }
            Err(e) => {
                if st.failed.is_none() {
                    st.failed = Some(e.clone());
                }
            }
        }
    }
    for r in releases_now {
        r.apply();
    }
    q.done_cv.notify_all();
    let outcome = match &result {
        Ok(_) => Ok(()),
        Err(e) => {
            inner.poison(e);
            Err(e.clone())
        }
    };
    for c in batch.completions.drain(..) {
        c.complete(outcome.clone());
    }
    if !sync_only {
        batch.clear();
        q.state.lock().spare = Some(batch);
    }
}

fn fail_batch(mut batch: Batch, e: &Error) {
    for c in batch.completions.drain(..) {
        c.complete(Err(e.clone()));
    }
}

/// Syncs the open segment if it has unsynced bytes. Returns whether everything written is
/// now synced (always true on success).
fn sync_cur(inner: &Inner, w: &mut Writer) -> Result<bool> {
    if w.dirty {
        if let Some((_, f)) = w.cur.as_mut() {
            f.sync_data()?;
            w.synced_to = f.position();
            inner.stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        w.dirty = false;
    }
    Ok(true)
}

/// Writes a batch; returns whether it was synced.
fn write_batch(inner: &Inner, q: &Queue, w: &mut Writer, batch: &mut Batch) -> Result<bool> {
    let n = batch.chunks.len();
    for i in 0..n {
        let (seg, file_off, start, end, pad, wend) = {
            let c = &batch.chunks[i];
            (c.seg.clone(), c.file_off, c.start, c.end, c.pad, c.wend)
        };
        let switch = match &w.cur {
            Some((s, _)) => !Arc::ptr_eq(s, &seg),
            None => true,
        };
        if switch {
            // Invariant 2: the old segment is sealed and durable before the new one gets a
            // frame.
            write_seal(inner, w)?;
            sync_cur(inner, w)?;
            if let Some((old, _)) = w.cur.take() {
                old.sealed.store(true, Ordering::Release);
                inner.kick_maintenance();
            }
            let f = inner.activate_segment(&seg, q.id)?;
            // (Its header is synced.)
            w.synced_to = f.position();
            w.cur = Some((seg.clone(), f));
        }
        let Some((_, f)) = w.cur.as_mut() else {
            unreachable!("a segment file was just opened");
        };
        if f.position() != file_off {
            return Err(Error::Corruption {
                path: seg.path.clone(),
                offset: file_off,
                reason: format!(
                    "writer at offset {} but frame placed at {file_off}",
                    f.position()
                ),
            });
        }
        {
            let (hdr, rest) = batch.buf[start..end].split_at_mut(FRAME_HEADER_LEN);
            format::seal_frame(seg.seq, FRAME_BATCH, hdr, rest);
        }
        if let Some((at, len)) = pad {
            let (hdr, rest) = batch.buf[at..at + len].split_at_mut(FRAME_HEADER_LEN);
            format::seal_frame(seg.seq, FRAME_PAD, hdr, rest);
        }
        let bytes = &batch.buf[start..wend];
        if inner.opts.direct_io {
            write_aligned(f.as_mut(), bytes)?;
        } else {
            f.append(bytes)?;
        }
        w.dirty = true;
        seg.written
            .store(file_off + bytes.len() as u64, Ordering::Release);
        inner.stats.writes.fetch_add(1, Ordering::Relaxed);
        inner
            .stats
            .bytes_written
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
    let need_sync = batch.durable || inner.opts.sync;
    if need_sync {
        sync_cur(inner, w)?;
    }
    Ok(need_sync)
}

/// Ends the open segment with a seal frame (not synced here): recovery then knows that
/// whatever follows is stale, not a torn write.
fn write_seal(inner: &Inner, w: &mut Writer) -> Result<()> {
    let Some((seg, f)) = w.cur.as_mut() else {
        return Ok(());
    };
    let len = if inner.opts.direct_io {
        DIRECT_IO_ALIGN
    } else {
        FRAME_HEADER_LEN
    };
    let bytes = format::seal_frame_bytes(seg.seq, len);
    if inner.opts.direct_io {
        write_aligned(f.as_mut(), &bytes)?;
    } else {
        f.append(&bytes)?;
    }
    w.dirty = true;
    seg.written.store(f.position(), Ordering::Release);
    Ok(())
}

/// Appends `bytes` (a multiple of the direct-I/O block) from a block-aligned buffer.
fn write_aligned(f: &mut dyn WritableFile, bytes: &[u8]) -> Result<()> {
    let align = DIRECT_IO_ALIGN;
    let mut scratch = vec![0u8; bytes.len() + align];
    let shift = scratch.as_ptr().align_offset(align);
    if shift > align {
        return Err(Error::InvalidArgument(
            "cannot align a direct I/O buffer".into(),
        ));
    }
    let slot = &mut scratch[shift..shift + bytes.len()];
    slot.copy_from_slice(bytes);
    f.append(slot)?;
    Ok(())
}

/// Final drain on stop: sync and seal the open segment.
fn finish(inner: &Inner, q: &Queue, w: &mut Writer) {
    let failed = q.state.lock().failed.is_some();
    if !failed {
        match write_seal(inner, w).and_then(|()| sync_cur(inner, w)) {
            Ok(_) => {
                let mut releases = Vec::new();
                {
                    let mut st = q.state.lock();
                    st.synced_gen = st.written_gen;
                    for (_, r) in st.pending_releases.drain(..) {
                        releases.extend(r);
                    }
                }
                for r in releases {
                    r.apply();
                }
            }
            Err(e) => {
                w.note_failure(inner);
                inner.poison(&e);
                q.state.lock().failed = Some(e);
            }
        }
    }
    if let Some((seg, _)) = w.cur.take() {
        seg.sealed.store(true, Ordering::Release);
    }
    // A segment assigned by the filling side but never written is sealed too (it has no
    // file; reclamation only forgets it).
    let st = q.state.lock();
    if let Some(seg) = &st.seg {
        seg.sealed.store(true, Ordering::Release);
    }
    drop(st);
    q.done_cv.notify_all();
}
