//! The memtable: an arena-allocated concurrent skiplist of internal keys, plus the
//! memtable's range tombstones in a small separate list.
//!
//! Representation: every node lives in an arena of 256 KiB chunks owned by the memtable
//! and is laid out as `header ‖ tower of `height` next-pointers ‖ internal key ‖ value`.
//! Nodes are never freed or moved until the memtable is dropped, which is what lets
//! readers follow raw pointers without locks.
//!
//! Thread safety: one writer at a time (inserts take an internal mutex; the engine's
//! write-group leader is the only writer anyway), any number of lock-free readers. A new
//! node is fully initialised before it is published with a release store into its
//! predecessors' towers, bottom level first; readers load with acquire. So a reader sees
//! either the list without the node or a complete node.
//!
//! Invariants: (1) keys on level 0 are strictly increasing by `compare_internal`
//! (internal keys are unique because every record gets its own sequence number);
//! (2) each level is a sub-list of the level below.

use std::cmp::Ordering;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering as AtOrd};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::Result;
use crate::iter::{InternalIterator, ReadScope};
use crate::key::{
    compare_internal, encode_internal_key, parse_internal_key, seek_key, RangeTombstone,
    SequenceNumber, ValueKind,
};
use crate::table::filter::DynamicFilter;

const MAX_HEIGHT: usize = 12;
const CHUNK_BYTES: usize = 256 * 1024;
const ALIGN: usize = 8;

#[repr(C, align(8))]
struct Node {
    key_len: u32,
    value_len: u32,
    height: u32,
    _pad: u32,
    // Followed by `height` AtomicPtr<Node>, then the key, then the value.
}

const _: () = assert!(
    std::mem::size_of::<Node>().is_multiple_of(std::mem::align_of::<AtomicPtr<Node>>())
        && std::mem::align_of::<Node>() == ALIGN
        && std::mem::align_of::<AtomicPtr<Node>>() <= ALIGN
);

impl Node {
    /// # Safety
    /// `this` points to a node allocated by [`Arena::alloc_node`].
    unsafe fn tower<'a>(this: *const Node) -> &'a [AtomicPtr<Node>] {
        // SAFETY: the tower follows the header and holds `height` initialised pointers.
        unsafe {
            let h = (*this).height as usize;
            std::slice::from_raw_parts(this.add(1) as *const AtomicPtr<Node>, h)
        }
    }

    /// # Safety
    /// As for `tower`; `level < height`.
    unsafe fn next(this: *const Node, level: usize) -> *mut Node {
        // SAFETY: caller guarantees a valid node; the slice index is bounds-checked.
        unsafe { Node::tower(this)[level].load(AtOrd::Acquire) }
    }

    /// # Safety
    /// `this` is a valid node; the returned slice lives as long as the arena.
    unsafe fn key<'a>(this: *const Node) -> &'a [u8] {
        // SAFETY: key bytes follow the tower and were written before publication.
        unsafe {
            let h = (*this).height as usize;
            let p = (this.add(1) as *const AtomicPtr<Node>).add(h) as *const u8;
            std::slice::from_raw_parts(p, (*this).key_len as usize)
        }
    }

    /// # Safety
    /// As for `key`.
    unsafe fn value<'a>(this: *const Node) -> &'a [u8] {
        // SAFETY: value bytes follow the key and were written before publication.
        unsafe {
            let h = (*this).height as usize;
            let p = (this.add(1) as *const AtomicPtr<Node>).add(h) as *const u8;
            let klen = (*this).key_len as usize;
            std::slice::from_raw_parts(p.add(klen), (*this).value_len as usize)
        }
    }
}

/// Bump allocator; only the writer (under the insert mutex) allocates.
struct Arena {
    chunks: Vec<Box<[u64]>>,
    ptr: *mut u8,
    remaining: usize,
}

impl Arena {
    fn new() -> Self {
        Arena {
            chunks: Vec::new(),
            ptr: ptr::null_mut(),
            remaining: 0,
        }
    }

