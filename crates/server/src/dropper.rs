//! The dropper: a thread that drops the data of replicas removed from this node (their
//! engine keys, by deleting files, and their log streams), off the raft driver, so a
//! drop does not stall the other groups. The driver writes each removal's tombstone to
//! the registry first and records the drop done when told (`Event::Dropped`); a drop
//! cut short by a crash or an error is redone, at the next start or retry, and finds
//! whatever is left. Removals that arrive together are dropped together: one engine
//! flush for them all (`Db::drop_groups`).

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::failpoint::{check, names};
use crate::node::Event;
use crate::shared::Shared;

/// The dropper thread's handle: dropping it lets the thread finish the drops queued,
/// then joins it.
pub struct Dropper {
    tx: Option<Sender<Vec<u64>>>,
    thread: Option<JoinHandle<()>>,
}

impl Dropper {
    /// Starts the thread.
    pub fn start(shared: Arc<Shared>) -> crate::Result<Dropper> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("phoenix-dropper".into())
            .spawn(move || run(&shared, &rx))
            .map_err(|e| crate::Error::io("starting the dropper thread", e))?;
        Ok(Dropper {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues the drop of `groups`' data; `Event::Dropped` tells how it went.
    pub fn drop_groups(&self, groups: Vec<u64>) {
        if let Some(tx) = &self.tx {
            // The thread lives until this sender goes: a failed send means it died (a
            // panic). The tombstones stay marked dropping, so the next start drops them.
            if let Err(e) = tx.send(groups) {
                tracing::error!(
                    groups = ?e.into_inner(),
                    "the dropper thread is gone: removed replicas' data stays until restart"
                );
            }
        }
    }
}

impl Drop for Dropper {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, rx: &Receiver<Vec<u64>>) {
    while let Ok(mut groups) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            groups.extend(more);
        }
        groups.sort_unstable();
        groups.dedup();
        let started = std::time::Instant::now();
        let result = drop_data(shared, &groups).map_err(|e| e.to_string());
        match &result {
            Ok(()) => tracing::info!(
                groups = groups.len(),
                first = groups.first().copied().unwrap_or(0),
                ms = started.elapsed().as_millis() as u64,
                "removed replicas' data dropped"
            ),
            Err(e) => tracing::error!(groups = ?groups, "dropping removed replicas' data: {e}"),
        }
        // A closed channel means the driver stopped: the next start drops them again.
        let _ = shared.events.send(Event::Dropped { groups, result });
    }
}

/// Drops the engine data, then the log streams: a crash in between leaves a stream
/// without data, which the redo removes (a replica is never opened from a tombstone).
fn drop_data(shared: &Shared, groups: &[u64]) -> crate::Result<()> {
    let node = shared.cfg.node_id;
    check(names::DROP_BEFORE_ENGINE, node)?;
    match shared.cfg.drop_mode {
        crate::config::DropMode::Files => shared.engine.drop_groups(groups)?,
        crate::config::DropMode::RangeDelete => {
            // Tombstones only (their data stays on disk until compaction), made durable
            // by one flush: the engine's WAL may be off (log-as-WAL).
            let mut batch = phoenix_engine::WriteBatch::new();
            for &g in groups {
                // Only id u64::MAX has no end key, and ids are handed out from 1 up.
                let end = crate::keys::group_end(g).ok_or_else(|| {
                    crate::Error::Invariant(format!("group {g} has no end key to drop to"))
                })?;
                batch.delete_range(&crate::keys::group_start(g), &end);
            }
            shared.engine.write(&Default::default(), batch)?;
            check(names::DROP_BEFORE_FLUSH, node)?;
            shared.engine.flush()?;
        }
    }
    check(names::DROP_BEFORE_LOG, node)?;
    for &g in groups {
        shared.log.remove_stream(g)?;
    }
    check(names::DROP_BEFORE_DONE, node)?;
    Ok(())
}
