//! Write batches: a sequence of puts, deletes and range deletes applied atomically.
//!
//! A batch is the unit of atomicity: it is one WAL record, it lands in one memtable, and
//! its records take consecutive sequence numbers starting at the batch's sequence.
//!
//! Byte grammar (the WAL record payload is exactly these bytes):
//!
//! ```text
//! batch   := sequence:u64le count:u32le record{count}
//! record  := 0x01 varint32(klen) key varint32(vlen) value     -- Put
//!          | 0x00 varint32(klen) key                          -- Delete
//!          | 0x02 varint32(slen) start varint32(elen) end     -- RangeDelete [start, end)
//! ```
//!
//! Decoding validates every length against the remaining bytes, the kinds, the count and
//! the limits in [`crate::options`], and that a range's start is below its end.

use crate::error::{Error, Result};
use crate::key::{SequenceNumber, ValueKind};
use crate::options::{BATCH_BYTES_MAX, KEY_LEN_MAX, VALUE_LEN_MAX};

/// Bytes of the batch header (sequence + count).
pub const HEADER_LEN: usize = 12;

/// An atomic group of writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteBatch {
    rep: Vec<u8>,
    count: u32,
    /// The first limit violation met while building (reported by `Db::write`).
    invalid: Option<String>,
}

impl Default for WriteBatch {
    fn default() -> Self {
        Self::new()
    }
}

/// One decoded record of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchRecord<'a> {
    /// Set `key` to `value`.
    Put(&'a [u8], &'a [u8]),
    /// Delete `key`.
    Delete(&'a [u8]),
    /// Delete every key in `[start, end)`.
    RangeDelete(&'a [u8], &'a [u8]),
}

pub(crate) fn put_varint32(buf: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

pub(crate) fn put_varint64(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Decodes a varint64 at `*pos`, advancing it; `None` if truncated or overlong.
pub(crate) fn get_varint64(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut result: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *data.get(*pos)?;
        *pos += 1;
        if shift == 63 && b > 1 {
            return None;
        }
        result |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(result);
        }
    }
    None
}

/// Decodes a varint32 at `*pos`, advancing it.
pub(crate) fn get_varint32(data: &[u8], pos: &mut usize) -> Option<u32> {
    get_varint64(data, pos).and_then(|v| u32::try_from(v).ok())
}