    /// Allocates `size` bytes aligned to 8, zeroed.
    fn alloc(&mut self, size: usize) -> *mut u8 {
        let size = size.div_ceil(ALIGN) * ALIGN;
        if size > self.remaining {
            let chunk_bytes = if size > CHUNK_BYTES / 4 {
                size
            } else {
                CHUNK_BYTES
            };
            let mut chunk = vec![0u64; chunk_bytes / 8].into_boxed_slice();
            let p = chunk.as_mut_ptr() as *mut u8;
            self.chunks.push(chunk);
            if chunk_bytes == size {
                // A dedicated chunk; keep bumping in the current one afterwards.
                return p;
            }
            self.ptr = p;
            self.remaining = chunk_bytes;
        }
        let p = self.ptr;
        // SAFETY: `size <= remaining`, so the result stays inside the current chunk.
        self.ptr = unsafe { self.ptr.add(size) };
        self.remaining -= size;
        p
    }

    fn alloc_node(&mut self, height: usize, key_len: usize, value_len: usize) -> *mut Node {
        let size = std::mem::size_of::<Node>()
            + height * std::mem::size_of::<AtomicPtr<Node>>()
            + key_len
            + value_len;
        let p = self.alloc(size) as *mut Node;
        // SAFETY: `p` is aligned to 8 (Node's alignment) and has room for the header; the
        // zeroed tower bytes are valid null AtomicPtrs.
        unsafe {
            ptr::write(
                p,
                Node {
                    key_len: key_len as u32,
                    value_len: value_len as u32,
                    height: height as u32,
                    _pad: 0,
                },
            );
        }
        p
    }
}

struct Writer {
    arena: Arena,
    rng: u64,
    scratch: Vec<u8>,
}

/// An in-memory sorted buffer of recent writes.
pub struct MemTable {
    head: *mut Node,
    max_height: AtomicUsize,
    writer: Mutex<Writer>,
    memory: AtomicUsize,
    entries: AtomicU64,
    range_dels: RwLock<Vec<RangeTombstone>>,
    /// Id of the memtable, increasing in creation order.
    id: u64,
    /// First WAL entry whose batch went into this memtable (0 if none).
    wal_first: AtomicU64,
    largest_seq: AtomicU64,
    /// The filter over key prefixes and the prefix length (prefix seeks skip the
    /// memtable when it rules their prefix out).
    prefix_filter: Option<(usize, DynamicFilter)>,
}

// SAFETY: the raw pointers point into the arena owned by the memtable; nodes are
// immutable after publication except their atomic towers; arena mutation happens only
// under the `writer` mutex. So sharing between threads is sound.
unsafe impl Send for MemTable {}
// SAFETY: see above.
unsafe impl Sync for MemTable {}

impl std::fmt::Debug for MemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTable")
            .field("id", &self.id)
            .field("entries", &self.num_entries())
            .field("memory", &self.approximate_memory_usage())
            .finish()
    }
}

/// What a memtable knows about a key at a snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum MemGet {
    /// The newest visible version is a value.
    Value(Vec<u8>, SequenceNumber),
    /// The newest visible version is a point tombstone.
    Deleted(SequenceNumber),
    /// No visible version.
    Absent,
}

impl MemTable {
    /// An empty memtable with a filter of about `bytes` bytes over the first
    /// `prefix_len` bytes of its keys, which prefix seeks use to skip it.
    pub fn with_prefix_filter(id: u64, prefix_len: usize, bytes: usize) -> Self {
        debug_assert!(prefix_len > 0);
        let filter = DynamicFilter::new(bytes);
        // The filter counts toward the memtable's size, as RocksDB's arena holds its bloom.
        MemTable {
            memory: AtomicUsize::new(filter.len()),
            prefix_filter: Some((prefix_len, filter)),
            ..MemTable::new(id)
        }
    }

    /// An empty memtable.
    pub fn new(id: u64) -> Self {
        let mut arena = Arena::new();
        let head = arena.alloc_node(MAX_HEIGHT, 0, 0);
        MemTable {
            head,
            max_height: AtomicUsize::new(1),
            writer: Mutex::new(Writer {
                arena,
                rng: 0x9e37_79b9_7f4a_7c15 ^ id,
                scratch: Vec::new(),
            }),
            memory: AtomicUsize::new(0),
            entries: AtomicU64::new(0),
            range_dels: RwLock::new(Vec::new()),
            id,
            wal_first: AtomicU64::new(0),
            largest_seq: AtomicU64::new(0),
            prefix_filter: None,
        }
    }

