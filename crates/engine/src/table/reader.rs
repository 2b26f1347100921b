//! Reads a table file: point lookups through the bloom filter and the index, and a
//! two-level iterator (index block → data blocks) over all entries.
//!
//! The index block, the filter, the properties and the range tombstones are decoded at
//! open and kept with the table; data blocks go through the block cache when there is
//! one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use phoenix_storage::ReadableFile;

use crate::error::{Error, Result};
use crate::iter::InternalIterator;
use crate::iter::ReadScope;
use crate::key::{self, compare_internal, parse_internal_key, RangeTombstone, ValueKind};
use crate::table::block::{bytewise, Block, BlockIter};
use crate::table::cache::BlockCache;
use crate::table::filter::Filter;
use crate::table::format::{
    block_from, read_block, read_blocks, BlockHandle, Footer, BLOCK_TRAILER_LEN, FOOTER_LEN,
};
use crate::table::{
    clone_error, TableProperties, META_BLOOM, META_PREFIX_BLOOM, META_PROPERTIES, META_RANGE_DEL,
};

/// An open table. `Send + Sync`; shared as `Arc<Table>`.
#[derive(Debug)]
pub struct Table {
    file: Arc<dyn ReadableFile>,
    path: Arc<PathBuf>,
    number: u64,
    size: u64,
    cache: Option<Arc<BlockCache>>,
    cache_id: u64,
    index: Arc<Block>,
    filter: Option<Filter>,
    /// The prefix filter and the prefix length it was built for.
    prefix_filter: Option<(usize, Filter)>,
    props: TableProperties,
    tombstones: Vec<RangeTombstone>,
    /// How many bytes of blocks the table's adaptive cursors read in a row lately (a
    /// moving average): where the next one starts reading ahead.
    scan_history: AtomicU64,
}

/// How a table cursor reads ahead of itself on a file whose reads are requests (an
/// object store; on a local file system the kernel reads ahead, and cursors read block
/// by block).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Readahead {
    /// One read per data block.
    #[default]
    Off,
    /// Reads grow along a forward run (seed 004 §4.1.4): the second block loaded in a
    /// row reads two blocks' worth, or as far as the table's cursors read in a row
    /// lately if that is more, and each read ahead after doubles, up to `max` bytes. A
    /// table its cursors lately read far is read ahead from the first block.
    Adaptive {
        /// The most a read ahead takes, in bytes.
        max: usize,
    },
    /// Every read takes at least this many bytes (compaction inputs, read whole).
    Fixed(usize),
}

/// What a cursor read ahead of itself, and how its reads go on.
#[derive(Debug)]
struct Prefetch {
    policy: Readahead,
    /// Bytes of the file from `start`, read ahead.
    start: u64,
    buf: Vec<u8>,
    /// How much the next read ahead takes (adaptive: doubles up to the maximum).
    next: u64,
    /// Where the block loaded last ends (with its trailer): a load there goes on a run.
    run_end: u64,
    /// Bytes of the blocks loaded in a row so far, in file order.
    run: u64,
    /// Where reading ahead stops: the end of the data block holding the keys just
    /// below the scope's upper bound (`u64::MAX`: no bound).
    limit: u64,
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch {
            policy: Readahead::Off,
            start: 0,
            buf: Vec::new(),
            next: 0,
            run_end: 0,
            run: 0,
            limit: u64::MAX,
        }
    }
}

impl Prefetch {
    /// Whether block `h` is among the bytes read ahead.
    fn holds(&self, h: BlockHandle) -> bool {
        h.offset >= self.start
            && h.offset
                .saturating_add(h.size)
                .saturating_add(BLOCK_TRAILER_LEN as u64)
                <= self.start.saturating_add(self.buf.len() as u64)
    }
}

