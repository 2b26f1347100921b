//! A group rebuilt on another engine by copying its tables (seed 004 §6.2: a replica
//! rebuilt by copying files instead of streaming its data through the nodes), between
//! engines whose tables live on one object store, each under its own prefix:
//! - the source pins a snapshot and its tables below L0 that hold the group alone
//!   ([`Db::export_group`]: those files cover no other group, so they can sit in another
//!   engine's levels as they are), then writes out the rest: what the snapshot shows of
//!   the group that those tables alone do not ([`Db::write_group_rest`]: memtables, L0,
//!   tables shared with other groups, tombstones over copied keys);
//! - the destination copies the pinned tables into its own prefix under its own numbers,
//!   by copies the store makes itself ([`Db::copy_in_group`]), then swaps the group's
//!   data for the copies (each at the level it had) and the rest (in L0, at one sequence
//!   number past every copied entry) in one manifest edit
//!   ([`Db::replace_group_with_copies`]).
//!
//! Copies not installed are deleted when their [`CopiedTables`] is dropped (not once the
//! engine closes: their numbers may be a reopened engine's); after a crash the next open
//! removes them as not in the manifest.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering as AtOrd;
use std::sync::Arc;

use super::{Db, Inner, Snapshot, View};
use crate::error::{Error, Result};
use crate::iter::{InternalIterator, ReadScope};
use crate::key::{compare_internal, group_range, internal_key, user_key, ValueKind, MAX_SEQUENCE};
use crate::merge::{BoxIter, LevelIter, MergingIterator};
use crate::options::ReadOptions;
use crate::range_del::Fragments;
use crate::table::{Readahead, Table};
use crate::version_edit::FileMeta;
use crate::DbIterator;

/// One entry of a group's rest ([`Db::write_group_rest`]), in key order (a range at its
/// start, before the keys inside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestEntry<'a> {
    /// The key holds the value.
    Put(&'a [u8], &'a [u8]),
    /// The key is deleted.
    Delete(&'a [u8]),
    /// Every copied key in `[start, end)` is deleted: the rest's own entries there stay
    /// (a range tombstone at the rest's sequence, which hides only older entries).
    DeleteRange(&'a [u8], &'a [u8]),
}

/// One table of an exported group, as another engine copies it in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedTable {
    /// Its level (1 or deeper) in the source engine; the copy takes the same.
    pub level: u32,
    /// Its name on the shared store ([`crate::TableStore::table_object`]).
    pub object: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A group's tables pinned for copying, with the snapshot whose data they hold part of.
/// The tables stay on the store while it lives.
pub struct GroupExport {
    group: u64,
    snapshot: Snapshot,
    store_id: String,
    files: Vec<(usize, Arc<FileMeta>)>,
    tables: Vec<SharedTable>,
    /// The state the rest is read from (memtables, every table), until it is written.
    view: Option<Arc<View>>,
    /// Keeps the tables to copy on the store.
    _pins: Pins,
}

/// Tables kept on the store whatever compactions do, while it lives.
struct Pins {
    inner: Arc<Inner>,
    numbers: Vec<u64>,
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock();
        st.vset.unpin(&self.numbers);
        // (Once the engine closed, what is left is the next open's to remove.)
        if !st.closed {
            for n in st.vset.delete_obsolete_files() {
                self.inner.tables.evict(n);
            }
        }
    }
}

impl std::fmt::Debug for GroupExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupExport")
            .field("group", &self.group)
            .field("seq", &self.snapshot.sequence())
            .field("tables", &self.tables)
            .finish()
    }
}

impl GroupExport {
    /// The snapshot the export describes: read the group's state at it.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The tables to copy.
    pub fn tables(&self) -> &[SharedTable] {
        &self.tables
    }

    /// The shared store the tables are on ([`crate::TableStore::shared_id`]).
    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    /// Their bytes in all.
    pub fn bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.size).sum()
    }

    /// Copies the tables to `prefix/<table name>` on the shared store (a backup), by
    /// copies the store makes itself, named `000001.sst`, `000002.sst`, … in the order of
    /// [`GroupExport::tables`]. Returns them as [`SharedTable`]s naming the copies.
    pub fn copy_tables_to(&self, prefix: &str) -> Result<Vec<SharedTable>> {
        let _background = crate::io_class::Background::enter();
        let prefix = prefix.trim_end_matches('/');
        let mut out = Vec::with_capacity(self.tables.len());
        for (i, ((_, f), t)) in self.files.iter().zip(&self.tables).enumerate() {
            let object = format!("{prefix}/{}", crate::table::table_file_name(i as u64 + 1));
            self._pins.inner.store.copy_table_out(f.number, &object)?;
            out.push(SharedTable {
                level: t.level,
                object,
                size: t.size,
            });
        }
        Ok(out)
    }
}

