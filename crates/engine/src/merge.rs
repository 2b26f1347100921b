//! Iterators that combine sources: [`LevelIter`] walks the non-overlapping files of one
//! level opening tables lazily; [`MergingIterator`] merges any number of sorted sources
//! into one internal-key order (forward and backward, LevelDB's direction switching).

use std::cmp::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::iter::{InternalIterator, ReadScope};
use crate::key::compare_internal;
use crate::table::{Readahead, TableCache};
use crate::version_edit::FileMeta;

/// A boxed internal iterator.
pub type BoxIter = Box<dyn InternalIterator>;

/// Concatenates the files of one level (sorted, non-overlapping).
pub struct LevelIter {
    tables: Arc<TableCache>,
    files: Arc<Vec<Arc<FileMeta>>>,
    index: usize,
    cur: Option<BoxIter>,
    error: Option<Error>,
    fill_cache: bool,
    /// What the reads are confined to: files wholly outside it are not opened.
    scope: Option<Arc<ReadScope>>,
    /// How each table's cursor reads ahead.
    readahead: Readahead,
}

impl LevelIter {
    /// A cursor over `files`; blocks read enter the block cache only with `fill_cache`.
    pub fn new(tables: Arc<TableCache>, files: Arc<Vec<Arc<FileMeta>>>, fill_cache: bool) -> Self {
        LevelIter {
            tables,
            files,
            fill_cache,
            index: 0,
            cur: None,
            error: None,
            scope: None,
            readahead: Readahead::Off,
        }
    }

    /// Each table's cursor reads ahead as `r` says (on a file whose reads are requests).
    pub fn with_readahead(mut self, r: Readahead) -> Self {
        self.readahead = r;
        self
    }

    fn open(&mut self, index: usize) -> bool {
        self.index = index;
        self.cur = None;
        let Some(f) = self.files.get(index) else {
            return false;
        };
        match self.tables.get(f.number, f.size) {
            Ok(t) => {
                let mut it = t.iter_with(self.fill_cache).with_readahead(self.readahead);
                if let Some(s) = &self.scope {
                    it.set_scope(s);
                }
                self.cur = Some(Box::new(it));
                true
            }
            Err(e) => {
                if self.error.is_none() {
                    self.error = Some(e);
                }
                false
            }
        }
    }

    fn check_cur(&mut self) {
        if let Some(c) = &self.cur {
            if let Err(e) = c.status() {
                if self.error.is_none() {
                    self.error = Some(e);
                }
                self.cur = None;
            }
        }
    }

    fn skip_forward(&mut self) {
        loop {
            self.check_cur();
            if self.error.is_some() {
                self.cur = None;
                return;
            }
            match &self.cur {
                Some(c) if c.valid() => return,
                None => return,
                Some(_) => {}
            }
            let past_scope = self.files.get(self.index + 1).is_none_or(|f| {
                self.scope
                    .as_ref()
                    .is_some_and(|s| s.above_upper(f.smallest_user_key()))
            });
            if past_scope {
                self.cur = None;
                return;
            }
            if !self.open(self.index + 1) {
                return;
            }
            if let Some(c) = self.cur.as_mut() {
                c.seek_to_first();
            }
        }
    }

    fn skip_backward(&mut self) {
        loop {
            self.check_cur();
            if self.error.is_some() {
                self.cur = None;
                return;
            }
            match &self.cur {
                Some(c) if c.valid() => return,
                None => return,
                Some(_) => {}
            }
            let before_scope = self.index == 0
                || self.files.get(self.index - 1).is_none_or(|f| {
                    self.scope
                        .as_ref()
                        .is_some_and(|s| s.below_lower(f.largest_user_key()))
                });
            if before_scope {
                self.cur = None;
                return;
            }
            if !self.open(self.index - 1) {
                return;
            }
            if let Some(c) = self.cur.as_mut() {
                c.seek_to_last();
            }
        }
    }
}