    /// The memtable's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes used by entries (node sizes, not whole arena chunks).
    pub fn approximate_memory_usage(&self) -> usize {
        self.memory.load(AtOrd::Relaxed)
    }

    /// Point entries plus range tombstones inserted.
    pub fn num_entries(&self) -> u64 {
        self.entries.load(AtOrd::Relaxed)
    }

    /// Whether nothing was inserted.
    pub fn is_empty(&self) -> bool {
        self.num_entries() == 0
    }

    /// The largest sequence number inserted (0 if empty).
    pub fn largest_seq(&self) -> SequenceNumber {
        self.largest_seq.load(AtOrd::Acquire)
    }

    pub(crate) fn set_wal_first(&self, index: u64) {
        let _ = self
            .wal_first
            .compare_exchange(0, index, AtOrd::AcqRel, AtOrd::Acquire);
    }

    pub(crate) fn wal_first(&self) -> u64 {
        self.wal_first.load(AtOrd::Acquire)
    }

    /// Adds one entry. Internal keys must be unique (one sequence number per record).
    pub fn add(&self, seq: SequenceNumber, kind: ValueKind, user_key: &[u8], value: &[u8]) {
        self.largest_seq.fetch_max(seq, AtOrd::AcqRel);
        if kind == ValueKind::RangeDelete {
            self.range_dels.write().push(RangeTombstone {
                start: user_key.to_vec(),
                end: value.to_vec(),
                seq,
            });
            self.memory
                .fetch_add(user_key.len() + value.len() + 48, AtOrd::Relaxed);
            self.entries.fetch_add(1, AtOrd::Relaxed);
            return;
        }
        if let Some((len, f)) = &self.prefix_filter {
            // Set before the write's sequence is published (release), which a reader
            // loads (acquire) before it checks the filter: it sees every prefix of the
            // entries its snapshot can see.
            if let Some(p) = user_key.get(..*len) {
                f.add(p);
            }
        }
        let mut w = self.writer.lock();
        let w = &mut *w;
        w.scratch.clear();
        encode_internal_key(&mut w.scratch, user_key, seq, kind);
        let ikey = &w.scratch;

        let mut prev = [self.head; MAX_HEIGHT];
        let found = self.find_greater_or_equal(ikey, Some(&mut prev));
        // SAFETY: `found` is null or a valid node of this list.
        debug_assert!(
            found.is_null()
                || compare_internal(unsafe { Node::key(found) }, ikey) != Ordering::Equal,
            "duplicate internal key inserted into memtable"
        );

        // Height: geometric with p = 1/4.
        let mut height = 1;
        loop {
            w.rng ^= w.rng << 13;
            w.rng ^= w.rng >> 7;
            w.rng ^= w.rng << 17;
            if height < MAX_HEIGHT && (w.rng & 3) == 0 {
                height += 1;
            } else {
                break;
            }
        }
        let cur_max = self.max_height.load(AtOrd::Relaxed);
        if height > cur_max {
            // `prev` already holds head for the new levels. Readers that see the new
            // height early find null pointers in head's tower there, which is fine.
            self.max_height.store(height, AtOrd::Relaxed);
        }

        let node = w.arena.alloc_node(height, ikey.len(), value.len());
        // SAFETY: the node was just allocated with room for its tower, key and value and
        // is not yet reachable by any reader; `prev[i]` are valid nodes whose level-i
        // successor is the insertion point (we hold the writer lock).
        unsafe {
            let base = (node.add(1) as *mut AtomicPtr<Node>).add(height) as *mut u8;
            ptr::copy_nonoverlapping(ikey.as_ptr(), base, ikey.len());
            ptr::copy_nonoverlapping(value.as_ptr(), base.add(ikey.len()), value.len());
            let tower = Node::tower(node);
            for (level, slot) in tower.iter().enumerate() {
                slot.store(Node::next(prev[level], level), AtOrd::Relaxed);
            }
            for (level, p) in prev.iter().enumerate().take(height) {
                Node::tower(*p)[level].store(node, AtOrd::Release);
            }
        }
        let size = std::mem::size_of::<Node>() + height * 8 + ikey.len() + value.len();
        self.memory.fetch_add(size, AtOrd::Relaxed);
        self.entries.fetch_add(1, AtOrd::Relaxed);
    }

