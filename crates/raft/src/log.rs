//! The raft log as the core sees it: the durable part behind [`Storage`] and the
//! `Unstable` part (entries and a snapshot not yet persisted), plus the commit index and
//! the apply cursor.
//!
//! Invariants (checked by `check_invariants` in tests and the simulation):
//! 1. `unstable.entries` are contiguous from `unstable.offset`;
//! 2. `applied <= applying <= committed` and `applying <= persisted` except right after
//!    a snapshot restore, where all three move to the snapshot index together;
//! 3. `unstable.in_progress` lies in `[unstable.offset, last_index + 1]`.

use crate::error::{Error, StorageError};
use crate::storage::{limit_size, Storage};
use crate::types::{Entry, Snapshot};

/// Entries and snapshot handed to the application but not yet known to be durable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct Unstable {
    /// A snapshot to install, if any (it precedes `entries`).
    pub snapshot: Option<Snapshot>,
    /// Whether `snapshot` was handed out in a ready already.
    pub snapshot_in_progress: bool,
    /// Entries from `offset` on.
    pub entries: Vec<Entry>,
    /// Index of `entries[0]` (or where it would be).
    pub offset: u64,
    /// First index not yet handed out in a ready.
    pub in_progress: u64,
}

impl Unstable {
    fn last_index(&self) -> Option<u64> {
        if let Some(e) = self.entries.last() {
            return Some(e.index);
        }
        self.snapshot.as_ref().map(|s| s.meta.index)
    }

    fn term(&self, index: u64) -> Option<u64> {
        if index < self.offset {
            return self
                .snapshot
                .as_ref()
                .filter(|s| s.meta.index == index)
                .map(|s| s.meta.term);
        }
        self.entries
            .get((index - self.offset) as usize)
            .map(|e| e.term)
    }

    /// Drops entries up to `index` once they are durable, if the entry there still has
    /// `term` (it may have been replaced by a conflicting append meanwhile).
    fn stable_to(&mut self, index: u64, term: u64) {
        if index < self.offset || self.term(index) != Some(term) {
            return;
        }
        let n = (index + 1 - self.offset) as usize;
        self.entries.drain(..n);
        self.offset = index + 1;
        self.in_progress = self.in_progress.max(self.offset);
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            // Keep idle groups small: give back the buffer of a past burst.
            self.entries.shrink_to_fit();
        }
    }

    fn truncate_and_append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        let after = first.index;
        if after == self.offset + self.entries.len() as u64 {
            self.entries.extend_from_slice(ents);
        } else if after <= self.offset {
            // Replaces everything unstable; durable entries from `after` on are replaced
            // once this ready persists (storage appends truncate the suffix).
            self.offset = after;
            self.entries.clear();
            self.entries.extend_from_slice(ents);
        } else {
            self.entries.truncate((after - self.offset) as usize);
            self.entries.extend_from_slice(ents);
        }
        self.in_progress = self.in_progress.min(after);
    }
}

/// The raft log of one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RaftLog<S> {
    pub(crate) store: S,
    pub(crate) unstable: Unstable,
    /// Highest index known committed.
    pub(crate) committed: u64,
    /// Highest index known durable on this node.
    pub(crate) persisted: u64,
    /// Apply cursor: highest index handed out to apply.
    pub(crate) applying: u64,
    /// Apply cursor: highest index the application said it applied.
    pub(crate) applied: u64,
    /// Maximum bytes of entries per message / per ready.
    pub(crate) max_size: u64,
}

impl<S: Storage> RaftLog<S> {
    pub(crate) fn new(store: S, max_size: u64) -> Result<RaftLog<S>, Error> {
        let first = store.first_index()?;
        let last = store.last_index()?;
        let commit = store.initial_state()?.hard_state.commit;
        if commit < first - 1 || commit > last {
            return Err(Error::Invariant(format!(
                "stored commit {commit} outside the stored log [{}, {last}]",
                first - 1
            )));
        }
        Ok(RaftLog {
            store,
            unstable: Unstable {
                offset: last + 1,
                in_progress: last + 1,
                ..Unstable::default()
            },
            committed: commit,
            persisted: last,
            applying: first - 1,
            applied: first - 1,
            max_size,
        })
    }

