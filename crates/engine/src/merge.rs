//! Iterators that combine sources: [`LevelIter`] walks the non-overlapping files of one
//! level opening tables lazily; [`MergingIterator`] merges any number of sorted sources
//! into one internal-key order (forward and backward, LevelDB's direction switching).

use std::cmp::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::iter::InternalIterator;
use crate::key::compare_internal;
use crate::table::TableCache;
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
        }
    }

    fn open(&mut self, index: usize) -> bool {
        self.index = index;
        self.cur = None;
        let Some(f) = self.files.get(index) else {
            return false;
        };
        match self.tables.get(f.number, f.size) {
            Ok(t) => {
                self.cur = Some(Box::new(t.iter_with(self.fill_cache)));
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
            if self.index + 1 >= self.files.len() {
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
            if self.index == 0 {
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
}

/// Copies an error for repeated `status()` calls (errors are not `Clone`).
pub(crate) fn clone_error(e: &Error) -> Error {
    match e {
        Error::Corruption { file, offset, what } => Error::Corruption {
            file: file.clone(),
            offset: *offset,
            what: what.clone(),
        },
        Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
        Error::Background(s) => Error::Background(s.clone()),
        Error::Closed => Error::Closed,
        other => Error::Background(other.to_string()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Reverse,
}

/// Merges sorted sources. Internal keys are unique across sources (one sequence number
/// per record), so there are no ties to break.
pub struct MergingIterator {
    children: Vec<BoxIter>,
    current: Option<usize>,
    direction: Direction,
}

impl MergingIterator {
    /// Merges `children`.
    pub fn new(children: Vec<BoxIter>) -> Self {
        MergingIterator {
            children,
            current: None,
            direction: Direction::Forward,
        }
    }

    fn find_smallest(&mut self) {
        let mut best: Option<usize> = None;
        for (i, c) in self.children.iter().enumerate() {
            if !c.valid() {
                continue;
            }
            best = match best {
                Some(b) if compare_internal(c.key(), self.children[b].key()) != Ordering::Less => {
                    Some(b)
                }
                _ => Some(i),
            };
        }
        self.current = best;
    }

    fn find_largest(&mut self) {
        let mut best: Option<usize> = None;
        for (i, c) in self.children.iter().enumerate() {
            if !c.valid() {
                continue;
            }
            best = match best {
                Some(b)
                    if compare_internal(c.key(), self.children[b].key()) != Ordering::Greater =>
                {
                    Some(b)
                }
                _ => Some(i),
            };
        }
        self.current = best;
    }
}

impl InternalIterator for MergingIterator {
    fn valid(&self) -> bool {
        self.current.is_some()
    }
    fn seek_to_first(&mut self) {
        for c in &mut self.children {
            c.seek_to_first();
        }
        self.direction = Direction::Forward;
        self.find_smallest();
    }
    fn seek_to_last(&mut self) {
        for c in &mut self.children {
            c.seek_to_last();
        }
        self.direction = Direction::Reverse;
        self.find_largest();
    }
    fn seek(&mut self, target: &[u8]) {
        for c in &mut self.children {
            c.seek(target);
        }
        self.direction = Direction::Forward;
        self.find_smallest();
    }
    fn seek_for_prev(&mut self, target: &[u8]) {
        for c in &mut self.children {
            c.seek_for_prev(target);
        }
        self.direction = Direction::Reverse;
        self.find_largest();
    }
    fn next(&mut self) {
        let Some(cur) = self.current else { return };
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
            self.direction = Direction::Forward;
        }
        self.children[cur].next();
        self.find_smallest();
    }
    fn prev(&mut self) {
        let Some(cur) = self.current else { return };
        if self.direction != Direction::Reverse {
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
            self.direction = Direction::Reverse;
        }
        self.children[cur].prev();
        self.find_largest();
    }
    fn key(&self) -> &[u8] {
        match self.current {
            Some(i) => self.children[i].key(),
            None => &[],
        }
    }
    fn value(&self) -> &[u8] {
        match self.current {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{internal_key, ValueKind};
    use crate::memtable::MemTable;

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
}
