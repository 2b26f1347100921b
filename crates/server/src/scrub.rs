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
use std::time::Instant;

use parking_lot::Mutex;
use phoenix_engine::{Db, DbIterator, ReadOptions, Snapshot};

use crate::keys;

/// One scrub's outcome on this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubResult {
    /// The scrub point's log index.
    pub index: u64,
    /// crc32c over the group's user keys and values, each length-prefixed, in order.
    pub crc: u32,
    /// How many keys.
    pub keys: u64,
    /// Their key and value bytes.
    pub bytes: u64,
    /// When it was computed.
    pub at: Instant,
    /// The scrub failed (the group's data could not be read there, e.g. corruption
    /// found by a block checksum): why. The meta leader lists it as a mismatch.
    pub error: Option<String>,
}

/// The latest scrub of each group hosted here, as computed.
#[derive(Debug, Default)]
pub struct Scrubs {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    results: HashMap<u64, ScrubResult>,
    /// Per group, the latest scrub point whose checksum is being computed.
    running: HashMap<u64, u64>,
    /// Per group, how many times its replica left this node: a checksum started before
    /// the last time is not recorded (the group may be back with another state).
    generation: HashMap<u64, u64>,
}

impl Scrubs {
    /// Group `g`'s latest scrub on this node, if any since it started, and the scrub
    /// point whose checksum is being computed (0: none), read together.
    pub fn latest(&self, g: u64) -> (Option<ScrubResult>, u64) {
        let i = self.inner.lock();
        (
            i.results.get(&g).cloned(),
            i.running.get(&g).copied().unwrap_or(0),
        )
    }

    /// Forgets group `g` (its replica left the node), and any checksum of it still
    /// being computed.
    pub fn forget(&self, g: u64) {
        let mut i = self.inner.lock();
        i.results.remove(&g);
        i.running.remove(&g);
        *i.generation.entry(g).or_default() += 1;
    }

    /// Computes group `g`'s checksum as of `snap` (taken right after the entry at
    /// `index` was written) and records it. The iterator is made here, on the caller's
    /// thread, so it pins the engine's files of that moment (a snapshot install or a
    /// drop of the group right after cannot change what it reads); the scan runs on a
    /// thread of its own. A failure is logged and recorded as the scrub's result: the
    /// meta leader lists it as a mismatch, never as agreement.
    pub fn start(self: &Arc<Self>, engine: &Db, g: u64, index: u64, snap: Snapshot) {
        let generation = self.begin(g, index);
        let failed = move |why: String| {
            tracing::error!(group = g, index, "scrubbing the group: {why}");
            ScrubResult {
                index,
                crc: 0,
                keys: 0,
                bytes: 0,
                at: Instant::now(),
                error: Some(why),
            }
        };
        let it = match data_iter(engine, g, &snap) {
            Ok(it) => it,
            Err(e) => {
                self.record(g, generation, failed(e.to_string()));
                return;
            }
        };
        let scrubs = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("phoenix-scrub-{g}"))
            .spawn(move || {
                let started = Instant::now();
                // A panic in the scan is recorded as the scrub's failure: the replica
                // must not look as if still computing forever.
                let sum = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    checksum(it, keys::data_key(g, b"").len())
                }))
                .map_err(|_| "the scrub's scan panicked".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
                drop(snap);
                match sum {
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
                        let r = ScrubResult {
                            index,
                            crc,
                            keys,
                            bytes,
                            at: Instant::now(),
                            error: None,
                        };
                        scrubs.record(g, generation, r);
                    }
                    Err(why) => scrubs.record(g, generation, failed(why)),
                }
            });
        if let Err(e) = spawned {
            self.record(
                g,
                generation,
                failed(format!("cannot start a scrub thread: {e}")),
            );
        }
    }

    /// Marks group `g`'s scrub point `index` under way; returns the group's generation.
    fn begin(&self, g: u64, index: u64) -> u64 {
        let mut i = self.inner.lock();
        let r = i.running.entry(g).or_default();
        *r = (*r).max(index);
        i.generation.get(&g).copied().unwrap_or(0)
    }

    /// Keeps `r` unless a later scrub of `g` is recorded already (threads may finish out
    /// of order) or the replica left the node since the scrub started (`generation`).
    fn record(&self, g: u64, generation: u64, r: ScrubResult) {
        let mut i = self.inner.lock();
        if i.generation.get(&g).copied().unwrap_or(0) != generation {
            return;
        }
        if i.running.get(&g).is_some_and(|&run| run <= r.index) {
            i.running.remove(&g);
        }
        match i.results.get(&g) {
            Some(old) if old.index > r.index => {}
            _ => {
                i.results.insert(g, r);
            }
        }
    }
}