impl Table {
    /// Opens table `number` whose file holds `size` bytes.
    pub fn open(
        file: Arc<dyn ReadableFile>,
        number: u64,
        size: u64,
        cache: Option<Arc<BlockCache>>,
    ) -> Result<Table> {
        let path = Arc::new(file.path().to_path_buf());
        if size < FOOTER_LEN as u64 {
            return Err(Error::corruption(
                path.as_path(),
                0,
                format!("file of {size} bytes is too short to be a table"),
            ));
        }
        let footer_at = size - FOOTER_LEN as u64;
        let mut fbuf = [0u8; FOOTER_LEN];
        file.read_exact_at(footer_at, &mut fbuf)?;
        let footer = Footer::decode(&fbuf, &path, footer_at)?;

        let read = |h: BlockHandle| -> Result<Arc<Block>> {
            let data = read_block(&*file, size, h, &path)?;
            Ok(Arc::new(Block::new(data, Arc::clone(&path), h.offset)?))
        };
        let metaindex = read(footer.metaindex)?;
        let mut meta = metaindex.iter(bytewise, 0);
        let mut bloom = None;
        let mut props = None;
        let mut range_del = None;
        let mut prefix_bloom = None;
        meta.seek_to_first();
        while meta.valid() {
            let prefix_len = meta
                .key()
                .strip_prefix(META_PREFIX_BLOOM)
                .and_then(|l| std::str::from_utf8(l).ok())
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|&l| l > 0);
            let slot = match meta.key() {
                _ if prefix_len.is_some() => {
                    let h = BlockHandle::decode_exact(meta.value()).ok_or_else(|| {
                        Error::corruption(
                            path.as_path(),
                            meta.file_offset(),
                            "bad metaindex handle",
                        )
                    })?;
                    prefix_bloom = prefix_len.map(|l| (l, h));
                    meta.next();
                    continue;
                }
                k if k == META_BLOOM => &mut bloom,
                k if k == META_PROPERTIES => &mut props,
                k if k == META_RANGE_DEL => &mut range_del,
                // Unknown meta blocks are skipped (a later format may add some).
                _ => {
                    meta.next();
                    continue;
                }
            };
            let h = BlockHandle::decode_exact(meta.value()).ok_or_else(|| {
                Error::corruption(path.as_path(), meta.file_offset(), "bad metaindex handle")
            })?;
            *slot = Some(h);
            meta.next();
        }
        meta.status()?;

        let props_handle = props.ok_or_else(|| {
            Error::corruption(
                path.as_path(),
                footer.metaindex.offset,
                "table has no properties block",
            )
        })?;
        let pdata = read_block(&*file, size, props_handle, &path)?;
        let props = TableProperties::decode(&pdata).map_err(|(at, what)| {
            Error::corruption(
                path.as_path(),
                props_handle.offset + at as u64,
                format!("properties: {what}"),
            )
        })?;

        let read_filter = |h: BlockHandle| -> Result<Filter> {
            let data = read_block(&*file, size, h, &path)?;
            Filter::new(data).map_err(|what| {
                Error::corruption(path.as_path(), h.offset, format!("filter: {what}"))
            })
        };
        let filter = bloom.map(read_filter).transpose()?;
        let prefix_filter = match prefix_bloom {
            Some((len, h)) => Some((len, read_filter(h)?)),
            None => None,
        };

        let mut tombstones = Vec::new();
        if let Some(h) = range_del {
            let block = read(h)?;
            let mut it = block.iter(compare_internal, key::TRAILER_LEN);
            it.seek_to_first();
            while it.valid() {
                let bad = |what: &str| Error::corruption(path.as_path(), it.file_offset(), what);
                let p = parse_internal_key(it.key())
                    .filter(|p| p.kind == ValueKind::RangeDelete)
                    .ok_or_else(|| bad("range-deletion entry is not a range-deletion key"))?;
                if p.user_key >= it.value() {
                    return Err(bad("range tombstone with start >= end"));
                }
                tombstones.push(RangeTombstone {
                    start: p.user_key.to_vec(),
                    end: it.value().to_vec(),
                    seq: p.seq,
                });
                it.next();
            }
            it.status()?;
        }
        if tombstones.len() as u64 != props.num_range_deletions {
            return Err(Error::corruption(
                path.as_path(),
                props_handle.offset,
                format!(
                    "properties count {} range deletions, the table holds {}",
                    props.num_range_deletions,
                    tombstones.len()
                ),
            ));
        }

