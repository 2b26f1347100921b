//! The leader's sweep of expired keys. Reads hide a key once its expiry has passed
//! (service.rs), and the commands that read before they write treat it as absent
//! (apply.rs), but its records stay until a write or a sweep removes them. Every
//! [`SWEEP_INTERVAL`] the node looks, for each group it leads that may hold expiries,
//! at the next [`SCAN_RECORDS_MAX`] records of the group's expiry namespace (a cursor per
//! group that wraps around, so a group with many long-lived expiries is walked over a
//! few passes, not scanned whole each time) and proposes the expired keys it found
//! (`SweepExpiredCommand`s of at most [`SWEEP_KEYS_MAX`] keys, one after the other). The
//! command deletes each listed
//! key whose expiry has passed by its time as it applies, on every replica alike: a key
//! written again between the scan and the apply stays.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use phoenix_engine::ReadOptions;
use phoenix_proto as proto;
use prost::Message;

use crate::keys;
use crate::meta::META_GROUP;
use crate::node::Event;
use crate::shared::Shared;

/// Time between two sweeps of the groups led here.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Expiry records looked at per group and sweep.
pub const SCAN_RECORDS_MAX: usize = 4096;
/// Keys one sweep command lists at most.
pub const SWEEP_KEYS_MAX: usize = 512;
/// Longest wait for a sweep command to apply.
const PROPOSE_WAIT: Duration = Duration::from_secs(5);

/// Sweeps the groups this node leads until the task is aborted.
pub async fn sweep_loop(shared: Arc<Shared>) {
    // Per group: the user key the next scan starts at.
    let mut cursors: HashMap<u64, Vec<u8>> = HashMap::new();
    loop {
        tokio::time::sleep(SWEEP_INTERVAL).await;
        if shared.cluster_protocol() < phoenix_meta::PROTOCOL_TTL {
            continue;
        }
        let groups: Vec<(u64, u64)> = shared
            .groups
            .read()
            .iter()
            .filter(|(g, v)| {
                **g != META_GROUP
                    && v.is_leader
                    && v.failed.is_none()
                    && v.merging_into == 0
                    && v.expiries != Some(false)
            })
            .map(|(g, v)| (*g, v.route.epoch))
            .collect();
        cursors.retain(|g, _| groups.iter().any(|(h, _)| h == g));
        for (g, epoch) in groups {
            let now = crate::service::now_ms();
            let from = cursors.remove(&g).unwrap_or_default();
            let sh = Arc::clone(&shared);
            let scanned =
                tokio::task::spawn_blocking(move || expired_keys(&sh, g, &from, now)).await;
            let Scanned { expired, next } = match scanned {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    tracing::warn!(group = g, "expiry sweep scan: {e}");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(group = g, "expiry sweep task: {e}");
                    continue;
                }
            };
            if let Some(n) = next {
                cursors.insert(g, n);
            }
            for chunk in expired.chunks(SWEEP_KEYS_MAX) {
                let cmd = proto::KvCommand {
                    now_ms: now,
                    epoch,
                    session: None,
                    cmd: Some(proto::kv_command::Cmd::SweepExpired(
                        proto::SweepExpiredCommand {
                            up_to_ms: now,
                            keys: chunk.iter().map(|k| k.clone().into()).collect(),
                        },
                    )),
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                let sent = shared.events.send(Event::Propose {
                    group: g,
                    data: cmd.encode_to_vec().into(),
                    reply: tx,
                });
                if sent.is_err() {
                    return;
                }
                match tokio::time::timeout(PROPOSE_WAIT, rx).await {
                    Ok(Ok(Ok(_))) => {
                        tracing::debug!(group = g, keys = chunk.len(), "expired keys swept");
                    }
                    Ok(Ok(Err(e))) => {
                        // (Not leading any more, or the group stopped: the next pass sees.)
                        tracing::debug!(group = g, "expiry sweep: {e}");
                        break;
                    }
                    Ok(Err(_)) | Err(_) => {
                        tracing::debug!(group = g, "expiry sweep: no answer");
                        break;
                    }
                }
            }
        }
    }
}

/// What one scan of a group's expiries found.
struct Scanned {
    /// The keys whose expiry has passed.
    expired: Vec<Vec<u8>>,
    /// The user key the next scan starts at (None: back at the first).
    next: Option<Vec<u8>>,
}

/// The keys of group `g` whose expiry is before `now`, among the next
/// [`SCAN_RECORDS_MAX`] expiry records from user key `from`.
fn expired_keys(shared: &Shared, g: u64, from: &[u8], now: u64) -> crate::Result<Scanned> {
    let ro = ReadOptions {
        lower_bound: Some(keys::expiry_key(g, b"")),
        upper_bound: Some(keys::expiry_end(g)),
        // A walk over expiries would evict the hot blocks of reads.
        fill_cache: false,
        ..ReadOptions::default()
    };
    let mut it = shared.engine.iter(&ro)?;
    it.seek(&keys::expiry_key(g, from));
    let prefix = keys::expiry_key(g, b"").len();
    let mut expired = Vec::new();
    let mut next = None;
    let mut seen = 0;
    while it.valid() {
        let user = it.key().get(prefix..).unwrap_or_default();
        if seen >= SCAN_RECORDS_MAX {
            next = Some(user.to_vec());
            break;
        }
        seen += 1;
        match keys::decode_expiry(it.value()) {
            Some(at) if at < now => expired.push(user.to_vec()),
            Some(_) => {}
            None => {
                return Err(crate::Error::Corruption(format!(
                    "group {g}: the expiry of key {user:02x?} is {} bytes, not 8",
                    it.value().len()
                )))
            }
        }
        it.next();
    }
    it.status()?;
    Ok(Scanned { expired, next })
}
