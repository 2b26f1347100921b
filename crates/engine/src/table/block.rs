//! Blocks: sorted key/value entries with prefix-compressed keys and restart points, and a
//! cursor over them that binary-searches the restart points.
//!
//! Byte grammar of a block's (uncompressed) contents:
//!
//! ```text
//! block    := entry* restart* num_restarts
//! entry    := shared varint32 ‖ non_shared varint32 ‖ value_len varint32
//!             ‖ key_delta[non_shared] ‖ value[value_len]
//! restart  := u32 little-endian offset of an entry whose shared == 0
//! num_restarts := u32 little-endian, >= 1
//! ```
//!
//! An entry's key is the first `shared` bytes of the previous entry's key followed by
//! `key_delta`. Every `restart_interval` entries a restart point stores the whole key, so a
//! seek binary-searches the restart points and then scans at most one interval.
//!
//! Every offset read from the block is checked against the block's bounds: a corrupt
//! block yields a corruption error naming the file and the byte offset inside the file,
//! never a panic or an out-of-bounds read.

use std::cmp::Ordering;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::iter::InternalIterator;
use crate::table::format::{get_varint32, put_varint32, read_u32_le};

/// Orders the keys of a block.
pub type KeyCmp = fn(&[u8], &[u8]) -> Ordering;

/// Bytewise order (metaindex block).
pub fn bytewise(a: &[u8], b: &[u8]) -> Ordering {
    a.cmp(b)
}

/// Builds one block.
#[derive(Debug)]
pub struct BlockBuilder {
    buf: Vec<u8>,
    restarts: Vec<u32>,
    counter: usize,
    restart_interval: usize,
    last_key: Vec<u8>,
    entries: usize,
}

impl BlockBuilder {
    /// A builder that stores a whole key every `restart_interval` entries.
    pub fn new(restart_interval: usize) -> Self {
        BlockBuilder {
            buf: Vec::with_capacity(4096 + 512),
            restarts: vec![0],
            counter: 0,
            restart_interval: restart_interval.max(1),
            last_key: Vec::new(),
            entries: 0,
        }
    }

    /// Appends an entry. Keys must be added in increasing order (the caller checks).
    pub fn add(&mut self, key: &[u8], value: &[u8]) {
        let shared = if self.counter < self.restart_interval {
            self.last_key
                .iter()
                .zip(key)
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            self.restarts.push(self.buf.len() as u32);
            self.counter = 0;
            0
        };
        let non_shared = key.len() - shared;
        put_varint32(&mut self.buf, shared as u32);
        put_varint32(&mut self.buf, non_shared as u32);
        put_varint32(&mut self.buf, value.len() as u32);
        self.buf.extend_from_slice(&key[shared..]);
        self.buf.extend_from_slice(value);
        self.last_key.truncate(shared);
        self.last_key.extend_from_slice(&key[shared..]);
        self.counter += 1;
        self.entries += 1;
    }

    /// Size of the block if finished now.
    pub fn size_estimate(&self) -> usize {
        self.buf.len() + self.restarts.len() * 4 + 4
    }

    /// Whether no entry was added since the last reset.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The last key added.
    pub fn last_key(&self) -> &[u8] {
        &self.last_key
    }

    /// Appends the restart array and returns the block's contents; call `reset` before
    /// adding again.
    pub fn finish(&mut self) -> &[u8] {
        for r in &self.restarts {
            self.buf.extend_from_slice(&r.to_le_bytes());
        }
        self.buf
            .extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        &self.buf
    }

    /// Empties the builder for the next block.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.restarts.clear();
        self.restarts.push(0);
        self.counter = 0;
        self.last_key.clear();
        self.entries = 0;
    }
}

/// A decoded block, shared by the block cache and the cursors reading it.
#[derive(Debug)]
pub struct Block {
    data: Vec<u8>,
    restart_offset: usize,
    num_restarts: usize,
    file: Arc<PathBuf>,
    offset: u64,
}

