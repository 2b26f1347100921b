//! Failpoints at the steps of a replica's life (apply, snapshot install, log truncation,
//! replica creation). Compiled in only with the `failpoints` feature (the crate's tests
//! turn it on); otherwise [`check`] is a no-op the optimiser removes.
//!
//! A test turns one on with `fail::cfg(name, "return(<node ids>)")`: the step then fails
//! with [`crate::Error::Injected`] on those nodes (comma-separated ids; `return` alone:
//! every node). What happens next is what an I/O error at that step would cause; a test
//! that then stops and restarts the node sees the disk as a crash at that point left it.

/// Names of the failpoints.
pub mod names {
    /// Before a round's apply batch is written.
    pub const APPLY_BEFORE_WRITE: &str = "apply_before_write";
    /// Before a received snapshot replaces the group's engine data.
    pub const INSTALL_BEFORE_REPLACE: &str = "install_before_replace";
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
}

/// Fails with an injected error if failpoint `name` is on for node `node`.
#[allow(unused_variables)]
pub fn check(name: &str, node: u64) -> crate::Result<()> {
    #[cfg(feature = "failpoints")]
    {
        let hit = fail::eval(name, |payload| {
            payload.is_none_or(|ids| ids.split(',').any(|id| id.trim() == node.to_string()))
        });
        if hit == Some(true) {
            return Err(crate::Error::Injected(name.to_string()));
        }
    }
    Ok(())
}
