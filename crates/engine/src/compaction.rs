//! Compaction: the policy that picks what to compact ([`pick`], pure: a version and the
//! options in, a [`Compaction`] out) and the executor that merges input tables into
//! output tables ([`run`]) and the flush of a memtable into an L0 table ([`build_l0`]).
//!
//! Policy (leveled, as in LevelDB/RocksDB): L0's score is its file count over
//! `level0_file_num_compaction_trigger`; level `l >= 1` scores its bytes over
//! `max_bytes_for_level_base * multiplier^(l-1)`. The highest score `>= 1` wins. An L0
//! compaction takes every L0 file (so no older L0 data is left above newer data in L1)
//! plus the overlapping L1 files; a level-`l` compaction takes the file after the level's
//! compact pointer plus the overlapping files of `l+1`.
//!
//! Execution keeps what live snapshots need: entries are split into "stripes" by the
//! snapshots (the stripe of sequence `s` is the smallest snapshot `>= s`); within a stripe
//! only the newest version of a key survives, and versions covered by a range tombstone
//! of the same stripe are dropped. Point and range tombstones of the oldest stripe are
//! dropped only at the bottom (no file below overlaps the compaction's key range).
//!
//! Output files are cut at the target file size (between user keys, so a key's versions
//! never straddle two files) and, from L1 down, at group boundaries once the file holds
//! `min_group_file_size` bytes (default 0: at every boundary, so no L1+ file holds points
//! of two groups; a positive value lets groups smaller than it share files, which
//! drop_group then rewrites). Range tombstones are clipped to each file's interval (between the
//! neighbouring files' first keys and within the file's group); tombstone pieces over
//! stretches without point data go to tombstone-only files (which may span several
//! groups that hold no data in this compaction).
//!
//! A long compaction installs its work in [`Piece`]s (`Options::compaction_piece_bytes`):
//! at an output cut, once the sorted-level inputs wholly behind it reach that many bytes,
//! the outputs so far (with the tombstone pieces of the stretch's gaps) replace them in
//! one manifest edit. L0 inputs stay until the last edit; until then their entries are
//! also below them, at the same sequence numbers, which reads resolve alike. A crash
//! between pieces leaves a valid tree whose next L0 compaction merges the duplicates.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::Result;
use crate::iter::InternalIterator;
use crate::key::{
    group_of, group_range, parse_internal_key, RangeTombstone, SequenceNumber, ValueKind,
};
use crate::memtable::MemTable;
use crate::merge::{BoxIter, LevelIter, MergingIterator};
use crate::options::Options;
use crate::range_del::{Fragment, Fragments};
use crate::table::{Readahead, TableBuilder, TableCache, TableOptions};
use crate::table_store::TableStore;
use crate::version::Version;
use crate::version_edit::FileMeta;

/// Why a compaction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// L0 has too many files.
    L0Files,
    /// A level is over its target size.
    LevelSize,
    /// `compact_range` or `drop_group` asked for it.
    Manual,
}

/// A chosen compaction.
#[derive(Clone, Debug)]
pub struct Compaction {
    /// Level of the first input set.
    pub level: usize,
    /// Level the outputs go to.
    pub output_level: usize,
    /// Inputs at `level`.
    pub inputs: Vec<Arc<FileMeta>>,
    /// Inputs at `output_level`.
    pub next_inputs: Vec<Arc<FileMeta>>,
    /// Whether nothing below `output_level` overlaps the inputs.
    pub bottommost: bool,
    /// Why.
    pub reason: Reason,
}

impl Compaction {
    /// Whether the single input can be moved to the next level without rewriting.
    pub fn is_trivial_move(&self) -> bool {
        self.inputs.len() == 1
            && self.next_inputs.is_empty()
            && self.inputs[0].min_group == self.inputs[0].max_group
    }

    /// The user-key range `[smallest, largest]` of all inputs.
    pub fn user_range(&self) -> (Vec<u8>, Vec<u8>) {
        user_range(self.inputs.iter().chain(self.next_inputs.iter()))
    }
}

