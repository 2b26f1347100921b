//! The split check (TiKV's split checker): every `split_check_interval` the node shares
//! its engine's tables out by group ([`phoenix_engine::Db::group_sizes`], file metadata
//! only) and, for each group it leads past `group_split_bytes` or `group_split_keys`,
//! finds the key in the middle of its data (by bytes, or by count when only the count is
//! over) with one scan of the lower half. Heartbeats report the sizes and the middle key
//! (tagged with the range epoch it was measured at); the meta leader plans the split
//! (`phoenix_meta::size_splits`). A group's key is found once per range epoch.
//!
//! Split by load (TiKV's load-based split): the request layer records the keys it serves
//! for the groups led here, one request in [`LOAD_SAMPLE_EVERY`] (a counter, a short
//! lock), into a bounded sample per group. A group led here whose requests over the last
//! check interval ran above `group_split_qps` a second is split at the median of its
//! sampled keys, so each half takes about half the requests (not when the median is its
//! first key: one hot key cannot be split).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use phoenix_engine::{GroupSize, ReadOptions};

use crate::keys;
use crate::meta::META_GROUP;
use crate::shared::Shared;

/// The middle key found for a group at one range epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitHint {
    /// The range epoch the group had when measured.
    pub epoch: u64,
    /// The first key of the upper half.
    pub key: Vec<u8>,
}

/// One request in this many is sampled for the load split.
pub const LOAD_SAMPLE_EVERY: u64 = 8;
/// Keys kept per group for the load split (a reservoir sample).
pub const LOAD_KEYS_MAX: usize = 128;

/// The requests sampled for one group since the last check.
#[derive(Debug, Default)]
struct Sampled {
    /// Requests sampled.
    count: u64,
    /// A uniform sample of their keys.
    keys: Vec<Vec<u8>>,
}

/// What the last check found (read by heartbeats), and the load sampled since.
#[derive(Debug)]
pub struct SplitCheck {
    sizes: Mutex<HashMap<u64, GroupSize>>,
    hints: Mutex<HashMap<u64, SplitHint>>,
    seen: AtomicU64,
    load: Mutex<(Instant, HashMap<u64, Sampled>)>,
}

impl Default for SplitCheck {
    fn default() -> Self {
        SplitCheck {
            sizes: Mutex::default(),
            hints: Mutex::default(),
            seen: AtomicU64::new(0),
            load: Mutex::new((Instant::now(), HashMap::new())),
        }
    }
}

impl SplitCheck {
    /// Records a request for `key` of group `g` served here (sampled: see the module
    /// doc).
    pub fn record(&self, g: u64, key: &[u8]) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(LOAD_SAMPLE_EVERY) {
            return;
        }
        let mut load = self.load.lock();
        let s = load.1.entry(g).or_default();
        s.count += 1;
        if s.keys.len() < LOAD_KEYS_MAX {
            s.keys.push(key.to_vec());
        } else {
            // Reservoir sampling: the i-th key replaces a kept one with chance MAX / i
            // (the slot from a multiplicative hash of the request number).
            let slot = (n / LOAD_SAMPLE_EVERY).wrapping_mul(0x9E37_79B9_7F4A_7C15) % s.count;
            if let Some(k) = s.keys.get_mut(slot as usize) {
                *k = key.to_vec();
            }
        }
    }

    /// Group `g`'s approximate size as last measured.
    pub fn size(&self, g: u64) -> GroupSize {
        self.sizes.lock().get(&g).copied().unwrap_or_default()
    }

    /// Group `g`'s middle key, if it is over the thresholds and was measured at `epoch`.
    pub fn hint(&self, g: u64, epoch: u64) -> Option<Vec<u8>> {
        self.hints
            .lock()
            .get(&g)
            .filter(|h| h.epoch == epoch)
            .map(|h| h.key.clone())
    }
}

/// Runs the check every `split_check_interval`, off the async threads.
/// (The load is measured over the same interval.)
pub async fn split_check_loop(shared: Arc<Shared>) {
    let interval = shared.cfg.split_check_interval;
    loop {
        tokio::time::sleep(interval).await;
        let s = Arc::clone(&shared);
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || check(&s)).await {
            tracing::warn!("split check: {e}");
        }
    }
}

