//! The user-level iterator: turns the merged stream of internal entries into the user
//! keys and values visible at one snapshot, hiding older versions, point tombstones and
//! entries covered by range tombstones, within optional bounds, in both directions.
//!
//! Prefix seeks: with a prefix extractor and `prefix_same_as_start`, a seek to a key at
//! least as long as the prefix confines the iterator to the keys sharing the sought key's
//! prefix (the bounds become the intersection of the read's bounds and the prefix's
//! range), and tells the sources, so tables whose prefix filter rules it out are skipped.
//! A seek to a shorter key, and `seek_to_first`/`seek_to_last`, go back to the read's
//! own bounds.
//!
//! Positions: going forward, the inner cursor sits on the entry being returned; going
//! backward, it sits before every entry of the current user key and the key and value
//! are held in `saved_*` (LevelDB's DBIter scheme).

use std::sync::Arc;

use crate::error::Result;
use crate::iter::{InternalIterator, ReadScope};
use crate::key::{internal_key, parse_internal_key, SequenceNumber, ValueKind, MAX_SEQUENCE};
use crate::merge::MergingIterator;
use crate::range_del::Fragments;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Reverse,
}

/// A cursor over user keys at a snapshot. Holds the sources it reads alive.
pub struct DbIterator {
    inner: MergingIterator,
    snapshot: SequenceNumber,
    tombstones: Fragments,
    /// The read's own bounds.
    base: Arc<ReadScope>,
    /// The bounds in force: `base`, or `base` narrowed to the last seek's prefix.
    scope: Arc<ReadScope>,
    /// The prefix extractor's length, when seeks are confined to the sought prefix.
    prefix_len: Option<usize>,
    direction: Direction,
    valid: bool,
    saved_key: Vec<u8>,
    saved_value: Vec<u8>,
    /// Going forward: the user key whose remaining versions are skipped (reused so a
    /// step allocates nothing).
    skip_key: Vec<u8>,
    /// Keeps the version, memtables and snapshot the iterator reads alive.
    _pins: Vec<Arc<dyn std::any::Any + Send + Sync>>,
}

impl DbIterator {
    pub(crate) fn new(
        mut inner: MergingIterator,
        snapshot: SequenceNumber,
        tombstones: Fragments,
        base: ReadScope,
        prefix_len: Option<usize>,
        pins: Vec<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        debug_assert!(base.prefix.is_none() && prefix_len != Some(0));
        let base = Arc::new(base);
        if base.lower.is_some() || base.upper.is_some() {
            inner.set_scope(&base);
        }
        DbIterator {
            inner,
            snapshot,
            tombstones,
            scope: Arc::clone(&base),
            base,
            prefix_len,
            direction: Direction::Forward,
            valid: false,
            saved_key: Vec::new(),
            saved_value: Vec::new(),
            skip_key: Vec::new(),
            _pins: pins,
        }
    }

    /// Whether the cursor is on a key.
    pub fn valid(&self) -> bool {
        self.valid
    }

    /// The current user key. Requires `valid()` (empty otherwise).
    pub fn key(&self) -> &[u8] {
        if !self.valid {
            return &[];
        }
        match self.direction {
            Direction::Forward => crate::key::user_key(self.inner.key()),
            Direction::Reverse => &self.saved_key,
        }
    }

    /// The current value. Requires `valid()` (empty otherwise).
    pub fn value(&self) -> &[u8] {
        if !self.valid {
            return &[];
        }
        match self.direction {
            Direction::Forward => self.inner.value(),
            Direction::Reverse => &self.saved_value,
        }
    }

    /// The first error met (a corrupt block stops the scan instead of skipping it).
    pub fn status(&self) -> Result<()> {
        self.inner.status()
    }

    /// Whether version `seq` of `user_key` is hidden by a range tombstone.
    fn covered(&self, user_key: &[u8], seq: SequenceNumber) -> bool {
        !self.tombstones.is_empty() && seq < self.tombstones.max_covering(user_key)
    }

    fn above_upper(&self, user_key: &[u8]) -> bool {
        self.scope.above_upper(user_key)
    }

    fn below_lower(&self, user_key: &[u8]) -> bool {
        self.scope.below_lower(user_key)
    }