    /// First node with key >= `target`, filling `prev` with the last node < target per level.
    fn find_greater_or_equal(
        &self,
        target: &[u8],
        mut prev: Option<&mut [*mut Node; MAX_HEIGHT]>,
    ) -> *mut Node {
        let mut x = self.head;
        let mut level = self.max_height.load(AtOrd::Relaxed).max(1) - 1;
        // The node that stopped the search one level up: it is often `next` again on the
        // level below, and its key is known to be >= target (saves a comparison, usually
        // a cache miss, per level).
        let mut known_ge: *mut Node = ptr::null_mut();
        loop {
            // SAFETY: `x` is head or a published node; `level` is below its height
            // because we only descend, and every node at level l has height > l.
            let next = unsafe { Node::next(x, level) };
            let go_right = !next.is_null()
                && next != known_ge
                // SAFETY: non-null published node.
                && compare_internal(unsafe { Node::key(next) }, target) == Ordering::Less;
            if go_right {
                x = next;
            } else {
                known_ge = next;
                if let Some(p) = prev.as_deref_mut() {
                    p[level] = x;
                }
                if level == 0 {
                    return next;
                }
                level -= 1;
            }
        }
    }

    /// Last node with key < `target` (head if none).
    fn find_less_than(&self, target: &[u8]) -> *mut Node {
        let mut x = self.head;
        let mut level = self.max_height.load(AtOrd::Relaxed).max(1) - 1;
        let mut known_ge: *mut Node = ptr::null_mut();
        loop {
            // SAFETY: as in `find_greater_or_equal`.
            let next = unsafe { Node::next(x, level) };
            let go_right = !next.is_null()
                && next != known_ge
                // SAFETY: non-null published node.
                && compare_internal(unsafe { Node::key(next) }, target) == Ordering::Less;
            if go_right {
                x = next;
            } else if level == 0 {
                return x;
            } else {
                known_ge = next;
                level -= 1;
            }
        }
    }

    fn find_last(&self) -> *mut Node {
        let mut x = self.head;
        let mut level = self.max_height.load(AtOrd::Relaxed).max(1) - 1;
        loop {
            // SAFETY: as in `find_greater_or_equal`.
            let next = unsafe { Node::next(x, level) };
            if !next.is_null() {
                x = next;
            } else if level == 0 {
                return x;
            } else {
                level -= 1;
            }
        }
    }

    /// The newest version of `user_key` visible at `snapshot`, ignoring range tombstones
    /// (see [`MemTable::max_covering_tombstone`]).
    pub fn get(&self, user_key: &[u8], snapshot: SequenceNumber) -> MemGet {
        let target = seek_key(user_key, snapshot);
        let node = self.find_greater_or_equal(&target, None);
        if node.is_null() {
            return MemGet::Absent;
        }
        // SAFETY: non-null published node.
        let (k, v) = unsafe { (Node::key(node), Node::value(node)) };
        match parse_internal_key(k) {
            Some(p) if p.user_key == user_key => match p.kind {
                ValueKind::Put => MemGet::Value(v.to_vec(), p.seq),
                _ => MemGet::Deleted(p.seq),
            },
            _ => MemGet::Absent,
        }
    }

    /// The largest sequence of a range tombstone here covering `user_key` and visible at
    /// `snapshot` (0 if none).
    pub fn max_covering_tombstone(&self, user_key: &[u8], snapshot: SequenceNumber) -> u64 {
        let dels = self.range_dels.read();
        dels.iter()
            .filter(|t| {
                t.seq <= snapshot && t.start.as_slice() <= user_key && user_key < t.end.as_slice()
            })
            .map(|t| t.seq)
            .max()
            .unwrap_or(0)
    }

    /// Whether the memtable holds range tombstones.
    pub fn has_range_tombstones(&self) -> bool {
        !self.range_dels.read().is_empty()
    }

    /// A copy of the range tombstones.
    pub fn range_tombstones(&self) -> Vec<RangeTombstone> {
        self.range_dels.read().clone()
    }