impl Block {
    /// Wraps the contents of the block found at `offset` of `file`, checking the restart
    /// array.
    pub fn new(data: Vec<u8>, file: Arc<PathBuf>, offset: u64) -> Result<Block> {
        let bad = |at: usize, what: String| Error::corruption(&*file, offset + at as u64, what);
        if data.len() < 4 {
            return Err(bad(
                0,
                format!("block of {} bytes is too short", data.len()),
            ));
        }
        let num_at = data.len() - 4;
        let num_restarts = read_u32_le(&data, num_at).unwrap_or(0) as usize;
        let max_restarts = num_at / 4;
        if num_restarts == 0 || num_restarts > max_restarts {
            return Err(bad(
                num_at,
                format!("block claims {num_restarts} restart points, room for {max_restarts}"),
            ));
        }
        let restart_offset = num_at - num_restarts * 4;
        let mut prev = None;
        for i in 0..num_restarts {
            let at = restart_offset + 4 * i;
            let r = read_u32_le(&data, at).unwrap_or(u32::MAX) as usize;
            // Restart points lie inside the entries and increase; only an empty block has
            // its single restart at the end of the (empty) entries.
            let in_bounds = r < restart_offset || (r == 0 && restart_offset == 0);
            if !in_bounds || prev.is_some_and(|p| r <= p) {
                return Err(bad(
                    at,
                    format!("restart point {i} ({r}) is out of order or bounds"),
                ));
            }
            prev = Some(r);
        }
        Ok(Block {
            data,
            restart_offset,
            num_restarts,
            file,
            offset,
        })
    }

    /// Bytes of memory the block holds (what the block cache charges).
    pub fn charge(&self) -> usize {
        self.data.capacity() + std::mem::size_of::<Block>()
    }

    /// File offset of the block.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file the block came from.
    pub fn file(&self) -> &Arc<PathBuf> {
        &self.file
    }

    #[inline]
    fn restart_point(&self, i: usize) -> usize {
        read_u32_le(&self.data, self.restart_offset + 4 * i).unwrap_or(0) as usize
    }

    /// A cursor over the block ordered by `cmp`; every key must be at least
    /// `min_key_len` bytes (8 for internal keys) or the cursor reports corruption.
    pub fn iter(self: &Arc<Self>, cmp: KeyCmp, min_key_len: usize) -> BlockIter {
        BlockIter {
            current: self.restart_offset,
            next_offset: self.restart_offset,
            restart_index: self.num_restarts,
            block: Arc::clone(self),
            cmp,
            min_key_len,
            key: Vec::new(),
            value: (0, 0),
            err: None,
        }
    }
}

/// One decoded entry header: shared, non_shared, value_len, header length.
#[inline]
fn decode_entry(data: &[u8], pos: usize, limit: usize) -> Option<(usize, usize, usize, usize)> {
    let p = data.get(pos..limit)?;
    // Fast path: all three lengths fit one byte each.
    if p.len() >= 3 && (p[0] | p[1] | p[2]) < 0x80 {
        let (s, n, v) = (p[0] as usize, p[1] as usize, p[2] as usize);
        return (3 + n + v <= p.len()).then_some((s, n, v, 3));
    }
    let (s, a) = get_varint32(p)?;
    let (n, b) = get_varint32(p.get(a..)?)?;
    let (v, c) = get_varint32(p.get(a + b..)?)?;
    let h = a + b + c;
    let total = h.checked_add(n as usize)?.checked_add(v as usize)?;
    (total <= p.len()).then_some((s as usize, n as usize, v as usize, h))
}

/// A cursor over one block.
#[derive(Debug)]
pub struct BlockIter {
    block: Arc<Block>,
    cmp: KeyCmp,
    min_key_len: usize,
    /// Offset of the current entry; `restart_offset` when not positioned.
    current: usize,
    /// Offset just past the current entry.
    next_offset: usize,
    /// Index of the restart interval holding `current`.
    restart_index: usize,
    key: Vec<u8>,
    value: (usize, usize),
    err: Option<(u64, String)>,
}

