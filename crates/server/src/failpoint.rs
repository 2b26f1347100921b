//! Failpoints at the steps of a replica's life (apply, snapshot install, log truncation,
//! replica creation, the drop of a removed replica's data). Compiled in only with the
//! `failpoints` feature (the crate's tests turn it on); otherwise [`check`] is a no-op
//! the optimiser removes.
//!
//! A test turns one on with `fail::cfg(name, "return(<node ids>)")`: the step then fails
//! with [`crate::Error::Injected`] on those nodes (comma-separated ids; `return` alone:
//! every node; `node/group` limits a step that belongs to one replica to that group). What happens next is what an I/O error at that step would cause; a test
//! that then stops and restarts the node sees the disk as a crash at that point left it.

/// Names of the failpoints.
pub mod names {
    /// After a replica's ready is taken from raft, before any of its work (messages,
    /// install, append, apply) is done.
    pub const READY_BEFORE_SEND: &str = "ready_before_send";
    /// Before a round's apply batch is written (each batch, when a scrub point cuts a
    /// round in two).
    pub const APPLY_BEFORE_WRITE: &str = "apply_before_write";
    /// Before a received snapshot replaces the group's engine data.
    pub const INSTALL_BEFORE_REPLACE: &str = "install_before_replace";
    /// Before a received snapshot's tables are copied in on the shared store (a snapshot
    /// by copy): the copy fails as one the store refuses would.
    pub const SNAPSHOT_COPY_IN: &str = "snapshot_copy_in";
    /// After the engine holds the snapshot, before the log is reset.
    pub const INSTALL_AFTER_REPLACE: &str = "install_after_replace";
    /// After the log's suffix above the snapshot is gone, before its prefix is.
    pub const INSTALL_AFTER_SUFFIX: &str = "install_after_suffix";
    /// Before a group's log is truncated to the engine's persisted index.
    pub const TRUNCATE_BEFORE: &str = "truncate_before";
    /// When a replica is opened (node start or creation).
    pub const OPEN_REPLICA: &str = "open_replica";
    /// After a new replica is in the registry, before it is opened.
    pub const CREATE_AFTER_REGISTRY: &str = "create_after_registry";
    /// After a removed replica's tombstone is in the registry, before the engine drops
    /// its data.
    pub const DROP_BEFORE_ENGINE: &str = "drop_before_engine";
    /// After the engine dropped a removed replica's data, before its log stream goes.
    pub const DROP_BEFORE_LOG: &str = "drop_before_log";
    /// `--drop-mode range-delete`: after a removed replica's range tombstone is written
    /// (in a memtable, maybe with no WAL), before the flush that makes it durable.
    pub const DROP_BEFORE_FLUSH: &str = "drop_before_flush";
    /// After a removed replica's log stream is gone, before the registry records the
    /// drop done.
    pub const DROP_BEFORE_DONE: &str = "drop_before_done";
    /// After a split's new group is in the registry, before the round that applies the
    /// split is written.
    pub const SPLIT_AFTER_REGISTRY: &str = "split_after_registry";
    /// After a split's new range epoch is published, before its round is written.
    pub const SPLIT_BEFORE_WRITE: &str = "split_before_write";
    /// After the round that applied a split is written, before the new group's replica
    /// is opened.
    pub const SPLIT_BEFORE_OPEN: &str = "split_before_open";
    /// After the first batch of a round cut at a scrub point is written (and the scrub
    /// started), before the rest of the round is taken.
    pub const SCRUB_AFTER_FIRST_BATCH: &str = "scrub_after_first_batch";
    /// After a merge's commit is taken into the target's round, before the round is
    /// written.
    pub const MERGE_BEFORE_WRITE: &str = "merge_before_write";
    /// After the round that took a merge in is durable, before the source's replica is
    /// removed from the registry (and its data dropped).
    pub const MERGE_BEFORE_DROP: &str = "merge_before_drop";
}

/// Fails with an injected error if failpoint `name` is on for node `node`.
pub fn check(name: &str, node: u64) -> crate::Result<()> {
    check_at(name, node, None)
}

/// Like [`check`], for a step of group `group`'s replica: also hit by `node/group`.
pub fn check_group(name: &str, node: u64, group: u64) -> crate::Result<()> {
    check_at(name, node, Some(group))
}

#[allow(unused_variables)]
fn check_at(name: &str, node: u64, group: Option<u64>) -> crate::Result<()> {
    #[cfg(feature = "failpoints")]
    {
        let hit = fail::eval(name, |payload| {
            payload.is_none_or(|ids| ids.split(',').any(|item| matches(item, node, group)))
        });
        if hit == Some(true) {
            return Err(crate::Error::Injected(name.to_string()));
        }
    }
    Ok(())
}

/// Whether one payload item (`node` or `node/group`) names this step.
#[cfg(feature = "failpoints")]
fn matches(item: &str, node: u64, group: Option<u64>) -> bool {
    let mut parts = item.trim().splitn(2, '/');
    let n = parts.next().and_then(|n| n.trim().parse::<u64>().ok());
    match (n, parts.next()) {
        (Some(n), None) => n == node,
        (Some(n), Some(g)) => match (g.trim().parse::<u64>(), group) {
            (Ok(g), Some(group)) => n == node && g == group,
            // A malformed group, or a step that belongs to no group: no match.
            _ => false,
        },
        (None, _) => false,
    }
}