/// Tables copied into this engine's store for one group and not installed yet
/// ([`Db::replace_group_with_copies`] takes them); deleted when dropped.
pub struct CopiedTables {
    group: u64,
    inner: Arc<Inner>,
    /// (level, meta) of each copy made (also of one whose copy failed half way: the
    /// number is deleted all the same).
    files: Vec<(usize, Arc<FileMeta>)>,
    /// Numbers taken whose copy did not finish.
    partial: Option<u64>,
    /// Whether dropping deletes them (no manifest may name them).
    armed: bool,
}

impl std::fmt::Debug for CopiedTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopiedTables")
            .field("group", &self.group)
            .field("files", &self.files.len())
            .finish()
    }
}

impl CopiedTables {
    /// Their bytes in all.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, f)| f.size).sum()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

impl Drop for CopiedTables {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Under the write gate, as `close` takes it after `writes_closed`: once the
        // engine closes, the numbers may be a reopened engine's, and the leftovers are
        // its open's to remove.
        let _gate = self.inner.write_gate.read();
        if self.inner.writes_closed.load(AtOrd::Acquire) {
            return;
        }
        let numbers = self.files.iter().map(|(_, f)| f.number).chain(self.partial);
        for n in numbers {
            if let Err(e) = self.inner.store.delete_table(n) {
                if !e.is_not_found() {
                    let file = self.inner.store.table_location(n);
                    tracing::warn!(file = %file.display(), error = %e, "could not delete a table copied in and not installed");
                }
            }
        }
    }
}

impl Db {
    /// The shared store this engine's tables are on, which others on it can copy them
    /// from ([`crate::TableStore::shared_id`]); `None` on a local disk.
    pub fn shared_store_id(&self) -> Option<String> {
        self.inner.store.shared_id()
    }