impl BlockIter {
    fn corrupt(&mut self, at: usize, what: impl Into<String>) {
        if self.err.is_none() {
            self.err = Some((self.block.offset + at as u64, what.into()));
        }
        self.invalidate();
    }

    fn invalidate(&mut self) {
        self.current = self.block.restart_offset;
        self.next_offset = self.block.restart_offset;
        self.restart_index = self.block.num_restarts;
    }

    fn seek_to_restart(&mut self, i: usize) {
        self.key.clear();
        self.restart_index = i;
        self.next_offset = self.block.restart_point(i);
    }

    /// Decodes the entry at `next_offset`; false at the end or on corruption.
    fn parse_next(&mut self) -> bool {
        self.current = self.next_offset;
        let limit = self.block.restart_offset;
        if self.current >= limit {
            self.invalidate();
            return false;
        }
        let pos = self.current;
        let Some((shared, non_shared, value_len, h)) = decode_entry(&self.block.data, pos, limit)
        else {
            self.corrupt(pos, "bad block entry header or length");
            return false;
        };
        if shared > self.key.len() {
            self.corrupt(
                pos,
                format!(
                    "entry shares {shared} key bytes, previous key has {}",
                    self.key.len()
                ),
            );
            return false;
        }
        let kstart = pos + h;
        self.key.truncate(shared);
        self.key
            .extend_from_slice(&self.block.data[kstart..kstart + non_shared]);
        if self.key.len() < self.min_key_len {
            self.corrupt(
                pos,
                format!("key of {} bytes is shorter than a trailer", self.key.len()),
            );
            return false;
        }
        self.value = (kstart + non_shared, value_len);
        self.next_offset = kstart + non_shared + value_len;
        while self.restart_index + 1 < self.block.num_restarts
            && self.block.restart_point(self.restart_index + 1) <= self.current
        {
            self.restart_index += 1;
        }
        true
    }

    /// The key stored whole at restart point `i`.
    fn restart_key(&mut self, i: usize) -> Option<(usize, usize)> {
        let pos = self.block.restart_point(i);
        match decode_entry(&self.block.data, pos, self.block.restart_offset) {
            Some((0, n, _, h)) if n >= self.min_key_len => Some((pos + h, n)),
            _ => {
                self.corrupt(pos, format!("bad entry at restart point {i}"));
                None
            }
        }
    }

    /// Offset of the current entry inside the file (for error messages).
    pub fn file_offset(&self) -> u64 {
        self.block.offset + self.current as u64
    }
}

impl InternalIterator for BlockIter {
    #[inline]
    fn valid(&self) -> bool {
        self.current < self.block.restart_offset
    }

    fn seek_to_first(&mut self) {
        self.err = None;
        self.seek_to_restart(0);
        self.parse_next();
    }

    fn seek_to_last(&mut self) {
        self.err = None;
        self.seek_to_restart(self.block.num_restarts - 1);
        while self.parse_next() && self.next_offset < self.block.restart_offset {}
    }

    fn seek(&mut self, target: &[u8]) {
        self.err = None;
        if self.block.restart_offset == 0 {
            self.invalidate();
            return;
        }
        // Find the last restart point whose key is < target.
        let (mut left, mut right) = (0usize, self.block.num_restarts - 1);
        while left < right {
            let mid = (left + right).div_ceil(2);
            let Some((start, len)) = self.restart_key(mid) else {
                return;
            };
            let k = &self.block.data[start..start + len];
            if (self.cmp)(k, target) == Ordering::Less {
                left = mid;
            } else {
                right = mid - 1;
            }
        }
        self.seek_to_restart(left);
        while self.parse_next() {
            if (self.cmp)(&self.key, target) != Ordering::Less {
                return;
            }
        }
    }

