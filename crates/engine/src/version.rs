//! An immutable version of the LSM tree: the live table files of every level.
//!
//! Invariants (checked by [`Version::apply`] and [`Version::check`]):
//! 1. L0 files are ordered newest first (descending file number; flushes take numbers in
//!    the order memtables became immutable). They may overlap.
//! 2. From L1 down, files are sorted by smallest key and do not overlap: each file's
//!    largest internal key is below the next file's smallest.
//! 3. For any user key, newer versions (and range tombstones) live in newer L0 files or
//!    higher levels than older ones; reads stop at the first source holding the key. (A
//!    compaction installed in pieces leaves copies, at the same sequence numbers, below
//!    its L0 inputs until its last piece: the first source found holds the same.)

use std::cmp::Ordering;
use std::sync::Arc;

use crate::error::Result;
use crate::key::{compare_internal, parse_internal_key, seek_key, SequenceNumber, ValueKind};
use crate::table::TableCache;
use crate::version_edit::{FileMeta, VersionEdit};

/// The live files per level.
#[derive(Clone, Debug, Default)]
pub struct Version {
    /// `levels[l]` holds level `l`'s files (see the module invariants).
    pub levels: Vec<Arc<Vec<Arc<FileMeta>>>>,
}

/// What the persisted tables say about a key.
#[derive(Debug, PartialEq, Eq)]
pub enum TableGet {
    /// Found a value.
    Value(Vec<u8>),
    /// Found a deletion (point or range).
    Deleted,
    /// Nothing in the tables.
    Absent,
}

impl Version {
    /// An empty version with `num_levels` levels.
    pub fn empty(num_levels: usize) -> Version {
        Version {
            levels: (0..num_levels).map(|_| Arc::new(Vec::new())).collect(),
        }
    }

    /// The number of levels.
    pub fn num_levels(&self) -> usize {
        self.levels.len()
    }

    /// Files at `level`.
    pub fn files(&self, level: usize) -> &[Arc<FileMeta>] {
        self.levels.get(level).map(|l| l.as_slice()).unwrap_or(&[])
    }

    /// Total bytes at `level`.
    pub fn level_bytes(&self, level: usize) -> u64 {
        self.files(level).iter().map(|f| f.size).sum()
    }

