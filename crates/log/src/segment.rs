//! Segment files: names, the in-memory accounting of each segment, reading entries back,
//! and preparing free files for reuse.
//!
//! Files in a store directory:
//! - `<seq:016x>.seg`: a segment in use; its header carries the same `seq`.
//! - `<id:016x>.free`: a file ready for reuse (zero-filled, or a dead segment whose bytes
//!   are stale); `id` comes from the same counter as segment numbers, so a new segment
//!   number is always above every number any file on disk has carried.
//! - `QUEUES`: the queue count (see `store`). `LOCK`: the directory lock.
//!
//! A free file becomes a segment by: write the header (new seq, previous seq), sync, rename
//! `.free` to `.seg`, sync the directory. Only then does the queue write frames into it,
//! so a `.seg` name always has a valid header on disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_storage::{ReadableFile, SharedFs};

use crate::error::{Error, Result};

/// Path of segment `seq` in `dir`.
pub(crate) fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.seg"))
}

/// Path of free file `id` in `dir`.
pub(crate) fn free_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.free"))
}

/// Parses `<hex16>.<ext>`.
pub(crate) fn parse_name(name: &str, ext: &str) -> Option<u64> {
    let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
    if stem.len() != 16 {
        return None;
    }
    u64::from_str_radix(stem, 16).ok()
}

/// The in-memory state of one segment.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Sequence number (unique, increasing across the store's life).
    pub seq: u64,
    /// Queue that writes (or wrote) it.
    pub queue: u32,
    /// File path.
    pub path: PathBuf,
    /// File offset up to which frames are written (readable).
    pub written: AtomicU64,
    /// Bytes of live entries (header + data) that point into this segment. Decreased only
    /// once the op that made them dead is durable.
    pub live: AtomicU64,
    /// Streams' references to ops in this segment that recovery needs (a stream's latest
    /// op, its latest hard state, a removed stream's removal). Same durability rule.
    pub pins: AtomicI64,
    /// No more frames will be written.
    pub sealed: AtomicBool,
    /// Deleted or recycled; every reference is stale.
    pub deleted: AtomicBool,
    reader: Mutex<Option<Arc<dyn ReadableFile>>>,
}

impl Segment {
    pub(crate) fn new(dir: &Path, seq: u64, queue: u32, written: u64) -> Segment {
        Segment {
            seq,
            queue,
            path: seg_path(dir, seq),
            written: AtomicU64::new(written),
            live: AtomicU64::new(0),
            pins: AtomicI64::new(0),
            sealed: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            reader: Mutex::new(None),
        }
    }

    fn reader(&self, fs: &SharedFs) -> Result<Arc<dyn ReadableFile>> {
        let mut r = self.reader.lock();
        if let Some(f) = r.as_ref() {
            return Ok(f.clone());
        }
        let f = fs.open(&self.path)?;
        *r = Some(f.clone());
        Ok(f)
    }

    /// Drops the cached read handle (before the file is deleted or recycled).
    pub(crate) fn drop_reader(&self) {
        *self.reader.lock() = None;
    }

    /// Reads `len` bytes at `off` (a span of one or more entries).
    pub(crate) fn read_span(&self, fs: &SharedFs, off: u64, len: usize) -> Result<Vec<u8>> {
        let written = self.written.load(Ordering::Acquire);
        if off + len as u64 > written {
            return Err(Error::Corruption {
                path: self.path.clone(),
                offset: off,
                reason: format!("entry span of {len} bytes is past the written end {written}"),
            });
        }
        let f = self.reader(fs)?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(off, &mut buf)?;
        Ok(buf)
    }

    /// Checks an entry's bytes against its checksum.
    pub(crate) fn verify(&self, off: u64, data: &[u8], crc: u32) -> Result<()> {
        if crc32c::crc32c(data) != crc {
            return Err(Error::Corruption {
                path: self.path.clone(),
                offset: off,
                reason: format!("entry checksum mismatch ({} bytes)", data.len()),
            });
        }
        Ok(())
    }

    /// Applies a release (see `Release`).
    pub(crate) fn release(&self, live: u64, pins: i64) {
        let prev = self.live.fetch_sub(live, Ordering::AcqRel);
        debug_assert!(prev >= live, "segment {} live bytes underflow", self.seq);
        let prev = self.pins.fetch_sub(pins, Ordering::AcqRel);
        debug_assert!(prev >= pins, "segment {} pins underflow", self.seq);
    }

    /// Whether nothing needs this segment any more (it may still be the newest one).
    pub(crate) fn is_dead(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
            && self.live.load(Ordering::Acquire) == 0
            && self.pins.load(Ordering::Acquire) == 0
    }
}

/// A reference that stops once an op is durable: live bytes and pins to give back.
#[derive(Debug)]
pub(crate) struct Release {
    pub seg: Arc<Segment>,
    pub live: u64,
    pub pins: i64,
}

impl Release {
    pub(crate) fn apply(self) {
        self.seg.release(self.live, self.pins);
    }
}

/// A file ready to become a segment.
#[derive(Debug, Clone)]
pub(crate) struct FreeFile {
    pub path: PathBuf,
    /// Sequence number of the segment it last was (0 if never): the new header records it
    /// so recovery recognises the stale frames behind the new ones.
    pub prev_seq: u64,
}
