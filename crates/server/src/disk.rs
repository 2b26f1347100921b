//! The node's view of its data disk's free space, and the refusal of writes while the
//! space is under the reserve (`--reserve-space-mb`).
//!
//! A write that fails for lack of space poisons the log store or the engine (they cannot
//! tell which of the bytes written made it), and the node's groups stop until a restart.
//! So the node stops *taking* client writes before that: while the free space is under
//! the reserve, its leaders refuse client writes with a typed `DiskFull`. Everything else
//! goes on within the reserve — reads (ReadIndex writes nothing), replication to this
//! node's followers, applies, flushes, compactions (which free space), log truncation,
//! the meta group's own proposals — and writes are taken again by themselves once the
//! space is back (a watcher samples it every `disk_check_interval`).
//!
//! Its leaders do not wait for the space to return: every half second the driver hands
//! each group it leads to its most caught-up follower on a node with room (as the meta
//! service last reported, so leadership does not bounce between full nodes), and the
//! group's writes go on there. With no such follower the group refuses writes until
//! the space returns.
//!
//! Leaving the state needs 5% more than the reserve, so a disk hovering at the line does
//! not flip the node's answer at every sample.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_proto as proto;

use crate::shared::Shared;

/// Free space of the data disk as last sampled, and whether writes are refused.
#[derive(Debug)]
pub struct DiskSpace {
    reserve: u64,
    available: AtomicU64,
    full: AtomicBool,
    /// The nodes the meta service last said are short of space (this one included).
    full_nodes: Mutex<Vec<u64>>,
}

impl DiskSpace {
    /// A view with `reserve` bytes kept free (0: never full), not sampled yet.
    pub fn new(reserve: u64) -> DiskSpace {
        DiskSpace {
            reserve,
            available: AtomicU64::new(u64::MAX),
            full: AtomicBool::new(false),
            full_nodes: Mutex::new(Vec::new()),
        }
    }

    /// Takes the meta service's list of nodes short of space.
    pub fn set_full_nodes(&self, nodes: Vec<u64>) {
        *self.full_nodes.lock() = nodes;
    }

    /// Whether the meta service last said node `id`'s disk is short of space.
    pub fn is_node_full(&self, id: u64) -> bool {
        self.full_nodes.lock().contains(&id)
    }

    /// Takes a sample of the free space; returns the new state if it changed.
    pub fn observe(&self, available: u64) -> Option<bool> {
        self.available.store(available, Ordering::Release);
        if self.reserve == 0 {
            return None;
        }
        let was = self.full.load(Ordering::Acquire);
        let now = if was {
            available < self.reserve.saturating_add(self.reserve / 20)
        } else {
            available < self.reserve
        };
        if now == was {
            return None;
        }
        self.full.store(now, Ordering::Release);
        Some(now)
    }

    /// Whether client writes are refused.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Free bytes at the last sample (`u64::MAX` before the first).
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Acquire)
    }

    /// The refusal of a client write to group `g` on node `node`, if the disk is full.
    pub fn refusal(&self, g: u64, node: u64) -> Option<proto::Error> {
        self.is_full()
            .then(|| proto::Error::disk_full(g, node, self.available(), self.reserve))
    }
}

/// Samples the data disk's free space every `disk_check_interval`, forever, and logs
/// each change of state. A failed sample keeps the last state (and is logged).
pub async fn watch(shared: Arc<Shared>) {
    let dir = shared.cfg.data_dir.clone();
    let mut failing = false;
    loop {
        match shared.fs.available_space(&dir) {
            Ok(avail) => {
                failing = false;
                match shared.disk.observe(avail) {
                    Some(true) => tracing::error!(
                        available = avail,
                        reserve = shared.cfg.reserve_space,
                        "disk nearly full: client writes refused until space is freed"
                    ),
                    Some(false) => tracing::warn!(
                        available = avail,
                        "disk space back above the reserve: writes taken again"
                    ),
                    None => {}
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot sample the data disk's free space: {e}");
                }
                failing = true;
            }
        }
        tokio::time::sleep(shared.cfg.disk_check_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_under_the_reserve_and_back_above_it_with_a_margin() {
        let d = DiskSpace::new(1000);
        assert!(!d.is_full());
        assert_eq!(d.refusal(1, 2), None);
        assert_eq!(d.observe(5000), None);
        assert_eq!(d.observe(999), Some(true));
        assert!(d.is_full());
        let e = d.refusal(7, 2).map(|e| e.kind);
        assert!(
            matches!(
                e,
                Some(Some(proto::error::Kind::DiskFull(proto::DiskFull {
                    group_id: 7,
                    node_id: 2,
                    available: 999,
                    reserve: 1000,
                })))
            ),
            "{e:?}"
        );
        // At the reserve, not yet 5% above it: still full.
        assert_eq!(d.observe(1000), None);
        assert_eq!(d.observe(1049), None);
        assert_eq!(d.observe(1050), Some(false));
        assert!(!d.is_full());
        assert_eq!(d.observe(1000), None);
        assert_eq!(d.observe(0), Some(true));
    }

    #[test]
    fn a_zero_reserve_is_never_full() {
        let d = DiskSpace::new(0);
        assert_eq!(d.observe(0), None);
        assert!(!d.is_full());
        assert_eq!(d.available(), 0);
    }
}