    /// Puts in force the bounds of a seek to `target`: narrowed to its prefix in prefix
    /// mode (when `target` has one), the read's own otherwise.
    fn scope_for(&mut self, target: Option<&[u8]>) {
        let prefix = self
            .prefix_len
            .zip(target)
            .and_then(|(len, t)| t.get(..len));
        let Some(p) = prefix else {
            if !Arc::ptr_eq(&self.scope, &self.base) {
                self.scope = Arc::clone(&self.base);
                self.inner.set_scope(&self.scope);
            }
            return;
        };
        if self.scope.prefix.as_deref() == Some(p) {
            return;
        }
        let lower = match self.base.lower.as_deref() {
            Some(l) if l > p => l.to_vec(),
            _ => p.to_vec(),
        };
        let upper = match (self.base.upper.as_deref(), prefix_successor(p)) {
            (Some(u), Some(s)) => Some(if u < s.as_slice() { u.to_vec() } else { s }),
            (u, s) => s.or_else(|| u.map(<[u8]>::to_vec)),
        };
        self.scope = Arc::new(ReadScope {
            lower: Some(lower),
            upper,
            prefix: Some(p.to_vec()),
        });
        self.inner.set_scope(&self.scope);
    }

    /// Positions on the first key `>= target` (clamped to the lower bound).
    pub fn seek(&mut self, target: &[u8]) {
        // As RocksDB: the prefix is the one of the target clamped to the lower bound.
        let base = Arc::clone(&self.base);
        match base.lower.as_deref() {
            Some(l) if target < l => self.scope_for(Some(l)),
            _ => self.scope_for(Some(target)),
        }
        self.seek_in_scope(target);
    }

    fn seek_in_scope(&mut self, target: &[u8]) {
        let t = match self.scope.lower.as_deref() {
            Some(l) if target < l => l.to_vec(),
            _ => target.to_vec(),
        };
        self.direction = Direction::Forward;
        self.inner
            .seek(&internal_key(&t, self.snapshot, ValueKind::RangeDelete));
        self.find_next_user_entry(false);
    }

    /// Positions on the first key.
    pub fn seek_to_first(&mut self) {
        self.scope_for(None);
        match self.scope.lower.clone() {
            Some(l) => self.seek_in_scope(&l),
            None => {
                self.direction = Direction::Forward;
                self.inner.seek_to_first();
                self.find_next_user_entry(false);
            }
        }
    }

    /// Positions on the last key `<= target` (clamped below the upper bound).
    pub fn seek_for_prev(&mut self, target: &[u8]) {
        // As RocksDB: the prefix is the one of the target clamped to the upper bound.
        let base = Arc::clone(&self.base);
        match base.upper.as_deref() {
            Some(u) if target >= u => self.scope_for(Some(u)),
            _ => self.scope_for(Some(target)),
        }
        self.direction = Direction::Reverse;
        match self.scope.upper.as_deref() {
            Some(u) if target >= u => {
                let t = internal_key(u, MAX_SEQUENCE, ValueKind::RangeDelete);
                self.inner.seek_for_prev(&t);
            }
            _ => {
                let t = internal_key(target, 0, ValueKind::Delete);
                self.inner.seek_for_prev(&t);
            }
        }
        self.find_prev_user_entry();
    }

    /// Positions on the last key.
    pub fn seek_to_last(&mut self) {
        self.scope_for(None);
        self.direction = Direction::Reverse;
        match self.scope.upper.clone() {
            Some(u) => {
                let t = internal_key(&u, MAX_SEQUENCE, ValueKind::RangeDelete);
                self.inner.seek_for_prev(&t);
            }
            None => self.inner.seek_to_last(),
        }
        self.find_prev_user_entry();
    }