/// Decodes a length-prefixed slice at `*pos`.
pub(crate) fn get_length_prefixed<'a>(data: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let len = get_varint32(data, pos)? as usize;
    let end = pos.checked_add(len)?;
    let s = data.get(*pos..end)?;
    *pos = end;
    Some(s)
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::with_capacity(64)
    }

    /// An empty batch whose buffer holds `bytes` of records without growing.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut rep = Vec::with_capacity(HEADER_LEN + bytes);
        rep.resize(HEADER_LEN, 0);
        WriteBatch {
            rep,
            count: 0,
            invalid: None,
        }
    }

    fn note_limits(&mut self, key: &[u8], value_len: usize, value_limit: usize) {
        if self.invalid.is_some() {
            return;
        }
        if key.len() > KEY_LEN_MAX {
            self.invalid = Some(format!(
                "key of {} bytes exceeds the limit of {KEY_LEN_MAX}",
                key.len()
            ));
        } else if value_len > value_limit {
            self.invalid = Some(format!(
                "value of {value_len} bytes exceeds the limit of {value_limit}"
            ));
        } else if self.rep.len() + key.len() + value_len + 16 > BATCH_BYTES_MAX {
            self.invalid = Some(format!("batch exceeds {BATCH_BYTES_MAX} bytes"));
        } else if self.count == u32::MAX {
            self.invalid = Some("batch holds too many records".to_string());
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.note_limits(key, value.len(), VALUE_LEN_MAX);
        if self.invalid.is_some() {
            return;
        }
        self.rep.push(ValueKind::Put as u8);
        put_varint32(&mut self.rep, key.len() as u32);
        self.rep.extend_from_slice(key);
        put_varint32(&mut self.rep, value.len() as u32);
        self.rep.extend_from_slice(value);
        self.count += 1;
    }

    /// Deletes `key`.
    pub fn delete(&mut self, key: &[u8]) {
        self.note_limits(key, 0, 0);
        if self.invalid.is_some() {
            return;
        }
        self.rep.push(ValueKind::Delete as u8);
        put_varint32(&mut self.rep, key.len() as u32);
        self.rep.extend_from_slice(key);
        self.count += 1;
    }

    /// Deletes every key in `[start, end)`; an empty range is rejected by `Db::write`.
    pub fn delete_range(&mut self, start: &[u8], end: &[u8]) {
        self.note_limits(start, end.len(), KEY_LEN_MAX);
        if self.invalid.is_none() && start >= end {
            self.invalid = Some("delete_range needs start < end".to_string());
        }
        if self.invalid.is_some() {
            return;
        }
        self.rep.push(ValueKind::RangeDelete as u8);
        put_varint32(&mut self.rep, start.len() as u32);
        self.rep.extend_from_slice(start);
        put_varint32(&mut self.rep, end.len() as u32);
        self.rep.extend_from_slice(end);
        self.count += 1;
    }

    /// Records in the batch.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether the batch holds no records.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Encoded size in bytes.
    pub fn approximate_size(&self) -> usize {
        self.rep.len()
    }

    /// Removes every record.
    pub fn clear(&mut self) {
        self.rep.truncate(HEADER_LEN);
        self.rep[..HEADER_LEN].fill(0);
        self.count = 0;
        self.invalid = None;
    }

    /// The first limit the batch broke while it was built, if any.
    pub fn validate(&self) -> Result<()> {
        match &self.invalid {
            Some(what) => Err(Error::InvalidArgument(what.clone())),
            None => Ok(()),
        }
    }

    /// The sequence number of the first record (set when the batch is written).
    pub fn sequence(&self) -> SequenceNumber {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.rep[..8]);
        u64::from_le_bytes(b)
    }

    pub(crate) fn set_sequence(&mut self, seq: SequenceNumber) {
        self.rep[..8].copy_from_slice(&seq.to_le_bytes());
        let count = self.count;
        self.rep[8..12].copy_from_slice(&count.to_le_bytes());
    }

    /// The encoded batch (header filled in by `set_sequence`).
    pub fn data(&self) -> &[u8] {
        &self.rep
    }

    /// Appends every record of `other` (the write group merges its writers' batches).
    pub(crate) fn append(&mut self, other: &WriteBatch) {
        self.rep.extend_from_slice(&other.rep[HEADER_LEN..]);
        self.count += other.count;
    }

    /// Decodes and validates an encoded batch; `file`/`offset` name where it was read.
    pub fn decode(data: &[u8], file: &std::path::Path, offset: u64) -> Result<WriteBatch> {
        let corrupt = |at: usize, what: &str| {
            Error::corruption(file, offset + at as u64, format!("write batch: {what}"))
        };
        if data.len() < HEADER_LEN {
            return Err(corrupt(0, "shorter than its header"));
        }
        let mut c = [0u8; 4];
        c.copy_from_slice(&data[8..12]);
        let count = u32::from_le_bytes(c);
        let batch = WriteBatch {
            rep: data.to_vec(),
            count,
            invalid: None,
        };
        let mut seen = 0u32;
        let mut pos = HEADER_LEN;
        while pos < data.len() {
            let at = pos;
            batch
                .record_at(&mut pos)
                .ok_or_else(|| corrupt(at, "bad record"))?;
            seen = seen
                .checked_add(1)
                .ok_or_else(|| corrupt(at, "too many records"))?;
        }
        if seen != count {
            return Err(corrupt(
                8,
                &format!("header counts {count} records, found {seen}"),
            ));
        }
        Ok(batch)
    }

    fn record_at(&self, pos: &mut usize) -> Option<BatchRecord<'_>> {
        let data = &self.rep;
        let kind = ValueKind::from_u8(*data.get(*pos)?)?;
        *pos += 1;
        let key = get_length_prefixed(data, pos)?;
        if key.len() > KEY_LEN_MAX {
            return None;
        }
        match kind {
            ValueKind::Put => {
                let value = get_length_prefixed(data, pos)?;
                (value.len() <= VALUE_LEN_MAX).then_some(BatchRecord::Put(key, value))
            }
            ValueKind::Delete => Some(BatchRecord::Delete(key)),
            ValueKind::RangeDelete => {
                let end = get_length_prefixed(data, pos)?;
                (end.len() <= KEY_LEN_MAX && key < end)
                    .then_some(BatchRecord::RangeDelete(key, end))
            }
        }
    }

    /// The records in order. Batches are validated when built or decoded, so iteration
    /// cannot fail.
    pub fn iter(&self) -> BatchIter<'_> {
        BatchIter {
            batch: self,
            pos: HEADER_LEN,
        }
    }
}

