//! The node's view of its data disk's free space (and of which other nodes are short
//! of it), and the refusal of writes while the space is under the reserve
//! (`--reserve-space-mb`).
//!
//! A write that fails for lack of space poisons the log store or the engine (they cannot
//! tell which of the bytes written made it), and the node's groups stop until its
//! storage restarts (below). So the node stops *taking* writes before that: while its
//! free space is under the reserve, its leaders refuse client writes with a typed `DiskFull`, its followers drop
//! appends of data entries (node.rs), and every half second it hands the groups it leads
//! to a follower on a node with room (node.rs `shed_leaders`; the meta service's
//! heartbeat answer says which nodes are full). A leader with room refuses too when fewer
//! than a quorum of the group's voters have room. Everything else goes on within the
//! reserve — reads, applies, flushes, compactions (which free space), log truncation, the
//! meta group — and writes are taken again by themselves once the space is back (a
//! watcher samples it every `disk_check_interval`).
//!
//! Leaving the state needs 5% more than the reserve, so a disk hovering at the line does
//! not flip the node's answer at every sample.
//!
//! Should a write or sync fail anyway (the disk filled faster than the watcher samples,
//! or it returned an I/O error), the log store or the engine stops, and with it the
//! node's replicas. The same watcher then probes the disk (a small file written, synced
//! and deleted through the node's file system, in each store's directory) every
//! `disk_check_interval`; once a probe passes (under the reserve too: the restart frees
//! what the failed stores hold), it asks the node to restart its storage
//! (`Shared::storage_restart`): the node stops its services and runs again in the
//! process, reopening the engine and the log store from what reached the disk, as a
//! restart by hand would, less the log bytes written after their last successful sync
//! (a failed `fsync` leaves them readable in the page cache only: lib.rs). Only a failure of the storage itself is restarted
//! (not corruption), and not after `STORAGE_RESTARTS_MAX` quick restarts in a row.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phoenix_proto as proto;

use crate::shared::Shared;

/// Free space of the data disk as last sampled, and whether writes are refused.
#[derive(Debug)]
pub struct DiskSpace {
    reserve: u64,
    available: AtomicU64,
    full: AtomicBool,
    /// The nodes the meta service last said are short of space, and when it said so.
    full_nodes: Mutex<(Vec<u64>, Option<Instant>)>,
    /// How long that list is trusted (a few heartbeat intervals): past it, other nodes
    /// count as having room.
    fresh_for: Duration,
}

impl DiskSpace {
    /// A view with `reserve` bytes kept free (0: never full), not sampled yet; the meta
    /// service's list of full nodes is trusted for `fresh_for`.
    pub fn new(reserve: u64, fresh_for: Duration) -> DiskSpace {
        DiskSpace {
            reserve,
            available: AtomicU64::new(u64::MAX),
            full: AtomicBool::new(false),
            full_nodes: Mutex::new((Vec::new(), None)),
            fresh_for,
        }
    }

    /// Takes the meta service's list of nodes short of space.
    pub fn set_full_nodes(&self, nodes: Vec<u64>) {
        *self.full_nodes.lock() = (nodes, Some(Instant::now()));
    }

    /// Whether the meta service's list is recent enough to act on.
    pub fn knows_peers(&self) -> bool {
        self.is_fresh(self.full_nodes.lock().1)
    }

