//! Replica scrubbing (PolarCtrl's, TiKV's consistency check): the checksums this node's
//! replicas computed at their groups' scrub points, and the threads that compute them.
//!
//! A scrub point is a `ScrubCommand` entry in the group's log. The apply round writes
//! every entry up to it (so the engine holds the group's state as of that index exactly)
//! and takes an engine snapshot there (`node.rs`, `apply_round`); the checksum is then
//! computed from the snapshot on a thread of its own, so the scan of the group's data
//! never stalls the raft driver. Every replica applies the same entry to the same state,
//! so their checksums at one index must agree: the meta leader compares them from the
//! heartbeats (`phoenix_meta::scrub_mismatches`).
//!
//! What is covered: the group's user data (every key and value of its `'d'` namespace,
//! as a read would see them: range deletions applied). Not covered: its system records
//! (client sessions, membership, sentinel), which hold per-replica bookkeeping such as
//! the format a record was last written in.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_engine::{Db, ReadOptions, Snapshot};

use crate::keys;

/// One scrub's outcome on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubResult {
    /// The scrub point's log index.
    pub index: u64,
    /// crc32c over the group's user keys and values, each length-prefixed, in order.
    pub crc: u32,
    /// How many keys.
    pub keys: u64,
    /// Their key and value bytes.
    pub bytes: u64,
}

/// The latest scrub of each group hosted here, as computed.
#[derive(Debug, Default)]
pub struct Scrubs {
    results: Mutex<HashMap<u64, ScrubResult>>,
}

impl Scrubs {
    /// Group `g`'s latest scrub on this node, if any since it started.
    pub fn latest(&self, g: u64) -> Option<ScrubResult> {
        self.results.lock().get(&g).copied()
    }

    /// Forgets group `g` (its replica left the node).
    pub fn forget(&self, g: u64) {
        self.results.lock().remove(&g);
    }

    /// Computes group `g`'s checksum from `snap` (taken right after the entry at `index`
    /// was written) on a thread of its own, and records it. A failure is logged: the
    /// scrub then has no result here, which the meta leader's comparison shows as a
    /// missing report, never as agreement.
    pub fn start(self: &Arc<Self>, engine: &Arc<Db>, g: u64, index: u64, snap: Snapshot) {
        let (scrubs, engine) = (Arc::clone(self), Arc::clone(engine));
        let spawned = std::thread::Builder::new()
            .name(format!("phoenix-scrub-{g}"))
            .spawn(move || {
                let started = std::time::Instant::now();
                match checksum(&engine, g, &snap) {
                    Ok((crc, keys, bytes)) => {
                        tracing::info!(
                            group = g,
                            index,
                            crc = format_args!("{crc:08x}"),
                            keys,
                            bytes,
                            ms = started.elapsed().as_millis() as u64,
                            "group scrubbed"
                        );
                        scrubs.record(
                            g,
                            ScrubResult {
                                index,
                                crc,
                                keys,
                                bytes,
                            },
                        );
                    }
                    Err(e) => tracing::error!(group = g, index, "scrubbing the group: {e}"),
                }
            });
        if let Err(e) = spawned {
            tracing::error!(group = g, index, "cannot start a scrub thread: {e}");
        }
    }

    /// Keeps `r` unless a later scrub of `g` is recorded already (threads may finish out
    /// of order).
    fn record(&self, g: u64, r: ScrubResult) {
        let mut results = self.results.lock();
        let e = results.entry(g).or_default();
        if r.index >= e.index {
            *e = r;
        }
    }
}

/// The checksum of group `g`'s user data as of `snap`: (crc32c, keys, bytes), over each
/// key and value in key order as `len: u32 BE ‖ user key ‖ len: u32 BE ‖ value`.
pub fn checksum(engine: &Db, g: u64, snap: &Snapshot) -> crate::Result<(u32, u64, u64)> {
    let ro = ReadOptions {
        snapshot: Some(snap),
        lower_bound: Some(keys::data_key(g, b"")),
        upper_bound: Some(keys::data_end(g)),
        // A whole-group scan would evict the hot blocks of every other group.
        fill_cache: false,
        ..ReadOptions::default()
    };
    let prefix = keys::data_key(g, b"").len();
    let mut it = engine.iter(&ro)?;
    it.seek_to_first();
    let (mut crc, mut n, mut bytes) = (0u32, 0u64, 0u64);
    while it.valid() {
        let (k, v) = (&it.key()[prefix..], it.value());
        for part in [k, v] {
            crc = crc32c::crc32c_append(crc, &(part.len() as u32).to_be_bytes());
            crc = crc32c::crc32c_append(crc, part);
        }
        n += 1;
        bytes += (k.len() + v.len()) as u64;
        it.next();
    }
    it.status()?;
    Ok((crc, n, bytes))
}
