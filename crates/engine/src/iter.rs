//! The iterator interface every sorted source of internal entries implements (memtable,
//! SST block, whole table, level, merging iterator), in LevelDB's style: a cursor that is
//! positioned with `seek*`, moved with `next`/`prev`, and read with `key`/`value` while
//! `valid()`. Errors stop the cursor (`valid()` turns false) and are reported by
//! `status()`, so a scan never silently skips a corrupt block.

use crate::error::Result;

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
}