    /// A cursor over the point entries.
    pub fn iter(self: &Arc<Self>) -> MemTableIter {
        MemTableIter {
            mem: Arc::clone(self),
            node: ptr::null_mut(),
            excluded: false,
        }
    }

    /// Whether the memtable surely holds no key starting with `prefix` (false without a
    /// prefix filter of `prefix`'s length).
    pub fn excludes_prefix(&self, prefix: &[u8]) -> bool {
        self.prefix_filter
            .as_ref()
            .is_some_and(|(len, f)| *len == prefix.len() && !f.may_contain(prefix))
    }
}

/// A cursor over a memtable's point entries; keeps the memtable alive.
pub struct MemTableIter {
    mem: Arc<MemTable>,
    node: *mut Node,
    /// The read's prefix is ruled out by the prefix filter: every seek finds nothing.
    excluded: bool,
}

// SAFETY: the iterator only reads published nodes of a memtable it keeps alive.
unsafe impl Send for MemTableIter {}

impl InternalIterator for MemTableIter {
    fn valid(&self) -> bool {
        !self.node.is_null()
    }
    fn seek_to_first(&mut self) {
        if self.excluded {
            self.node = ptr::null_mut();
            return;
        }
        // SAFETY: head is valid with MAX_HEIGHT levels.
        self.node = unsafe { Node::next(self.mem.head, 0) };
    }
    fn seek_to_last(&mut self) {
        if self.excluded {
            self.node = ptr::null_mut();
            return;
        }
        let n = self.mem.find_last();
        self.node = if n == self.mem.head {
            ptr::null_mut()
        } else {
            n
        };
    }
    fn seek(&mut self, target: &[u8]) {
        if self.excluded {
            self.node = ptr::null_mut();
            return;
        }
        self.node = self.mem.find_greater_or_equal(target, None);
    }
    fn seek_for_prev(&mut self, target: &[u8]) {
        if self.excluded {
            self.node = ptr::null_mut();
            return;
        }
        self.seek(target);
        if !self.valid() {
            self.seek_to_last();
        } else if compare_internal(self.key(), target) == Ordering::Greater {
            self.prev();
        }
    }
    fn next(&mut self) {
        debug_assert!(self.valid());
        if self.node.is_null() {
            return;
        }
        // SAFETY: non-null, so a published node of `mem`.
        self.node = unsafe { Node::next(self.node, 0) };
    }
    fn prev(&mut self) {
        debug_assert!(self.valid());
        if self.node.is_null() {
            return;
        }
        // SAFETY: non-null, so a published node of `mem`.
        let key = unsafe { Node::key(self.node) };
        let n = self.mem.find_less_than(key);
        self.node = if n == self.mem.head {
            ptr::null_mut()
        } else {
            n
        };
    }
    fn key(&self) -> &[u8] {
        if self.node.is_null() {
            return &[];
        }
        // SAFETY: non-null, so a published node; it lives as long as `mem`.
        unsafe { Node::key(self.node) }
    }
    fn value(&self) -> &[u8] {
        if self.node.is_null() {
            return &[];
        }
        // SAFETY: as for key().
        unsafe { Node::value(self.node) }
    }
    fn status(&self) -> Result<()> {
        Ok(())
    }
    fn set_scope(&mut self, scope: &Arc<ReadScope>) {
        self.excluded = scope
            .prefix
            .as_deref()
            .is_some_and(|p| self.mem.excludes_prefix(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::user_key;

    #[test]
    fn prefix_filter_rules_out_absent_prefixes_only() {
        let m = Arc::new(MemTable::with_prefix_filter(1, 2, 4096));
        for i in 0..100u32 {
            m.add(
                u64::from(i) + 1,
                ValueKind::Put,
                format!("aa{i:03}").as_bytes(),
                b"v",
            );
        }
        m.add(200, ValueKind::Put, b"b", b"short keys have no prefix");
        let scoped = |prefix: &[u8]| {
            let mut it = m.iter();
            it.set_scope(&Arc::new(ReadScope {
                prefix: Some(prefix.to_vec()),
                ..ReadScope::default()
            }));
            it.seek(&seek_key(b"", crate::key::MAX_SEQUENCE));
            it.valid()
        };
        assert!(scoped(b"aa"));
        assert!(!scoped(b"zz"));
        assert!(!m.excludes_prefix(b"aa"));
        assert!(m.excludes_prefix(b"zz"));
        // A filter of another length says nothing.
        assert!(!m.excludes_prefix(b"zzz"));
        assert!(!MemTable::new(2).excludes_prefix(b"zz"));
    }

    #[test]
    fn get_sees_newest_visible_version() {
        let m = MemTable::new(1);
        m.add(1, ValueKind::Put, b"a", b"1");
        m.add(2, ValueKind::Put, b"a", b"2");
        m.add(3, ValueKind::Delete, b"a", b"");
        m.add(4, ValueKind::Put, b"b", b"x");
        assert_eq!(m.get(b"a", 1), MemGet::Value(b"1".to_vec(), 1));
        assert_eq!(m.get(b"a", 2), MemGet::Value(b"2".to_vec(), 2));
        assert_eq!(m.get(b"a", 9), MemGet::Deleted(3));
        assert_eq!(m.get(b"b", 3), MemGet::Absent);
        assert_eq!(m.get(b"c", 9), MemGet::Absent);
        assert_eq!(m.get(b"", 9), MemGet::Absent);
        m.add(5, ValueKind::RangeDelete, b"a", b"b");
        assert_eq!(m.max_covering_tombstone(b"a", 9), 5);
        assert_eq!(m.max_covering_tombstone(b"a", 4), 0);
        assert_eq!(m.max_covering_tombstone(b"b", 9), 0);
    }

    #[test]
    fn iterates_in_order_both_ways() {
        let m = Arc::new(MemTable::new(2));
        let mut model = Vec::new();
        let mut x: u64 = 12345;
        for seq in 1..2000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = format!("{:05}", (x >> 33) % 500);
            m.add(seq, ValueKind::Put, k.as_bytes(), &seq.to_le_bytes());
            model.push(crate::key::internal_key(k.as_bytes(), seq, ValueKind::Put));
        }
        model.sort_by(|a, b| compare_internal(a, b));
        let mut it = m.iter();
        it.seek_to_first();
        let mut got = Vec::new();
        while it.valid() {
            got.push(it.key().to_vec());
            it.next();
        }
        assert_eq!(got, model);
        it.seek_to_last();
        let mut back = Vec::new();
        while it.valid() {
            back.push(it.key().to_vec());
            it.prev();
        }
        back.reverse();
        assert_eq!(back, model);
        // seek / seek_for_prev agree with binary search in the model.
        for probe in ["00000", "00250", "00499", "1"] {
            let t = seek_key(probe.as_bytes(), 1000);
            it.seek(&t);
            let i = model.partition_point(|k| compare_internal(k, &t) == Ordering::Less);
            assert_eq!(it.valid(), i < model.len());
            if it.valid() {
                assert_eq!(it.key(), model[i].as_slice());
            }
            it.seek_for_prev(&t);
            let j = model.partition_point(|k| compare_internal(k, &t) != Ordering::Greater);
            assert_eq!(it.valid(), j > 0);
            if j > 0 {
                assert_eq!(it.key(), model[j - 1].as_slice());
                assert!(user_key(it.key()) <= probe.as_bytes());
            }
        }
    }

    #[test]
    fn concurrent_readers_see_consistent_lists() {
        let m = Arc::new(MemTable::new(3));
        let writer = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for seq in 1..20_000u64 {
                    let k = (seq * 7919 % 10_007).to_be_bytes();
                    m.add(seq, ValueKind::Put, &k, &[7u8; 20]);
                }
            })
        };
        let mut readers = Vec::new();
        for _ in 0..2 {
            let m = Arc::clone(&m);
            readers.push(std::thread::spawn(move || {
                for _ in 0..50 {
                    let mut it = m.iter();
                    it.seek_to_first();
                    let mut last: Option<Vec<u8>> = None;
                    while it.valid() {
                        if let Some(l) = &last {
                            assert_eq!(compare_internal(l, it.key()), Ordering::Less);
                        }
                        assert_eq!(it.value(), &[7u8; 20]);
                        last = Some(it.key().to_vec());
                        it.next();
                    }
                }
            }));
        }
        writer.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(m.num_entries(), 19_999);
    }
}