        let index = read(footer.index)?;
        let cache_id = cache.as_ref().map_or(0, |c| c.new_id());
        Ok(Table {
            file,
            path,
            number,
            size,
            cache,
            cache_id,
            index,
            filter,
            prefix_filter,
            props,
            tombstones,
            scan_history: AtomicU64::new(0),
        })
    }

    /// Data block `h` for a cursor reading ahead as `pf` says: from the block cache,
    /// from what the cursor read ahead, or read with more of the file after it.
    fn block_ahead(
        &self,
        h: BlockHandle,
        fill_cache: bool,
        pf: &mut Prefetch,
        forward: bool,
    ) -> Result<Arc<Block>> {
        if pf.policy == Readahead::Off {
            return self.block(h, fill_cache);
        }
        let len = h.size.saturating_add(BLOCK_TRAILER_LEN as u64);
        let in_a_row = forward && pf.run > 0 && pf.run_end == h.offset;
        if !in_a_row {
            self.note_run(pf);
            pf.run = 0;
            pf.next = 0;
        }
        if !forward {
            // A backward move reads the block alone and starts no run.
            pf.buf = Vec::new();
            return self.block(h, fill_cache);
        }
        pf.run = pf.run.saturating_add(len);
        pf.run_end = h.offset.saturating_add(len);
        if let Some(c) = &self.cache {
            if let Some(b) = c.get(self.cache_id, h.offset) {
                return Ok(b);
            }
        }
        let data = match block_from(&pf.buf, pf.start, self.size, h, &self.path) {
            Some(data) => {
                if pf.run_end >= pf.start.saturating_add(pf.buf.len() as u64) {
                    // Its last block served: the bytes go.
                    pf.buf = Vec::new();
                }
                data?
            }
            None => {
                // A block at hand without waiting (on flash) is read alone: reading ahead
                // would wait on the store for the rest.
                let want = if self.file.read_waits(h.offset, len as usize) {
                    self.readahead(len, in_a_row, pf)
                } else {
                    0
                };
                // Read ahead within the data blocks (the index and filters are in memory)
                // and the cursor's scope.
                let end = h
                    .offset
                    .saturating_add(want)
                    .min(self.props.data_bytes)
                    .min(pf.limit)
                    .min(self.size);
                if end > pf.run_end {
                    let mut buf = vec![0u8; (end - h.offset) as usize];
                    self.file.read_exact_at(h.offset, &mut buf)?;
                    pf.start = h.offset;
                    pf.buf = buf;
                    match block_from(&pf.buf, pf.start, self.size, h, &self.path) {
                        Some(data) => data?,
                        None => read_block(&*self.file, self.size, h, &self.path)?,
                    }
                } else {
                    read_block(&*self.file, self.size, h, &self.path)?
                }
            }
        };
        let block = Arc::new(Block::new(data, Arc::clone(&self.path), h.offset)?);
        if let Some(c) = self.cache.as_ref().filter(|_| fill_cache) {
            c.insert(self.cache_id, h.offset, Arc::clone(&block));
        }
        Ok(block)
    }

    /// How many bytes to read from a block of `len` bytes on (0: the block alone).
    fn readahead(&self, len: u64, in_a_row: bool, pf: &mut Prefetch) -> u64 {
        if !self.file.reads_at_once() {
            return 0;
        }
        match pf.policy {
            Readahead::Off => 0,
            Readahead::Fixed(n) => n as u64,
            Readahead::Adaptive { max } => {
                let history = self.scan_history.load(Ordering::Relaxed);
                let want = if in_a_row {
                    pf.next.max(2 * len).max(history)
                } else if history >= 2 * len {
                    history
                } else {
                    return 0;
                };
                let want = want.min(max as u64);
                pf.next = want.saturating_mul(2).min(max as u64);
                want
            }
        }
    }

    /// The end of the data block holding the keys just below user key `upper` (where a
    /// cursor bounded by it stops reading).
    fn end_below(&self, upper: &[u8]) -> u64 {
        match self.seek_block(&key::seek_key(upper, key::MAX_SEQUENCE)) {
            Some(h) => h
                .offset
                .saturating_add(h.size)
                .saturating_add(BLOCK_TRAILER_LEN as u64),
            None => u64::MAX,
        }
    }

    /// Takes an adaptive cursor's run of blocks read in a row into the table's history.
    fn note_run(&self, pf: &Prefetch) {
        if matches!(pf.policy, Readahead::Adaptive { .. }) && pf.run > 0 {
            // The latest run weighs a quarter: a few cursors' habit, not one's.
            let old = self.scan_history.load(Ordering::Relaxed);
            let new = old.saturating_mul(3).saturating_add(pf.run) / 4;
            self.scan_history.store(new, Ordering::Relaxed);
        }
    }

    /// The data block `h`, from the cache when it is there; a block read from the file
    /// enters the cache only with `fill_cache`.
    fn block(&self, h: BlockHandle, fill_cache: bool) -> Result<Arc<Block>> {
        if let Some(c) = &self.cache {
            if let Some(b) = c.get(self.cache_id, h.offset) {
                return Ok(b);
            }
        }
        let data = read_block(&*self.file, self.size, h, &self.path)?;
        let block = Arc::new(Block::new(data, Arc::clone(&self.path), h.offset)?);
        if let Some(c) = self.cache.as_ref().filter(|_| fill_cache) {
            c.insert(self.cache_id, h.offset, Arc::clone(&block));
        }
        Ok(block)
    }

    fn handle_at(&self, index: &BlockIter) -> Result<BlockHandle> {
        BlockHandle::decode_exact(index.value()).ok_or_else(|| {
            Error::corruption(
                self.path.as_path(),
                index.file_offset(),
                "bad data block handle in the index",
            )
        })
    }

    /// The first entry `>= seek_key` whose user key equals `seek_key`'s, if any (the
    /// bloom filter is checked first). Range tombstones are not applied here. Blocks read
    /// enter the block cache only with `fill_cache`.
    pub fn get(&self, seek_key: &[u8], fill_cache: bool) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.get_with(seek_key, fill_cache, &HashMap::new())
    }

    /// [`Table::get`] of each key of `seek_keys`. With `parallel`, on a file that does
    /// its reads at once (a table on an object store), the first data block each key
    /// may be in (its filter passing) is read in one batch first, so the keys wait on
    /// one round of requests rather than one per block (seed 004 §4.1.4's parallel I/O
    /// for MultiGet).
    pub fn multi_get(
        &self,
        seek_keys: &[&[u8]],
        fill_cache: bool,
        parallel: bool,
    ) -> Result<Vec<Option<Entry>>> {
        let mut fetched = HashMap::new();
        if parallel && seek_keys.len() > 1 && self.file.reads_at_once() {
            let mut wanted: Vec<BlockHandle> = Vec::new();
            for k in seek_keys {
                if k.len() < key::TRAILER_LEN {
                    continue; // (get_with says why)
                }
                if self
                    .filter
                    .as_ref()
                    .is_some_and(|f| !f.may_contain(key::user_key(k)))
                {
                    continue;
                }
                let mut ix = self.index.iter(compare_internal, key::TRAILER_LEN);
                ix.seek(k);
                if !ix.valid() {
                    ix.status()?;
                    continue;
                }
                let h = self.handle_at(&ix)?;
                let cached = self
                    .cache
                    .as_ref()
                    .is_some_and(|c| c.get(self.cache_id, h.offset).is_some());
                if !cached && !wanted.contains(&h) {
                    wanted.push(h);
                }
            }
            if wanted.len() > 1 {
                let data = read_blocks(&*self.file, self.size, &wanted, &self.path)?;
                for (h, data) in wanted.iter().zip(data) {
                    let block = Arc::new(Block::new(data, Arc::clone(&self.path), h.offset)?);
                    if let Some(c) = self.cache.as_ref().filter(|_| fill_cache) {
                        c.insert(self.cache_id, h.offset, Arc::clone(&block));
                    }
                    fetched.insert(h.offset, block);
                }
            }
        }
        seek_keys
            .iter()
            .map(|k| self.get_with(k, fill_cache, &fetched))
            .collect()
    }

    /// [`Table::get`], taking the data blocks in `fetched` (by offset) as read.
    fn get_with(
        &self,
        seek_key: &[u8],
        fill_cache: bool,
        fetched: &HashMap<u64, Arc<Block>>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if seek_key.len() < key::TRAILER_LEN {
            return Err(Error::InvalidArgument(format!(
                "seek key of {} bytes is shorter than a trailer",
                seek_key.len()
            )));
        }
        let uk = key::user_key(seek_key);
        if let Some(f) = &self.filter {
            if !f.may_contain(uk) {
                return Ok(None);
            }
        }
        let mut ix = self.index.iter(compare_internal, key::TRAILER_LEN);
        ix.seek(seek_key);
        // A separator may equal the seek key (both carry the largest trailer when the
        // seek is at the newest sequence): its block then holds only smaller keys, and
        // the entry sought, if any, opens the next block.
        for _ in 0..2 {
            if !ix.valid() {
                ix.status()?;
                return Ok(None);
            }
            let h = self.handle_at(&ix)?;
            let block = match fetched.get(&h.offset) {
                Some(b) => Arc::clone(b),
                None => self.block(h, fill_cache)?,
            };
            let mut it = block.iter(compare_internal, key::TRAILER_LEN);
            it.seek(seek_key);
            it.status()?;
            if it.valid() {
                if key::user_key(it.key()) == uk {
                    return Ok(Some((it.key().to_vec(), it.value().to_vec())));
                }
                return Ok(None);
            }
            ix.next();
        }
        Ok(None)
    }

    /// Whether the table surely holds no key starting with `prefix` (false when it has
    /// no prefix filter of `prefix`'s length).
    pub fn excludes_prefix(&self, prefix: &[u8]) -> bool {
        self.prefix_filter
            .as_ref()
            .is_some_and(|(len, f)| *len == prefix.len() && !f.may_contain(prefix))
    }

    /// The data block a seek to `target` lands in (`None`: past the last entry, or a bad
    /// handle, which the seek itself reports). The index is in memory: nothing is read.
    fn seek_block(&self, target: &[u8]) -> Option<BlockHandle> {
        let mut index = self.index.iter(compare_internal, key::TRAILER_LEN);
        index.seek(target);
        if !index.valid() {
            return None;
        }
        self.handle_at(&index).ok()
    }

    /// Whether block `h` is in the block cache.
    fn cached(&self, h: BlockHandle) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|c| c.get(self.cache_id, h.offset).is_some())
    }

    /// Whether block `h` is neither in the block cache nor in reach without waiting on a
    /// remote store (a local file, the flash cache).
    fn read_waits(&self, h: BlockHandle) -> bool {
        !self.cached(h)
            && self
                .file
                .read_waits(h.offset, h.size as usize + BLOCK_TRAILER_LEN)
    }

    /// Whether a seek to `target` would wait on a remote read of its data block.
    pub fn seek_would_read(&self, target: &[u8]) -> bool {
        self.seek_block(target).is_some_and(|h| self.read_waits(h))
    }

    /// A cursor over the table's point entries; the blocks it reads enter the cache.
    pub fn iter(self: &Arc<Self>) -> TableIter {
        self.iter_with(true)
    }

    /// A cursor whose blocks read from the file enter the block cache only with
    /// `fill_cache` (scans and compactions leave the cache to point reads).
    pub fn iter_with(self: &Arc<Self>, fill_cache: bool) -> TableIter {
        TableIter {
            fill_cache,
            index: self.index.iter(compare_internal, key::TRAILER_LEN),
            table: Arc::clone(self),
            data: None,
            data_offset: 0,
            err: None,
            scope: None,
            excluded: false,
            ahead: Prefetch::default(),
        }
    }

    /// The table's range tombstones, ordered by start key then newest first.
    pub fn range_tombstones(&self) -> &[RangeTombstone] {
        &self.tombstones
    }

    /// The table's properties.
    pub fn properties(&self) -> &TableProperties {
        &self.props
    }

    /// The table's file number.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The table's file size.
    pub fn file_size(&self) -> u64 {
        self.size
    }

    /// The table's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// About how many bytes of the file precede `ikey`'s entry (the offset of the data
    /// block that would hold it; the end of the data for keys past the last).
    pub fn approximate_offset_of(&self, ikey: &[u8]) -> u64 {
        let mut ix = self.index.iter(compare_internal, key::TRAILER_LEN);
        ix.seek(ikey);
        if ix.valid() {
            if let Ok(h) = self.handle_at(&ix) {
                return h.offset;
            }
        }
        self.props.data_bytes
    }
}

