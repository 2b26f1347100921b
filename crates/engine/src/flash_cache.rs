//! A cache of remote table bytes on local flash (seed 004 §4.1.3), under the in-memory
//! block cache: what the object table store fetched (or uploaded) is kept in pages on a
//! local file system, so a read the memory cache misses costs a local read, not a
//! request to the object store.
//!
//! The cache owns its directory. Pages are appended to segment files
//! (`<seq>.fcache`); when the bytes held pass the capacity, the oldest segment goes
//! whole (FIFO by segment, as CacheLib's region-based flash cache: no small random
//! writes, no per-page bookkeeping on flash). Each page carries a header with its key
//! and checksums, one per 4 KiB chunk of its data, so a read of a few KiB of a page
//! reads and checks only the chunks it covers:
//!
//! ```text
//! page   := magic "PFC2" u64(object) u64(page) u32(len) u32(crc32c(crcs))
//!           u32(crc32c(the 28 bytes before)) crcs data[len]      (little-endian)
//! crcs   := u32(crc32c(chunk)) per CHUNK_BYTES of data (the last chunk shorter)
//! ```
//!
//! `object` names one version of one object (its path and ETag, hashed), so a page can
//! never be served for other bytes than it was fetched from: a table number used again
//! (after a store is emptied) has another ETag.
//!
//! Nothing is synced: it is a cache. At open the segments are scanned and their pages
//! indexed; a scan stops at the first header that does not check (a torn tail after a
//! crash, said in the log). A page's data is checked against its checksum at each
//! read; one that does not match is dropped, counted and logged, and the caller reads
//! the object store instead. A segment of another format version (its first header does
//! not check) holds nothing the cache serves, and ages out as the oldest. A segment that
//! cannot be read at all is removed. The directory is locked while the cache is open.
//! After a write fails (a full disk), nothing is written for ten seconds.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phoenix_storage::{ReadableFile, SharedFs, WritableFile};

use crate::error::Result;

/// Bytes of a page (the last of an object is shorter): the unit fetched from the store
/// and kept on flash. A ranged request for 64 KiB costs about what one for 4 KiB does.
pub const PAGE_BYTES: u64 = 64 << 10;

const MAGIC: &[u8; 4] = b"PFC2";
const HEADER_BYTES: usize = 32;
/// Bytes each checksum of a page covers.
const CHUNK_BYTES: usize = 4 << 10;
const SUFFIX: &str = ".fcache";

/// Counters of a [`FlashCache`] since it opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlashCacheStats {
    /// Pages found.
    pub hits: u64,
    /// Pages looked for and not found.
    pub misses: u64,
    /// Pages written.
    pub inserts: u64,
    /// Pages whose data did not match its checksum (dropped, read from the store).
    pub corrupt: u64,
    /// Bytes held now (headers included).
    pub bytes: u64,
}

/// A page's key: (object, page number).
type PageKey = (u64, u64);

/// Where a page lives, and its chunks' checksums.
#[derive(Debug, Clone)]
struct Loc {
    segment: u64,
    /// Offset of the data (past the header and checksums).
    pos: u64,
    len: u32,
    crcs: Arc<[u32]>,
}

struct Segment {
    seq: u64,
    reader: Arc<dyn ReadableFile>,
    bytes: u64,
    keys: Vec<(u64, u64)>,
}

struct Inner {
    index: HashMap<(u64, u64), Loc>,
    /// Oldest first; the last one takes appends.
    segments: VecDeque<Segment>,
    writer: Option<Box<dyn WritableFile>>,
    bytes: u64,
    next_seq: u64,
    /// When a write last failed: none is tried for [`WRITE_RETRY_AFTER`] (a full or
    /// failing disk must not cost a new segment per page).
    write_failed: Option<Instant>,
}

/// How long the cache writes nothing after a write failed.
const WRITE_RETRY_AFTER: Duration = Duration::from_secs(10);

/// A bounded cache of object pages on a local file system (see the module docs).
pub struct FlashCache {
    fs: SharedFs,
    _lock: Box<dyn phoenix_storage::FileLock>,
    dir: PathBuf,
    capacity: u64,
    segment_bytes: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    corrupt: AtomicU64,
}

impl std::fmt::Debug for FlashCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashCache")
            .field("dir", &self.dir)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// The key of one version of an object: its path and ETag.