    /// The storage behind the log.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Term of the entry at `index` in this node's log (durable or not), `None` if the
    /// index is compacted or beyond the end.
    pub fn entry_term(&self, index: u64) -> Result<Option<u64>, Error> {
        self.term_opt(index)
    }

    /// Last index of this node's log (durable or not).
    pub fn last_log_index(&self) -> Result<u64, Error> {
        self.last_index()
    }

    /// Commit index.
    pub fn commit_index(&self) -> u64 {
        self.committed
    }

    /// Applied index (as acknowledged by the application).
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    pub(crate) fn first_index(&self) -> Result<u64, Error> {
        if let Some(s) = &self.unstable.snapshot {
            return Ok(s.meta.index + 1);
        }
        Ok(self.store.first_index()?)
    }

    pub(crate) fn last_index(&self) -> Result<u64, Error> {
        if let Some(i) = self.unstable.last_index() {
            return Ok(i);
        }
        Ok(self.store.last_index()?)
    }

    /// Term at `index`: `Ok(None)` when outside the log (compacted or beyond the end).
    pub(crate) fn term_opt(&self, index: u64) -> Result<Option<u64>, Error> {
        if let Some(t) = self.unstable.term(index) {
            return Ok(Some(t));
        }
        let dummy = self.first_index()? - 1;
        if index < dummy || index > self.last_index()? {
            return Ok(None);
        }
        if index >= self.unstable.offset && self.unstable.snapshot.is_none() {
            return Ok(None);
        }
        match self.store.term(index) {
            Ok(t) => Ok(Some(t)),
            Err(StorageError::Compacted { .. }) | Err(StorageError::Unavailable { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Term at `index`, which must be inside the log.
    pub(crate) fn term(&self, index: u64) -> Result<u64, Error> {
        self.term_opt(index)?
            .ok_or_else(|| Error::Invariant(format!("term of index {index} is not available")))
    }

    pub(crate) fn last_term(&self) -> Result<u64, Error> {
        self.term(self.last_index()?)
    }

    pub(crate) fn match_term(&self, index: u64, term: u64) -> Result<bool, Error> {
        Ok(self.term_opt(index)? == Some(term))
    }

    /// Whether a log ending at (`last_index`, `term`) is at least as up to date as ours
    /// (Raft §5.4.1).
    pub(crate) fn is_up_to_date(&self, last_index: u64, term: u64) -> Result<bool, Error> {
        let our_term = self.last_term()?;
        Ok(term > our_term || (term == our_term && last_index >= self.last_index()?))
    }

    /// Entries `[lo, hi)` within `max_size` bytes (at least one), from storage then
    /// unstable.
    pub(crate) fn slice(&self, lo: u64, hi: u64, max_size: u64) -> Result<Vec<Entry>, Error> {
        if lo >= hi {
            return Ok(Vec::new());
        }
        let first = self.first_index()?;
        if lo < first {
            return Err(StorageError::Compacted {
                index: lo,
                first_index: first,
            }
            .into());
        }
        let last = self.last_index()?;
        if hi > last + 1 {
            return Err(Error::Invariant(format!(
                "slice [{lo}, {hi}) beyond last index {last}"
            )));
        }
        let mut out = Vec::new();
        let uoff = self.unstable.offset;
        if lo < uoff {
            out = self.store.entries(lo, hi.min(uoff), max_size)?;
            let got = out.len() as u64;
            if got < hi.min(uoff) - lo {
                return Ok(out); // size limit reached inside storage
            }
        }
        if hi > uoff {
            let from = lo.max(uoff);
            let ents = self
                .unstable
                .entries
                .get((from - uoff) as usize..(hi - uoff) as usize)
                .ok_or_else(|| {
                    Error::Invariant(format!("unstable slice [{from}, {hi}) missing"))
                })?;
            if out.is_empty() {
                out.extend_from_slice(limit_size(ents, max_size));
            } else {
                let mut size: u64 = out.iter().map(Entry::size).sum();
                for e in ents {
                    size += e.size();
                    if size > max_size {
                        break;
                    }
                    out.push(e.clone());
                }
            }
        }
        Ok(out)
    }

    /// Appends entries the leader created; returns the new last index.
    pub(crate) fn append(&mut self, ents: &[Entry]) -> Result<u64, Error> {
        let Some(first) = ents.first() else {
            return self.last_index();
        };
        if first.index <= self.committed {
            return Err(Error::Invariant(format!(
                "append at {} would overwrite committed index {}",
                first.index, self.committed
            )));
        }
        self.unstable.truncate_and_append(ents);
        if first.index <= self.persisted {
            self.persisted = first.index - 1;
        }
        self.last_index()
    }

    /// Follower side of AppendEntries: if our entry at `index` has `log_term`, appends
    /// `ents` after truncating a conflicting suffix and returns the last new index.
    pub(crate) fn maybe_append(
        &mut self,
        index: u64,
        log_term: u64,
        committed: u64,
        ents: &[Entry],
    ) -> Result<Option<u64>, Error> {
        if !self.match_term(index, log_term)? {
            return Ok(None);
        }
        let last_new = index + ents.len() as u64;
        let conflict = self.find_conflict(ents)?;
        if conflict != 0 {
            if conflict <= self.committed {
                return Err(Error::Invariant(format!(
                    "entry {conflict} conflicts with the committed log (commit {})",
                    self.committed
                )));
            }
            let start = (conflict - index - 1) as usize;
            let rest = ents.get(start..).unwrap_or(&[]);
            self.append(rest)?;
        }
        self.commit_to(committed.min(last_new));
        Ok(Some(last_new))
    }

    /// First index among `ents` whose term differs from ours (or that we lack); 0 if
    /// all match.
    fn find_conflict(&self, ents: &[Entry]) -> Result<u64, Error> {
        for e in ents {
            if !self.match_term(e.index, e.term)? {
                return Ok(e.index);
            }
        }
        Ok(0)
    }

    /// The largest index ≤ `index` whose term is ≤ `term` (fast back-off: both sides
    /// skip a whole term of a divergent suffix per round trip).
    pub(crate) fn find_conflict_by_term(&self, index: u64, term: u64) -> Result<(u64, u64), Error> {
        let mut i = index.min(self.last_index()?);
        loop {
            match self.term_opt(i)? {
                Some(t) if t > term => i -= 1,
                Some(t) => return Ok((i, t)),
                None => return Ok((i, 0)),
            }
        }
    }

    pub(crate) fn commit_to(&mut self, to: u64) {
        if to > self.committed {
            self.committed = to;
        }
    }

    /// Leader rule: commit `max_index` only if its entry is of the current `term`
    /// (Raft §5.4.2: never count replicas of older-term entries).
    pub(crate) fn maybe_commit(&mut self, max_index: u64, term: u64) -> Result<bool, Error> {
        if max_index > self.committed && self.term_opt(max_index)? == Some(term) {
            self.commit_to(max_index);
            return Ok(true);
        }
        Ok(false)
    }

    /// Installs a snapshot received from the leader.
    pub(crate) fn restore(&mut self, snap: Snapshot) {
        let idx = snap.meta.index;
        self.committed = idx;
        self.persisted = self.persisted.min(idx);
        self.applying = idx;
        self.applied = idx;
        self.unstable.entries.clear();
        self.unstable.offset = idx + 1;
        self.unstable.in_progress = idx + 1;
        self.unstable.snapshot = Some(snap);
        self.unstable.snapshot_in_progress = false;
    }

    /// Entries not yet handed out for persistence.
    pub(crate) fn next_unstable_entries(&self) -> &[Entry] {
        let start = self
            .unstable
            .in_progress
            .saturating_sub(self.unstable.offset) as usize;
        self.unstable.entries.get(start..).unwrap_or(&[])
    }

    /// Index of the snapshot raft waits for the application to install (handed out in
    /// a ready or not yet), if any.
    pub fn pending_snapshot_index(&self) -> Option<u64> {
        self.unstable.snapshot.as_ref().map(|s| s.meta.index)
    }

    /// The index of the snapshot raft accepted and has not handed out in a ready yet
    /// (None: none, or the one pending is being installed).
    pub fn snapshot_to_hand_out(&self) -> Option<u64> {
        if self.unstable.snapshot_in_progress {
            return None;
        }
        self.pending_snapshot_index()
    }

    pub(crate) fn has_next_unstable_snapshot(&self) -> bool {
        self.unstable.snapshot.is_some() && !self.unstable.snapshot_in_progress
    }

    /// Marks everything unstable as handed out.
    pub(crate) fn accept_unstable(&mut self) {
        if let Some(e) = self.unstable.entries.last() {
            self.unstable.in_progress = e.index + 1;
        }
        if self.unstable.snapshot.is_some() {
            self.unstable.snapshot_in_progress = true;
        }
    }

    /// The application made entries up to (`index`, `term`) durable.
    pub(crate) fn stable_to(&mut self, index: u64, term: u64) {
        if self.unstable.term(index) == Some(term) && index >= self.unstable.offset {
            self.persisted = self.persisted.max(index);
        }
        self.unstable.stable_to(index, term);
    }

    /// The application made the snapshot at `index` durable.
    pub(crate) fn stable_snap_to(&mut self, index: u64) {
        if self
            .unstable
            .snapshot
            .as_ref()
            .is_some_and(|s| s.meta.index == index)
        {
            self.unstable.snapshot = None;
            self.unstable.snapshot_in_progress = false;
            self.persisted = self.persisted.max(index);
        }
    }

    /// Highest index that may be handed out to apply: committed and durable here.
    pub(crate) fn max_appliable(&self) -> u64 {
        self.committed.min(self.persisted)
    }

    pub(crate) fn has_next_committed_entries(&self) -> bool {
        self.unstable.snapshot.is_none() && self.max_appliable() > self.applying
    }

    /// Committed entries not yet handed out, at most `max_size` bytes.
    pub(crate) fn next_committed_entries(&self) -> Result<Vec<Entry>, Error> {
        if !self.has_next_committed_entries() {
            return Ok(Vec::new());
        }
        self.slice(self.applying + 1, self.max_appliable() + 1, self.max_size)
    }

    pub(crate) fn applying_to(&mut self, index: u64) {
        self.applying = self.applying.max(index);
    }

    /// The application applied up to `index`.
    pub(crate) fn applied_to(&mut self, index: u64) -> Result<(), Error> {
        if index > self.committed || index > self.applying {
            return Err(Error::Misuse("applied index beyond what was handed out"));
        }
        self.applied = self.applied.max(index);
        Ok(())
    }

    /// Checks the invariants listed in the module doc.
    pub(crate) fn check_invariants(&self) -> Result<(), Error> {
        let u = &self.unstable;
        for (k, e) in u.entries.iter().enumerate() {
            if e.index != u.offset + k as u64 {
                return Err(Error::Invariant(format!(
                    "unstable entry {} at slot {k} (offset {})",
                    e.index, u.offset
                )));
            }
        }
        if self.applied > self.applying || self.applying > self.committed {
            return Err(Error::Invariant(format!(
                "apply cursor: applied {} applying {} committed {}",
                self.applied, self.applying, self.committed
            )));
        }
        if self.committed > self.last_index()? {
            return Err(Error::Invariant(format!(
                "commit {} beyond last index {}",
                self.committed,
                self.last_index()?
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;
    use crate::types::ConfState;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: bytes::Bytes::from(vec![index as u8; 8]),
            ..Entry::default()
        }
    }

    fn log_with(stored: &[(u64, u64)]) -> RaftLog<MemStorage> {
        let mut s = MemStorage::new_with_conf(ConfState::with_voters([1]));
        let ents: Vec<Entry> = stored.iter().map(|&(i, t)| ent(i, t)).collect();
        s.append(&ents).unwrap();
        RaftLog::new(s, u64::MAX).unwrap()
    }

    #[test]
    fn maybe_append_truncates_conflicting_suffix_only() {
        let mut l = log_with(&[(1, 1), (2, 1), (3, 2)]);
        // Matching prefix, conflicting entry at 3.
        let got = l
            .maybe_append(1, 1, 0, &[ent(2, 1), ent(3, 3), ent(4, 3)])
            .unwrap();
        assert_eq!(got, Some(4));
        assert_eq!(l.term_opt(3).unwrap(), Some(3));
        assert_eq!(l.last_index().unwrap(), 4);
        assert_eq!(
            l.persisted, 2,
            "the replaced durable entry no longer counts as persisted"
        );
        // A stale duplicate of a prefix does not truncate what follows.
        assert_eq!(l.maybe_append(1, 1, 0, &[ent(2, 1)]).unwrap(), Some(2));
        assert_eq!(l.last_index().unwrap(), 4);
        // Mismatch at the previous index is refused.
        assert_eq!(l.maybe_append(4, 9, 0, &[]).unwrap(), None);
        l.check_invariants().unwrap();
    }

    #[test]
    fn conflict_with_committed_entry_is_an_invariant_error() {
        let mut l = log_with(&[(1, 1), (2, 1)]);
        l.commit_to(2);
        assert!(matches!(
            l.maybe_append(1, 1, 0, &[ent(2, 5)]),
            Err(Error::Invariant(_))
        ));
    }

    #[test]
    fn stable_to_ignores_entries_replaced_meanwhile() {
        let mut l = log_with(&[(1, 1)]);
        l.append(&[ent(2, 1), ent(3, 1)]).unwrap();
        l.accept_unstable();
        // Before (3, 1) is durable it is replaced by a term-2 entry.
        l.maybe_append(2, 1, 0, &[ent(3, 2)]).unwrap();
        l.stable_to(3, 1);
        assert_eq!(
            l.unstable.offset, 2,
            "stale acknowledgement changes nothing"
        );
        assert_eq!(
            l.next_unstable_entries().len(),
            1,
            "the new entry 3 is handed out again"
        );
        l.stable_to(3, 2);
        assert!(l.unstable.entries.is_empty());
        assert_eq!(l.persisted, 3);
    }

    #[test]
    fn find_conflict_by_term_skips_whole_terms() {
        let l = log_with(&[(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 4)]);
        assert_eq!(l.find_conflict_by_term(6, 3).unwrap(), (5, 2));
        assert_eq!(l.find_conflict_by_term(6, 1).unwrap(), (2, 1));
        assert_eq!(l.find_conflict_by_term(100, 9).unwrap(), (6, 4));
        assert_eq!(l.find_conflict_by_term(6, 0).unwrap(), (0, 0));
    }

    #[test]
    fn slice_spans_storage_and_unstable_and_respects_size() {
        let mut l = log_with(&[(1, 1), (2, 1)]);
        l.append(&[ent(3, 2), ent(4, 2)]).unwrap();
        let all = l.slice(1, 5, u64::MAX).unwrap();
        assert_eq!(
            all.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        let one = l.slice(1, 5, 1).unwrap();
        assert_eq!(one.len(), 1, "at least one entry, then the size limit");
        let two = l.slice(2, 5, 2 * ent(1, 1).size()).unwrap();
        assert_eq!(two.iter().map(|e| e.index).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn commit_only_for_current_term_entries() {
        let mut l = log_with(&[(1, 1), (2, 2)]);
        assert!(
            !l.maybe_commit(2, 3).unwrap(),
            "term-2 entry not committed by a term-3 leader"
        );
        assert!(l.maybe_commit(2, 2).unwrap());
        assert_eq!(l.committed, 2);
    }
}