    /// Pins a snapshot and the tables below L0 that hold only group `g`'s keys, for
    /// another engine on the same shared store to copy in (see the module docs). Refused
    /// on a store whose tables cannot be copied ([`crate::TableStore::shared_id`]).
    pub fn export_group(&self, g: u64) -> Result<GroupExport> {
        let inner = &self.inner;
        let store_id = inner.store.shared_id().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: tables on this store cannot be copied to another engine",
                inner.store.location().display()
            ))
        })?;
        // The snapshot first, then the view: every entry at or below the snapshot is in
        // the view (a write's sequence is published once a memtable holds it, and a
        // flush or compaction publishes its output before its inputs leave), where
        // `write_group_rest` finds it. A table to copy that holds entries past the
        // snapshot (written and compacted down since) would carry them along: taken
        // again.
        for _ in 0..8 {
            let snapshot = self.snapshot();
            fail::fail_point!("engine::export_group::between");
            let view = inner.view()?;
            let mut files = Vec::new();
            let mut tables = Vec::new();
            let mut ahead = false;
            for level in 1..view.version.num_levels() {
                for f in view.version.files(level) {
                    if f.min_group != g || f.max_group != g {
                        continue;
                    }
                    ahead |= f.largest_seq > snapshot.sequence();
                    let object = inner.store.table_object(f.number).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{}: table {} has no shared name",
                            inner.store.location().display(),
                            f.number
                        ))
                    })?;
                    tables.push(SharedTable {
                        level: level as u32,
                        object,
                        size: f.size,
                    });
                    files.push((level, Arc::clone(f)));
                }
            }
            if ahead {
                std::thread::yield_now();
                continue;
            }
            let numbers: Vec<u64> = files.iter().map(|(_, f)| f.number).collect();
            // (The view holds them until pinned.)
            inner.state.lock().vset.pin(&numbers);
            let pins = Pins {
                inner: Arc::clone(inner),
                numbers,
            };
            return Ok(GroupExport {
                group: g,
                snapshot,
                store_id,
                files,
                tables,
                view: Some(view),
                _pins: pins,
            });
        }
        Err(Error::Background(format!(
            "exporting group {g}: its tables kept holding writes past the snapshot"
        )))
    }

    /// Writes out, in key order, what `export`'s snapshot shows of its group that its
    /// tables alone do not: [`RestEntry::Put`] for a key whose value differs (or that
    /// they lack), [`RestEntry::Delete`] for a key they hold and the snapshot does not,
    /// [`RestEntry::DeleteRange`] where a range deletion of another source hides copied
    /// keys (with a put of each key the snapshot shows there). Every key at or past
    /// `always_from` in the group goes out whatever the tables hold (a caller's system
    /// keys, which it reads back from the rest alone). Installed above the tables, the
    /// rest makes the group read exactly as the snapshot. Reads the tables only where
    /// something else holds the same keys; holds one key at a time, not the keys it
    /// found. Returns how many entries went out.
    pub fn write_group_rest(
        &self,
        export: &mut GroupExport,
        always_from: &[u8],
        mut out: impl FnMut(RestEntry<'_>) -> Result<()>,
    ) -> Result<u64> {
        let _background = crate::io_class::Background::enter();
        let inner = &self.inner;
        let g = export.group;
        let (lo, hi) = group_range(g);
        let seq = export.snapshot.sequence();
        let copied: HashSet<u64> = export.files.iter().map(|(_, f)| f.number).collect();
        // Taken: once the rest is out the export holds its tables alone, not every
        // memtable and table of the engine while the copies are made.
        let view = export.view.take().ok_or_else(|| {
            Error::InvalidArgument(format!("group {g}: the export's rest was written already"))
        })?;
        let export = &*export;
        let last_of_group = {
            let mut k = lo.clone();
            k.extend_from_slice(&[0xff; crate::options::KEY_LEN_MAX]);
            k
        };
        let holds = |f: &FileMeta| f.overlaps_exactly(&lo, &last_of_group);
        let readahead = inner.whole_table_readahead();

        // Everything else that may hold the group: each key it names is a candidate.
        let mut children: Vec<BoxIter> = Vec::new();
        let mut tombstones = Vec::new();
        for m in std::iter::once(&view.mem).chain(view.imms.iter()) {
            children.push(Box::new(m.iter()));
            tombstones.extend(m.range_tombstones());
        }
        for f in view.version.files(0).iter().filter(|f| holds(f)) {
            let t = inner.tables.get(f.number, f.size)?;
            tombstones.extend_from_slice(t.range_tombstones());
            children.push(Box::new(t.iter_with(false).with_readahead(readahead)));
        }
        for level in 1..view.version.num_levels() {
            let files: Vec<Arc<FileMeta>> = view
                .version
                .files(level)
                .iter()
                .filter(|f| !copied.contains(&f.number) && holds(f))
                .cloned()
                .collect();
            inner.add_level(files, readahead, &mut children, &mut tombstones)?;
        }
        let mut others = MergingIterator::new(children);
        // The snapshot through the tables alone, and through everything.
        let mut copies = self.iter_over(export, &view)?;
        let ro = ReadOptions {
            snapshot: Some(&export.snapshot),
            lower_bound: Some(lo.clone()),
            upper_bound: hi.clone(),
            fill_cache: false,
            ..ReadOptions::default()
        };
        let mut all = self.iter(&ro)?;
        let past = |k: &[u8]| hi.as_deref().is_some_and(|h| k >= h);

        // The others' range tombstones over copied keys go out as ranges (clipped to the
        // group, adjacent pieces joined, only where a copied key shows): installed above
        // the copies they hide every copied key in them, and each key the snapshot shows
        // there goes out again as a put.
        let clipped: Vec<_> = tombstones
            .iter()
            .filter(|t| t.end.as_slice() > lo.as_slice() && !past(&t.start))
            .map(|t| crate::key::RangeTombstone {
                start: t.start.clone().max(lo.clone()),
                end: match &hi {
                    Some(h) if t.end > *h => h.clone(),
                    _ => t.end.clone(),
                },
                seq: t.seq,
            })
            .collect();
        let mut ranges: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for frag in Fragments::new(&clipped, seq).fragments() {
            match ranges.last_mut() {
                Some(last) if last.1 == frag.start => last.1.clone_from(&frag.end),
                _ => ranges.push((frag.start.clone(), frag.end.clone())),
            }
        }
        let mut holding = Vec::with_capacity(ranges.len());
        for r in ranges {
            copies.seek(&r.0);
            let holds = copies.valid() && copies.key() < r.1.as_slice();
            copies.status()?;
            if holds {
                holding.push(r);
            }
        }
        let ranges = holding;
        let in_range = |k: &[u8]| {
            let i = ranges.partition_point(|(s, _)| s.as_slice() <= k);
            i > 0 && k < ranges[i - 1].1.as_slice()
        };
        // Keys the other sources do not name but that must go out all the same: what the
        // snapshot shows under those ranges, and every key from `always_from`. Scanned
        // in order with the other sources, not collected.
        let mut scanned: Vec<(Vec<u8>, Option<Vec<u8>>)> = ranges
            .iter()
            .map(|(s, e)| (s.clone(), Some(e.clone())))
            .collect();
        scanned.push((always_from.max(lo.as_slice()).to_vec(), None));
        scanned.sort_by(|a, b| a.0.cmp(&b.0));
        let mut extra = Scan::new(self.iter(&ro)?, join(scanned))?;

        others.seek(&internal_key(&lo, MAX_SEQUENCE, ValueKind::RangeDelete));
        let mut next_range = 0;
        let mut written = 0u64;
        loop {
            let named = (others.valid() && !past(user_key(others.key())))
                .then(|| user_key(others.key()).to_vec());
            let key = match (named, extra.peek()) {
                (None, None) => break,
                (Some(a), Some(b)) if b < a.as_slice() => b.to_vec(),
                (Some(a), _) => a,
                (None, Some(b)) => b.to_vec(),
            };
            // Past every version of this key in the other sources, and in the scan.
            while others.valid() && user_key(others.key()) == key.as_slice() {
                others.next();
            }
            if extra.peek() == Some(key.as_slice()) {
                extra.advance()?;
            }
            // Ranges in key order with the keys: each before the keys inside it.
            while let Some((s, e)) = ranges.get(next_range).filter(|(s, _)| *s <= key) {
                out(RestEntry::DeleteRange(s, e))?;
                written += 1;
                next_range += 1;
            }
            let want = value_at(&mut all, &key)?;
            let have = if in_range(&key) {
                None
            } else {
                value_at(&mut copies, &key)?
            };
            if want != have || key.as_slice() >= always_from {
                match &want {
                    Some(v) => out(RestEntry::Put(&key, v))?,
                    None if have.is_some() => out(RestEntry::Delete(&key))?,
                    None => continue,
                }
                written += 1;
            }
        }
        others.status()?;
        for (s, e) in &ranges[next_range..] {
            out(RestEntry::DeleteRange(s, e))?;
            written += 1;
        }
        Ok(written)
    }

    /// An iterator over the export's tables alone, at its snapshot, within its group.
    fn iter_over(&self, export: &GroupExport, view: &Arc<View>) -> Result<DbIterator> {
        let inner = &self.inner;
        let (lo, hi) = group_range(export.group);
        let mut children: Vec<BoxIter> = Vec::new();
        let mut tombstones = Vec::new();
        let deepest = export.files.iter().map(|(l, _)| *l).max().unwrap_or(0);
        for level in 1..=deepest {
            let files: Vec<Arc<FileMeta>> = export
                .files
                .iter()
                .filter(|(l, _)| *l == level)
                .map(|(_, f)| Arc::clone(f))
                .collect();
            inner.add_level(files, Readahead::Off, &mut children, &mut tombstones)?;
        }
        let seq = export.snapshot.sequence();
        let pin: Arc<dyn std::any::Any + Send + Sync> = view.clone();
        Ok(DbIterator::new(
            MergingIterator::new(children),
            seq,
            Fragments::new(&tombstones, seq),
            ReadScope {
                lower: Some(lo),
                upper: hi,
                prefix: None,
            },
            None,
            vec![pin],
        ))
    }

    /// Copies the tables another engine on the same shared store exported for group `g`
    /// ([`Db::export_group`]; `store_id` is its [`GroupExport::store_id`]) into this
    /// engine's store, under this engine's numbers, by copies the store makes itself.
    /// Each copy is opened and checked (size, footer, index and properties: a table of
    /// group `g` alone; copies of one level do not overlap). The copies serve nothing
    /// until [`Db::replace_group_with_copies`] installs them.
    pub fn copy_in_group(
        &self,
        g: u64,
        store_id: &str,
        tables: &[SharedTable],
    ) -> Result<CopiedTables> {
        let _background = crate::io_class::Background::enter();
        let inner = &self.inner;
        match inner.store.shared_id() {
            Some(id) if id == store_id => {}
            mine => {
                return Err(Error::InvalidArgument(format!(
                    "group {g}: tables on {store_id:?} cannot be copied into {} (on {})",
                    inner.store.location().display(),
                    mine.as_deref().unwrap_or("no shared store")
                )))
            }
        }
        let mut copied = CopiedTables {
            group: g,
            inner: Arc::clone(inner),
            files: Vec::with_capacity(tables.len()),
            partial: None,
            armed: true,
        };
        for t in tables {
            let level = t.level as usize;
            if level == 0 || level >= inner.opts.num_levels {
                return Err(Error::InvalidArgument(format!(
                    "group {g}: table {:?} is for level {level}; this engine copies into \
                     levels 1..{}",
                    t.object, inner.opts.num_levels
                )));
            }
            // (Under the gate, as writes: none is made once `close` began.)
            let _gate = inner.write_gate.read();
            inner.refuse_once_closing()?;
            let number = inner.state.lock().vset.new_file_number();
            copied.partial = Some(number);
            inner.store.copy_table(&t.object, number)?;
            let file = inner.store.open_table(number)?;
            let at = inner.store.table_location(number);
            if file.size() != t.size {
                return Err(Error::corruption(
                    &at,
                    0,
                    format!(
                        "the copy of {:?} holds {} bytes, the export says {}",
                        t.object,
                        file.size(),
                        t.size
                    ),
                ));
            }
            let table = Table::open(file, number, t.size, None)?;
            let p = table.properties();
            if p.min_group != g || p.max_group != g {
                return Err(Error::InvalidArgument(format!(
                    "{}: the copy of {:?} holds groups {}..={}, not group {g} alone",
                    at.display(),
                    t.object,
                    p.min_group,
                    p.max_group
                )));
            }
            copied.files.push((
                level,
                Arc::new(FileMeta::from_properties(number, t.size, p)),
            ));
            copied.partial = None;
        }
        // Copies of one level must fit in one level.
        let mut by_level = copied.files.clone();
        by_level.sort_by(|(la, a), (lb, b)| {
            la.cmp(lb).then(compare_internal(&a.smallest, &b.smallest))
        });
        for w in by_level.windows(2) {
            if w[0].0 == w[1].0 && compare_internal(&w[0].1.largest, &w[1].1.smallest).is_ge() {
                return Err(Error::InvalidArgument(format!(
                    "group {g}: exported tables of level {} overlap",
                    w[0].0
                )));
            }
        }
        // Each copy needs room at its level once the group's own tables leave it. A
        // table there that holds groups on both sides of g (groups sharing tables,
        // with a positive `min_group_file_size`) stays across the copy's keys, and the
        // install could not place the copy: refused now, while the snapshot can still
        // be sent another way. (Groups never share tables below L0 otherwise.)
        let version = inner.state.lock().vset.current();
        for (level, f) in &copied.files {
            let (lo, hi) = (f.smallest_user_key(), f.largest_user_key());
            if let Some(o) = version
                .files(*level)
                .iter()
                // (One reaching into g from one side alone is rewritten without g by the
                // install and leaves room.)
                .find(|o| o.min_group < g && o.max_group > g && o.overlaps_exactly(lo, hi))
            {
                return Err(Error::InvalidArgument(format!(
                    "group {g}: a copied table does not fit in level {level} of {}, where \
                     table {} holds groups {}..={}",
                    inner.store.location().display(),
                    o.number,
                    o.min_group,
                    o.max_group
                )));
            }
        }
        Ok(copied)
    }

    /// Replaces group `g`'s data with `copied` (each copy at its level) and the tables
    /// at `rest` (written with [`crate::SstWriter`] from [`Db::write_group_rest`]: they
    /// go to L0 at one sequence number past every copied entry, above the copies), in
    /// one manifest edit, as [`Db::replace_group`] does with streamed files. The
    /// engine's last sequence moves past the copies' (the source's numbering). On an
    /// error before the edit could be written, the copies are deleted; the rest's files
    /// stay, as with `replace_group`.
    pub fn replace_group_with_copies(
        &self,
        g: u64,
        copied: CopiedTables,
        rest: &[PathBuf],
    ) -> Result<()> {
        if copied.group != g || !Arc::ptr_eq(&copied.inner, &self.inner) {
            return Err(Error::InvalidArgument(format!(
                "tables copied for group {} into another engine cannot replace group {g}",
                copied.group
            )));
        }
        self.inner.replace_group_with(g, rest, Some(copied))
    }
}