fn user_range<'a>(files: impl Iterator<Item = &'a Arc<FileMeta>>) -> (Vec<u8>, Vec<u8>) {
    let mut lo: Option<&[u8]> = None;
    let mut hi: Option<&[u8]> = None;
    for f in files {
        let s = f.smallest_user_key();
        let l = f.largest_user_key();
        if lo.is_none_or(|x| s < x) {
            lo = Some(s);
        }
        if hi.is_none_or(|x| l > x) {
            hi = Some(l);
        }
    }
    (
        lo.unwrap_or_default().to_vec(),
        hi.unwrap_or_default().to_vec(),
    )
}

/// The user-key range `[start, end)` of group `g` (`end` is `None` for the last group).
/// Unlike `key::group_range`, the bounds are the shortest keys of their groups (the
/// 8-byte id with trailing zero bytes removed): keys shorter than 8 bytes are
/// zero-padded into a group, so `b"ab"` belongs to the group `b"ab\0\0\0\0\0\0"` but
/// sorts before that 8-byte key.
pub fn group_key_range(g: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    fn strip(mut k: Vec<u8>) -> Vec<u8> {
        while k.last() == Some(&0) {
            k.pop();
        }
        k
    }
    let (s, e) = group_range(g);
    (strip(s), e.map(strip))
}

/// Target bytes of `level` (>= 1).
pub fn level_target(opts: &Options, level: usize) -> u64 {
    let mut t = opts.max_bytes_for_level_base;
    for _ in 1..level {
        t = t.saturating_mul(opts.max_bytes_for_level_multiplier);
    }
    t
}

/// The compaction score of every level but the last.
pub fn scores(v: &Version, opts: &Options) -> Vec<f64> {
    (0..v.num_levels().saturating_sub(1))
        .map(|l| {
            if l == 0 {
                v.files(0).len() as f64 / opts.level0_file_num_compaction_trigger as f64
            } else {
                v.level_bytes(l) as f64 / level_target(opts, l) as f64
            }
        })
        .collect()
}

/// Fills in the next level's overlapping files and the bottommost flag.
pub fn complete(
    v: &Version,
    level: usize,
    inputs: Vec<Arc<FileMeta>>,
    reason: Reason,
) -> Compaction {
    let output_level = (level + 1).min(v.num_levels() - 1);
    let (lo, hi) = user_range(inputs.iter());
    let next_inputs = if output_level == level {
        Vec::new()
    } else {
        v.overlapping(output_level, Some(&lo), Some(&hi))
    };
    let mut c = Compaction {
        level,
        output_level,
        inputs,
        next_inputs,
        bottommost: false,
        reason,
    };
    let (lo, hi) = c.user_range();
    c.bottommost = ((output_level + 1)..v.num_levels())
        .all(|l| v.overlapping(l, Some(&lo), Some(&hi)).is_empty());
    c
}

/// Picks the most urgent compaction, if any level needs one, using no file in `busy`
/// (inputs of compactions already running, so that several can run at once: each takes
/// every overlapping file of its output level, so disjoint input sets never write
/// overlapping outputs). `pointers[l]` is the largest key of the last level-`l`
/// compaction (round-robin through the level).
pub fn pick(
    v: &Version,
    opts: &Options,
    pointers: &[Vec<u8>],
    busy: &HashSet<u64>,
) -> Option<Compaction> {
    let mut s: Vec<(usize, f64)> = scores(v, opts).into_iter().enumerate().collect();
    s.sort_by(|a, b| b.1.total_cmp(&a.1));
    let free = |c: &Compaction| {
        c.inputs
            .iter()
            .chain(c.next_inputs.iter())
            .all(|f| !busy.contains(&f.number))
    };
    for (level, score) in s {
        if score < 1.0 {
            break;
        }
        if level == 0 {
            // One L0 compaction at a time: it takes every L0 file.
            if v.files(0).iter().any(|f| busy.contains(&f.number)) {
                continue;
            }
            let c = complete(v, 0, v.files(0).to_vec(), Reason::L0Files);
            if free(&c) {
                return Some(c);
            }
            continue;
        }
        let files = v.files(level);
        let ptr = pointers.get(level).map(|p| p.as_slice()).unwrap_or(&[]);
        let start = files
            .iter()
            .position(|f| ptr.is_empty() || crate::key::compare_internal(&f.largest, ptr).is_gt())
            .unwrap_or(0);
        for i in (start..files.len()).chain(0..start) {
            let f = &files[i];
            if busy.contains(&f.number) {
                continue;
            }
            let c = complete(v, level, vec![Arc::clone(f)], Reason::LevelSize);
            if free(&c) {
                return Some(c);
            }
        }
    }
    None
}