    /// Every live file number.
    pub fn live_files(&self) -> impl Iterator<Item = u64> + '_ {
        self.levels.iter().flat_map(|l| l.iter().map(|f| f.number))
    }

    /// Applies an edit, returning the next version or what is inconsistent.
    pub fn apply(&self, edit: &VersionEdit) -> std::result::Result<Version, String> {
        let mut levels: Vec<Vec<Arc<FileMeta>>> = self.levels.iter().map(|l| l.to_vec()).collect();
        let n = levels.len();
        for &(level, number) in &edit.deleted_files {
            let files = levels
                .get_mut(level)
                .ok_or_else(|| format!("deleted file {number} at level {level} of {n}"))?;
            let before = files.len();
            files.retain(|f| f.number != number);
            if files.len() == before {
                return Err(format!("deleted file {number} is not at level {level}"));
            }
        }
        for (level, f) in &edit.new_files {
            let files = levels
                .get_mut(*level)
                .ok_or_else(|| format!("new file {} at level {level} of {n}", f.number))?;
            files.push(Arc::clone(f));
        }
        levels[0].sort_by_key(|f| std::cmp::Reverse(f.number));
        for files in levels.iter_mut().skip(1) {
            files.sort_by(|a, b| compare_internal(&a.smallest, &b.smallest));
        }
        let v = Version {
            levels: levels.into_iter().map(Arc::new).collect(),
        };
        v.check()?;
        Ok(v)
    }

    /// Checks the ordering invariants.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (level, files) in self.levels.iter().enumerate() {
            for f in files.iter() {
                if !seen.insert(f.number) {
                    return Err(format!("file {} appears twice", f.number));
                }
            }
            if level == 0 {
                continue;
            }
            for w in files.windows(2) {
                if compare_internal(&w[0].largest, &w[1].smallest) != Ordering::Less {
                    return Err(format!(
                        "L{level} files {} and {} overlap",
                        w[0].number, w[1].number
                    ));
                }
            }
        }
        Ok(())
    }

    /// Files at `level` whose user-key range intersects `[begin, end]` (inclusive;
    /// `None` is unbounded). Conservative: a range-tombstone end sentinel counts as
    /// inclusive.
    pub fn overlapping(
        &self,
        level: usize,
        begin: Option<&[u8]>,
        end: Option<&[u8]>,
    ) -> Vec<Arc<FileMeta>> {
        self.files(level)
            .iter()
            .filter(|f| {
                let before = end.is_some_and(|e| f.smallest_user_key() > e);
                let after = begin.is_some_and(|b| f.largest_user_key() < b);
                !before && !after
            })
            .cloned()
            .collect()
    }

    /// Looks `user_key` up in the tables as of `snapshot`. `max_tombstone` carries the
    /// newest covering range tombstone seen in newer sources (memtables).
    pub fn get(
        &self,
        tables: &TableCache,
        user_key: &[u8],
        snapshot: SequenceNumber,
        mut max_tombstone: SequenceNumber,
        fill_cache: bool,
    ) -> Result<TableGet> {
        if max_tombstone > 0 {
            return Ok(TableGet::Deleted);
        }
        let target = seek_key(user_key, snapshot);
        let mut probe = |f: &FileMeta| -> Result<Option<TableGet>> {
            let t = tables.get(f.number, f.size)?;
            note_tombstones(&t, user_key, snapshot, &mut max_tombstone);
            let found = t.get(&target, fill_cache)?;
            Ok(settle(found, user_key, snapshot, max_tombstone))
        };
        for f in self.files(0) {
            if f.smallest_user_key() <= user_key && user_key <= f.largest_user_key() {
                if let Some(r) = probe(f)? {
                    return Ok(r);
                }
            }
        }
        for level in 1..self.num_levels() {
            let files = self.files(level);
            if let Some(i) = level_file(files, &target, user_key) {
                if let Some(r) = probe(&files[i])? {
                    return Ok(r);
                }
            }
        }
        Ok(TableGet::Absent)
    }

    /// [`Version::get`] of each of `user_keys` (no tombstone from newer sources), the
    /// keys probing a table together ([`Table::multi_get`](crate::table::Table::multi_get):
    /// with `parallel`, their blocks of a remote table are read at once).
    pub fn multi_get(
        &self,
        tables: &TableCache,
        user_keys: &[&[u8]],
        snapshot: SequenceNumber,
        fill_cache: bool,
        parallel: bool,
    ) -> Result<Vec<TableGet>> {
        let targets: Vec<Vec<u8>> = user_keys.iter().map(|k| seek_key(k, snapshot)).collect();
        let mut out: Vec<Option<TableGet>> = user_keys.iter().map(|_| None).collect();
        let mut tombstone: Vec<SequenceNumber> = vec![0; user_keys.len()];
        // Probes `f` for the keys `keys` (indices of keys not settled yet).
        let mut probe =
            |f: &FileMeta, keys: &[usize], out: &mut [Option<TableGet>]| -> Result<()> {
                let t = tables.get(f.number, f.size)?;
                for &i in keys {
                    note_tombstones(&t, user_keys[i], snapshot, &mut tombstone[i]);
                }
                let seeks: Vec<&[u8]> = keys.iter().map(|&i| targets[i].as_slice()).collect();
                let found = t.multi_get(&seeks, fill_cache, parallel)?;
                for (&i, found) in keys.iter().zip(found) {
                    out[i] = settle(found, user_keys[i], snapshot, tombstone[i]);
                }
                Ok(())
            };
        for f in self.files(0) {
            let keys: Vec<usize> = (0..user_keys.len())
                .filter(|&i| {
                    out[i].is_none()
                        && f.smallest_user_key() <= user_keys[i]
                        && user_keys[i] <= f.largest_user_key()
                })
                .collect();
            if !keys.is_empty() {
                probe(f, &keys, &mut out)?;
            }
        }
        for level in 1..self.num_levels() {
            let files = self.files(level);
            // The keys by the one file of the level that may hold each.
            let mut by_file: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
            for i in (0..user_keys.len()).filter(|&i| out[i].is_none()) {
                if let Some(f) = level_file(files, &targets[i], user_keys[i]) {
                    by_file.entry(f).or_default().push(i);
                }
            }
            for (f, keys) in by_file {
                probe(&files[f], &keys, &mut out)?;
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or(TableGet::Absent))
            .collect())
    }

    /// Bytes of the files that hold only group `g` (and how many there are).
    pub fn group_only_files(&self, g: u64) -> Vec<(usize, Arc<FileMeta>)> {
        let mut out = Vec::new();
        for (level, files) in self.levels.iter().enumerate() {
            for f in files.iter() {
                if f.min_group == g && f.max_group == g {
                    out.push((level, Arc::clone(f)));
                }
            }
        }
        out
    }
}