/// One check (see the module doc).
pub fn check(shared: &Shared) -> crate::Result<()> {
    let sizes = shared.engine.group_sizes()?;
    *shared.split.sizes.lock() = sizes.iter().map(|(&g, &s)| (g, s)).collect();
    let (max_bytes, max_keys) = (shared.cfg.group_split_bytes, shared.cfg.group_split_keys);
    let led: Vec<(u64, phoenix_proto::Route)> = shared
        .groups
        .read()
        .iter()
        .filter(|(g, v)| **g != META_GROUP && v.is_leader && v.failed.is_none())
        .map(|(g, v)| (*g, v.route.clone()))
        .collect();
    let (since, mut load) = {
        let mut l = shared.split.load.lock();
        let since = std::mem::replace(&mut l.0, Instant::now());
        (since, std::mem::take(&mut l.1))
    };
    let secs = since.elapsed().as_secs_f64().max(0.001);
    let max_qps = shared.cfg.group_split_qps;
    let mut keep = HashMap::new();
    for (g, route) in led {
        let size = sizes.get(&g).copied().unwrap_or_default();
        let by_bytes = max_bytes > 0 && size.bytes > max_bytes;
        let by_keys = max_keys > 0 && size.entries > max_keys;
        if !by_bytes && !by_keys {
            let sampled = load.remove(&g).unwrap_or_default();
            let qps = (sampled.count * LOAD_SAMPLE_EVERY) as f64 / secs;
            if max_qps > 0 && qps > max_qps as f64 {
                if let Some(key) = load_median(&route, sampled.keys) {
                    tracing::info!(
                        group = g,
                        qps = qps as u64,
                        key = %key.escape_ascii(),
                        "group over its split load; median key found"
                    );
                    keep.insert(
                        g,
                        SplitHint {
                            epoch: route.epoch,
                            key,
                        },
                    );
                }
            }
            continue;
        }
        if let Some(h) = shared
            .split
            .hints
            .lock()
            .get(&g)
            .filter(|h| h.epoch == route.epoch)
        {
            keep.insert(g, h.clone());
            continue;
        }
        let half = if by_bytes {
            size.bytes / 2
        } else {
            size.entries / 2
        };
        if let Some(key) = middle_key(shared, g, &route, half, by_bytes)? {
            tracing::info!(
                group = g,
                bytes = size.bytes,
                entries = size.entries,
                key = %key.escape_ascii(),
                "group over its split size; middle key found"
            );
            keep.insert(
                g,
                SplitHint {
                    epoch: route.epoch,
                    key,
                },
            );
        }
    }
    *shared.split.hints.lock() = keep;
    Ok(())
}

/// The median of `keys` (sampled requests of the group routed by `route`) that lie in
/// its range, if it is past the range's first key.
fn load_median(route: &phoenix_proto::Route, mut keys: Vec<Vec<u8>>) -> Option<Vec<u8>> {
    keys.retain(|k| {
        k.as_slice() >= route.start_key.as_ref()
            && (route.end_key.is_empty() || k.as_slice() < route.end_key.as_ref())
    });
    keys.sort_unstable();
    let mid = keys.get(keys.len() / 2)?.clone();
    (mid.as_slice() > route.start_key.as_ref()).then_some(mid)
}

/// The first key of group `g` (range of `route`) past `half` bytes (`by_bytes`) or
/// entries of its data; None if that is its first key (nothing to split off below it)
/// or the group holds less.
fn middle_key(
    shared: &Shared,
    g: u64,
    route: &phoenix_proto::Route,
    half: u64,
    by_bytes: bool,
) -> crate::Result<Option<Vec<u8>>> {
    let lower = keys::data_key(g, &route.start_key);
    let upper = if route.end_key.is_empty() {
        keys::data_end(g)
    } else {
        keys::data_key(g, &route.end_key)
    };
    let ro = ReadOptions {
        lower_bound: Some(lower.clone()),
        upper_bound: Some(upper),
        fill_cache: false,
        ..ReadOptions::default()
    };
    let mut it = shared.engine.iter(&ro)?;
    it.seek(&lower);
    let mut seen = 0u64;
    while it.valid() {
        seen += if by_bytes {
            (it.key().len() + it.value().len()) as u64
        } else {
            1
        };
        if seen > half {
            let user = it
                .key()
                .get(lower.len() - route.start_key.len()..)
                .unwrap_or_default();
            if user > route.start_key.as_ref() {
                return Ok(Some(user.to_vec()));
            }
        }
        it.next();
    }
    it.status()?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn route(start: &str, end: &str) -> phoenix_proto::Route {
        phoenix_proto::Route {
            start_key: start.as_bytes().to_vec().into(),
            end_key: end.as_bytes().to_vec().into(),
            ..Default::default()
        }
    }

    fn keys(ks: &[&str]) -> Vec<Vec<u8>> {
        ks.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    #[test]
    fn the_load_median_is_inside_the_range_and_past_its_start() {
        let r = route("b", "y");
        assert_eq!(
            load_median(&r, keys(&["c", "a", "z", "d", "e"])),
            Some(b"d".to_vec()),
            "keys outside the range (a split since) are left out"
        );
        // One hot key at the range's start cannot be split off.
        assert_eq!(load_median(&r, keys(&["b", "b", "b", "c"])), None);
        assert_eq!(load_median(&r, Vec::new()), None);
        assert_eq!(
            load_median(&route("", ""), keys(&["k", "k", "k"])),
            Some(b"k".to_vec())
        );
    }

    #[test]
    fn the_sample_is_bounded_and_counts_one_request_in_every_few() {
        let s = SplitCheck::default();
        let n = 100 * LOAD_KEYS_MAX as u64 * LOAD_SAMPLE_EVERY;
        for i in 0..n {
            s.record(7, format!("k{i:08}").as_bytes());
        }
        let load = s.load.lock();
        let sampled = &load.1[&7];
        assert_eq!(sampled.count, n / LOAD_SAMPLE_EVERY);
        assert_eq!(sampled.keys.len(), LOAD_KEYS_MAX);
        // The reservoir keeps keys from all over the stream, not only the first seen:
        // about half of them from its second half.
        let late = format!("k{:08}", n / 2).into_bytes();
        let from_second_half = sampled.keys.iter().filter(|k| **k >= late).count();
        assert!(
            from_second_half > LOAD_KEYS_MAX / 4 && from_second_half < LOAD_KEYS_MAX * 3 / 4,
            "{from_second_half} of {LOAD_KEYS_MAX} kept keys from the second half"
        );
    }
}