/// A finished stretch of a running compaction, to install before the rest is read.
#[derive(Debug)]
pub struct Piece {
    /// Output files holding every surviving entry and tombstone of the stretch (for the
    /// output level).
    pub files: Vec<Arc<FileMeta>>,
    /// Inputs of sorted levels wholly inside the stretch, with their levels: the files
    /// replace them.
    pub consumed: Vec<(usize, Arc<FileMeta>)>,
}

/// What an executed compaction produced.
#[derive(Debug, Default)]
pub struct Output {
    /// The new files not installed in a [`Piece`].
    pub files: Vec<Arc<FileMeta>>,
    /// Bytes read from inputs.
    pub bytes_read: u64,
    /// Bytes written to outputs.
    pub bytes_written: u64,
    /// Entries dropped.
    pub dropped: u64,
}

/// What the executor needs from the engine.
pub struct Env<'a> {
    /// Where tables are written.
    pub store: &'a dyn TableStore,
    /// How tables are built.
    pub table: &'a TableOptions,
    /// Open tables.
    pub tables: &'a Arc<TableCache>,
    /// Target output file size.
    pub target_file_size: u64,
    /// From L1 down, a group boundary cuts the output file only once it holds this much.
    pub min_group_file_size: u64,
    /// Input bytes behind the write position that make a [`Piece`]; 0: no pieces.
    pub piece_bytes: u64,
    /// How the input tables are read.
    pub readahead: Readahead,
    /// Hands out file numbers (a worker's job has only so many).
    pub new_file_number: &'a dyn Fn() -> Result<u64>,
}

pub(crate) fn meta_from(number: u64, summary: &crate::table::TableSummary) -> Arc<FileMeta> {
    Arc::new(FileMeta::from_properties(
        number,
        summary.file_size,
        &summary.properties,
    ))
}

/// Writes an L0 table with everything in `mem`; `None` if the memtable is empty.
pub fn build_l0(env: &Env<'_>, mem: &Arc<MemTable>) -> Result<Option<Arc<FileMeta>>> {
    if mem.is_empty() {
        return Ok(None);
    }
    let number = (env.new_file_number)()?;
    let result: Result<Arc<FileMeta>> = (|| {
        let file = env.store.create_table(number)?;
        let mut b = TableBuilder::new(file, env.table);
        let mut it = mem.iter();
        it.seek_to_first();
        while it.valid() {
            b.add(it.key(), it.value())?;
            it.next();
        }
        for t in mem.range_tombstones() {
            b.add_range_tombstone(&t)?;
        }
        let summary = b.finish()?;
        env.store.sync()?;
        Ok(meta_from(number, &summary))
    })();
    match &result {
        // Taken: not this flush's table (see `OutputState::finish_table`).
        Err(e) if e.is_fenced() => {}
        // Best effort; a leftover is removed on the next open as not in the manifest.
        Err(_) => {
            let _ = env.store.delete_table(number);
        }
        Ok(_) => {}
    }
    result.map(Some)
}

/// Sorted snapshot sequences split entries into stripes.
struct Stripes<'a> {
    snapshots: &'a [SequenceNumber],
}