/// An entry found: its internal key and value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A two-level cursor over a table: the index block picks data blocks.
#[derive(Debug)]
pub struct TableIter {
    table: Arc<Table>,
    index: BlockIter,
    data: Option<BlockIter>,
    data_offset: u64,
    err: Option<Error>,
    fill_cache: bool,
    /// What the reads are confined to: no block wholly past it is read.
    scope: Option<Arc<ReadScope>>,
    /// The scope's prefix is ruled out by the prefix filter: every seek finds nothing.
    excluded: bool,
    /// What the cursor read ahead (on a file whose reads are requests).
    ahead: Prefetch,
}

impl Drop for TableIter {
    fn drop(&mut self) {
        self.table.note_run(&self.ahead);
    }
}

impl TableIter {
    /// The cursor reads ahead as `r` says (on a file whose reads are requests).
    pub fn with_readahead(mut self, r: Readahead) -> Self {
        self.ahead.policy = r;
        self
    }

    /// Whether the block after the current index entry's lies wholly past the scope's
    /// upper bound: the entry's separator is >= every key of its block and < every key
    /// of the next, so the next block's user keys are >= the separator's.
    fn next_block_out_of_scope(&self) -> bool {
        self.scope.as_ref().is_some_and(|s| {
            s.upper.is_some()
                && self.index.valid()
                && s.above_upper(key::user_key(self.index.key()))
        })
    }

