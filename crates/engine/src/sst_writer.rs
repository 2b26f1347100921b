//! Building tables outside the engine for [`crate::Db::ingest`] (snapshot install).
//!
//! Every entry is written with sequence number 0. Ingested into an empty key range, the
//! file is moved in as it is (nothing else there to order against); ingested over
//! existing data, the engine copies it with one new sequence number (see `Db::ingest`).

use std::path::Path;

use phoenix_storage::SharedFs;

use crate::error::{Error, Result};
use crate::key::{internal_key, ValueKind};
use crate::options::KEY_LEN_MAX;
use crate::table::{TableBuilder, TableOptions, TableProperties};

/// Writes one ingestable table; keys must be added in strictly increasing order.
pub struct SstWriter {
    builder: TableBuilder,
    last: Option<Vec<u8>>,
}

impl std::fmt::Debug for SstWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SstWriter")
            .field("entries", &self.builder.num_entries())
            .finish()
    }
}

impl SstWriter {
    /// Creates the file `path`.
    pub fn create(fs: &SharedFs, path: &Path, opts: &TableOptions) -> Result<SstWriter> {
        let file = fs.create(path, Default::default())?;
        Ok(SstWriter {
            builder: TableBuilder::new(file, opts),
            last: None,
        })
    }

    fn check(&mut self, key: &[u8]) -> Result<()> {
        if key.len() > KEY_LEN_MAX {
            return Err(Error::InvalidArgument(format!(
                "key of {} bytes exceeds the limit of {KEY_LEN_MAX}",
                key.len()
            )));
        }
        if self.last.as_deref().is_some_and(|l| key <= l) {
            return Err(Error::InvalidArgument(
                "SstWriter keys must be strictly increasing".into(),
            ));
        }
        self.last = Some(key.to_vec());
        Ok(())
    }

    /// Adds `key` = `value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if value.len() > crate::options::VALUE_LEN_MAX {
            return Err(Error::InvalidArgument("value too large".into()));
        }
        self.check(key)?;
        self.builder
            .add(&internal_key(key, 0, ValueKind::Put), value)
    }

    /// Adds a deletion of `key` (useful only to document absence; nothing older exists).
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.check(key)?;
        self.builder
            .add(&internal_key(key, 0, ValueKind::Delete), &[])
    }

    /// Adds a deletion of every key in `[start, end)` that is older than this file once
    /// ingested (the file's own entries stay). Ranges go in any order, apart from the
    /// keys.
    pub fn delete_range(&mut self, start: &[u8], end: &[u8]) -> Result<()> {
        if start.len() > KEY_LEN_MAX || end.len() > KEY_LEN_MAX {
            return Err(Error::InvalidArgument(format!(
                "range bound exceeds the key limit of {KEY_LEN_MAX} bytes"
            )));
        }
        if start >= end {
            return Err(Error::InvalidArgument(
                "a range deletion needs start < end".into(),
            ));
        }
        self.builder
            .add_range_tombstone(&crate::key::RangeTombstone {
                start: start.to_vec(),
                end: end.to_vec(),
                seq: 0,
            })
    }

    /// Entries added so far.
    pub fn num_entries(&self) -> u64 {
        self.builder.num_entries()
    }

    /// Writes the index, filter and footer and syncs the file; the caller syncs the
    /// directory (or `ingest` moves the file and syncs the database directory).
    pub fn finish(self) -> Result<TableProperties> {
        Ok(self.builder.finish()?.properties)
    }
}

/// The value of `key` in an ingestable table at `path` (one written by [`SstWriter`]),
/// `None` if absent or deleted there. Lets a caller check a file before ingesting it.
pub fn sst_get(fs: &SharedFs, path: &Path, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let file = fs.open(path)?;
    let size = file.size();
    let table = crate::table::Table::open(file, 0, size, None)?;
    let seek = internal_key(key, crate::key::MAX_SEQUENCE, ValueKind::Put);
    Ok(match table.get(&seek, false)? {
        Some((ikey, value)) => match crate::key::parse_internal_key(&ikey) {
            Some(p) if p.kind == ValueKind::Put => Some(value),
            Some(_) => None,
            None => return Err(Error::corruption(path, 0, "malformed internal key")),
        },
        None => None,
    })
}