    /// Moves to the next key. Requires `valid()`.
    pub fn next(&mut self) {
        if !self.valid {
            return;
        }
        if self.direction == Direction::Reverse {
            // The inner cursor is before the current key's entries: step onto them.
            self.direction = Direction::Forward;
            if self.inner.valid() {
                self.inner.next();
            } else {
                // Before the start of the data, or of what the scope lets the sources
                // read: seek back to the current key's entries rather than reading from
                // the very first key.
                self.inner.seek(&internal_key(
                    &self.saved_key,
                    MAX_SEQUENCE,
                    ValueKind::RangeDelete,
                ));
            }
            // `saved_key` holds the current key; `saved_*` are rebuilt when going back.
            std::mem::swap(&mut self.skip_key, &mut self.saved_key);
            self.find_next_user_entry(true);
            return;
        }
        self.skip_key.clear();
        self.skip_key
            .extend_from_slice(crate::key::user_key(self.inner.key()));
        self.inner.next();
        self.find_next_user_entry(true);
    }

    /// Moves to the previous key. Requires `valid()`.
    pub fn prev(&mut self) {
        if !self.valid {
            return;
        }
        if self.direction == Direction::Forward {
            // Step back before every entry of the current key.
            self.saved_key.clear();
            self.saved_key
                .extend_from_slice(crate::key::user_key(self.inner.key()));
            loop {
                self.inner.prev();
                if !self.inner.valid() {
                    break;
                }
                if crate::key::user_key(self.inner.key()) < self.saved_key.as_slice() {
                    break;
                }
            }
            self.direction = Direction::Reverse;
        }
        self.find_prev_user_entry();
    }

    /// Forward: settles on the first visible entry, skipping (when `skipping`) versions
    /// of `skip_key` and of any key whose newest visible version is a deletion.
    fn find_next_user_entry(&mut self, mut skipping: bool) {
        while self.inner.valid() {
            let Some(p) = parse_internal_key(self.inner.key()) else {
                self.inner.next();
                continue;
            };
            if self.above_upper(p.user_key) {
                break;
            }
            let skipped = skipping && p.user_key <= self.skip_key.as_slice();
            if p.seq <= self.snapshot && !skipped {
                if p.kind == ValueKind::Put && !self.covered(p.user_key, p.seq) {
                    self.valid = true;
                    return;
                }
                // The newest visible version is deleted: skip the whole key.
                self.skip_key.clear();
                self.skip_key.extend_from_slice(p.user_key);
                skipping = true;
            }
            self.inner.next();
        }
        self.valid = false;
    }

    /// Reverse: walks back over the entries of the previous user key(s), remembering
    /// the newest visible version, until a live key is found.
    fn find_prev_user_entry(&mut self) {
        let mut kind = ValueKind::Delete;
        self.saved_key.clear();
        self.saved_value.clear();
        while self.inner.valid() {
            let Some(p) = parse_internal_key(self.inner.key()) else {
                self.inner.prev();
                continue;
            };
            if p.seq <= self.snapshot {
                if kind != ValueKind::Delete && p.user_key < self.saved_key.as_slice() {
                    // A live version of `saved_key` is complete.
                    break;
                }
                if self.below_lower(p.user_key) {
                    break;
                }
                if self.above_upper(p.user_key) {
                    self.inner.prev();
                    continue;
                }
                let live = p.kind == ValueKind::Put && !self.covered(p.user_key, p.seq);
                if live {
                    kind = ValueKind::Put;
                    self.saved_key.clear();
                    self.saved_key.extend_from_slice(p.user_key);
                    self.saved_value.clear();
                    self.saved_value.extend_from_slice(self.inner.value());
                } else {
                    kind = ValueKind::Delete;
                    self.saved_key.clear();
                    self.saved_value.clear();
                }
            }
            self.inner.prev();
        }
        if kind == ValueKind::Delete {
            self.valid = false;
            self.saved_key.clear();
            self.saved_value.clear();
        } else {
            self.valid = true;
        }
    }
}

/// The smallest key greater than every key starting with `p`: `p` with its last byte
/// below 0xff incremented and the bytes after it dropped; none when `p` is all 0xff.
fn prefix_successor(p: &[u8]) -> Option<Vec<u8>> {
    let i = p.iter().rposition(|&b| b != 0xff)?;
    let mut s = p[..=i].to_vec();
    s[i] += 1;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::prefix_successor;

    #[test]
    fn prefix_successor_bounds_the_prefix() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xff\xff"), None);
        assert_eq!(prefix_successor(b""), None);
    }
}