    /// Whether the current index entry's block lies wholly before the scope's lower
    /// bound: its separator is >= every key of the block, and a separator with the
    /// largest trailer is above every entry of its own user key too.
    fn block_below_scope(&self) -> bool {
        let Some(lower) = self.scope.as_ref().and_then(|s| s.lower.as_deref()) else {
            return false;
        };
        if !self.index.valid() {
            return false;
        }
        let sep = self.index.key();
        let uk = key::user_key(sep);
        uk < lower
            || (uk == lower
                && key::trailer(sep) == key::pack_trailer(key::MAX_SEQUENCE, key::KIND_FOR_SEEK))
    }

    fn set_error(&mut self, e: Error) {
        if self.err.is_none() {
            self.err = Some(e);
        }
        self.data = None;
    }

    /// Points `data` at the block named by the index's current entry; `forward` when
    /// the cursor moves towards larger keys (only those moves read ahead).
    fn load(&mut self, forward: bool) -> bool {
        if !self.index.valid() {
            self.data = None;
            if let Err(e) = self.index.status() {
                self.set_error(e);
            }
            return false;
        }
        let h = match self.table.handle_at(&self.index) {
            Ok(h) => h,
            Err(e) => {
                self.set_error(e);
                return false;
            }
        };
        if self.data.is_some() && self.data_offset == h.offset {
            return true;
        }
        match self
            .table
            .block_ahead(h, self.fill_cache, &mut self.ahead, forward)
        {
            Ok(b) => {
                self.data = Some(b.iter(compare_internal, key::TRAILER_LEN));
                self.data_offset = h.offset;
                true
            }
            Err(e) => {
                self.set_error(e);
                false
            }
        }
    }

