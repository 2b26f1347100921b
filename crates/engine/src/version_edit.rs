//! Version edits: the records of the manifest. Each edit is a delta from one version of
//! the LSM tree (the set of live files per level) to the next.
//!
//! Byte grammar (all integers varint unless noted; fields in any order, each at most
//! once except deleted/new files):
//!
//! ```text
//! edit        := field*
//! field       := 1 varint64(log_number)          -- first WAL entry still needed
//!              | 2 varint64(next_file_number)
//!              | 3 varint64(last_sequence)
//!              | 4 varint32(level) varint64(number)                 -- deleted file
//!              | 5 varint32(level) file_meta                        -- new file
//! file_meta   := varint64(number) varint64(size)
//!                varint32(len) smallest_internal_key
//!                varint32(len) largest_internal_key
//!                varint64(smallest_seq) varint64(largest_seq)
//!                varint64(min_group) varint64(max_group) varint64(num_entries)
//!                varint64(num_range_deletions)
//! ```
//!
//! Decoding checks every length, that levels are below [`LEVELS_MAX`], that keys are
//! well-formed internal keys with `smallest <= largest`, and rejects unknown tags; the
//! caller names the manifest file and the record's offset in the error.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::key::{compare_internal, parse_internal_key, SequenceNumber};
use crate::options::LEVELS_MAX;
use crate::write_batch::{
    get_length_prefixed, get_varint32, get_varint64, put_varint32, put_varint64,
};

const TAG_LOG_NUMBER: u32 = 1;
const TAG_NEXT_FILE: u32 = 2;
const TAG_LAST_SEQ: u32 = 3;
const TAG_DELETED_FILE: u32 = 4;
const TAG_NEW_FILE: u32 = 5;

/// What the manifest knows about one table file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// File number (names `<number>.sst`).
    pub number: u64,
    /// File size in bytes.
    pub size: u64,
    /// Smallest internal key (point or range-tombstone start).
    pub smallest: Vec<u8>,
    /// Largest internal key; a range tombstone's exclusive end `e` appears as
    /// `(e, MAX_SEQUENCE, RangeDelete)`, which sorts before every real entry of `e`.
    pub largest: Vec<u8>,
    /// Smallest sequence number inside.
    pub smallest_seq: SequenceNumber,
    /// Largest sequence number inside.
    pub largest_seq: SequenceNumber,
    /// Smallest group id holding data in the file.
    pub min_group: u64,
    /// Largest group id holding data in the file.
    pub max_group: u64,
    /// Point entries plus range tombstones.
    pub num_entries: u64,
    /// Range tombstones (readers open only files that have some to gather them).
    pub num_range_deletions: u64,
}

impl FileMeta {
    /// The meta of table `number` of `size` bytes, from its properties.
    pub fn from_properties(number: u64, size: u64, p: &crate::table::TableProperties) -> FileMeta {
        FileMeta {
            number,
            size,
            smallest: p.smallest_key.clone(),
            largest: p.largest_key.clone(),
            smallest_seq: p.smallest_seq,
            largest_seq: p.largest_seq,
            min_group: p.min_group,
            max_group: p.max_group,
            num_entries: p.num_entries + p.num_range_deletions,
            num_range_deletions: p.num_range_deletions,
        }
    }

    /// The smallest user key.
    pub fn smallest_user_key(&self) -> &[u8] {
        crate::key::user_key(&self.smallest)
    }
    /// The largest user key (exclusive if `largest` is a range-tombstone end sentinel).
    pub fn largest_user_key(&self) -> &[u8] {
        crate::key::user_key(&self.largest)
    }

    /// Whether `largest` is a range tombstone's exclusive end, not a key inside.
    pub fn largest_is_exclusive(&self) -> bool {
        crate::key::trailer(&self.largest)
            == crate::key::pack_trailer(
                crate::key::MAX_SEQUENCE,
                crate::key::ValueKind::RangeDelete,
            )
    }

    /// Whether the file holds anything for a user key in `[lo, hi]` (inclusive), counting
    /// an exclusive tombstone end as outside.
    pub fn overlaps_exactly(&self, lo: &[u8], hi: &[u8]) -> bool {
        let below = if self.largest_is_exclusive() {
            self.largest_user_key() <= lo
        } else {
            self.largest_user_key() < lo
        };
        !below && self.smallest_user_key() <= hi
    }
}

/// A delta between two versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionEdit {
    /// First WAL entry index whose batch is not yet in a table.
    pub log_number: Option<u64>,
    /// Next file number to hand out.
    pub next_file_number: Option<u64>,
    /// Largest sequence number of any write in a table (or handed out, at open).
    pub last_sequence: Option<SequenceNumber>,
    /// Files removed: (level, number).
    pub deleted_files: Vec<(usize, u64)>,
    /// Files added: (level, meta).
    pub new_files: Vec<(usize, Arc<FileMeta>)>,
}