/// Sorted ranges `[start, end)` (`None`: to the end) joined where they overlap or touch.
fn join(sorted: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut out: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        if let Some((_, last)) = out.last_mut() {
            if last.as_ref().is_none_or(|l| s <= *l) {
                *last = match (last.take(), e) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                continue;
            }
        }
        out.push((s, e));
    }
    out
}

/// The keys an iterator shows inside sorted, disjoint ranges, in order.
struct Scan {
    it: DbIterator,
    ranges: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    at: usize,
}

impl Scan {
    fn new(mut it: DbIterator, ranges: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<Scan> {
        if let Some((s, _)) = ranges.first() {
            it.seek(s);
        }
        let mut scan = Scan { it, ranges, at: 0 };
        scan.settle()?;
        Ok(scan)
    }

    /// Moves to the first key at or past the iterator's that lies in a range.
    fn settle(&mut self) -> Result<()> {
        while self.it.valid() {
            let Some((s, e)) = self.ranges.get(self.at) else {
                break;
            };
            if self.it.key() < s.as_slice() {
                self.it.seek(s);
            } else if e.as_ref().is_some_and(|e| self.it.key() >= e.as_slice()) {
                self.at += 1;
            } else {
                break;
            }
        }
        self.it.status()
    }

    fn peek(&self) -> Option<&[u8]> {
        (self.at < self.ranges.len() && self.it.valid()).then(|| self.it.key())
    }

    fn advance(&mut self) -> Result<()> {
        self.it.next();
        self.settle()
    }
}

/// The value `it` shows for exactly `key` (`None`: absent or deleted).
fn value_at(it: &mut DbIterator, key: &[u8]) -> Result<Option<Vec<u8>>> {
    it.seek(key);
    let v = (it.valid() && it.key() == key).then(|| it.value().to_vec());
    it.status()?;
    Ok(v)
}

impl Inner {
    /// Adds one level's `files` (not overlapping) as a source: an iterator to
    /// `children`, their range tombstones to `tombstones`.
    fn add_level(
        &self,
        files: Vec<Arc<FileMeta>>,
        readahead: Readahead,
        children: &mut Vec<BoxIter>,
        tombstones: &mut Vec<crate::key::RangeTombstone>,
    ) -> Result<()> {
        for f in files.iter().filter(|f| f.num_range_deletions > 0) {
            tombstones.extend_from_slice(self.tables.get(f.number, f.size)?.range_tombstones());
        }
        if !files.is_empty() {
            children.push(Box::new(
                LevelIter::new(Arc::clone(&self.tables), Arc::new(files), false)
                    .with_readahead(readahead),
            ));
        }
        Ok(())
    }

    /// Places copies at their levels in `version` (what is left once the group's files
    /// are gone): none may overlap a file staying there.
    pub(super) fn place_copies(
        &self,
        g: u64,
        version: &crate::version::Version,
        copied: &CopiedTables,
        edit: &mut crate::version_edit::VersionEdit,
    ) -> Result<u64> {
        let mut largest_seq = 0;
        for (level, f) in &copied.files {
            let (lo, hi) = (f.smallest_user_key(), f.largest_user_key());
            if let Some(o) = version
                .files(*level)
                .iter()
                .find(|o| o.overlaps_exactly(lo, hi))
            {
                return Err(Error::InvalidArgument(format!(
                    "replacing group {g}: a copied table does not fit in level {level}, \
                     where table {} stays",
                    o.number
                )));
            }
            largest_seq = largest_seq.max(f.largest_seq);
            edit.new_files.push((*level, Arc::clone(f)));
        }
        Ok(largest_seq)
    }
}

/// Marks `copied` as no longer this module's to delete (installed, or named by a
/// manifest edit that may have been written).
pub(super) fn disarm(copied: &mut CopiedTables) {
    copied.armed = false;
}