/// Raises `max_tombstone` to the newest range tombstone of `t` covering `user_key` as
/// of `snapshot`.
fn note_tombstones(
    t: &crate::table::Table,
    user_key: &[u8],
    snapshot: SequenceNumber,
    max_tombstone: &mut SequenceNumber,
) {
    for rt in t.range_tombstones() {
        if rt.seq <= snapshot
            && rt.seq > *max_tombstone
            && rt.start.as_slice() <= user_key
            && user_key < rt.end.as_slice()
        {
            *max_tombstone = rt.seq;
        }
    }
}

/// What a table's answer (`found`, the first entry at or after the seek key) settles
/// about `user_key`, given the newest covering tombstone seen so far; `None`: look in
/// older tables.
fn settle(
    found: Option<(Vec<u8>, Vec<u8>)>,
    user_key: &[u8],
    snapshot: SequenceNumber,
    max_tombstone: SequenceNumber,
) -> Option<TableGet> {
    if let Some((ikey, value)) = found {
        if let Some(p) = parse_internal_key(&ikey) {
            if p.user_key == user_key && p.seq <= snapshot {
                if p.seq < max_tombstone || p.kind != ValueKind::Put {
                    return Some(TableGet::Deleted);
                }
                return Some(TableGet::Value(value));
            }
        }
    }
    // A tombstone newer than anything below hides every older version.
    (max_tombstone > 0).then_some(TableGet::Deleted)
}

/// The file of a level (`files`, sorted and disjoint) that may hold `target` (the seek
/// key of `user_key`), by its index.
fn level_file(files: &[Arc<FileMeta>], target: &[u8], user_key: &[u8]) -> Option<usize> {
    // The first file that may hold `target`. A file whose largest key is a range
    // tombstone's exclusive end at `user_key` does not, although at the newest sequence
    // that sentinel equals `target`: the key is in the next file.
    let i = files.partition_point(|f| {
        compare_internal(&f.largest, target) == Ordering::Less
            || (f.largest_is_exclusive() && f.largest_user_key() <= user_key)
    });
    files
        .get(i)
        .filter(|f| f.smallest_user_key() <= user_key)
        .map(|_| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::internal_key;

    fn meta(number: u64, lo: &str, hi: &str) -> Arc<FileMeta> {
        Arc::new(FileMeta {
            number,
            size: 100,
            smallest: internal_key(lo.as_bytes(), 1, ValueKind::Put),
            largest: internal_key(hi.as_bytes(), 1, ValueKind::Put),
            smallest_seq: 1,
            largest_seq: 1,
            min_group: 0,
            max_group: 0,
            num_entries: 1,
            num_range_deletions: 0,
        })
    }

    #[test]
    fn apply_sorts_and_rejects_overlap() {
        let v = Version::empty(3);
        let mut e = VersionEdit::default();
        e.new_files.push((1, meta(2, "m", "p")));
        e.new_files.push((1, meta(3, "a", "c")));
        e.new_files.push((0, meta(4, "a", "z")));
        e.new_files.push((0, meta(5, "a", "z")));
        let v = v.apply(&e).unwrap();
        assert_eq!(v.files(1)[0].number, 3);
        assert_eq!(v.files(0)[0].number, 5);
        let mut bad = VersionEdit::default();
        bad.new_files.push((1, meta(6, "b", "n")));
        assert!(v.apply(&bad).is_err());
        let mut del = VersionEdit::default();
        del.deleted_files.push((2, 2));
        assert!(v.apply(&del).is_err());
        assert_eq!(v.overlapping(1, Some(b"d"), Some(b"m")).len(), 1);
        assert_eq!(v.overlapping(1, None, None).len(), 2);
    }
}
