//! A read-only follower of an engine whose tables are on a shared store (seed 004 §7.1):
//! it reads the primary's manifest (never writing anything), serves reads from the
//! tables it names, and follows the primary when asked ([`Secondary::catch_up`]).
//!
//! It sees what the primary has flushed: the primary's memtables (and, on a node, the
//! raft log that is its WAL) are not on the store. A table the primary's compactions
//! replaced is deleted once no version of the primary holds it and
//! `Options::obsolete_table_delay` has passed: a secondary that catches up more often
//! than that always finds the tables of the version it reads. One that fell further
//! behind finds a table gone; a point read then catches up by itself and reads again,
//! an iterator fails with the store's not-found error (catch up, then iterate again).

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{iter_over, View};
use crate::db_iter::DbIterator;
use crate::error::{Error, Result};
use crate::key::{SequenceNumber, MAX_SEQUENCE};
use crate::memtable::MemTable;
use crate::options::{Options, ReadOptions};
use crate::table::{BlockCache, TableCache};
use crate::table_store::SharedTableStore;
use crate::version::TableGet;
use crate::version_set::replay;

/// A read-only follower of the engine whose tables and manifest are in a store. See
/// the module docs.
pub struct Secondary {
    store: SharedTableStore,
    opts: Options,
    tables: Arc<TableCache>,
    view: RwLock<Arc<View>>,
    /// The manifest read last: its number and length, and its last sequence.
    followed: Mutex<(u64, usize, SequenceNumber)>,
}

impl std::fmt::Debug for Secondary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (number, len, seq) = *self.followed.lock();
        f.debug_struct("Secondary")
            .field("store", &self.store.location())
            .field("manifest", &number)
            .field("manifest_bytes", &len)
            .field("last_sequence", &seq)
            .finish()
    }
}

impl Secondary {
    /// Follows the engine in `store` (which must hold one). `opts` gives the read
    /// settings: block cache, open tables, levels, the table options' prefix length.
    pub fn open(store: SharedTableStore, opts: Options) -> Result<Secondary> {
        opts.validate()?;
        let block_cache =
            (opts.block_cache_size > 0).then(|| BlockCache::new(opts.block_cache_size));
        let tables = Arc::new(TableCache::new(
            Arc::clone(&store),
            opts.max_open_files,
            block_cache,
        ));
        let s = Secondary {
            view: RwLock::new(Arc::new(View {
                mem: Arc::new(MemTable::new(0)),
                imms: Vec::new(),
                version: Arc::new(crate::version::Version::empty(opts.num_levels)),
            })),
            followed: Mutex::new((0, 0, 0)),
            store,
            opts,
            tables,
        };
        if !s.catch_up()? {
            return Err(Error::InvalidArgument(format!(
                "{} holds no database to follow",
                s.store.location().display()
            )));
        }
        Ok(s)
    }

    /// Reads the primary's manifest again and reads from its tables from now on;
    /// whether anything changed. A manifest that does not decode is reported, and the
    /// tables read so far stay in use.
    pub fn catch_up(&self) -> Result<bool> {
        let mut followed = self.followed.lock();
        // The primary may roll its manifest (name a new one, remove the old) between
        // our reads of the pointer and of the manifest: read again.
        let mut tries = 0;
        let replayed = loop {
            match replay(&self.store, self.opts.num_levels) {
                Err(e) if e.is_not_found() && tries < 3 => tries += 1,
                r => break r?,
            }
        };
        let Some(r) = replayed else {
            return Ok(false);
        };
        if (r.number, r.len) == (followed.0, followed.1) {
            return Ok(false);
        }
        let old = self.view.read().version.live_files().collect::<Vec<_>>();
        let version = Arc::new(r.version);
        let live: std::collections::HashSet<u64> = version.live_files().collect();
        *self.view.write() = Arc::new(View {
            mem: Arc::new(MemTable::new(0)),
            imms: Vec::new(),
            version,
        });
        // Tables the primary dropped are closed (readers holding them keep theirs).
        for n in old.into_iter().filter(|n| !live.contains(n)) {
            self.tables.evict(n);
        }
        *followed = (r.number, r.len, r.last_sequence);
        Ok(true)
    }

    /// The primary's last sequence as of the manifest read last.
    pub fn last_sequence(&self) -> SequenceNumber {
        self.followed.lock().2
    }

    /// Reads `key` from the tables of the manifest read last (catching up once if one
    /// of them is gone). Snapshots are the primary's: `ro.snapshot` is refused.
    pub fn get(&self, ro: &ReadOptions<'_>, key: &[u8]) -> Result<Option<Vec<u8>>> {
        refuse_snapshot(ro)?;
        self.again_if_gone(|| {
            let view = Arc::clone(&self.view.read());
            match view
                .version
                .get(&self.tables, key, MAX_SEQUENCE, 0, ro.fill_cache)?
            {
                TableGet::Value(v) => Ok(Some(v)),
                _ => Ok(None),
            }
        })
    }

    /// Reads several keys from one version (catching up once if a table is gone).
    pub fn multi_get(&self, ro: &ReadOptions<'_>, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        refuse_snapshot(ro)?;
        self.again_if_gone(|| {
            let view = Arc::clone(&self.view.read());
            let got = view.version.multi_get(
                &self.tables,
                keys,
                MAX_SEQUENCE,
                ro.fill_cache,
                ro.parallel_io,
            )?;
            Ok(got
                .into_iter()
                .map(|g| match g {
                    TableGet::Value(v) => Some(v),
                    _ => None,
                })
                .collect())
        })
    }

    /// A cursor over the tables of the manifest read last, within the read's bounds.
    pub fn iter(&self, ro: &ReadOptions<'_>) -> Result<DbIterator> {
        refuse_snapshot(ro)?;
        let view = Arc::clone(&self.view.read());
        iter_over(
            view,
            &self.tables,
            self.store.reads_at_once(),
            self.opts.table.prefix_len,
            ro,
            MAX_SEQUENCE,
        )
    }

    fn again_if_gone<T>(&self, read: impl Fn() -> Result<T>) -> Result<T> {
        match read() {
            Err(e) if e.is_not_found() => {
                self.catch_up()?;
                read()
            }
            r => r,
        }
    }
}

fn refuse_snapshot(ro: &ReadOptions<'_>) -> Result<()> {
    if ro.snapshot.is_some() {
        return Err(Error::InvalidArgument(
            "a secondary reads the primary's latest flushed state; it takes no snapshot".into(),
        ));
    }
    Ok(())
}
