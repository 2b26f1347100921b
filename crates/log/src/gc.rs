//! Space reclamation: delete (or recycle) segments nothing needs; rewrite cold streams
//! forward when the live share of the log is low (seed 003, "snapshot instead of flush").
//!
//! Why deleting a segment never brings truncated entries back: recovery replays a
//! stream's surviving ops in `opseq` order and clamps it to each op's `[first, last]`. A
//! segment is deleted only when (a) no live entry points into it, (b) it holds no stream's
//! latest op and no stream's latest hard state (*pins*), and (c) the ops that made (a) and
//! (b) true are durable (releases are applied only after the sync that covered them). So
//! every stream's latest op survives; replaying any subset of its older ops and then the
//! latest one ends clamped to the right range, and every live entry's newest version
//! survives and is replayed after its older versions. A removed stream keeps its removal
//! op pinned (a tombstone) until no older op of the stream is left on disk.
//!
//! The newest segment of the store is never deleted, so segment numbers never go back.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::Result;
use crate::format::HEADER_LEN;
use crate::segment::{free_path, FreeFile, Segment};
use crate::store::{Inner, StreamState};

/// One round of reclamation; see the module docs.
pub(crate) fn run(inner: &Arc<Inner>) -> Result<()> {
    inner.check_open()?;
    let _g = inner.gc_lock.lock();
    // Releases of written but unsynced batches count only once synced.
    let queues = inner.queues.read().clone();
    for q in &queues {
        if q.pending_release_count() > 0 {
            q.sync_now()?;
        }
    }
    drop_tombstones(inner);
    reclaim(inner)?;
    if rewrite_cold(inner)? {
        drop_tombstones(inner);
        reclaim(inner)?;
    }
    Ok(())
}

/// Forgets removed streams whose older ops are all gone, unpinning their removal op.
fn drop_tombstones(inner: &Inner) {
    let mut map = inner.streams.write();
    map.retain(|_, h| {
        let mut st = h.lock();
        if !st.removed {
            return true;
        }
        let latest = st.latest_seg.clone();
        let older_left = st.rec_segs.iter().any(|s| {
            !s.deleted.load(Ordering::Acquire)
                && !latest.as_ref().is_some_and(|l| Arc::ptr_eq(l, s))
        });
        if older_left {
            return true;
        }
        if let Some(l) = st.latest_seg.take() {
            l.release(0, 1);
        }
        if let Some(h) = st.hs_seg.take() {
            h.release(0, 1);
        }
        st.rec_segs.clear();
        false
    });
}

/// Deletes or recycles every dead segment except the newest.
fn reclaim(inner: &Inner) -> Result<usize> {
    let dead: Vec<Arc<Segment>> = {
        let mut segs = inner.segments.lock();
        let newest = segs.keys().next_back().copied();
        let dead: Vec<u64> = segs
            .values()
            .filter(|s| Some(s.seq) != newest && s.is_dead())
            .map(|s| s.seq)
            .collect();
        dead.iter().filter_map(|k| segs.remove(k)).collect()
    };
    if dead.is_empty() {
        return Ok(0);
    }
    let mut renamed = Vec::new();
    let mut pool_len = inner.free.lock().len();
    for seg in &dead {
        seg.deleted.store(true, Ordering::Release);
        seg.drop_reader();
        let r = if pool_len < inner.free_cap() {
            let to = free_path(&inner.dir, seg.seq);
            inner.fs.rename(&seg.path, &to).map(|_| {
                pool_len += 1;
                renamed.push(FreeFile {
                    path: to,
                    prev_seq: seg.seq,
                })
            })
        } else {
            inner.fs.delete(&seg.path)
        };
        match r {
            Ok(()) => {}
            // A segment placed by a queue that failed before creating its file.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        inner
            .stats
            .segments_reclaimed
            .fetch_add(1, Ordering::Relaxed);
    }
    // The renames must be durable before a file is reused: rewriting the header of a file
    // whose old `.seg` name could come back after a crash would leave a segment with a torn
    // header, indistinguishable from a damaged live one.
    inner.fs.sync_dir(&inner.dir)?;
    inner.free.lock().extend(renamed);
    Ok(dead.len())
}

/// If the live ratio is under the threshold, rewrites the streams that pin the coldest
/// segments into the newest ones. Returns whether anything was rewritten.
fn rewrite_cold(inner: &Inner) -> Result<bool> {
    let ratio = inner.opts.gc_live_ratio;
    let (cold, live, total): (HashSet<u64>, u64, u64) = {
        let segs = inner.segments.lock();
        let newest = segs.keys().next_back().copied();
        let mut live = 0u64;
        let mut total = 0u64;
        let mut cold = HashSet::new();
        for s in segs.values() {
            let t = s.written.load(Ordering::Acquire).saturating_sub(HEADER_LEN);
            let l = s.live.load(Ordering::Acquire);
            live += l;
            total += t;
            if s.sealed.load(Ordering::Acquire)
                && Some(s.seq) != newest
                && (l as f64) < ratio * t as f64
            {
                cold.insert(s.seq);
            }
        }
        (cold, live, total)
    };
    if total == 0 || cold.is_empty() || live as f64 >= ratio * total as f64 {
        return Ok(false);
    }
    // Streams that reference a cold segment, smallest first, within a budget of one
    // segment's worth of rewritten bytes per round.
    let handles: Vec<_> = inner.streams.read().values().cloned().collect();
    let mut candidates: Vec<(u64, u64)> = Vec::new();
    for h in handles {
        let st = h.lock();
        if st.removed {
            continue;
        }
        if references_any(&st, &cold) {
            let bytes: u64 = st.entries.iter().map(|m| m.live_size()).sum();
            candidates.push((bytes, st.id));
        }
    }
    candidates.sort_unstable();
    let mut budget = inner.opts.segment_size;
    let mut any = false;
    for (bytes, id) in candidates {
        if bytes > budget {
            // A stream this big is not cold; rewriting it would cost more than it frees.
            continue;
        }
        budget -= bytes;
        // One at a time, like a resize: reproducible file operations for seeded tests.
        if let Some(h) = inner.rewrite_stream(id)? {
            h.wait()?;
            any = true;
        }
    }
    if any {
        // The rewrites' releases apply once they are synced; durable rewrites are.
        tracing::debug!(dir = %inner.dir.display(), "log space reclamation rewrote cold streams");
    }
    Ok(any)
}

fn references_any(st: &StreamState, cold: &HashSet<u64>) -> bool {
    st.latest_seg
        .as_ref()
        .is_some_and(|s| cold.contains(&s.seq))
        || st.hs_seg.as_ref().is_some_and(|s| cold.contains(&s.seq))
        || st.entries.iter().any(|m| cold.contains(&m.seg.seq))
}
