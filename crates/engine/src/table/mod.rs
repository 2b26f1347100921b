//! Sorted string tables (SST files): the immutable, checksummed files that hold the LSM
//! tree's levels, and the caches in front of them.
//!
//! File layout (byte grammar of the pieces in [`format`], [`block`], [`filter`]):
//!
//! ```text
//! table      := data_block* [filter_block] [range_del_block] properties_block
//!               metaindex_block index_block footer
//! *_block    := contents ‖ trailer                      (see format.rs)
//! data_block := block of (internal_key -> value), Put and Delete kinds only
//! index_block:= block of (separator internal_key -> block_handle of a data block);
//!               separator >= every key of its block and < every key of the next block
//! filter     := bloom filter over the user keys of all data blocks (filter.rs)
//! prefix_filter := bloom filter (same grammar) over the first L bytes of every user key
//!               at least L long, L being the prefix extractor's length when written
//! range_del  := block (restart interval 1) of (start ‖ trailer(seq, RangeDelete) -> end),
//!               ordered like internal keys
//! properties := see [`TableProperties::encode`]
//! metaindex  := block, bytewise order, of (name -> block_handle) with names
//!               "phoenix.bloom", "phoenix.prefix_bloom.<L in decimal>",
//!               "phoenix.properties", "phoenix.range_del"; readers skip names they do
//!               not know, and a filter of another length than the reader's is not used
//!               (format version 2 tables are refused by version-1 binaries anyway: see
//!               `format::FORMAT_VERSION`)
//! footer     := 56 bytes naming the metaindex and index blocks (format.rs)
//! ```
//!
//! Data blocks start at offset 0 and are contiguous, so a key's approximate file offset is
//! its data block's offset. Every block carries a crc32c, and every decoder checks every
//! length and offset; corruption is reported with the file path and the byte offset of
//! the bad block or field.

pub mod block;
mod builder;
pub mod cache;
pub mod filter;
pub mod format;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
mod reader;

use crate::error::Error;
use crate::key::{self, group_of};
use crate::table::format::{get_varint64, put_varint64};

pub use builder::{TableBuilder, TableSummary};
pub use cache::{BlockCache, TableCache};
pub use format::Compression;
pub use reader::{Readahead, Table, TableIter};

/// Metaindex name of the bloom filter block.
pub const META_BLOOM: &[u8] = b"phoenix.bloom";
/// Metaindex name of the prefix filter block, followed by the prefix length in decimal.
pub const META_PREFIX_BLOOM: &[u8] = b"phoenix.prefix_bloom.";
/// Metaindex name of the properties block.
pub const META_PROPERTIES: &[u8] = b"phoenix.properties";
/// Metaindex name of the range-deletion block.
pub const META_RANGE_DEL: &[u8] = b"phoenix.range_del";

/// How tables are built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Target size of a data block's contents before compression (bytes).
    pub block_size: usize,
    /// Entries between restart points in data blocks.
    pub restart_interval: usize,
    /// Bloom filter bits per key; 0 builds no filter.
    pub bloom_bits_per_key: u32,
    /// Compression of data blocks.
    pub compression: Compression,
    /// Entries between restart points in the index block.
    pub index_restart_interval: usize,
    /// The prefix extractor: the first `prefix_len` bytes of a key are its prefix (keys
    /// shorter have none), as RocksDB's fixed prefix transform. With a bloom filter
    /// (`bloom_bits_per_key > 0`), tables also get a filter over the prefixes, which a
    /// prefix seek uses to skip tables. 0: no prefix extractor.
    pub prefix_len: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            block_size: 4096,
            restart_interval: 16,
            bloom_bits_per_key: 10,
            compression: Compression::None,
            index_restart_interval: 1,
            prefix_len: 0,
        }
    }
}

/// What a table holds, recorded in its properties block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableProperties {
    /// Smallest internal key, range tombstones included (a tombstone counts as
    /// `start ‖ trailer(seq, RangeDelete)`).
    pub smallest_key: Vec<u8>,
    /// Largest internal key, range tombstones included (a tombstone counts as
    /// `end ‖ trailer(MAX_SEQUENCE, RangeDelete)`, which sorts before every real entry of
    /// `end`, so the bound is exclusive in user-key terms when it comes from a tombstone).
    pub largest_key: Vec<u8>,
    /// Smallest sequence number of any entry or tombstone.
    pub smallest_seq: u64,
    /// Largest sequence number of any entry or tombstone.
    pub largest_seq: u64,
    /// Point entries (puts and deletes).
    pub num_entries: u64,
    /// Point deletes among `num_entries`.
    pub num_deletions: u64,
    /// Range tombstones.
    pub num_range_deletions: u64,
    /// Sum of the internal keys' lengths.
    pub raw_key_bytes: u64,
    /// Sum of the values' lengths.
    pub raw_value_bytes: u64,
    /// Bytes of data blocks on disk (trailers included).
    pub data_bytes: u64,
    /// Bytes of the index block on disk.
    pub index_bytes: u64,
    /// Bytes of the filter blocks (whole-key and prefix) on disk.
    pub filter_bytes: u64,
    /// Group of the smallest user key.
    pub min_group: u64,
    /// Group of the largest user key covered (for a tombstone ending exactly at a group's
    /// first key, the group before it).
    pub max_group: u64,
}

