//! Writes one table file from entries given in order (see the grammar in `table/mod.rs`).

use std::cmp::Ordering;
use std::path::PathBuf;

use phoenix_storage::WritableFile;

use crate::error::{Error, Result};
use crate::key::{
    self, compare_internal, group_of, parse_internal_key, RangeTombstone, ValueKind, KIND_FOR_SEEK,
    MAX_SEQUENCE,
};
use crate::table::block::BlockBuilder;
use crate::table::filter::FilterBuilder;
use crate::table::format::{
    block_trailer, compress_block, BlockHandle, Compression, Footer, BLOCK_TRAILER_LEN,
};
use crate::table::{
    last_group_before, TableOptions, TableProperties, META_BLOOM, META_PREFIX_BLOOM,
    META_PROPERTIES, META_RANGE_DEL,
};

/// Buffered bytes handed to the file at once (the file itself does not buffer).
const WRITE_BUFFER_LEN: usize = 256 << 10;

/// What a finished table is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSummary {
    /// Size of the file in bytes.
    pub file_size: u64,
    /// The properties written into it.
    pub properties: TableProperties,
}

/// Builds a table file. Entries go in strictly increasing internal-key order; range
/// tombstones in any order. `finish` writes the metadata and syncs the file.
#[derive(Debug)]
pub struct TableBuilder {
    file: Box<dyn WritableFile>,
    path: PathBuf,
    opts: TableOptions,
    /// File offset of the next block (bytes written plus bytes buffered in `out`).
    offset: u64,
    out: Vec<u8>,
    data: BlockBuilder,
    index: BlockBuilder,
    filter: Option<FilterBuilder>,
    /// The prefix filter and the prefix length it is built for.
    prefix_filter: Option<(usize, FilterBuilder)>,
    /// Handle of the last data block, whose index entry waits for the next key (so the
    /// separator can be shortened).
    pending: Option<BlockHandle>,
    last_key: Vec<u8>,
    first_key: Option<Vec<u8>>,
    compressed: Vec<u8>,
    tombstones: Vec<RangeTombstone>,
    props: TableProperties,
}

impl TableBuilder {
    /// A builder writing into `file` (empty, at offset 0).
    pub fn new(file: Box<dyn WritableFile>, opts: &TableOptions) -> Self {
        let path = file.path().to_path_buf();
        let offset = file.position();
        TableBuilder {
            file,
            path,
            offset,
            out: Vec::with_capacity(WRITE_BUFFER_LEN + 8192),
            data: BlockBuilder::new(opts.restart_interval),
            index: BlockBuilder::new(opts.index_restart_interval),
            filter: (opts.bloom_bits_per_key > 0)
                .then(|| FilterBuilder::new(opts.bloom_bits_per_key)),
            prefix_filter: (opts.bloom_bits_per_key > 0 && opts.prefix_len > 0)
                .then(|| (opts.prefix_len, FilterBuilder::new(opts.bloom_bits_per_key))),
            opts: opts.clone(),
            pending: None,
            last_key: Vec::new(),
            first_key: None,
            compressed: Vec::new(),
            tombstones: Vec::new(),
            props: TableProperties {
                smallest_seq: u64::MAX,
                ..TableProperties::default()
            },
        }
    }