    fn seek_for_prev(&mut self, target: &[u8]) {
        self.seek(target);
        if self.err.is_some() {
            return;
        }
        if !self.valid() {
            self.seek_to_last();
        } else if (self.cmp)(&self.key, target) == Ordering::Greater {
            self.prev();
        }
    }

    fn next(&mut self) {
        debug_assert!(self.valid());
        self.parse_next();
    }

    fn prev(&mut self) {
        debug_assert!(self.valid());
        let original = self.current;
        while self.block.restart_point(self.restart_index) >= original {
            if self.restart_index == 0 {
                self.invalidate();
                return;
            }
            self.restart_index -= 1;
        }
        let r = self.restart_index;
        self.seek_to_restart(r);
        while self.parse_next() && self.next_offset < original {}
    }

    #[inline]
    fn key(&self) -> &[u8] {
        &self.key
    }

    #[inline]
    fn value(&self) -> &[u8] {
        let (s, l) = self.value;
        self.block.data.get(s..s + l).unwrap_or(&[])
    }

    fn status(&self) -> Result<()> {
        match &self.err {
            None => Ok(()),
            Some((offset, what)) => Err(Error::corruption(
                self.block.file.as_path(),
                *offset,
                what.clone(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Kvs = Vec<(Vec<u8>, Vec<u8>)>;

    fn build(n: usize, interval: usize) -> (Arc<Block>, Kvs) {
        let mut b = BlockBuilder::new(interval);
        let mut kvs = Vec::new();
        for i in 0..n {
            let k = format!("key{:05}", i * 3).into_bytes();
            let v = format!("v{i}").into_bytes();
            b.add(&k, &v);
            kvs.push((k, v));
        }
        let data = b.finish().to_vec();
        let block = Block::new(data, Arc::new(PathBuf::from("t.sst")), 0).unwrap();
        (Arc::new(block), kvs)
    }

    #[test]
    fn iterates_both_ways_and_seeks() {
        for interval in [1, 2, 16] {
            for n in [0, 1, 5, 100] {
                let (block, kvs) = build(n, interval);
                let mut it = block.iter(bytewise, 0);
                it.seek_to_first();
                for (k, v) in &kvs {
                    assert!(it.valid());
                    assert_eq!((it.key(), it.value()), (&k[..], &v[..]));
                    it.next();
                }
                assert!(!it.valid());
                it.seek_to_last();
                for (k, _) in kvs.iter().rev() {
                    assert_eq!(it.key(), &k[..]);
                    it.prev();
                }
                assert!(!it.valid());
                for i in 0..n * 3 + 2 {
                    let t = format!("key{i:05}").into_bytes();
                    it.seek(&t);
                    let want = kvs.iter().find(|(k, _)| k >= &t);
                    assert_eq!(
                        it.valid().then(|| it.key().to_vec()),
                        want.map(|w| w.0.clone())
                    );
                    it.seek_for_prev(&t);
                    let want = kvs.iter().rev().find(|(k, _)| k <= &t);
                    assert_eq!(
                        it.valid().then(|| it.key().to_vec()),
                        want.map(|w| w.0.clone())
                    );
                }
                assert!(it.status().is_ok());
            }
        }
    }

    #[test]
    fn corrupt_bytes_never_panic() {
        let (block, _) = build(40, 4);
        let data = block.data.clone();
        for i in 0..data.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut d = data.clone();
                d[i] ^= x;
                let Ok(b) = Block::new(d, Arc::new(PathBuf::from("t.sst")), 100) else {
                    continue;
                };
                let b = Arc::new(b);
                let mut it = b.iter(bytewise, 0);
                it.seek_to_first();
                let mut n = 0;
                while it.valid() && n < 1000 {
                    it.next();
                    n += 1;
                }
                it.seek_to_last();
                while it.valid() && n < 2000 {
                    it.prev();
                    n += 1;
                }
                it.seek(b"key00050");
                if let Err(e) = it.status() {
                    assert!(e.to_string().contains("t.sst"), "{e}");
                }
            }
        }
    }
}
