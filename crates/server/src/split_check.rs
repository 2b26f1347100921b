//! The split check (TiKV's split checker): every `split_check_interval` the node shares
//! its engine's tables out by group ([`phoenix_engine::Db::group_sizes`], file metadata
//! only) and, for each group it leads past `group_split_bytes` or `group_split_keys`,
//! finds the key in the middle of its data (by bytes, or by count when only the count is
//! over) with one scan of the lower half. Heartbeats report the sizes and the middle key
//! (tagged with the range epoch it was measured at); the meta leader plans the split
//! (`phoenix_meta::size_splits`). A group's key is found once per range epoch.

use std::collections::HashMap;
use std::sync::Arc;

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

/// What the last check found (read by heartbeats).
#[derive(Debug, Default)]
pub struct SplitCheck {
    sizes: Mutex<HashMap<u64, GroupSize>>,
    hints: Mutex<HashMap<u64, SplitHint>>,
}

impl SplitCheck {
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
    *shared.split.sizes.lock() = sizes.clone().into_iter().collect();
    let (max_bytes, max_keys) = (shared.cfg.group_split_bytes, shared.cfg.group_split_keys);
    let led: Vec<(u64, phoenix_proto::Route)> = shared
        .groups
        .read()
        .iter()
        .filter(|(g, v)| **g != META_GROUP && v.is_leader && v.failed.is_none())
        .map(|(g, v)| (*g, v.route.clone()))
        .collect();
    let mut keep = HashMap::new();
    for (g, route) in led {
        let size = sizes.get(&g).copied().unwrap_or_default();
        let by_bytes = max_bytes > 0 && size.bytes > max_bytes;
        let by_keys = max_keys > 0 && size.entries > max_keys;
        if !by_bytes && !by_keys {
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
