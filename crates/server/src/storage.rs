//! Raft storage of one group replica over the node's shared log store.
//!
//! The group's entries live in log-store stream `group_id`; each [`LogEntry`] carries
//! the raft index and term, and its payload is `kind: u8 (0 normal, 1 conf change) ‖
//! data`. The hard state is the stream's hard state. Everything at or below `snap`
//! (the "dummy" entry: the last index covered by the engine's state, or by an installed
//! snapshot) is treated as compacted, even if the log store still holds it.
//!
//! On restart the replica starts at its persisted applied index `P` (engine sentinel):
//! `snap = (P, term at P)`, entries `(P, last]` are replayed (seed 000, log-as-WAL).
//!
//! Only entries and term/vote changes must be durable before raft acts on them. A hard
//! state whose sole change is the commit index is kept in memory and written with the
//! next append that must be durable anyway (etcd's `MustSync`): the commit index is
//! recoverable (a restarted replica learns it from the leader, and never starts below
//! its persisted applied index), and syncing it costs a second `fdatasync` per write on
//! every replica — on the leader between the quorum's acknowledgement and the reply.

use std::sync::Arc;

use bytes::Bytes;
use phoenix_log::{LogEntry, LogStore};
use phoenix_raft::{
    ConfState, Entry, EntryKind, HardState, RaftState, Snapshot, SnapshotMeta, Storage,
    StorageError,
};

/// Encodes a raft entry as a log-store entry.
pub fn encode_entry(e: &Entry) -> LogEntry {
    let mut data = Vec::with_capacity(1 + e.data.len());
    data.push(match e.kind {
        EntryKind::Normal => 0u8,
        EntryKind::ConfChange => 1u8,
    });
    data.extend_from_slice(&e.data);
    LogEntry::new(e.index, e.term, data)
}

/// Decodes a log-store entry of stream `stream`.
pub fn decode_entry(stream: u64, e: LogEntry) -> Result<Entry, StorageError> {
    let kind = match e.data.first() {
        Some(0) => EntryKind::Normal,
        Some(1) => EntryKind::ConfChange,
        other => {
            return Err(StorageError::Other(
                format!(
                    "log stream {stream} entry {}: bad entry kind byte {other:?}",
                    e.index
                )
                .into(),
            ))
        }
    };
    Ok(Entry {
        term: e.term,
        index: e.index,
        kind,
        data: e.data.slice(1..),
        conflict_keys: None,
    })
}

