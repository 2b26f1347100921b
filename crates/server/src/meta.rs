//! Hosting the meta group's state machine ([`phoenix_meta::MetaState`], raft group 0)
//! in the node's engine.
//!
//! The records live under group 0's data namespace and are applied like any group's
//! data, in the round's engine batch with the group's applied-index sentinel:
//! ```text
//! 0u64 BE ‖ 'd' ‖ record_key → record   (record_key, record: phoenix_meta::state)
//! ```
//! The in-memory copy (`Shared::meta`) is rebuilt from the engine at start and after a
//! snapshot install of group 0. Liveness, stats and leaders are soft state of the meta
//! leader ([`LeaderView`]), not replicated.

use phoenix_engine::{Db, ReadOptions, WriteBatch};
pub use phoenix_meta::{LeaderView, MetaState, META_GROUP};

use crate::error::{Error, Result};
use crate::keys;
use crate::node::ApplyResult;

impl From<phoenix_meta::Error> for Error {
    fn from(e: phoenix_meta::Error) -> Error {
        Error::Corruption(e.to_string())
    }
}

/// Loads the meta state from the engine: its records and the applied index they
/// reflect (the group's sentinel).
pub fn load(db: &Db) -> Result<MetaState> {
    let applied = db
        .get(&ReadOptions::default(), &keys::applied_key(META_GROUP))?
        .map(|v| {
            keys::decode_applied(&v).ok_or_else(|| {
                Error::Corruption(format!(
                    "meta group applied-index sentinel has {} bytes, expected 16",
                    v.len()
                ))
            })
        })
        .transpose()?
        .map_or(0, |(index, _)| index);
    let ro = ReadOptions {
        lower_bound: Some(keys::data_key(META_GROUP, b"")),
        upper_bound: Some(keys::data_end(META_GROUP)),
        ..ReadOptions::default()
    };
    let prefix = keys::data_key(META_GROUP, b"").len();
    let mut records = Vec::new();
    let mut it = db.iter(&ro)?;
    it.seek_to_first();
    while it.valid() {
        let k = it.key();
        records.push((
            k.get(prefix..).unwrap_or_default().to_vec(),
            it.value().to_vec(),
        ));
        it.next();
    }
    it.status()?;
    Ok(MetaState::from_records(applied, records)?)
}

/// Applies the committed meta entry at `index`: the state's record writes go into
/// `wb` (the round's batch of group 0). An undecodable entry is corruption.
pub fn apply_entry(
    state: &mut MetaState,
    index: u64,
    data: &[u8],
    wb: &mut WriteBatch,
) -> Result<ApplyResult> {
    Ok(match state.apply_entry(index, data)? {
        Ok(phoenix_meta::Applied::Changed(writes)) => {
            for w in writes {
                wb.put(&keys::data_key(META_GROUP, &w.key), &w.value);
            }
            ApplyResult::Done
        }
        Ok(phoenix_meta::Applied::Unchanged | phoenix_meta::Applied::Replayed) => ApplyResult::Done,
        Err(refusal) => ApplyResult::Refused(refusal.to_string()),
    })
}
