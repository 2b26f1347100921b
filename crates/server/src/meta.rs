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
                if w.value.is_empty() {
                    wb.delete(&keys::data_key(META_GROUP, &w.key));
                } else {
                    wb.put(&keys::data_key(META_GROUP, &w.key), &w.value);
                }
            }
            ApplyResult::Done
        }
        Ok(phoenix_meta::Applied::Unchanged | phoenix_meta::Applied::Replayed) => ApplyResult::Done,
        Err(refusal) => ApplyResult::Refused(refusal.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use phoenix_engine::{Options, WalMode, WriteOptions};
    use phoenix_proto::{meta_command, CreateGroups, MetaCommand, Replica, Route};
    use prost::Message as _;
    use std::sync::Arc;

    fn engine() -> Arc<Db> {
        let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::MemFs::new());
        let opts = Options {
            wal: WalMode::None,
            ..Options::default()
        };
        Db::open(fs, std::path::Path::new("/db"), opts).unwrap()
    }

    fn register(id: u64, addr: &str) -> Vec<u8> {
        MetaCommand {
            cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                protocol: 0,
                node_id: id,
                addr: addr.into(),
            })),
        }
        .encode_to_vec()
    }

    /// Applies `entries` (from index `first`) as the driver does: one batch with the
    /// sentinel.
    fn apply_round(
        db: &Db,
        st: &mut MetaState,
        first: u64,
        entries: &[Vec<u8>],
    ) -> Vec<ApplyResult> {
        let mut wb = WriteBatch::new();
        let mut out = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            out.push(apply_entry(st, first + i as u64, e, &mut wb).unwrap());
        }
        let last = first + entries.len() as u64 - 1;
        wb.put(
            &keys::applied_key(META_GROUP),
            &keys::encode_applied(last, 1),
        );
        db.write(&WriteOptions::default(), wb).unwrap();
        out
    }

    #[test]
    fn records_in_the_engine_reload_and_replay_is_a_no_op() {
        let db = engine();
        let mut st = load(&db).unwrap();
        assert_eq!(st, MetaState::default());
        let route = Route {
            group_id: 1,
            epoch: 1,
            replicas: vec![Replica {
                protocol: 0,
                node_id: 1,
                addr: "h:1".into(),
            }],
            ..Route::default()
        };
        let create = MetaCommand {
            cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups {
                routes: vec![route],
            })),
        }
        .encode_to_vec();
        let log = vec![register(1, "h:1"), register(2, "h:1"), create];
        let got = apply_round(&db, &mut st, 1, &log);
        assert_eq!(got[0], ApplyResult::Done);
        assert_eq!(
            got[1],
            ApplyResult::Refused("address h:1 already belongs to node 1".into())
        );
        assert_eq!(got[2], ApplyResult::Done);

        let mut again = load(&db).unwrap();
        assert_eq!(again, st);
        assert_eq!(again.applied(), 3);
        // The same entries replayed: nothing written, nothing changed.
        let mut wb = WriteBatch::new();
        for (i, e) in log.iter().enumerate() {
            assert_eq!(
                apply_entry(&mut again, i as u64 + 1, e, &mut wb).unwrap(),
                ApplyResult::Done
            );
        }
        assert!(wb.is_empty());
        assert_eq!(again, st);

        // An undecodable committed entry is corruption, not a panic.
        let err = apply_entry(&mut again, 4, &[0x0a, 50], &mut wb).unwrap_err();
        assert!(matches!(err, Error::Corruption(_)), "{err}");
        // So is a stored record the state cannot read.
        let mut wb = WriteBatch::new();
        wb.put(&keys::data_key(META_GROUP, b"x"), b"?");
        db.write(&WriteOptions::default(), wb).unwrap();
        assert!(matches!(load(&db), Err(Error::Corruption(_))));
    }
}