/// Iterator over a batch's records.
pub struct BatchIter<'a> {
    batch: &'a WriteBatch,
    pos: usize,
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = BatchRecord<'a>;
    fn next(&mut self) -> Option<BatchRecord<'a>> {
        if self.pos >= self.batch.rep.len() {
            return None;
        }
        let rec = self.batch.record_at(&mut self.pos);
        debug_assert!(rec.is_some(), "validated batch failed to decode");
        if rec.is_none() {
            self.pos = self.batch.rep.len();
        }
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn round_trip_and_sequence() {
        let mut b = WriteBatch::new();
        b.put(b"k1", b"v1");
        b.delete(b"k2");
        b.delete_range(b"a", b"c");
        b.set_sequence(77);
        let d = WriteBatch::decode(b.data(), Path::new("wal"), 0).unwrap();
        assert_eq!(d.sequence(), 77);
        assert_eq!(d.count(), 3);
        let recs: Vec<_> = d.iter().collect();
        assert_eq!(
            recs,
            vec![
                BatchRecord::Put(b"k1", b"v1"),
                BatchRecord::Delete(b"k2"),
                BatchRecord::RangeDelete(b"a", b"c")
            ]
        );
    }

    #[test]
    fn decode_rejects_every_truncation_and_bad_count() {
        let mut b = WriteBatch::new();
        b.put(b"key", b"value");
        b.delete_range(b"a", b"b");
        b.set_sequence(1);
        let data = b.data().to_vec();
        for n in 0..data.len() {
            let e = WriteBatch::decode(&data[..n], Path::new("f"), 100).unwrap_err();
            assert!(e.is_corruption(), "{n}: {e}");
        }
        let mut bad = data.clone();
        bad[8] = 5;
        let e = WriteBatch::decode(&bad, Path::new("f"), 100).unwrap_err();
        assert!(e.to_string().contains("at offset 108"), "{e}");
        let mut bad_kind = data;
        bad_kind[HEADER_LEN] = 9;
        assert!(WriteBatch::decode(&bad_kind, Path::new("f"), 0).is_err());
    }

    #[test]
    fn limits_are_reported() {
        let mut b = WriteBatch::new();
        b.put(&vec![0u8; KEY_LEN_MAX + 1], b"");
        assert!(matches!(b.validate(), Err(Error::InvalidArgument(_))));
        let mut r = WriteBatch::new();
        r.delete_range(b"b", b"a");
        assert!(r.validate().is_err());
        let mut ok = WriteBatch::new();
        ok.put(&vec![0u8; KEY_LEN_MAX], b"v");
        ok.validate().unwrap();
    }

    #[test]
    fn varints_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut buf = Vec::new();
            put_varint64(&mut buf, v);
            let mut pos = 0;
            assert_eq!(get_varint64(&buf, &mut pos), Some(v));
            assert_eq!(pos, buf.len());
        }
        let mut pos = 0;
        assert_eq!(get_varint64(&[0x80, 0x80], &mut pos), None);
    }
}