    /// Adds a point entry (Put or Delete) whose internal key is greater than every key
    /// added before.
    pub fn add(&mut self, ikey: &[u8], value: &[u8]) -> Result<()> {
        let parsed = parse_internal_key(ikey).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "table {}: malformed internal key of {} bytes",
                self.path.display(),
                ikey.len()
            ))
        })?;
        if parsed.kind == ValueKind::RangeDelete {
            return Err(Error::InvalidArgument(format!(
                "table {}: range deletions go through add_range_tombstone",
                self.path.display()
            )));
        }
        if self.first_key.is_some() && compare_internal(ikey, &self.last_key) != Ordering::Greater {
            return Err(Error::InvalidArgument(format!(
                "table {}: keys added out of order",
                self.path.display()
            )));
        }
        if let Some(handle) = self.pending.take() {
            let sep = separator(&self.last_key, ikey);
            self.index.add(&sep, &handle.encode());
        }
        if let Some(f) = &mut self.filter {
            f.add(parsed.user_key);
        }
        if let Some((len, f)) = &mut self.prefix_filter {
            if let Some(prefix) = parsed.user_key.get(..*len) {
                f.add(prefix);
            }
        }
        if self.first_key.is_none() {
            self.first_key = Some(ikey.to_vec());
        }
        self.last_key.clear();
        self.last_key.extend_from_slice(ikey);

        let p = &mut self.props;
        p.num_entries += 1;
        if parsed.kind == ValueKind::Delete {
            p.num_deletions += 1;
        }
        p.raw_key_bytes += ikey.len() as u64;
        p.raw_value_bytes += value.len() as u64;
        p.smallest_seq = p.smallest_seq.min(parsed.seq);
        p.largest_seq = p.largest_seq.max(parsed.seq);

        self.data.add(ikey, value);
        if self.data.size_estimate() >= self.opts.block_size {
            self.flush_data_block()?;
        }
        Ok(())
    }

    /// Adds a range tombstone `[start, end)` at `seq`.
    pub fn add_range_tombstone(&mut self, t: &RangeTombstone) -> Result<()> {
        if t.start >= t.end || t.seq > MAX_SEQUENCE {
            return Err(Error::InvalidArgument(format!(
                "table {}: range tombstone must have start < end and a 56-bit sequence",
                self.path.display()
            )));
        }
        self.props.num_range_deletions += 1;
        self.props.smallest_seq = self.props.smallest_seq.min(t.seq);
        self.props.largest_seq = self.props.largest_seq.max(t.seq);
        self.tombstones.push(t.clone());
        Ok(())
    }

    /// Point entries added.
    pub fn num_entries(&self) -> u64 {
        self.props.num_entries
    }

    /// Size the file would have if finished now, about.
    pub fn estimated_file_size(&self) -> u64 {
        self.offset + self.data.size_estimate() as u64
    }

    /// The last point key added.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.first_key.as_ref().map(|_| self.last_key.as_slice())
    }

    fn flush_data_block(&mut self) -> Result<()> {
        if self.data.is_empty() {
            return Ok(());
        }
        let raw = self.data.finish();
        let used = compress_block(raw, self.opts.compression, &mut self.compressed);
        let handle = BlockHandle {
            offset: self.offset,
            size: self.compressed.len() as u64,
        };
        self.out.extend_from_slice(&self.compressed);
        self.out
            .extend_from_slice(&block_trailer(&self.compressed, used));
        self.offset += self.compressed.len() as u64 + BLOCK_TRAILER_LEN as u64;
        self.props.data_bytes += self.compressed.len() as u64 + BLOCK_TRAILER_LEN as u64;
        self.data.reset();
        debug_assert!(self.pending.is_none());
        self.pending = Some(handle);
        if self.out.len() >= WRITE_BUFFER_LEN {
            self.file.append(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Writes an uncompressed metadata block and returns its handle.
    fn write_raw_block(&mut self, contents: &[u8]) -> BlockHandle {
        let handle = BlockHandle {
            offset: self.offset,
            size: contents.len() as u64,
        };
        self.out.extend_from_slice(contents);
        self.out
            .extend_from_slice(&block_trailer(contents, Compression::None));
        self.offset += contents.len() as u64 + BLOCK_TRAILER_LEN as u64;
        handle
    }

    /// Writes every remaining block and the footer, syncs the file and returns what it
    /// holds. The caller syncs the directory.
    pub fn finish(mut self) -> Result<TableSummary> {
        self.flush_data_block()?;
        if let Some(handle) = self.pending.take() {
            let last = self.last_key.clone();
            self.index.add(&last, &handle.encode());
        }
        let mut meta: Vec<(Vec<u8>, BlockHandle)> = Vec::with_capacity(4);

        if let Some(f) = self.filter.take().filter(|f| !f.is_empty()) {
            let contents = f.finish();
            let h = self.write_raw_block(&contents);
            self.props.filter_bytes = h.size + BLOCK_TRAILER_LEN as u64;
            meta.push((META_BLOOM.to_vec(), h));
        }
        if let Some((len, f)) = self.prefix_filter.take().filter(|(_, f)| !f.is_empty()) {
            let contents = f.finish();
            let h = self.write_raw_block(&contents);
            self.props.filter_bytes += h.size + BLOCK_TRAILER_LEN as u64;
            let mut name = META_PREFIX_BLOOM.to_vec();
            name.extend_from_slice(len.to_string().as_bytes());
            meta.push((name, h));
        }

        let mut smallest = self.first_key.clone();
        let mut largest = self.first_key.as_ref().map(|_| self.last_key.clone());
        let mut max_group = largest.as_deref().map(|k| group_of(key::user_key(k)));
        if !self.tombstones.is_empty() {
            let mut ts = std::mem::take(&mut self.tombstones);
            ts.sort_by(|a, b| a.start.cmp(&b.start).then(b.seq.cmp(&a.seq)));
            let mut rb = BlockBuilder::new(1);
            let mut written = 0u64;
            let mut i = 0;
            while i < ts.len() {
                let t = &ts[i];
                // Tombstones with the same start and sequence are one write's effect: keep
                // the widest end (it covers the others).
                let mut end = t.end.as_slice();
                let mut j = i + 1;
                while j < ts.len() && ts[j].start == t.start && ts[j].seq == t.seq {
                    end = end.max(ts[j].end.as_slice());
                    j += 1;
                }
                let k = key::internal_key(&t.start, t.seq, ValueKind::RangeDelete);
                let end_key = key::internal_key(end, MAX_SEQUENCE, ValueKind::RangeDelete);
                if smallest
                    .as_deref()
                    .is_none_or(|s| compare_internal(&k, s) == Ordering::Less)
                {
                    smallest = Some(k.clone());
                }
                if largest
                    .as_deref()
                    .is_none_or(|l| compare_internal(&end_key, l) == Ordering::Greater)
                {
                    largest = Some(end_key);
                }
                let g = last_group_before(end).max(group_of(&t.start));
                max_group = Some(max_group.map_or(g, |m: u64| m.max(g)));
                rb.add(&k, end);
                written += 1;
                i = j;
            }
            self.props.num_range_deletions = written;
            let contents = rb.finish().to_vec();
            let h = self.write_raw_block(&contents);
            meta.push((META_RANGE_DEL.to_vec(), h));
        }

        let props = {
            let p = &mut self.props;
            p.smallest_key = smallest.unwrap_or_default();
            p.largest_key = largest.unwrap_or_default();
            if p.smallest_seq == u64::MAX {
                p.smallest_seq = 0;
            }
            p.min_group = if p.smallest_key.is_empty() {
                0
            } else {
                group_of(key::user_key(&p.smallest_key))
            };
            p.max_group = max_group.unwrap_or(0).max(p.min_group);
            // The index block is written after the properties block, so its size is
            // known now: compute it from the builder.
            p.index_bytes = (self.index.size_estimate() + BLOCK_TRAILER_LEN) as u64;
            p.clone()
        };
        let h = self.write_raw_block(&props.encode());
        meta.push((META_PROPERTIES.to_vec(), h));

        meta.sort_by(|a, b| a.0.cmp(&b.0));
        let mut mb = BlockBuilder::new(1);
        for (name, h) in &meta {
            mb.add(name, &h.encode());
        }
        let metaindex_contents = mb.finish().to_vec();
        let metaindex = self.write_raw_block(&metaindex_contents);
        let index_contents = self.index.finish().to_vec();
        debug_assert_eq!(
            index_contents.len() + BLOCK_TRAILER_LEN,
            props.index_bytes as usize
        );
        let index = self.write_raw_block(&index_contents);
        self.out
            .extend_from_slice(&Footer { metaindex, index }.encode());
        self.offset += crate::table::format::FOOTER_LEN as u64;
        self.file.append(&self.out)?;
        self.out.clear();
        self.file.sync_all()?;
        Ok(TableSummary {
            file_size: self.offset,
            properties: props,
        })
    }
}

/// A short internal key `s` with `a <= s < b` (for index entries). When the user keys
/// differ, `b`'s user key cut just past the first byte where it differs from `a`'s, with
/// the largest trailer: at most one byte longer than the common prefix, and the largest
/// key of that length below `b`, so an iterator's upper bound at or below the next
/// block's first key often rules that block out by this separator alone (no block read).
/// It may equal a seek key at the newest sequence (same user key, largest trailer), so
/// a point lookup whose block holds nothing at or past it looks at the next block.
/// Otherwise `a`.
fn separator(a: &[u8], b: &[u8]) -> Vec<u8> {
    let (ua, ub) = (key::user_key(a), key::user_key(b));
    let n = ua.iter().zip(ub).take_while(|(x, y)| x == y).count();
    if ua < ub {
        // `ub[n] > ua[n]` or `ua` is a proper prefix of `ub`, so `ub[..=n] > ua`.
        let mut s = Vec::with_capacity(n + 1 + key::TRAILER_LEN);
        s.extend_from_slice(&ub[..=n]);
        s.extend_from_slice(&key::pack_trailer(MAX_SEQUENCE, KIND_FOR_SEEK).to_le_bytes());
        debug_assert_eq!(compare_internal(a, &s), Ordering::Less);
        debug_assert_eq!(compare_internal(&s, b), Ordering::Less);
        return s;
    }
    a.to_vec()
}