/// Makes the log of `group` continue the engine's state at `applied` = (X, term), before
/// the replica opens:
/// - entries at or below X are dropped (the engine holds their effect);
/// - entries above X are kept only if they continue X: the log holds X with the same
///   term (log matching), or the log was cut at exactly X. Otherwise they were left by a
///   snapshot install that crashed between the engine's switch and the log's reset: the
///   install keeps nothing above the snapshot (see `apply_snapshot`), so neither does this.
/// - a log that starts past X + 1 has lost entries the engine never applied: corruption.
fn reconcile_log(log: &LogStore, group: u64, applied: (u64, u64)) -> crate::Result<()> {
    let (x, term) = applied;
    let first = log.first_index(group).unwrap_or(1);
    let last = log.last_index(group).unwrap_or(0);
    if x == u64::MAX {
        return Err(crate::Error::Corruption(format!(
            "group {group}: applied index {x} is out of range"
        )));
    }
    if first > x + 1 {
        return Err(crate::Error::Corruption(format!(
            "raft log of group {group} starts at {first} but the engine has applied only up \
             to {x}: entries {}..{first} are missing",
            x + 1
        )));
    }
    if last > x {
        match log.term(group, x) {
            Ok(Some(t)) if t != term => {
                tracing::warn!(
                    group,
                    applied = x,
                    "log entries above the installed snapshot diverge from it; dropping them"
                );
                log.truncate_suffix(group, x + 1)?;
            }
            // Holds X with its term (continues it), or was cut at exactly X.
            Ok(Some(_)) | Err(phoenix_log::Error::Compacted { .. }) => {}
            Ok(None) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if first <= x || log.last_index(group).unwrap_or(0) <= x {
        log.truncate_prefix(group, x + 1)?;
    }
    Ok(())
}

/// Raft storage of one group (see the module doc).
#[derive(Debug)]
pub struct GroupStorage {
    log: Arc<LogStore>,
    group: u64,
    /// Everything at or below `snap.index` is compacted; `snap.term` answers `term()`
    /// for it.
    snap: SnapshotMeta,
    hard_state: HardState,
    /// Whether `hard_state` holds a commit index not yet handed to the log store.
    hard_state_pending: bool,
    conf: ConfState,
    /// Last applied (index, term): what a snapshot built now would cover.
    applied: (u64, u64),
}

fn other(e: impl std::fmt::Display) -> StorageError {
    StorageError::Other(e.to_string().into())
}

impl GroupStorage {
    /// Storage of group `group` whose state machine is at `applied` (= the persisted
    /// applied index and its term) with membership `conf`.
    pub fn open(
        log: Arc<LogStore>,
        group: u64,
        applied: (u64, u64),
        conf: ConfState,
    ) -> crate::Result<GroupStorage> {
        let hs = log.hard_state(group).unwrap_or_default();
        let hard_state = HardState {
            term: hs.term.max(applied.1),
            vote: hs.vote,
            commit: hs.commit.max(applied.0),
        };
        if applied.0 > 0 {
            reconcile_log(&log, group, applied)?;
        }
        Ok(GroupStorage {
            log,
            group,
            snap: SnapshotMeta {
                index: applied.0,
                term: applied.1,
                conf: conf.clone(),
            },
            hard_state,
            hard_state_pending: false,
            conf,
            applied,
        })
    }

    /// The group id (= log stream id).
    pub fn group(&self) -> u64 {
        self.group
    }

    /// Records the applied position (after the engine batch covering it was written).
    pub fn set_applied(&mut self, index: u64, term: u64) {
        self.applied = (index, term);
    }

    /// Last applied (index, term).
    pub fn applied(&self) -> (u64, u64) {
        self.applied
    }

    /// Records a membership change applied at the applied index.
    pub fn set_conf(&mut self, conf: ConfState) {
        self.conf = conf;
    }

    /// Current membership.
    pub fn conf(&self) -> &ConfState {
        &self.conf
    }

    /// Records the durable hard state.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Index of the compaction point (first index - 1).
    pub fn snap_index(&self) -> u64 {
        self.snap.index
    }

    /// Appends entries (replacing a conflicting suffix) and the hard state; `done` runs
    /// (on the log store's writer thread) once they are durable. Returns `false`, without
    /// calling `done`, when nothing had to be written: a hard state that only moved the
    /// commit index is held back until the next durable append (see the module doc).
    pub fn append_then(
        &mut self,
        entries: &[Entry],
        hs: Option<HardState>,
        done: impl FnOnce(Result<(), phoenix_log::Error>) + Send + 'static,
    ) -> bool {
        if let Some(h) = hs {
            let must_sync = h.term != self.hard_state.term || h.vote != self.hard_state.vote;
            self.hard_state = h;
            self.hard_state_pending = true;
            if entries.is_empty() && !must_sync {
                return false;
            }
        }
        if entries.is_empty() && !self.hard_state_pending {
            return false;
        }
        let ents = entries.iter().map(encode_entry).collect();
        let hs = std::mem::take(&mut self.hard_state_pending).then_some(phoenix_log::HardState {
            term: self.hard_state.term,
            vote: self.hard_state.vote,
            commit: self.hard_state.commit,
        });
        self.log.append_with(self.group, ents, hs, done);
        true
    }

    /// Drops entries up to `index` (inclusive), which must be at or below the engine's
    /// persisted applied index and at or below the applied index.
    pub fn compact_to(&mut self, index: u64) -> Result<(), StorageError> {
        if index <= self.snap.index {
            return Ok(());
        }
        if index > self.applied.0 {
            return Err(other(format!(
                "group {}: cannot compact to {index} past applied {}",
                self.group, self.applied.0
            )));
        }
        let term = self.term(index)?;
        self.log
            .truncate_prefix(self.group, index + 1)
            .map_err(other)?;
        self.snap = SnapshotMeta {
            index,
            term,
            conf: self.conf.clone(),
        };
        Ok(())
    }

    /// Installs a snapshot's position once the engine holds its data: the log is reset to
    /// start right after `meta.index`. Entries above it go first (they may diverge from
    /// the snapshot's history: raft installs a snapshot only when its log does not hold
    /// the snapshot's last entry), then the ones below; `between` runs in between (a
    /// failpoint). A crash at any point is repaired by [`GroupStorage::open`].
    pub fn apply_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        between: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), StorageError> {
        self.log
            .truncate_suffix(self.group, meta.index + 1)
            .map_err(other)?;
        between().map_err(other)?;
        self.log
            .truncate_prefix(self.group, meta.index + 1)
            .map_err(other)?;
        self.snap = meta.clone();
        self.conf = meta.conf.clone();
        self.applied = (meta.index, meta.term);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.hard_state.term = self.hard_state.term.max(meta.term);
        Ok(())
    }

    fn log_last(&self) -> u64 {
        self.log
            .last_index(self.group)
            .unwrap_or(0)
            .max(self.snap.index)
    }
}

impl Storage for GroupStorage {
    fn initial_state(&self) -> Result<RaftState, StorageError> {
        Ok(RaftState {
            hard_state: self.hard_state,
            conf_state: self.conf.clone(),
        })
    }

    fn entries(&self, lo: u64, hi: u64, max_size: u64) -> Result<Vec<Entry>, StorageError> {
        if lo <= self.snap.index {
            return Err(StorageError::Compacted {
                index: lo,
                first_index: self.snap.index + 1,
            });
        }
        let last = self.log_last();
        if hi > last + 1 {
            return Err(StorageError::Unavailable {
                index: hi - 1,
                last_index: last,
            });
        }
        if lo >= hi {
            return Ok(Vec::new());
        }
        // Read in growing chunks and stop at `max_size`: a follower far behind asks for
        // everything up to the last index, and reading (and decoding) all of it on the
        // raft driver thread for every append message stalled heartbeats of every group.
        let mut out = Vec::new();
        let mut size = 0u64;
        let mut cur = lo;
        let mut chunk = 16u64;
        while cur < hi {
            let end = hi.min(cur.saturating_add(chunk));
            let raw = self.log.read(self.group, cur..end).map_err(|e| match e {
                phoenix_log::Error::Compacted { .. } => StorageError::Compacted {
                    index: lo,
                    first_index: self.snap.index + 1,
                },
                e => other(format!("group {} entries {cur}..{end}: {e}", self.group)),
            })?;
            for e in raw {
                let e = decode_entry(self.group, e)?;
                size += e.size();
                if !out.is_empty() && size > max_size {
                    return Ok(out);
                }
                out.push(e);
            }
            cur = end;
            chunk = (chunk * 2).min(1024);
        }
        Ok(out)
    }

    fn term(&self, index: u64) -> Result<u64, StorageError> {
        if index == self.snap.index {
            return Ok(self.snap.term);
        }
        if index < self.snap.index {
            return Err(StorageError::Compacted {
                index,
                first_index: self.snap.index + 1,
            });
        }
        match self.log.term(self.group, index) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(StorageError::Unavailable {
                index,
                last_index: self.log_last(),
            }),
            Err(phoenix_log::Error::Compacted { .. }) => Err(StorageError::Compacted {
                index,
                first_index: self.snap.index + 1,
            }),
            Err(e) => Err(other(format!("group {} term {index}: {e}", self.group))),
        }
    }

    fn first_index(&self) -> Result<u64, StorageError> {
        Ok(self.snap.index + 1)
    }

    fn last_index(&self) -> Result<u64, StorageError> {
        Ok(self.log_last())
    }

    fn snapshot(&self, _request_index: u64) -> Result<Snapshot, StorageError> {
        // The snapshot describes the engine state as of the applied index; its data is
        // built from an engine snapshot when the message leaves (snapshot.rs).
        Ok(Snapshot {
            meta: SnapshotMeta {
                index: self.applied.0,
                term: self.applied.1,
                conf: self.conf.clone(),
            },
            data: Bytes::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use phoenix_log::LogOptions;

    fn store() -> Arc<LogStore> {
        let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::MemFs::new());
        LogStore::open(fs, std::path::Path::new("/log"), LogOptions::default()).unwrap()
    }

    fn append(log: &LogStore, g: u64, range: std::ops::RangeInclusive<u64>, term: u64) {
        let ents = range
            .map(|i| {
                encode_entry(&Entry {
                    term,
                    index: i,
                    kind: EntryKind::Normal,
                    data: Bytes::from_static(b"x"),
                    conflict_keys: None,
                })
            })
            .collect();
        log.append(g, ents, None).wait().unwrap();
    }

    fn meta(index: u64, term: u64) -> SnapshotMeta {
        SnapshotMeta {
            index,
            term,
            conf: ConfState::with_voters([1, 2, 3]),
        }
    }

    /// Finding: installing a snapshot kept a divergent suffix above it; the replica's
    /// last index then named entries of another history.
    #[test]
    fn snapshot_install_drops_the_divergent_suffix() {
        let log = store();
        append(&log, 1, 1..=10, 1);
        let conf = ConfState::with_voters([1, 2, 3]);
        let mut s = GroupStorage::open(Arc::clone(&log), 1, (0, 0), conf).unwrap();
        s.apply_snapshot(&meta(5, 2), || Ok(())).unwrap();
        assert_eq!(s.last_index().unwrap(), 5);
        assert_eq!(s.first_index().unwrap(), 6);
        assert_eq!(s.term(5).unwrap(), 2);
        assert!(s.entries(6, 7, u64::MAX).is_err());
        assert_eq!(log.last_index(1), Some(5));
    }

    /// A crash after the engine took a snapshot at (X, term) but before the log was reset:
    /// opening drops the entries that do not continue X, keeps those that do.
    #[test]
    fn open_reconciles_the_log_with_the_applied_index() {
        let conf = ConfState::with_voters([1, 2, 3]);
        // Old history above X with another term at X: dropped.
        let log = store();
        append(&log, 1, 1..=10, 1);
        let s = GroupStorage::open(Arc::clone(&log), 1, (5, 2), conf.clone()).unwrap();
        assert_eq!(s.last_index().unwrap(), 5);
        assert_eq!(s.term(5).unwrap(), 2);
        // The log continues X (same term at X): kept.
        let log = store();
        append(&log, 1, 1..=10, 2);
        let s = GroupStorage::open(Arc::clone(&log), 1, (5, 2), conf.clone()).unwrap();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (6, 10));
        // The log was cut at exactly X (normal truncation): kept.
        let log = store();
        append(&log, 1, 1..=10, 2);
        log.truncate_prefix(1, 6).unwrap();
        let s = GroupStorage::open(Arc::clone(&log), 1, (5, 2), conf.clone()).unwrap();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (6, 10));
        // The log ends below X: restarts after X.
        let log = store();
        append(&log, 1, 1..=3, 1);
        let s = GroupStorage::open(Arc::clone(&log), 1, (5, 2), conf.clone()).unwrap();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (6, 5));
        // The log starts past X + 1: entries the engine never applied are gone.
        let log = store();
        append(&log, 1, 1..=10, 2);
        log.truncate_prefix(1, 8).unwrap();
        let err = GroupStorage::open(Arc::clone(&log), 1, (5, 2), conf).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