impl Stripes<'_> {
    fn of(&self, seq: SequenceNumber) -> usize {
        self.snapshots.partition_point(|&s| s < seq)
    }
    fn upper(&self, stripe: usize) -> SequenceNumber {
        self.snapshots.get(stripe).copied().unwrap_or(u64::MAX)
    }
}

/// A half-open user-key interval; `None` is unbounded.
#[derive(Clone, Debug)]
struct Interval {
    lo: Option<Vec<u8>>,
    hi: Option<Vec<u8>>,
}

fn max_lo(a: Option<Vec<u8>>, b: Option<Vec<u8>>) -> Option<Vec<u8>> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn min_hi(a: Option<Vec<u8>>, b: Option<Vec<u8>>) -> Option<Vec<u8>> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Pieces of `frags` inside `iv`, as tombstones.
fn clip(frags: &[Fragment], iv: &Interval) -> Vec<RangeTombstone> {
    let mut out = Vec::new();
    for f in frags {
        let start = match &iv.lo {
            Some(lo) if f.start < *lo => lo.clone(),
            _ => f.start.clone(),
        };
        let end = match &iv.hi {
            Some(hi) if f.end > *hi => hi.clone(),
            _ => f.end.clone(),
        };
        if start < end {
            for &seq in &f.seqs {
                out.push(RangeTombstone {
                    start: start.clone(),
                    end: end.clone(),
                    seq,
                });
            }
        }
    }
    out
}

/// Pieces of `frags` outside every interval of `covered` (sorted, disjoint).
fn gaps(frags: &[Fragment], covered: &[Interval]) -> Vec<Vec<RangeTombstone>> {
    let mut out = Vec::new();
    // Lower end of the current gap; `None` is minus infinity.
    let mut gap_lo: Option<Vec<u8>> = None;
    let push = |gap: Interval, out: &mut Vec<Vec<RangeTombstone>>| {
        let pieces = clip(frags, &gap);
        if !pieces.is_empty() {
            out.push(pieces);
        }
    };
    for iv in covered {
        // An interval starting at minus infinity leaves no gap before it.
        if let Some(hi) = &iv.lo {
            if gap_lo.as_ref().is_none_or(|lo| lo < hi) {
                push(
                    Interval {
                        lo: gap_lo.clone(),
                        hi: Some(hi.clone()),
                    },
                    &mut out,
                );
            }
        }
        match &iv.hi {
            Some(h) => gap_lo = Some(h.clone()),
            None => return out,
        }
    }
    push(
        Interval {
            lo: gap_lo,
            hi: None,
        },
        &mut out,
    );
    out
}

struct OutputState<'a, 'e> {
    env: &'a Env<'e>,
    current: Option<(u64, TableBuilder)>,
    file_lo: Option<Vec<u8>>,
    /// Groups of the open file's first and last keys (files hold contiguous groups).
    first_group: u64,
    last_group: u64,
    intervals: Vec<Interval>,
    frags: &'a [Fragment],
    out: Output,
    /// Files written and not installed yet (removed if the compaction fails).
    created: Vec<u64>,
    /// Inputs of sorted levels (not L0) not installed yet, ascending.
    remaining: Vec<(usize, Arc<FileMeta>)>,
    output_level: usize,
    /// A piece is due but an output-level input straddles the write position: cut the
    /// output at the first key past this one (the input's last), where none does.
    cut_after: Option<Vec<u8>>,
}

impl OutputState<'_, '_> {
    fn open(&mut self, first_user_key: &[u8], lo: Option<Vec<u8>>) -> Result<()> {
        let number = (self.env.new_file_number)()?;
        self.created.push(number);
        let file = self.env.store.create_table(number)?;
        self.current = Some((number, TableBuilder::new(file, self.env.table)));
        self.file_lo = lo;
        self.first_group = group_of(first_user_key);
        self.last_group = self.first_group;
        Ok(())
    }

