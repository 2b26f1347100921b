//! The iterator interface every sorted source of internal entries implements (memtable,
//! SST block, whole table, level, merging iterator), in LevelDB's style: a cursor that is
//! positioned with `seek*`, moved with `next`/`prev`, and read with `key`/`value` while
//! `valid()`. Errors stop the cursor (`valid()` turns false) and are reported by
//! `status()`, so a scan never silently skips a corrupt block.

use std::sync::Arc;

use crate::error::Result;

/// What a user-level read is confined to, in user keys. The iterator hands it down to
/// its sources so they can skip what no key of the read can be in: a table whose prefix
/// filter rules `prefix` out, a data block or a file wholly past `upper` or before
/// `lower`. A source given a scope may stop short of entries outside it, never of
/// entries inside it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadScope {
    /// First user key wanted.
    pub lower: Option<Vec<u8>>,
    /// First user key not wanted.
    pub upper: Option<Vec<u8>>,
    /// Every key wanted starts with these bytes (whose length is the prefix extractor's).
    pub prefix: Option<Vec<u8>>,
}

impl ReadScope {
    /// Whether user key `k` lies past the upper bound.
    #[inline]
    pub fn above_upper(&self, k: &[u8]) -> bool {
        self.upper.as_deref().is_some_and(|u| k >= u)
    }

    /// Whether user key `k` lies before the lower bound.
    #[inline]
    pub fn below_lower(&self, k: &[u8]) -> bool {
        self.lower.as_deref().is_some_and(|l| k < l)
    }
}

/// A cursor over internal entries ordered by [`crate::key::compare_internal`].
pub trait InternalIterator: Send {
    /// Whether the cursor is on an entry.
    fn valid(&self) -> bool;
    /// Positions on the first entry.
    fn seek_to_first(&mut self);
    /// Positions on the last entry.
    fn seek_to_last(&mut self);
    /// Positions on the first entry whose internal key is `>= target`.
    fn seek(&mut self, target: &[u8]);
    /// Positions on the last entry whose internal key is `<= target`.
    fn seek_for_prev(&mut self, target: &[u8]);
    /// Moves to the next entry. Requires `valid()`.
    fn next(&mut self);
    /// Moves to the previous entry. Requires `valid()`.
    fn prev(&mut self);
    /// The current internal key. Requires `valid()`.
    fn key(&self) -> &[u8];
    /// The current value. Requires `valid()`.
    fn value(&self) -> &[u8];
    /// The first error met, if any.
    fn status(&self) -> Result<()>;
    /// Confines the following seeks to `scope` (see [`ReadScope`]); sources that cannot
    /// use it ignore it.
    fn set_scope(&mut self, _scope: &Arc<ReadScope>) {}
    /// Whether a seek to `target` would read from a table file (a block not in the
    /// block cache, or a table not open yet): a merging iterator over a remote store
    /// seeks such sources side by side. In-memory sources never do.
    fn seek_would_read(&self, _target: &[u8]) -> bool {
        false
    }
}