pub fn object_key(path: &str, e_tag: &str) -> u64 {
    let mut b = Vec::with_capacity(path.len() + e_tag.len() + 1);
    b.extend_from_slice(path.as_bytes());
    b.push(0);
    b.extend_from_slice(e_tag.as_bytes());
    xxhash_rust::xxh3::xxh3_64(&b)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:012}{SUFFIX}"))
}

fn chunk_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks(CHUNK_BYTES).map(crc32c::crc32c).collect()
}

fn crcs_bytes(crcs: &[u32]) -> Vec<u8> {
    crcs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// A page's header and checksums.
fn encode_header(object: u64, page: u64, data: &[u8], crcs: &[u32]) -> Vec<u8> {
    let table = crcs_bytes(crcs);
    let mut h = vec![0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(MAGIC);
    h[4..12].copy_from_slice(&object.to_le_bytes());
    h[12..20].copy_from_slice(&page.to_le_bytes());
    h[20..24].copy_from_slice(&(data.len() as u32).to_le_bytes());
    h[24..28].copy_from_slice(&crc32c::crc32c(&table).to_le_bytes());
    let hc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&hc.to_le_bytes());
    h.extend_from_slice(&table);
    h
}

/// Bytes of the checksums of a page of `len` bytes.
fn crcs_len(len: u32) -> usize {
    (len as usize).div_ceil(CHUNK_BYTES) * 4
}

/// (object, page, len, crc of the checksums) of a header that checks.
fn decode_header(h: &[u8]) -> Option<(u64, u64, u32, u32)> {
    if h.len() < HEADER_BYTES || &h[0..4] != MAGIC {
        return None;
    }
    let word = |r: std::ops::Range<usize>| -> Option<u32> {
        Some(u32::from_le_bytes(h.get(r)?.try_into().ok()?))
    };
    let long = |r: std::ops::Range<usize>| -> Option<u64> {
        Some(u64::from_le_bytes(h.get(r)?.try_into().ok()?))
    };
    if word(28..32)? != crc32c::crc32c(&h[..28]) {
        return None;
    }
    Some((long(4..12)?, long(12..20)?, word(20..24)?, word(24..28)?))
}

/// The pages of segment `seq` at `path` and where they lie, reading only their headers
/// and checksums; the scan stops at the first that does not check. Nothing of a
/// segment that fails to read is indexed.
fn scan(fs: &SharedFs, path: &Path, seq: u64) -> Result<(Segment, Vec<(PageKey, Loc)>)> {
    let mut found = Vec::new();
    let reader = fs.open(path)?;
    let size = reader.size();
    let mut seg = Segment {
        seq,
        reader: Arc::clone(&reader),
        // (A torn tail still takes its room; no page is appended after it.)
        bytes: size,
        keys: Vec::new(),
    };
    let mut pos = 0u64;
    let mut header = [0u8; HEADER_BYTES];
    while pos < size {
        let torn = |what: &str| {
            tracing::warn!(file = %path.display(), offset = pos, "flash cache segment {what}: the pages before are kept");
        };
        if pos + HEADER_BYTES as u64 > size {
            torn("ends in a partial header (a torn tail)");
            break;
        }
        reader.read_exact_at(pos, &mut header)?;
        let Some((object, page, len, crc)) = decode_header(&header) else {
            torn("ends in bytes that do not check (a torn tail)");
            break;
        };
        let table_at = pos + HEADER_BYTES as u64;
        let data_at = table_at + crcs_len(len) as u64;
        let end = data_at + u64::from(len);
        if len as u64 > PAGE_BYTES || end > size {
            torn("is cut short");
            break;
        }
        let mut table = vec![0u8; crcs_len(len)];
        reader.read_exact_at(table_at, &mut table)?;
        if crc32c::crc32c(&table) != crc {
            torn("has damaged page checksums");
            break;
        }
        let crcs: Arc<[u32]> = table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let key = (object, page);
        found.push((
            key,
            Loc {
                segment: seq,
                pos: data_at,
                len,
                crcs,
            },
        ));
        seg.keys.push(key);
        pos = end;
    }
    Ok((seg, found))
}

impl FlashCache {
    /// Opens the cache in `dir` (created if missing) holding at most `capacity` bytes,
    /// with the pages an earlier run left there.
    pub fn open(fs: SharedFs, dir: &Path, capacity: u64) -> Result<Arc<FlashCache>> {
        fs.create_dir_all(dir)?;
        // One process at a time: another would number its segments as this one does.
        let lock = fs.lock(&dir.join("LOCK"))?;
        // Eight segments or more: evicting one drops an eighth of the cache at most.
        let segment_bytes = (capacity / 8).clamp(PAGE_BYTES * 4, 256 << 20);
        let mut seqs: Vec<u64> = Vec::new();
        for name in fs.list(dir)? {
            // (Numbers stay far from u64::MAX: the next one is always one more.)
            match name
                .strip_suffix(SUFFIX)
                .and_then(|s| s.parse::<u64>().ok())
            {
                Some(seq) if seq < u64::MAX / 2 && segment_path(dir, seq) == dir.join(&name) => {
                    seqs.push(seq)
                }
                _ if name == "LOCK" => {}
                _ => {
                    tracing::warn!(file = %dir.join(&name).display(), "not a flash cache file; left alone")
                }
            }
        }
        seqs.sort_unstable();
        let mut inner = Inner {
            index: HashMap::new(),
            segments: VecDeque::new(),
            writer: None,
            bytes: 0,
            next_seq: seqs.last().map_or(1, |s| s + 1),
            write_failed: None,
        };
        for seq in seqs {
            let path = segment_path(dir, seq);
            match scan(&fs, &path, seq) {
                Ok((seg, pages)) => {
                    inner.index.extend(pages);
                    inner.bytes += seg.bytes;
                    inner.segments.push_back(seg);
                }
                // A cache: what cannot be read is dropped, not a reason to stop.
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "flash cache segment unreadable; removed");
                    let _ = fs.delete(&path);
                }
            }
        }
        let cache = FlashCache {
            fs,
            _lock: lock,
            dir: dir.to_path_buf(),
            capacity,
            segment_bytes,
            inner: Mutex::new(inner),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        };
        cache.evict(&mut cache.inner.lock());
        Ok(Arc::new(cache))
    }

    /// Whether page `page` of object `object` is held (its bytes are not checked here).
    pub fn holds(&self, object: u64, page: u64) -> bool {
        self.inner.lock().index.contains_key(&(object, page))
    }

    /// The whole page `page` of object `object`, if held and its bytes check.
    pub fn get(&self, object: u64, page: u64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; PAGE_BYTES as usize];
        let n = self.read(object, page, 0, &mut buf)?;
        buf.truncate(n);
        Some(buf)
    }

    /// Fills `out` with bytes `from..` of page `page` of object `object` (as many as the
    /// page holds past `from`), reading and checking only the chunks they lie in;
    /// returns how many. `None` if the page is not held or its bytes do not check.
    pub fn read(&self, object: u64, page: u64, from: usize, out: &mut [u8]) -> Option<usize> {
        let (loc, reader) = {
            let inner = self.inner.lock();
            let found = inner.index.get(&(object, page)).and_then(|loc| {
                let seg = inner.segments.iter().find(|s| s.seq == loc.segment)?;
                Some((loc.clone(), Arc::clone(&seg.reader)))
            });
            match found {
                Some(f) => f,
                None => {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        };
        let len = loc.len as usize;
        let to = len.min(from.saturating_add(out.len()));
        if from >= to {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(0);
        }
        // The chunks covering from..to, read whole and checked.
        let first = from / CHUNK_BYTES;
        let last = (to - 1) / CHUNK_BYTES;
        let lo = first * CHUNK_BYTES;
        let hi = ((last + 1) * CHUNK_BYTES).min(len);
        let mut buf = vec![0u8; hi - lo];
        let read = reader.read_exact_at(loc.pos + lo as u64, &mut buf);
        let bad = match read {
            Ok(()) => buf
                .chunks(CHUNK_BYTES)
                .zip(&loc.crcs[first..=last])
                .any(|(chunk, crc)| crc32c::crc32c(chunk) != *crc)
                .then(|| "its bytes do not match their checksum".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = bad {
            self.corrupt.fetch_add(1, Ordering::Relaxed);
            self.misses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                file = %segment_path(&self.dir, loc.segment).display(),
                offset = loc.pos,
                "flash cache page dropped ({why}); read from the store instead"
            );
            let mut inner = self.inner.lock();
            if inner
                .index
                .get(&(object, page))
                .is_some_and(|l| l.segment == loc.segment && l.pos == loc.pos)
            {
                inner.index.remove(&(object, page));
            }
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        out[..to - from].copy_from_slice(&buf[from - lo..to - lo]);
        Some(to - from)
    }

    /// Keeps `data` as page `page` of object `object`. A failure to write is logged
    /// and leaves the cache without the page (the store still has it).
    pub fn insert(&self, object: u64, page: u64, data: &[u8]) {
        if let Err(e) = self.try_insert(object, page, data) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "flash cache write failed; page not kept");
        }
    }

    fn try_insert(&self, object: u64, page: u64, data: &[u8]) -> Result<()> {
        let crcs = chunk_crcs(data);
        let header = encode_header(object, page, data, &crcs);
        let need = (header.len() + data.len()) as u64;
        if need > self.segment_bytes {
            return Ok(());
        }
        let mut inner = self.inner.lock();
        if inner.index.contains_key(&(object, page))
            || inner
                .write_failed
                .is_some_and(|t| t.elapsed() < WRITE_RETRY_AFTER)
        {
            return Ok(());
        }
        let full = inner
            .segments
            .back()
            .is_none_or(|s| s.bytes + need > self.segment_bytes);
        if full || inner.writer.is_none() {
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let path = segment_path(&self.dir, seq);
            let opened = self
                .fs
                .create(&path, Default::default())
                .and_then(|w| Ok((w, self.fs.open(&path)?)));
            let (writer, reader) = match opened {
                Ok(o) => o,
                Err(e) => {
                    inner.write_failed = Some(Instant::now());
                    let _ = self.fs.delete(&path);
                    return Err(e.into());
                }
            };
            inner.writer = Some(writer);
            inner.segments.push_back(Segment {
                seq,
                reader,
                bytes: 0,
                keys: Vec::new(),
            });
        }
        let Inner {
            writer, segments, ..
        } = &mut *inner;
        let (Some(w), Some(seg)) = (writer.as_mut(), segments.back_mut()) else {
            return Ok(());
        };
        let start = seg.bytes;
        let written = w.append(&header).and_then(|_| w.append(data));
        if let Err(e) = written {
            // The segment's tail is unknown now: no more pages go into it. One that holds
            // none is removed (a disk that stays full must not gather empty segments);
            // another counts as holding what was tried, and goes in its turn.
            let (empty, seq, held) = (seg.keys.is_empty(), seg.seq, seg.bytes);
            if !empty {
                seg.bytes += need;
            }
            inner.writer = None;
            inner.write_failed = Some(Instant::now());
            if empty {
                inner.bytes = inner.bytes.saturating_sub(held);
                inner.segments.pop_back();
                let _ = self.fs.delete(&segment_path(&self.dir, seq));
            } else {
                inner.bytes += need;
            }
            return Err(e.into());
        }
        seg.bytes += need;
        seg.keys.push((object, page));
        let loc = Loc {
            segment: seg.seq,
            pos: start + header.len() as u64,
            len: data.len() as u32,
            crcs: crcs.into(),
        };
        inner.index.insert((object, page), loc);
        inner.bytes += need;
        self.inserts.fetch_add(1, Ordering::Relaxed);
        self.evict(&mut inner);
        Ok(())
    }

    /// Removes the oldest segments until the bytes held fit the capacity (the one taking
    /// appends last of all).
    fn evict(&self, inner: &mut Inner) {
        while inner.bytes > self.capacity && !inner.segments.is_empty() {
            let Some(seg) = inner.segments.pop_front() else {
                break;
            };
            if inner.segments.is_empty() {
                inner.writer = None;
            }
            for key in &seg.keys {
                if inner.index.get(key).is_some_and(|l| l.segment == seg.seq) {
                    inner.index.remove(key);
                }
            }
            inner.bytes = inner.bytes.saturating_sub(seg.bytes);
            let path = segment_path(&self.dir, seg.seq);
            if let Err(e) = self.fs.delete(&path) {
                // (Its pages are out of the index: only the room stays taken until the
                // next open finds the file again.)
                tracing::warn!(file = %path.display(), error = %e, "could not remove an evicted flash cache segment");
            }
        }
    }

    /// The counters since the cache opened, and the bytes it holds.
    pub fn stats(&self) -> FlashCacheStats {
        FlashCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            bytes: self.inner.lock().bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use phoenix_storage::MemFs;

    fn page(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|b| (b as u64 * 31 + i) as u8).collect()
    }

    #[test]
    fn pages_come_back_and_survive_a_reopen() {
        let fs: SharedFs = Arc::new(MemFs::new());
        let dir = Path::new("/cache");
        let c = FlashCache::open(Arc::clone(&fs), dir, 16 << 20).unwrap();
        assert_eq!(c.get(1, 0), None);
        for i in 0..20 {
            c.insert(1, i, &page(i, 1000 + i as usize));
        }
        c.insert(2, 0, &page(99, 10));
        assert_eq!(c.get(1, 7), Some(page(7, 1007)));
        assert_eq!(c.get(2, 0), Some(page(99, 10)));
        assert_eq!(c.get(3, 0), None);
        drop(c);
        let c = FlashCache::open(fs, dir, 16 << 20).unwrap();
        for i in 0..20 {
            assert_eq!(c.get(1, i), Some(page(i, 1000 + i as usize)), "page {i}");
        }
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.corrupt), (20, 0, 0));
    }

    #[test]
    fn the_oldest_segments_go_when_full() {
        let fs: SharedFs = Arc::new(MemFs::new());
        let dir = Path::new("/cache");
        // Segments of 4 pages (the smallest), 16 pages in all.
        let cap = PAGE_BYTES * 16;
        let c = FlashCache::open(Arc::clone(&fs), dir, cap).unwrap();
        let len = PAGE_BYTES as usize - HEADER_BYTES - crcs_len(PAGE_BYTES as u32);
        for i in 0..64 {
            c.insert(5, i, &page(i, len));
            assert!(c.stats().bytes <= cap);
        }
        assert_eq!(c.get(5, 0), None, "the oldest went");
        assert_eq!(c.get(5, 63), Some(page(63, len)), "the newest stays");
        let held = (0..64).filter(|&i| c.get(5, i).is_some()).count();
        assert!((12..=16).contains(&held), "{held}");
        let segments = fs
            .list(dir)
            .unwrap()
            .iter()
            .filter(|n| n.ends_with(SUFFIX))
            .count();
        assert!(segments <= 4, "{segments}");
    }

    /// A disk that refuses writes (full) costs the cache nothing more than the pages it
    /// cannot keep: no segment per page, no error to the reader; and a file in the
    /// directory that is not a segment of the cache does not stop it from opening.
    #[test]
    fn a_failing_disk_costs_no_segment_per_page() {
        let m = MemFs::new();
        let fs: SharedFs = Arc::new(m.clone());
        let dir = Path::new("/cache");
        fs.create_dir_all(dir).unwrap();
        fs.create(&dir.join("1.fcache"), Default::default())
            .unwrap();
        let c = FlashCache::open(Arc::clone(&fs), dir, 16 << 20).unwrap();
        m.inject(
            phoenix_storage::FaultKind::Write,
            1,
            std::io::ErrorKind::StorageFull,
            true,
        );
        for i in 0..100 {
            c.insert(9, i, &page(i, 1000));
        }
        m.clear_faults();
        let segments = fs
            .list(dir)
            .unwrap()
            .iter()
            .filter(|n| n.len() == 19)
            .count();
        assert!(segments <= 1, "{:?}", fs.list(dir).unwrap());
        assert_eq!(c.get(9, 0), None);
        assert_eq!(c.stats().inserts, 0);
    }

    /// A page whose bytes were damaged on flash is not served: dropped, counted, and
    /// the next read goes to the store; a torn tail is cut at the reopen.
    #[test]
    fn damaged_bytes_are_found_and_dropped() {
        let m = MemFs::new();
        let fs: SharedFs = Arc::new(m.clone());
        let dir = Path::new("/cache");
        let c = FlashCache::open(Arc::clone(&fs), dir, 16 << 20).unwrap();
        c.insert(1, 0, &page(0, 500));
        c.insert(1, 1, &page(1, 500));
        drop(c);
        let name = fs.list(dir).unwrap().remove(0);
        let path = dir.join(&name);
        let mut bytes = fs.read_all(&path).unwrap();
        // Flip a byte of the first page's data, and tear the second page's data.
        bytes[HEADER_BYTES + crcs_len(500) + 10] ^= 0xff;
        bytes.truncate(bytes.len() - 100);
        let mut w = fs.create(&path, Default::default()).unwrap();
        w.append(&bytes).unwrap();
        drop(w);
        let c = FlashCache::open(Arc::clone(&fs), dir, 16 << 20).unwrap();
        assert_eq!(c.get(1, 0), None, "the damaged page");
        assert_eq!(c.get(1, 1), None, "the torn page");
        assert_eq!(c.stats().corrupt, 1);
        c.insert(1, 0, &page(0, 500));
        assert_eq!(c.get(1, 0), Some(page(0, 500)));
    }
}