impl InternalIterator for LevelIter {
    fn valid(&self) -> bool {
        self.error.is_none() && self.cur.as_ref().is_some_and(|c| c.valid())
    }
    fn seek_to_first(&mut self) {
        if self.open(0) {
            if let Some(c) = self.cur.as_mut() {
                c.seek_to_first();
            }
            self.skip_forward();
        }
    }
    fn seek_to_last(&mut self) {
        if self.files.is_empty() {
            self.cur = None;
            return;
        }
        if self.open(self.files.len() - 1) {
            if let Some(c) = self.cur.as_mut() {
                c.seek_to_last();
            }
            self.skip_backward();
        }
    }
    fn seek_would_read(&self, target: &[u8]) -> bool {
        let i = self
            .files
            .partition_point(|f| compare_internal(&f.largest, target) == Ordering::Less);
        let Some(f) = self.files.get(i) else {
            return false;
        };
        // (A table not open yet is read to open it; one whose prefix filter rules the
        // scope's prefix out is not read: `TableIter::set_scope`.)
        let prefix = self.scope.as_ref().and_then(|s| s.prefix.as_deref());
        self.tables.get_open(f.number).is_none_or(|t| {
            !prefix.is_some_and(|p| t.excludes_prefix(p)) && t.seek_would_read(target)
        })
    }
    fn seek(&mut self, target: &[u8]) {
        let i = self
            .files
            .partition_point(|f| compare_internal(&f.largest, target) == Ordering::Less);
        if self.open(i) {
            if let Some(c) = self.cur.as_mut() {
                c.seek(target);
            }
            self.skip_forward();
        }
    }
    fn seek_for_prev(&mut self, target: &[u8]) {
        // The last file whose smallest key is <= target.
        let i = self
            .files
            .partition_point(|f| compare_internal(&f.smallest, target) != Ordering::Greater);
        if i == 0 {
            self.cur = None;
            return;
        }
        if self.open(i - 1) {
            if let Some(c) = self.cur.as_mut() {
                c.seek_for_prev(target);
            }
            self.skip_backward();
        }
    }
    fn next(&mut self) {
        if let Some(c) = self.cur.as_mut() {
            c.next();
        }
        self.skip_forward();
    }
    fn prev(&mut self) {
        if let Some(c) = self.cur.as_mut() {
            c.prev();
        }
        self.skip_backward();
    }
    fn key(&self) -> &[u8] {
        self.cur.as_ref().map(|c| c.key()).unwrap_or(&[])
    }
    fn value(&self) -> &[u8] {
        self.cur.as_ref().map(|c| c.value()).unwrap_or(&[])
    }
    fn status(&self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(clone_error(e));
        }
        self.cur.as_ref().map(|c| c.status()).unwrap_or(Ok(()))
    }
    fn set_scope(&mut self, scope: &Arc<ReadScope>) {
        if let Some(c) = self.cur.as_mut() {
            c.set_scope(scope);
        }
        self.scope = Some(Arc::clone(scope));
    }
}

/// Copies an error for repeated `status()` calls (errors are not `Clone`).
pub(crate) fn clone_error(e: &Error) -> Error {
    crate::table::clone_error(e)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Reverse,
}

/// Merges sorted sources. Internal keys are unique across sources (one sequence number
/// per record), so there are no ties to break.
///
/// The valid children sit in a binary heap on their current keys (a min-heap going
/// forward, a max-heap going backward), so a step costs O(log n) comparisons instead of
/// a scan of every source; in the common case (the child just advanced is still the
/// smallest) a step costs one or two comparisons.
pub struct MergingIterator {
    children: Vec<BoxIter>,
    /// Indices of the valid children; `heap[0]` is the current one.
    heap: Vec<usize>,
    direction: Direction,
    /// Children whose seek reads a table file seek side by side (tables on a remote
    /// store, `ReadOptions::parallel_io`).
    parallel_seeks: bool,
}