    /// Finishes the open file; `next_key` is the first key of the next file, if any.
    fn finish(&mut self, next_key: Option<&[u8]>) -> Result<()> {
        let Some((number, mut b)) = self.current.take() else {
            return Ok(());
        };
        let gs = group_key_range(self.first_group).0;
        let ge = group_key_range(self.last_group).1;
        let iv = Interval {
            lo: max_lo(self.file_lo.clone(), Some(gs)),
            hi: min_hi(next_key.map(|k| k.to_vec()), ge),
        };
        for t in clip(self.frags, &iv) {
            b.add_range_tombstone(&t)?;
        }
        self.intervals.push(iv);
        let summary = self.finish_table(number, b)?;
        self.out.bytes_written += summary.file_size;
        self.out.files.push(meta_from(number, &summary));
        Ok(())
    }

    /// At an output cut before `next_key` (no file open): hands the stretch behind it
    /// to `install` as a [`Piece`] once its sorted inputs hold `piece_bytes`.
    fn maybe_piece(
        &mut self,
        next_key: &[u8],
        install: &mut dyn FnMut(Piece) -> Result<()>,
    ) -> Result<()> {
        debug_assert!(self.current.is_none(), "a piece is cut between files");
        self.cut_after = None;
        if self.env.piece_bytes == 0 {
            return Ok(());
        }
        let behind = |f: &FileMeta| f.largest_user_key() < next_key;
        let bytes: u64 = self
            .remaining
            .iter()
            .filter(|(_, f)| behind(f))
            .map(|(_, f)| f.size)
            .sum();
        if bytes < self.env.piece_bytes {
            return Ok(());
        }
        // The new files may not overlap an output-level input still being read: cut
        // again past its end (inside a group larger than the target file size, old and
        // new files are cut at different keys).
        if let Some(last) = self
            .remaining
            .iter()
            .filter(|(l, f)| {
                *l == self.output_level && !behind(f) && f.smallest_user_key() < next_key
            })
            .map(|(_, f)| f.largest_user_key())
            .max()
        {
            self.cut_after = Some(last.to_vec());
            return Ok(());
        }
        let mut covered = std::mem::take(&mut self.intervals);
        covered.push(Interval {
            lo: Some(next_key.to_vec()),
            hi: None,
        });
        for pieces in gaps(self.frags, &covered) {
            self.write_tombstone_file(&pieces)?;
        }
        // Installed stretches count as covered for the gaps still to come.
        self.intervals = vec![Interval {
            lo: None,
            hi: Some(next_key.to_vec()),
        }];
        self.env.store.sync()?;
        let (consumed, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.remaining)
            .into_iter()
            .partition(|(_, f)| behind(f));
        self.remaining = rest;
        let files = std::mem::take(&mut self.out.files);
        // From here the files are the manifest's, even if `install` fails after its
        // edit became durable: never removed by this compaction's cleanup (a file no
        // manifest names is removed at the next open).
        self.created.clear();
        install(Piece { files, consumed })
    }

    /// Finishes table `number`. A store that refuses it as taken (create-if-absent on
    /// an object store: another writer's table, or a job given numbers in use) holds
    /// a table that is not this compaction's: the cleanup must leave it alone.
    fn finish_table(&mut self, number: u64, b: TableBuilder) -> Result<crate::table::TableSummary> {
        b.finish().inspect_err(|e| {
            if e.is_fenced() {
                self.created.retain(|&n| n != number);
            }
        })
    }

    fn write_tombstone_file(&mut self, ts: &[RangeTombstone]) -> Result<()> {
        let number = (self.env.new_file_number)()?;
        self.created.push(number);
        let file = self.env.store.create_table(number)?;
        let mut b = TableBuilder::new(file, self.env.table);
        for t in ts {
            b.add_range_tombstone(t)?;
        }
        let summary = self.finish_table(number, b)?;
        self.out.bytes_written += summary.file_size;
        self.out.files.push(meta_from(number, &summary));
        Ok(())
    }
}