    /// Whether node `id`'s disk is short of space: this node's from its own samples,
    /// another's from the meta service's recent list (not recent: it has room).
    pub fn is_node_full(&self, id: u64, me: u64) -> bool {
        if id == me {
            return self.is_full();
        }
        let l = self.full_nodes.lock();
        self.is_fresh(l.1) && l.0.contains(&id)
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

    /// The refusal of a client write to group `g` led by node `me` with `voters`, if
    /// this node's disk is full, or if fewer than a quorum of the voters are on nodes
    /// with room (the write could not commit; their followers take no new entries).
    pub fn refusal(&self, g: u64, me: u64, voters: &[u64]) -> Option<proto::Error> {
        let self_full = self.is_full();
        let mut full: Vec<u64> = {
            // One lock, and nothing built, on the usual path (every proposal asks).
            let l = self.full_nodes.lock();
            let fresh = self.is_fresh(l.1);
            if !self_full && (!fresh || l.0.is_empty()) {
                return None;
            }
            voters
                .iter()
                .copied()
                .filter(|&v| {
                    if v == me {
                        self_full
                    } else {
                        fresh && l.0.contains(&v)
                    }
                })
                .collect()
        };
        let quorum = voters.len() / 2 + 1;
        let roomy = voters.len() - full.len();
        if !self_full && roomy >= quorum {
            return None;
        }
        if self_full && !full.contains(&me) {
            full.push(me);
        }
        Some(proto::Error::disk_full(
            g,
            me,
            self.available(),
            self.reserve,
            full,
        ))
    }

    /// Whether a list received at `at` may still be acted on.
    fn is_fresh(&self, at: Option<Instant>) -> bool {
        at.is_some_and(|t| t.elapsed() < self.fresh_for)
    }
}

/// Samples the data disk's free space every `disk_check_interval`, forever, and logs
/// each change of state. A failed sample keeps the last state (and is logged).
pub async fn watch(shared: Arc<Shared>) {
    let dir = shared.cfg.data_dir.clone();
    let mut failing = false;
    let mut storage_failed: Option<(String, Instant)> = None;
    loop {
        // (statvfs blocks; on a hung network disk it must not hold a runtime worker.)
        let fs = Arc::clone(&shared.fs);
        let d = dir.clone();
        let sampled = match tokio::task::spawn_blocking(move || fs.available_space(&d)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the sampling task failed: {e}")),
        };
        match sampled {
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
        check_storage(&shared, &mut storage_failed).await;
        tokio::time::sleep(shared.cfg.disk_check_interval).await;
    }
}

/// How long a failed storage waits at least before the node restarts it: the failure
/// is visible (stopped replicas, the log line) for that long, and a disk that fails
/// again at once is not restarted in a tight loop (lib.rs backs off further).
pub const STORAGE_RESTART_DELAY_MIN: Duration = Duration::from_secs(1);

/// Storage restarts in a row (each run ending within `RESTART_BACKOFF_MAX` of its start)
/// after which the node restarts it no more: the disk passes the probe but fails the
/// stores again, and an operator must look.
pub const STORAGE_RESTARTS_MAX: u32 = 5;

/// The name of the probe file in the data directory.
const PROBE_FILE: &str = "storage-probe";

/// Notices the log store's or the engine's failure, and once the disk takes probe
/// writes again, asks the node to restart its storage. Only a failure of the storage
/// itself (a write, sync or read): corruption the engine found would be found again, so
/// the node stays as it is, for an operator (and so it does after too many restarts).
async fn check_storage(shared: &Arc<Shared>, failed: &mut Option<(String, Instant)>) {
    if failed.is_none() {
        let (why, io) = match (shared.log.failure(), shared.engine.failure()) {
            (Some(l), _) => (format!("the log store failed: {l}"), true),
            (None, Some(e)) => (format!("the engine failed: {}", e.message), e.io),
            (None, None) => return,
        };
        if !io || !shared.may_restart_storage {
            let not = if io {
                format!("it restarted its storage {STORAGE_RESTARTS_MAX} times in a row already")
            } else {
                "what failed is not the disk".to_string()
            };
            tracing::error!(
                "{why}; the node's replicas stop, and it does not restart its storage by \
                 itself ({not}): look into it, then restart the node"
            );
            // (Said once; nothing more to do.)
            *failed = Some((why, Instant::now()));
            return;
        }
        tracing::error!(
            "{why}; the node's replicas stop, and it restarts its storage by itself once \
             the disk takes writes again"
        );
        *failed = Some((why, Instant::now()));
    }
    let Some((why, since)) = failed.as_ref() else {
        return;
    };
    if !shared.may_restart_storage || since.elapsed() < STORAGE_RESTART_DELAY_MIN {
        return;
    }
    // A corruption found after the failure was first seen: leave it as well.
    if shared.engine.failure().is_some_and(|e| !e.io) {
        return;
    }
    // Under the reserve only client writes are refused: the restart itself is harmless
    // there, and the space it frees (files the failed stores still hold) may be what
    // brings the disk back over it. Each store's own directory is probed (either may be
    // elsewhere through a link).
    let fs = Arc::clone(&shared.fs);
    let data = shared.cfg.data_dir.clone();
    let probe = tokio::task::spawn_blocking(move || {
        ["db", "log"]
            .iter()
            .try_for_each(|d| probe(&*fs, &data.join(d).join(PROBE_FILE)))
    })
    .await;
    match probe {
        Ok(Ok(())) => {
            tracing::warn!("the disk takes writes again: restarting the node's storage ({why})");
            shared.storage_restart.send_replace(Some(why.clone()));
        }
        Ok(Err(e)) => tracing::debug!("storage probe: {e}"),
        Err(e) => tracing::warn!("storage probe task: {e}"),
    }
}

/// Writes, syncs and deletes a small file at `path`.
fn probe(
    fs: &dyn phoenix_storage::FileSystem,
    path: &std::path::Path,
) -> phoenix_storage::Result<()> {
    let mut f = fs.create(path, phoenix_storage::WriteOptions::default())?;
    f.append(&[0u8; 4096])?;
    f.sync_all()?;
    drop(f);
    fs.delete(path)?;
    if let Some(dir) = path.parent() {
        fs.sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: Duration = Duration::from_secs(60);

    #[test]
    fn full_under_the_reserve_and_back_above_it_with_a_margin() {
        let d = DiskSpace::new(1000, FRESH);
        assert!(!d.is_full());
        assert_eq!(d.refusal(1, 2, &[1, 2, 3]), None);
        assert_eq!(d.observe(5000), None);
        assert_eq!(d.observe(999), Some(true));
        assert!(d.is_full());
        let e = d.refusal(7, 2, &[1, 2, 3]).and_then(|e| e.kind);
        assert_eq!(
            e,
            Some(proto::error::Kind::DiskFull(proto::DiskFull {
                group_id: 7,
                node_id: 2,
                available: 999,
                reserve: 1000,
                full_nodes: vec![2],
            }))
        );
        // At the reserve, not yet 5% above it: still full.
        assert_eq!(d.observe(1000), None);
        assert_eq!(d.observe(1049), None);
        assert_eq!(d.observe(1050), Some(false));
        assert!(!d.is_full());
        assert_eq!(d.observe(1000), None);
        assert_eq!(d.observe(0), Some(true));
    }

    /// A leader with room refuses when too few voters have room for a quorum, as the
    /// meta service's recent list says; an old list is not acted on.
    #[test]
    fn too_few_voters_with_room_refuse_and_stale_lists_do_not() {
        let d = DiskSpace::new(1000, FRESH);
        assert_eq!(d.observe(5000), None);
        assert!(!d.knows_peers());
        d.set_full_nodes(vec![3]);
        assert!(d.knows_peers());
        assert!(d.is_node_full(3, 1) && !d.is_node_full(2, 1));
        // One of three full: a quorum has room.
        assert_eq!(d.refusal(5, 1, &[1, 2, 3]), None);
        d.set_full_nodes(vec![2, 3, 1]);
        // This node's own samples win over the list for itself.
        assert!(!d.is_node_full(1, 1));
        let e = d.refusal(5, 1, &[1, 2, 3]).unwrap_or_default();
        match e.kind {
            Some(proto::error::Kind::DiskFull(df)) => {
                assert_eq!((df.node_id, df.full_nodes), (1, vec![2, 3]))
            }
            other => panic!("{other:?}"),
        }
        assert!(e.message.contains("no quorum with room"), "{}", e.message);
        // One voter only (itself, with room): never refused for the others.
        assert_eq!(d.refusal(5, 1, &[1]), None);
        let stale = DiskSpace::new(1000, Duration::ZERO);
        stale.set_full_nodes(vec![2, 3]);
        assert!(!stale.knows_peers() && !stale.is_node_full(2, 1));
        assert_eq!(stale.refusal(5, 1, &[1, 2, 3]), None);
    }

    #[test]
    fn a_zero_reserve_is_never_full() {
        let d = DiskSpace::new(0, FRESH);
        assert_eq!(d.observe(0), None);
        assert!(!d.is_full());
        assert_eq!(d.available(), 0);
    }
}