    /// Whether the data cursor is done: on an entry (false) or exhausted (true). Moves a
    /// data-block error to `err`.
    fn data_exhausted(&mut self) -> Option<bool> {
        if self.err.is_some() {
            return None;
        }
        let d = self.data.as_ref()?;
        if d.valid() {
            return Some(false);
        }
        if let Err(e) = d.status() {
            self.set_error(e);
            return None;
        }
        Some(true)
    }

    fn skip_forward(&mut self) {
        while let Some(true) = self.data_exhausted() {
            if self.next_block_out_of_scope() {
                self.data = None;
                return;
            }
            self.index.next();
            if !self.load(true) {
                return;
            }
            if let Some(d) = &mut self.data {
                d.seek_to_first();
            }
        }
    }

    fn skip_backward(&mut self) {
        while let Some(true) = self.data_exhausted() {
            self.index.prev();
            if self.block_below_scope() {
                self.data = None;
                return;
            }
            if !self.load(false) {
                return;
            }
            if let Some(d) = &mut self.data {
                d.seek_to_last();
            }
        }
    }
}

impl InternalIterator for TableIter {
    #[inline]
    fn valid(&self) -> bool {
        self.err.is_none() && self.data.as_ref().is_some_and(|d| d.valid())
    }

    fn seek_to_first(&mut self) {
        if self.excluded {
            self.data = None;
            return;
        }
        self.index.seek_to_first();
        if self.load(true) {
            if let Some(d) = &mut self.data {
                d.seek_to_first();
            }
        }
        self.skip_forward();
    }