/// An iterator over group `g`'s user data and key expiries as of `snap` (no block
/// cache fill).
fn data_iter(engine: &Db, g: u64, snap: &Snapshot) -> crate::Result<DbIterator> {
    let ro = ReadOptions {
        snapshot: Some(snap),
        lower_bound: Some(keys::data_key(g, b"")),
        upper_bound: Some(keys::expiry_end(g)),
        // A whole-group scan would evict the hot blocks of every other group.
        fill_cache: false,
        ..ReadOptions::default()
    };
    Ok(engine.iter(&ro)?)
}

/// The checksum of what `it` reads: (crc32c, keys, bytes), over each key (less its
/// first `prefix` bytes: the group's engine prefix) and value in order as
/// `len: u32 BE ‖ key ‖ len: u32 BE ‖ value`; a key expiry (namespace byte 'e' at
/// `prefix - 1`) is preceded by `u32::MAX` (no key is that long), so a group without
/// expiries sums as before they existed and one with them cannot sum as data.
fn checksum(mut it: DbIterator, prefix: usize) -> crate::Result<(u32, u64, u64)> {
    it.seek_to_first();
    let (mut crc, mut n, mut bytes) = (0u32, 0u64, 0u64);
    while it.valid() {
        let (k, v) = (it.key().get(prefix..).unwrap_or_default(), it.value());
        if prefix > 0 && it.key().get(prefix - 1) == Some(&keys::NS_EXPIRY) {
            crc = crc32c::crc32c_append(crc, &u32::MAX.to_be_bytes());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn result(index: u64) -> ScrubResult {
        ScrubResult {
            index,
            crc: index as u32,
            keys: 1,
            bytes: 1,
            at: Instant::now(),
            error: None,
        }
    }

    /// A later scrub is not replaced by an earlier one finishing late, and a checksum
    /// started before the replica left the node is not recorded.
    #[test]
    fn late_and_stale_results_are_not_recorded() {
        let s = Scrubs::default();
        s.record(1, 0, result(9));
        s.record(1, 0, result(7));
        assert_eq!(s.latest(1).0.map(|r| r.index), Some(9));
        s.forget(1);
        assert_eq!(s.latest(1).0, None);
        s.record(1, 0, result(12));
        assert_eq!(s.latest(1).0, None, "started before the replica left");
        s.record(1, 1, result(12));
        assert_eq!(s.latest(1).0.map(|r| r.index), Some(12));
    }

    /// A scrub point is reported under way from its start until its checksum (or a later
    /// one's) is recorded; an earlier one finishing late does not clear it.
    #[test]
    fn a_scrub_is_under_way_until_recorded() {
        let s = Scrubs::default();
        assert_eq!(s.latest(1), (None, 0));
        let generation = s.begin(1, 9);
        assert_eq!(s.latest(1).1, 9);
        s.begin(1, 12);
        s.record(1, generation, result(9));
        assert_eq!(s.latest(1).1, 12, "the later point is still under way");
        s.record(1, generation, result(12));
        assert_eq!(s.latest(1).1, 0);
        s.begin(1, 15);
        s.forget(1);
        assert_eq!(s.latest(1), (None, 0));
    }
}