impl TableProperties {
    /// Encodes the properties block's contents:
    ///
    /// ```text
    /// properties := len varint64 ‖ smallest_key ‖ len varint64 ‖ largest_key
    ///               ‖ 12 × varint64 (smallest_seq, largest_seq, num_entries,
    ///                  num_deletions, num_range_deletions, raw_key_bytes,
    ///                  raw_value_bytes, data_bytes, index_bytes, filter_bytes,
    ///                  min_group, max_group)
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.smallest_key.len() + self.largest_key.len());
        put_varint64(&mut b, self.smallest_key.len() as u64);
        b.extend_from_slice(&self.smallest_key);
        put_varint64(&mut b, self.largest_key.len() as u64);
        b.extend_from_slice(&self.largest_key);
        for v in self.numbers() {
            put_varint64(&mut b, v);
        }
        b
    }

    fn numbers(&self) -> [u64; 12] {
        [
            self.smallest_seq,
            self.largest_seq,
            self.num_entries,
            self.num_deletions,
            self.num_range_deletions,
            self.raw_key_bytes,
            self.raw_value_bytes,
            self.data_bytes,
            self.index_bytes,
            self.filter_bytes,
            self.min_group,
            self.max_group,
        ]
    }

    /// Decodes [`TableProperties::encode`]'s bytes; `Err((offset, what))` locates the bad
    /// field inside `data`.
    pub fn decode(data: &[u8]) -> std::result::Result<TableProperties, (usize, String)> {
        let mut pos = 0usize;
        let bytes = |pos: &mut usize,
                     name: &str|
         -> std::result::Result<Vec<u8>, (usize, String)> {
            let at = *pos;
            let (len, n) = get_varint64(&data[at..]).ok_or((at, format!("bad {name} length")))?;
            let start = at + n;
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| start.checked_add(l))
                .filter(|&e| e <= data.len())
                .ok_or((at, format!("{name} of {len} bytes overruns the block")))?;
            *pos = end;
            Ok(data[start..end].to_vec())
        };
        let smallest_key = bytes(&mut pos, "smallest key")?;
        let largest_key = bytes(&mut pos, "largest key")?;
        for (name, k) in [("smallest", &smallest_key), ("largest", &largest_key)] {
            if !k.is_empty() && key::parse_internal_key(k).is_none() {
                return Err((0, format!("{name} key is not an internal key")));
            }
        }
        let mut nums = [0u64; 12];
        for n in nums.iter_mut() {
            let (v, len) = get_varint64(&data[pos..]).ok_or((pos, "bad number".to_string()))?;
            *n = v;
            pos += len;
        }
        if pos != data.len() {
            return Err((pos, format!("{} trailing bytes", data.len() - pos)));
        }
        let [smallest_seq, largest_seq, num_entries, num_deletions, num_range_deletions, raw_key_bytes, raw_value_bytes, data_bytes, index_bytes, filter_bytes, min_group, max_group] =
            nums;
        Ok(TableProperties {
            smallest_key,
            largest_key,
            smallest_seq,
            largest_seq,
            num_entries,
            num_deletions,
            num_range_deletions,
            raw_key_bytes,
            raw_value_bytes,
            data_bytes,
            index_bytes,
            filter_bytes,
            min_group,
            max_group,
        })
    }
}

/// The name of table file `number` inside the engine's directory.
pub fn table_file_name(number: u64) -> String {
    format!("{number:06}.sst")
}

/// The group of the last user key a tombstone ending at `end` covers: `end` is exclusive,
/// so when it is exactly a group's first key (the 8-byte group id), the group before.
pub(crate) fn last_group_before(end: &[u8]) -> u64 {
    let g = group_of(end);
    if end.len() == key::GROUP_PREFIX_LEN && g > 0 {
        g - 1
    } else {
        g
    }
}

/// Rebuilds an error so it can be reported more than once (iterators keep their first
/// error and hand it out from every `status()` call).
pub(crate) fn clone_error(e: &Error) -> Error {
    match e {
        Error::Corruption { file, offset, what } => Error::Corruption {
            file: file.clone(),
            offset: *offset,
            what: what.clone(),
        },
        Error::Storage(phoenix_storage::Error::Io { op, path, source }) => {
            Error::Storage(phoenix_storage::Error::Io {
                op: *op,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            })
        }
        Error::Storage(phoenix_storage::Error::Unavailable { op, path, source }) => {
            Error::Storage(phoenix_storage::Error::Unavailable {
                op: *op,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            })
        }
        Error::Storage(phoenix_storage::Error::Locked { path }) => {
            Error::Storage(phoenix_storage::Error::Locked { path: path.clone() })
        }
        Error::Storage(phoenix_storage::Error::TooLarge { path }) => {
            Error::Storage(phoenix_storage::Error::TooLarge { path: path.clone() })
        }
        Error::Storage(phoenix_storage::Error::InvalidArgument { path, reason }) => {
            Error::Storage(phoenix_storage::Error::InvalidArgument {
                path: path.clone(),
                reason: reason.clone(),
            })
        }
        Error::Storage(phoenix_storage::Error::Fenced { path }) => {
            Error::Storage(phoenix_storage::Error::Fenced { path: path.clone() })
        }
        Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
        Error::Background(s) => Error::Background(s.clone()),
        Error::Closed => Error::Closed,
        other => Error::Background(other.to_string()),
    }
}

#[cfg(test)]
mod tests;