    fn seek_to_last(&mut self) {
        if self.excluded {
            self.data = None;
            return;
        }
        self.index.seek_to_last();
        if self.load(false) {
            if let Some(d) = &mut self.data {
                d.seek_to_last();
            }
        }
        self.skip_backward();
    }

    fn seek_would_read(&self, target: &[u8]) -> bool {
        // (The block this cursor holds is not read again: `load`.)
        !self.excluded
            && self.table.seek_block(target).is_some_and(|h| {
                // (Nor one it read ahead.)
                let held = self.data.is_some() && self.data_offset == h.offset;
                !(held || self.ahead.holds(h)) && self.table.read_waits(h)
            })
    }

    fn seek(&mut self, target: &[u8]) {
        if self.excluded {
            self.data = None;
            return;
        }
        self.index.seek(target);
        if self.load(true) {
            if let Some(d) = &mut self.data {
                d.seek(target);
            }
        }
        self.skip_forward();
    }

    fn seek_for_prev(&mut self, target: &[u8]) {
        if self.excluded {
            self.data = None;
            return;
        }
        self.index.seek(target);
        if !self.index.valid() {
            if let Err(e) = self.index.status() {
                self.set_error(e);
                return;
            }
            self.index.seek_to_last();
        }
        if self.load(false) {
            if let Some(d) = &mut self.data {
                d.seek_for_prev(target);
            }
        }
        self.skip_backward();
    }

    #[inline]
    fn next(&mut self) {
        debug_assert!(self.valid());
        if let Some(d) = &mut self.data {
            d.next();
            if d.valid() {
                return;
            }
        }
        self.skip_forward();
    }

    fn prev(&mut self) {
        debug_assert!(self.valid());
        if let Some(d) = &mut self.data {
            d.prev();
        }
        self.skip_backward();
    }

    #[inline]
    fn key(&self) -> &[u8] {
        self.data.as_ref().map_or(&[], |d| d.key())
    }

    #[inline]
    fn value(&self) -> &[u8] {
        self.data.as_ref().map_or(&[], |d| d.value())
    }

    fn status(&self) -> Result<()> {
        if let Some(e) = &self.err {
            return Err(clone_error(e));
        }
        self.index.status()?;
        match &self.data {
            Some(d) => d.status(),
            None => Ok(()),
        }
    }

    fn set_scope(&mut self, scope: &Arc<ReadScope>) {
        self.excluded = scope
            .prefix
            .as_deref()
            .is_some_and(|p| self.table.excludes_prefix(p));
        self.ahead.limit = match scope.upper.as_deref() {
            Some(u) if self.ahead.policy != Readahead::Off => self.table.end_below(u),
            _ => u64::MAX,
        };
        self.scope = Some(Arc::clone(scope));
    }
}
