//! The engine's write-ahead log: stream 0 of a `phoenix-log` store in `<db>/wal`.
//!
//! Each WAL entry is one write group's merged batch (write_batch.rs grammar); entry
//! indexes are consecutive from 1. A memtable remembers the index of the first entry
//! whose batch it holds; the manifest's log number is the first index not yet in a
//! table, and the log is truncated below it after each flush. Recovery replays the
//! entries from the log number on.
//!
//! Durability: an append with `sync` returns after the log's `fdatasync` covering it.
//! An append without `sync` returns once its bytes are written to the segment file
//! (`write(2)`, done on the calling thread when the log's writer is idle): like RocksDB
//! with `sync=false`, a crash of the process loses nothing acknowledged, a crash of the
//! machine may lose the last unsynced appends. The log keeps the stream's order, so a
//! later synced append also makes every earlier one durable.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_log::{LogEntry, LogOptions, LogStore};
use phoenix_storage::SharedFs;

use crate::error::{Error, Result};

/// Stream id of the engine's own WAL inside its log store.
pub const WAL_STREAM: u64 = 0;
/// Entries read at a time during recovery.
const REPLAY_CHUNK: u64 = 256;

fn wal_err(e: phoenix_log::Error) -> Error {
    Error::Wal(Box::new(e))
}

/// The WAL handle.
pub struct Wal {
    store: Arc<LogStore>,
    failed: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").finish()
    }
}

impl Wal {
    /// Opens (recovering) the log in `dir`.
    pub fn open(fs: SharedFs, dir: &Path, segment_size: u64) -> Result<Wal> {
        fs.create_dir_all(dir)?;
        let opts = LogOptions {
            queues: 1,
            segment_size,
            sync: false,
            ..LogOptions::default()
        };
        let store = LogStore::open(fs, dir, opts).map_err(wal_err)?;
        Ok(Wal {
            store,
            failed: Arc::new(Mutex::new(None)),
        })
    }

    /// The index after the last entry (1 for an empty log).
    pub fn next_index(&self) -> u64 {
        self.store.last_index(WAL_STREAM).map_or(1, |i| i + 1)
    }

    /// Appends entry `index`: with `sync`, returns once it is fsynced; without, once it
    /// is written to the file (see the module docs).
    pub fn append(&self, index: u64, data: Vec<u8>, sync: bool) -> Result<()> {
        if let Some(f) = self.failure() {
            return Err(Error::Wal(f.into()));
        }
        let entries = vec![LogEntry::new(index, 0, data)];
        let r = if sync {
            self.store
                .append_durable(WAL_STREAM, entries, None, true)
                .wait()
        } else {
            self.store.append_written(WAL_STREAM, entries, None)
        };
        if let Err(e) = &r {
            // The stream's order is broken from here on: no later append may succeed.
            self.failed
                .lock()
                .get_or_insert_with(|| format!("WAL append of entry {index}: {e}"));
        }
        r.map_err(wal_err)
    }

    /// The first failed append, if any.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// Calls `f(index, payload)` for every entry from `from` on, in order.
    pub fn replay(&self, from: u64, f: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let Some(last) = self.store.last_index(WAL_STREAM) else {
            return Ok(());
        };
        let first = self.store.first_index(WAL_STREAM).unwrap_or(1);
        let mut next = from.max(first);
        if from < first {
            // Entries the manifest still needs were truncated: that is lost data.
            return Err(Error::Wal(
                format!("WAL starts at entry {first} but the manifest needs entries from {from}")
                    .into(),
            ));
        }
        while next <= last {
            let end = (next + REPLAY_CHUNK).min(last + 1);
            for e in self.store.read(WAL_STREAM, next..end).map_err(wal_err)? {
                f(e.index, &e.data)?;
            }
            next = end;
        }
        Ok(())
    }

    /// Drops the entries below `upto` (they are in tables).
    pub fn truncate_prefix(&self, upto: u64) -> Result<()> {
        let Some(first) = self.store.first_index(WAL_STREAM) else {
            return Ok(());
        };
        if upto <= first {
            return Ok(());
        }
        self.store
            .truncate_prefix(WAL_STREAM, upto)
            .map_err(wal_err)
    }

    /// Makes everything appended durable.
    pub fn sync(&self) -> Result<()> {
        self.store.sync().map_err(wal_err)
    }

    /// Closes the store.
    pub fn close(&self) -> Result<()> {
        self.store.close().map_err(wal_err)
    }
}