/// Seeks every child to `target`. Those whose seek reads a table file, when there are
/// two or more, seek side by side ([`crate::io_class::side_by_side`]), so a seek waits
/// about one remote read rather than one per level (seed 004's parallel I/O for
/// iterators).
fn seek_side_by_side(children: &mut [BoxIter], target: &[u8]) {
    let (reading, in_memory): (Vec<_>, Vec<_>) =
        children.iter_mut().partition(|c| c.seek_would_read(target));
    for c in in_memory {
        c.seek(target);
    }
    if reading.len() < 2 {
        for c in reading {
            c.seek(target);
        }
        return;
    }
    for r in crate::io_class::side_by_side(reading, |c| c.seek(target)) {
        if let Err(panic) = r {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Whether child `a`'s key comes out of the heap before child `b`'s.
#[inline]
fn before(children: &[BoxIter], dir: Direction, a: usize, b: usize) -> bool {
    let ord = compare_internal(children[a].key(), children[b].key());
    match dir {
        Direction::Forward => ord == Ordering::Less,
        Direction::Reverse => ord == Ordering::Greater,
    }
}

fn sift_down(children: &[BoxIter], dir: Direction, heap: &mut [usize], mut i: usize) {
    let n = heap.len();
    loop {
        let l = 2 * i + 1;
        if l >= n {
            return;
        }
        let r = l + 1;
        let c = if r < n && before(children, dir, heap[r], heap[l]) {
            r
        } else {
            l
        };
        if !before(children, dir, heap[c], heap[i]) {
            return;
        }
        heap.swap(i, c);
        i = c;
    }
}

impl MergingIterator {
    /// Merges `children`.
    pub fn new(children: Vec<BoxIter>) -> Self {
        let heap = Vec::with_capacity(children.len());
        MergingIterator {
            children,
            heap,
            direction: Direction::Forward,
            parallel_seeks: false,
        }
    }

    /// Children whose seek reads a table file seek side by side (for tables on a
    /// remote store: on a local disk a thread costs more than the read).
    pub fn with_parallel_seeks(mut self, parallel: bool) -> Self {
        self.parallel_seeks = parallel;
        self
    }

    /// Rebuilds the heap from every valid child for direction `dir`; none if a child
    /// failed (see [`MergingIterator::fix_top`]).
    fn rebuild(&mut self, dir: Direction) {
        self.direction = dir;
        self.heap.clear();
        if self
            .children
            .iter()
            .any(|c| !c.valid() && c.status().is_err())
        {
            return;
        }
        self.heap
            .extend((0..self.children.len()).filter(|&i| self.children[i].valid()));
        for i in (0..self.heap.len() / 2).rev() {
            sift_down(&self.children, dir, &mut self.heap, i);
        }
        self.check_heap();
    }

    /// After the top child moved: keeps it in place if still first, else sifts it down
    /// (or drops it when exhausted). A child that failed ends the merge, its error in
    /// `status`: the others alone would show what it shadows (an older value, a deleted
    /// key) as current.
    fn fix_top(&mut self) {
        let Some(&top) = self.heap.first() else {
            return;
        };
        if !self.children[top].valid() {
            if self.children[top].status().is_err() {
                self.heap.clear();
                return;
            }
            self.heap.swap_remove(0);
        }
        sift_down(&self.children, self.direction, &mut self.heap, 0);
        self.check_heap();
    }

    /// Heap order holds (debug builds only: it is a full check per step).
    fn check_heap(&self) {
        if cfg!(debug_assertions) {
            for i in 1..self.heap.len() {
                let parent = (i - 1) / 2;
                debug_assert!(
                    !before(
                        &self.children,
                        self.direction,
                        self.heap[i],
                        self.heap[parent]
                    ),
                    "merging iterator heap out of order at {i}"
                );
            }
        }
    }

    fn current(&self) -> Option<usize> {
        self.heap.first().copied()
    }
}

impl InternalIterator for MergingIterator {
    fn valid(&self) -> bool {
        !self.heap.is_empty()
    }
    fn seek_to_first(&mut self) {
        for c in &mut self.children {
            c.seek_to_first();
        }
        self.rebuild(Direction::Forward);
    }
    fn seek_to_last(&mut self) {
        for c in &mut self.children {
            c.seek_to_last();
        }
        self.rebuild(Direction::Reverse);
    }
    fn seek(&mut self, target: &[u8]) {
        if self.parallel_seeks {
            seek_side_by_side(&mut self.children, target);
        } else {
            for c in &mut self.children {
                c.seek(target);
            }
        }
        self.rebuild(Direction::Forward);
    }
    fn seek_for_prev(&mut self, target: &[u8]) {
        for c in &mut self.children {
            c.seek_for_prev(target);
        }
        self.rebuild(Direction::Reverse);
    }
    fn next(&mut self) {
        let Some(cur) = self.current() else { return };
        if self.direction != Direction::Forward {
            // Move every other child to the first entry after the current key.
            let key = self.children[cur].key().to_vec();
            for (i, c) in self.children.iter_mut().enumerate() {
                if i == cur {
                    continue;
                }
                c.seek(&key);
                if c.valid() && compare_internal(c.key(), &key) == Ordering::Equal {
                    c.next();
                }
            }
            self.children[cur].next();
            self.rebuild(Direction::Forward);
            return;
        }
        self.children[cur].next();
        self.fix_top();
    }
    fn prev(&mut self) {
        let Some(cur) = self.current() else { return };
        if self.direction != Direction::Reverse {
            // Move every other child to the last entry before the current key.
            let key = self.children[cur].key().to_vec();
            for (i, c) in self.children.iter_mut().enumerate() {
                if i == cur {
                    continue;
                }
                c.seek_for_prev(&key);
                if c.valid() && compare_internal(c.key(), &key) == Ordering::Equal {
                    c.prev();
                }
            }
            self.children[cur].prev();
            self.rebuild(Direction::Reverse);
            return;
        }
        self.children[cur].prev();
        self.fix_top();
    }
    fn key(&self) -> &[u8] {
        match self.current() {
            Some(i) => self.children[i].key(),
            None => &[],
        }
    }
    fn value(&self) -> &[u8] {
        match self.current() {
            Some(i) => self.children[i].value(),
            None => &[],
        }
    }
    fn status(&self) -> Result<()> {
        for c in &self.children {
            c.status()?;
        }
        Ok(())
    }
    fn set_scope(&mut self, scope: &Arc<ReadScope>) {
        for c in &mut self.children {
            c.set_scope(scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{internal_key, ValueKind};
    use crate::memtable::MemTable;

    /// An iterator over `inner` whose read fails after `steps` moves: it turns invalid
    /// and reports the error, as a table iterator whose block read failed does.
    struct FailsAfter {
        inner: BoxIter,
        steps: usize,
    }

    impl FailsAfter {
        fn step(&mut self) {
            self.steps = self.steps.saturating_sub(1);
        }
    }

    impl InternalIterator for FailsAfter {
        fn valid(&self) -> bool {
            self.steps > 0 && self.inner.valid()
        }
        fn seek_to_first(&mut self) {
            self.inner.seek_to_first();
        }
        fn seek_to_last(&mut self) {
            self.inner.seek_to_last();
        }
        fn seek(&mut self, target: &[u8]) {
            self.inner.seek(target);
        }
        fn seek_for_prev(&mut self, target: &[u8]) {
            self.inner.seek_for_prev(target);
        }
        fn next(&mut self) {
            self.step();
            self.inner.next();
        }
        fn prev(&mut self) {
            self.step();
            self.inner.prev();
        }
        fn key(&self) -> &[u8] {
            self.inner.key()
        }
        fn value(&self) -> &[u8] {
            self.inner.value()
        }
        fn status(&self) -> Result<()> {
            if self.steps == 0 {
                return Err(Error::Background("injected read failure".into()));
            }
            Ok(())
        }
    }

    /// A child that fails mid-scan ends the merge (invalid, the error in `status`): going
    /// on with the other children would show keys the failed one shadows (an older
    /// value, a deleted key) as if they were current.
    #[test]
    fn a_child_that_fails_ends_the_merge() {
        for reverse in [false, true] {
            let a = Arc::new(MemTable::new(1));
            let b = Arc::new(MemTable::new(2));
            for i in 0..20u64 {
                let k = format!("{i:03}");
                a.add(100 + i, ValueKind::Put, k.as_bytes(), b"new");
                b.add(1 + i, ValueKind::Put, k.as_bytes(), b"old");
            }
            let failing = FailsAfter {
                inner: Box::new(a.iter()),
                steps: 5,
            };
            let mut m = MergingIterator::new(vec![Box::new(failing), Box::new(b.iter())]);
            if reverse {
                m.seek_to_last();
            } else {
                m.seek_to_first();
            }
            let mut seen = 0;
            while m.valid() {
                seen += 1;
                assert!(seen <= 40);
                if reverse {
                    m.prev();
                } else {
                    m.next();
                }
            }
            assert!(m.status().is_err(), "the failure is reported");
            assert!(
                seen < 12,
                "the merge went on past the failed child: {seen} entries"
            );
        }
    }

    #[test]
    fn merges_both_directions() {
        let a = Arc::new(MemTable::new(1));
        let b = Arc::new(MemTable::new(2));
        let mut all = Vec::new();
        for i in 0..200u64 {
            let m = if i % 3 == 0 { &a } else { &b };
            let k = format!("{:03}", i % 50);
            m.add(i + 1, ValueKind::Put, k.as_bytes(), b"v");
            all.push(internal_key(k.as_bytes(), i + 1, ValueKind::Put));
        }
        all.sort_by(|x, y| compare_internal(x, y));
        let mut m = MergingIterator::new(vec![Box::new(a.iter()), Box::new(b.iter())]);
        m.seek_to_first();
        let mut got = Vec::new();
        while m.valid() {
            got.push(m.key().to_vec());
            m.next();
        }
        assert_eq!(got, all);
        // Zig-zag: next then prev returns to the same key.
        m.seek(&all[10]);
        m.next();
        m.prev();
        assert_eq!(m.key(), all[10].as_slice());
        m.prev();
        assert_eq!(m.key(), all[9].as_slice());
        m.next();
        m.next();
        assert_eq!(m.key(), all[11].as_slice());
        m.seek_to_last();
        let mut back = Vec::new();
        while m.valid() {
            back.push(m.key().to_vec());
            m.prev();
        }
        back.reverse();
        assert_eq!(back, all);
    }

    /// Random walks (next, prev, seek, seek_for_prev, ends) over 1..12 sources checked
    /// step by step against a sorted model. Seeded: PHOENIX_MERGE_SEED replays one.
    #[test]
    fn random_walks_match_sorted_model() {
        use rand::{Rng, SeedableRng};
        let seeds: Vec<u64> = match std::env::var("PHOENIX_MERGE_SEED") {
            Ok(s) => vec![s.parse().expect("PHOENIX_MERGE_SEED is a u64")],
            Err(_) => (0..200).collect(),
        };
        for seed in seeds {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let sources = rng.gen_range(1..=12usize);
            let mems: Vec<Arc<MemTable>> = (0..sources)
                .map(|i| Arc::new(MemTable::new(i as u64 + 1)))
                .collect();
            let mut all = Vec::new();
            for seq in 1..=rng.gen_range(0..300u64) {
                let m = &mems[rng.gen_range(0..sources)];
                let k = format!("{:03}", rng.gen_range(0..80u32));
                m.add(seq, ValueKind::Put, k.as_bytes(), b"v");
                all.push(internal_key(k.as_bytes(), seq, ValueKind::Put));
            }
            all.sort_by(|x, y| compare_internal(x, y));
            let children: Vec<BoxIter> =
                mems.iter().map(|m| Box::new(m.iter()) as BoxIter).collect();
            let mut it = MergingIterator::new(children);
            // Model position: Some(i) = on all[i], None = invalid.
            let mut pos: Option<usize> = None;
            for step in 0..400 {
                let op = rng.gen_range(0..6u32);
                match op {
                    0 => {
                        it.seek_to_first();
                        pos = (!all.is_empty()).then_some(0);
                    }
                    1 => {
                        it.seek_to_last();
                        pos = all.len().checked_sub(1);
                    }
                    2 => {
                        let k = format!("{:03}", rng.gen_range(0..82u32));
                        let t = internal_key(k.as_bytes(), rng.gen_range(0..320), ValueKind::Put);
                        it.seek(&t);
                        let i = all.partition_point(|x| compare_internal(x, &t) == Ordering::Less);
                        pos = (i < all.len()).then_some(i);
                    }
                    3 => {
                        let k = format!("{:03}", rng.gen_range(0..82u32));
                        let t = internal_key(k.as_bytes(), rng.gen_range(0..320), ValueKind::Put);
                        it.seek_for_prev(&t);
                        let i =
                            all.partition_point(|x| compare_internal(x, &t) != Ordering::Greater);
                        pos = i.checked_sub(1);
                    }
                    4 if pos.is_some() => {
                        it.next();
                        pos = pos.map(|p| p + 1).filter(|&p| p < all.len());
                    }
                    5 if pos.is_some() => {
                        it.prev();
                        pos = pos.and_then(|p| p.checked_sub(1));
                    }
                    _ => continue,
                }
                let want = pos.map(|p| all[p].as_slice());
                let got = it.valid().then(|| it.key());
                assert_eq!(got, want, "seed {seed} step {step} op {op}");
            }
        }
    }
}
