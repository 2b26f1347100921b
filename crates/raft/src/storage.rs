//! The read-only view of durable raft state that the core needs ([`Storage`]), and
//! [`MemStorage`], an in-memory implementation for tests, simulation and benchmarks.
//!
//! The core never writes storage: the application persists what a `Ready` hands it
//! (entries, hard state, snapshot) and then tells the core. The `log` crate implements
//! [`Storage`] over the shared durable log.

use crate::error::StorageError;
use crate::types::{ConfState, Entry, HardState, Snapshot, SnapshotMeta};

/// Durable state read at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RaftState {
    /// Last persisted hard state.
    pub hard_state: HardState,
    /// Membership as of the application's applied index.
    pub conf_state: ConfState,
}

/// Read access to the durable log. Index `first_index() - 1` is the snapshot index and
/// `term` must answer for it (the "dummy" entry).
pub trait Storage {
    /// Hard state and membership to start from.
    fn initial_state(&self) -> Result<RaftState, StorageError>;
    /// Entries `[lo, hi)`, at least one if `lo < hi`, and beyond the first no more than
    /// `max_size` bytes in total.
    fn entries(&self, lo: u64, hi: u64, max_size: u64) -> Result<Vec<Entry>, StorageError>;
    /// Term of the entry at `index`, for `first_index() - 1 ..= last_index()`.
    fn term(&self, index: u64) -> Result<u64, StorageError>;
    /// First index still stored (snapshot index + 1).
    fn first_index(&self) -> Result<u64, StorageError>;
    /// Last index stored (the snapshot index if the log is empty after it).
    fn last_index(&self) -> Result<u64, StorageError>;
    /// The latest snapshot, covering at least `request_index` if possible.
    fn snapshot(&self, request_index: u64) -> Result<Snapshot, StorageError>;
}

/// An in-memory [`Storage`] that the application writes to directly.
///
/// Invariant: `entries` is contiguous from `snapshot.meta.index + 1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct MemStorage {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
}

impl MemStorage {
    /// Empty storage whose initial membership is `conf`.
    pub fn new_with_conf(conf: ConfState) -> MemStorage {
        MemStorage {
            conf_state: conf.clone(),
            snapshot: Snapshot {
                meta: SnapshotMeta {
                    index: 0,
                    term: 0,
                    conf,
                },
                data: Default::default(),
            },
            ..MemStorage::default()
        }
    }

    /// Records the hard state.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// The recorded hard state.
    pub fn hard_state(&self) -> HardState {
        self.hard_state
    }

    /// Records the membership in force at the applied index.
    pub fn set_conf_state(&mut self, cs: ConfState) {
        self.conf_state = cs;
    }

    /// The stored snapshot.
    pub fn snapshot_ref(&self) -> &Snapshot {
        &self.snapshot
    }

    /// All stored entries (after the snapshot).
    pub fn all_entries(&self) -> &[Entry] {
        &self.entries
    }

    fn offset(&self) -> u64 {
        self.snapshot.meta.index
    }

    fn last(&self) -> u64 {
        self.offset() + self.entries.len() as u64
    }

    /// Appends `ents`, replacing any stored suffix from `ents[0].index` on. Entries must
    /// be contiguous and must not leave a gap after the stored log; entries at or before
    /// the snapshot are skipped.
    pub fn append(&mut self, ents: &[Entry]) -> Result<(), StorageError> {
        let Some(first) = ents.first() else {
            return Ok(());
        };
        if first.index > self.last() + 1 {
            return Err(StorageError::Other(
                format!(
                    "append at {} leaves a gap after last index {}",
                    first.index,
                    self.last()
                )
                .into(),
            ));
        }
        let skip = (self.offset() + 1).saturating_sub(first.index) as usize;
        let ents = ents.get(skip..).unwrap_or(&[]);
        let Some(first) = ents.first() else {
            return Ok(());
        };
        let keep = (first.index - self.offset() - 1) as usize;
        self.entries.truncate(keep);
        self.entries.extend_from_slice(ents);
        Ok(())
    }

    /// Installs `snap`, dropping all entries (used by followers receiving a snapshot).
    pub fn apply_snapshot(&mut self, snap: Snapshot) -> Result<(), StorageError> {
        if snap.meta.index < self.offset() {
            return Err(StorageError::Other(
                format!(
                    "snapshot at {} is older than stored snapshot at {}",
                    snap.meta.index,
                    self.offset()
                )
                .into(),
            ));
        }
        self.hard_state.commit = self.hard_state.commit.max(snap.meta.index);
        if self.hard_state.term < snap.meta.term {
            self.hard_state.term = snap.meta.term;
        }
        self.conf_state = snap.meta.conf.clone();
        self.snapshot = snap;
        self.entries.clear();
        Ok(())
    }

    /// Makes a snapshot at `index` (≤ last index) with `conf` and `data`, and drops the
    /// entries it covers (the application calls this after applying up to `index`).
    pub fn compact_to_snapshot(
        &mut self,
        index: u64,
        conf: ConfState,
        data: bytes::Bytes,
    ) -> Result<(), StorageError> {
        if index <= self.offset() {
            return Ok(());
        }
        if index > self.last() {
            return Err(StorageError::Unavailable {
                index,
                last_index: self.last(),
            });
        }
        let term = self.term(index)?;
        let drop = (index - self.offset()) as usize;
        self.entries.drain(..drop);
        self.snapshot = Snapshot {
            meta: SnapshotMeta { index, term, conf },
            data,
        };
        Ok(())
    }
}

impl Storage for MemStorage {
    fn initial_state(&self) -> Result<RaftState, StorageError> {
        Ok(RaftState {
            hard_state: self.hard_state,
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(&self, lo: u64, hi: u64, max_size: u64) -> Result<Vec<Entry>, StorageError> {
        if lo <= self.offset() {
            return Err(StorageError::Compacted {
                index: lo,
                first_index: self.offset() + 1,
            });
        }
        if hi > self.last() + 1 {
            return Err(StorageError::Unavailable {
                index: hi - 1,
                last_index: self.last(),
            });
        }
        let lo_i = (lo - self.offset() - 1) as usize;
        let hi_i = (hi - self.offset() - 1) as usize;
        let slice = self.entries.get(lo_i..hi_i).unwrap_or(&[]);
        Ok(limit_size(slice, max_size).to_vec())
    }

    fn term(&self, index: u64) -> Result<u64, StorageError> {
        if index == self.offset() {
            return Ok(self.snapshot.meta.term);
        }
        if index < self.offset() {
            return Err(StorageError::Compacted {
                index,
                first_index: self.offset() + 1,
            });
        }
        let i = (index - self.offset() - 1) as usize;
        self.entries
            .get(i)
            .map(|e| e.term)
            .ok_or(StorageError::Unavailable {
                index,
                last_index: self.last(),
            })
    }

    fn first_index(&self) -> Result<u64, StorageError> {
        Ok(self.offset() + 1)
    }

    fn last_index(&self) -> Result<u64, StorageError> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64) -> Result<Snapshot, StorageError> {
        Ok(self.snapshot.clone())
    }
}

/// The longest prefix of `ents` within `max_size` bytes, but always at least one entry.
pub(crate) fn limit_size(ents: &[Entry], max_size: u64) -> &[Entry] {
    let mut size = 0u64;
    let mut n = 0;
    for e in ents {
        size += e.size();
        if n > 0 && size > max_size {
            break;
        }
        n += 1;
    }
    ents.get(..n).unwrap_or(ents)
}