impl VersionEdit {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        if let Some(v) = self.log_number {
            put_varint32(buf, TAG_LOG_NUMBER);
            put_varint64(buf, v);
        }
        if let Some(v) = self.next_file_number {
            put_varint32(buf, TAG_NEXT_FILE);
            put_varint64(buf, v);
        }
        if let Some(v) = self.last_sequence {
            put_varint32(buf, TAG_LAST_SEQ);
            put_varint64(buf, v);
        }
        for &(level, number) in &self.deleted_files {
            put_varint32(buf, TAG_DELETED_FILE);
            put_varint32(buf, level as u32);
            put_varint64(buf, number);
        }
        for (level, f) in &self.new_files {
            put_varint32(buf, TAG_NEW_FILE);
            put_varint32(buf, *level as u32);
            put_varint64(buf, f.number);
            put_varint64(buf, f.size);
            put_varint32(buf, f.smallest.len() as u32);
            buf.extend_from_slice(&f.smallest);
            put_varint32(buf, f.largest.len() as u32);
            buf.extend_from_slice(&f.largest);
            put_varint64(buf, f.smallest_seq);
            put_varint64(buf, f.largest_seq);
            put_varint64(buf, f.min_group);
            put_varint64(buf, f.max_group);
            put_varint64(buf, f.num_entries);
            put_varint64(buf, f.num_range_deletions);
        }
    }

    /// Decodes an edit; the error says what is wrong and at which byte of `data`.
    pub fn decode(data: &[u8]) -> Result<VersionEdit, (usize, String)> {
        let mut e = VersionEdit::default();
        let mut pos = 0;
        while pos < data.len() {
            let at = pos;
            let err = |what: &str| (at, what.to_string());
            let tag = get_varint32(data, &mut pos).ok_or_else(|| err("bad tag"))?;
            let v64 = |pos: &mut usize, what: &str| {
                get_varint64(data, pos).ok_or_else(|| (at, format!("truncated {what}")))
            };
            let level = |pos: &mut usize| -> Result<usize, (usize, String)> {
                let l = get_varint32(data, pos)
                    .ok_or_else(|| (at, "truncated level".to_string()))?
                    as usize;
                if l >= LEVELS_MAX {
                    return Err((at, format!("level {l} out of range")));
                }
                Ok(l)
            };
            match tag {
                TAG_LOG_NUMBER | TAG_NEXT_FILE | TAG_LAST_SEQ => {
                    let v = v64(&mut pos, "number")?;
                    let slot = match tag {
                        TAG_LOG_NUMBER => &mut e.log_number,
                        TAG_NEXT_FILE => &mut e.next_file_number,
                        _ => &mut e.last_sequence,
                    };
                    if slot.replace(v).is_some() {
                        return Err(err("field repeated"));
                    }
                }
                TAG_DELETED_FILE => {
                    let l = level(&mut pos)?;
                    let n = v64(&mut pos, "file number")?;
                    e.deleted_files.push((l, n));
                }
                TAG_NEW_FILE => {
                    let l = level(&mut pos)?;
                    let number = v64(&mut pos, "file number")?;
                    let size = v64(&mut pos, "file size")?;
                    let smallest = get_length_prefixed(data, &mut pos)
                        .ok_or_else(|| err("truncated smallest key"))?
                        .to_vec();
                    let largest = get_length_prefixed(data, &mut pos)
                        .ok_or_else(|| err("truncated largest key"))?
                        .to_vec();
                    let smallest_seq = v64(&mut pos, "smallest seq")?;
                    let largest_seq = v64(&mut pos, "largest seq")?;
                    let min_group = v64(&mut pos, "min group")?;
                    let max_group = v64(&mut pos, "max group")?;
                    let num_entries = v64(&mut pos, "entry count")?;
                    let num_range_deletions = v64(&mut pos, "range deletion count")?;
                    if parse_internal_key(&smallest).is_none()
                        || parse_internal_key(&largest).is_none()
                    {
                        return Err(err("malformed file key range"));
                    }
                    if compare_internal(&smallest, &largest) == Ordering::Greater
                        || smallest_seq > largest_seq
                        || min_group > max_group
                    {
                        return Err(err("file ranges out of order"));
                    }
                    e.new_files.push((
                        l,
                        Arc::new(FileMeta {
                            number,
                            size,
                            smallest,
                            largest,
                            smallest_seq,
                            largest_seq,
                            min_group,
                            max_group,
                            num_entries,
                            num_range_deletions,
                        }),
                    ));
                }
                _ => return Err(err(&format!("unknown tag {tag}"))),
            }
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{internal_key, ValueKind};

    pub(crate) fn sample() -> VersionEdit {
        VersionEdit {
            log_number: Some(3),
            next_file_number: Some(10),
            last_sequence: Some(99),
            deleted_files: vec![(1, 4), (0, 2)],
            new_files: vec![(
                2,
                Arc::new(FileMeta {
                    number: 9,
                    size: 4096,
                    smallest: internal_key(b"a", 5, ValueKind::Put),
                    largest: internal_key(b"z", 7, ValueKind::Delete),
                    smallest_seq: 5,
                    largest_seq: 7,
                    min_group: 0,
                    max_group: 0,
                    num_entries: 2,
                    num_range_deletions: 0,
                }),
            )],
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(VersionEdit::decode(&buf).unwrap(), e);
    }

    #[test]
    fn every_truncation_fails_or_is_a_prefix_edit() {
        let e = sample();
        let mut buf = Vec::new();
        e.encode(&mut buf);
        for n in 0..buf.len() {
            // A truncated edit either fails or decodes to fewer fields; never panics.
            if let Ok(d) = VersionEdit::decode(&buf[..n]) {
                assert_ne!(d, e);
            }
        }
        let mut bad = buf.clone();
        bad[0] = 77;
        assert!(VersionEdit::decode(&bad).is_err());
    }
}