/// Runs compaction `c`, writing its outputs; `install` takes the [`Piece`]s finished on
/// the way, the caller installs the rest (and deletes the inputs no piece consumed) with
/// a version edit. `snapshots` are the live snapshot sequences, ascending.
pub fn run(
    env: &Env<'_>,
    c: &Compaction,
    snapshots: &[SequenceNumber],
    install: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<Output> {
    let mut children: Vec<BoxIter> = Vec::new();
    let mut tombstones = Vec::new();
    let mut bytes_read = 0;
    for f in c.inputs.iter().chain(c.next_inputs.iter()) {
        let t = env.tables.get(f.number, f.size)?;
        tombstones.extend_from_slice(t.range_tombstones());
        bytes_read += f.size;
        if c.level == 0 && c.inputs.iter().any(|i| i.number == f.number) {
            // L0 files overlap: one cursor each. Compaction reads stay out of the block
            // cache: its inputs are about to be deleted.
            children.push(Box::new(t.iter_with(false).with_readahead(env.readahead)));
        }
    }
    // Sorted, non-overlapping inputs of one level: one concatenating cursor per level.
    let mut sorted_sets: Vec<&Vec<Arc<FileMeta>>> = vec![&c.next_inputs];
    if c.level != 0 {
        sorted_sets.push(&c.inputs);
    }
    for set in sorted_sets {
        if !set.is_empty() {
            let mut files = set.clone();
            files.sort_by(|a, b| crate::key::compare_internal(&a.smallest, &b.smallest));
            children.push(Box::new(
                LevelIter::new(Arc::clone(env.tables), Arc::new(files), false)
                    .with_readahead(env.readahead),
            ));
        }
    }
    let stripes = Stripes { snapshots };
    // Keep, per fragment, the newest tombstone of each stripe; drop the oldest stripe's
    // at the bottom (nothing older remains below to hide).
    let mut frags: Vec<Fragment> = Fragments::new(&tombstones, u64::MAX).fragments().to_vec();
    for f in &mut frags {
        let mut kept: Vec<SequenceNumber> = Vec::new();
        let mut last_stripe = None;
        for &s in &f.seqs {
            let st = stripes.of(s);
            if last_stripe == Some(st) {
                continue;
            }
            last_stripe = Some(st);
            if c.bottommost && st == 0 {
                continue;
            }
            kept.push(s);
        }
        f.seqs = kept;
    }
    let all_frags = Fragments::new(&tombstones, u64::MAX);
    frags.retain(|f| !f.seqs.is_empty());
    let mut remaining: Vec<(usize, Arc<FileMeta>)> = c
        .next_inputs
        .iter()
        .map(|f| (c.output_level, Arc::clone(f)))
        .collect();
    if c.level != 0 {
        remaining.extend(c.inputs.iter().map(|f| (c.level, Arc::clone(f))));
    }
    remaining.sort_by(|a, b| crate::key::compare_internal(&a.1.smallest, &b.1.smallest));

    let mut st = OutputState {
        env,
        current: None,
        file_lo: None,
        first_group: 0,
        last_group: 0,
        intervals: Vec::new(),
        frags: &frags,
        out: Output {
            bytes_read,
            ..Default::default()
        },
        created: Vec::new(),
        remaining,
        output_level: c.output_level,
        cut_after: None,
    };
    let result = (|| -> Result<()> {
        let mut it = MergingIterator::new(children);
        it.seek_to_first();
        let mut cur_key: Vec<u8> = Vec::new();
        let mut have_key = false;
        let mut last_stripe: Option<usize> = None;
        while it.valid() {
            let ikey = it.key();
            let p = parse_internal_key(ikey).ok_or_else(|| {
                crate::Error::corruption(
                    env.store.location(),
                    0,
                    "compaction input holds a malformed internal key",
                )
            })?;
            let new_key = !have_key || p.user_key != cur_key.as_slice();
            if new_key {
                // A user-key boundary: the place to cut output files.
                let forced = st
                    .cut_after
                    .as_deref()
                    .is_some_and(|after| p.user_key > after);
                let cut = match &st.current {
                    Some((_, b)) => {
                        let size = b.estimated_file_size();
                        forced
                            || size >= env.target_file_size
                            || (group_of(p.user_key) != st.last_group
                                && size >= env.min_group_file_size)
                    }
                    None => false,
                };
                if cut {
                    st.finish(Some(p.user_key))?;
                }
                if cut || forced {
                    st.file_lo = Some(p.user_key.to_vec());
                    if env.piece_bytes > 0 {
                        // An input that failed to read drops out of the merge silently
                        // (its error waits in the status): never let a piece count its
                        // unread files as consumed.
                        it.status()?;
                        st.maybe_piece(p.user_key, install)?;
                    }
                }
                cur_key.clear();
                cur_key.extend_from_slice(p.user_key);
                have_key = true;
                last_stripe = None;
            }
            let stripe = stripes.of(p.seq);
            let mut drop = last_stripe == Some(stripe);
            last_stripe = Some(stripe);
            if !drop {
                let t = all_frags.max_covering_at(p.user_key, stripes.upper(stripe));
                // Covered by a tombstone of its stripe, or a tombstone with nothing
                // older left below it.
                drop = t > p.seq || p.kind == ValueKind::Delete && c.bottommost && stripe == 0;
            }
            if drop {
                st.out.dropped += 1;
            } else {
                if st.current.is_none() {
                    let lo = st.file_lo.take();
                    st.open(p.user_key, lo)?;
                }
                if let Some((_, b)) = st.current.as_mut() {
                    b.add(it.key(), it.value())?;
                }
                st.last_group = group_of(p.user_key);
            }
            it.next();
        }
        it.status()?;
        st.finish(None)?;
        let intervals = std::mem::take(&mut st.intervals);
        for pieces in gaps(st.frags, &intervals) {
            st.write_tombstone_file(&pieces)?;
        }
        env.store.sync()?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(st.out),
        Err(e) => {
            drop(st.current.take());
            for &n in &st.created {
                let _ = env.store.delete_table(n);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(s: &str, e: &str) -> Fragment {
        Fragment {
            start: s.as_bytes().to_vec(),
            end: e.as_bytes().to_vec(),
            seqs: vec![3],
        }
    }

    #[test]
    fn gaps_cover_what_files_do_not() {
        let frags = vec![frag("a", "z")];
        let ivs = vec![
            Interval {
                lo: Some(b"c".to_vec()),
                hi: Some(b"f".to_vec()),
            },
            Interval {
                lo: Some(b"f".to_vec()),
                hi: Some(b"k".to_vec()),
            },
        ];
        let g = gaps(&frags, &ivs);
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = g
            .iter()
            .flatten()
            .map(|t| (t.start.clone(), t.end.clone()))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (b"a".to_vec(), b"c".to_vec()),
                (b"k".to_vec(), b"z".to_vec())
            ]
        );
        assert!(gaps(&frags, &[Interval { lo: None, hi: None }]).is_empty());
    }

    #[test]
    fn group_key_range_holds_exactly_the_group() {
        let g = group_of(b"ab");
        let (s, e) = group_key_range(g);
        assert_eq!(s, b"ab".to_vec());
        let e = e.unwrap();
        for k in [
            &b"ab"[..],
            b"ab\0",
            b"ab\0\0\0\0\0\0\xff",
            b"ab\0\0\0\0\0\0",
        ] {
            assert_eq!(group_of(k), g);
            assert!(s.as_slice() <= k && k < e.as_slice());
        }
        for k in [&b"a"[..], b"ab\0\0\0\0\0\x01", b"ac"] {
            assert_ne!(group_of(k), g);
            assert!(!(s.as_slice() <= k && k < e.as_slice()));
        }
        assert_eq!(group_key_range(0).0, Vec::<u8>::new());
    }

    #[test]
    fn stripes_split_by_snapshots() {
        let s = Stripes {
            snapshots: &[5, 10],
        };
        assert_eq!(s.of(1), 0);
        assert_eq!(s.of(5), 0);
        assert_eq!(s.of(6), 1);
        assert_eq!(s.of(11), 2);
        assert_eq!(s.upper(2), u64::MAX);
    }
}
