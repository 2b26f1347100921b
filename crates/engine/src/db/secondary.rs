//! A read-only follower of an engine whose tables are on a shared store (seed 004 §7.1):
//! it reads the primary's manifest (never writing anything), serves reads from the
//! tables it names, and follows the primary when asked ([`Secondary::catch_up`]).
//!
//! It sees what the primary has flushed: the primary's memtables (and, on a node, the
//! raft log that is its WAL) are not on the store. A table the primary's compactions
//! replaced is deleted once no version of the primary holds it and
//! `Options::obsolete_table_delay` has passed and, on a store that keeps leases, no
//! secondary's lease covers it ([`crate::reader_lease`]): each secondary writes its
//! lease (when the oldest version it still reads — its cursors' included — was read,
//! and until when the lease holds: `Options::reader_lease`) before each read of the
//! manifest, and renews it there and with [`Secondary::renew_lease`]. One whose lease
//! ran out finds a table gone; a point read then catches up by itself and reads again,
//! an iterator fails with the store's not-found error (catch up, then iterate again).

use std::sync::{Arc, Weak};

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
    /// This reader's lease name, and the versions it handed out with when each was read
    /// (ms since the epoch): the oldest still held is what its lease says.
    reader: String,
    views: Mutex<Vec<(u64, Weak<View>)>>,
    /// Until when the lease written last holds (0: none written).
    lease_until: std::sync::atomic::AtomicU64,
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
            reader: reader_id(),
            views: Mutex::new(Vec::new()),
            lease_until: std::sync::atomic::AtomicU64::new(0),
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
        // The lease first, dated before the manifest is read: whatever version that
        // read finds is covered from the start.
        let read_at = crate::reader_lease::now_ms();
        self.write_lease(Some(read_at));
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
        let view = Arc::new(View {
            mem: Arc::new(MemTable::new(0)),
            imms: Vec::new(),
            version,
        });
        self.views.lock().push((read_at, Arc::downgrade(&view)));
        *self.view.write() = view;
        // Tables the primary dropped are closed (readers holding them keep theirs).
        for n in old.into_iter().filter(|n| !live.contains(n)) {
            self.tables.evict(n);
        }
        *followed = (r.number, r.len, r.last_sequence);
        Ok(true)
    }

    /// Renews this reader's lease (the oldest version it still reads, for
    /// `Options::reader_lease` from now). A reader that reads without catching up for
    /// longer than that renews it so, or its tables may go. `Ok(false)`: the lease had
    /// run out (or was never written) before this renewal, so tables of the versions it
    /// reads may be gone: catch up, and open cursors again.
    pub fn renew_lease(&self) -> Result<bool> {
        let was = self.lease_until.load(std::sync::atomic::Ordering::Acquire);
        let live = was > crate::reader_lease::now_ms();
        if !self.write_lease(None) {
            return Err(Error::InvalidArgument(format!(
                "{}: the reader's lease could not be written (see the log)",
                self.store.location().display()
            )));
        }
        Ok(live)
    }

    /// Writes the lease: the oldest version still held (or `reading`, a read about to
    /// start, if older); whether it was written. A lease that cannot be written (a
    /// reader with read-only credentials) is reported and reading goes on, protected by
    /// the primary's deletion delay alone. `Options::reader_lease` of 0 keeps none.
    fn write_lease(&self, reading: Option<u64>) -> bool {
        if !self.store.supports_reader_leases() || self.opts.reader_lease.is_zero() {
            return true;
        }
        let oldest = {
            let mut views = self.views.lock();
            views.retain(|(_, w)| w.strong_count() > 0);
            views.iter().map(|(t, _)| *t).chain(reading).min()
        };
        let now = crate::reader_lease::now_ms();
        let ttl = u64::try_from(self.opts.reader_lease.as_millis()).unwrap_or(u64::MAX);
        let lease = crate::reader_lease::Lease {
            oldest_view_ms: oldest.unwrap_or(now),
            expires_ms: now.saturating_add(ttl),
        };
        match self.store.put_reader_lease(&self.reader, &lease.encode()) {
            Ok(()) => {
                self.lease_until
                    .store(lease.expires_ms, std::sync::atomic::Ordering::Release);
                true
            }
            Err(e) => {
                tracing::warn!(reader = %self.reader, error = %e, "could not write this reader's lease; its tables are kept only for the primary's deletion delay");
                false
            }
        }
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

impl Drop for Secondary {
    fn drop(&mut self) {
        // Cursors may outlive their secondary: while one holds a version, the lease
        // stays and runs out by itself.
        *self.view.get_mut() = Arc::new(View {
            mem: Arc::new(MemTable::new(0)),
            imms: Vec::new(),
            version: Arc::new(crate::version::Version::empty(self.opts.num_levels)),
        });
        if self
            .views
            .get_mut()
            .iter()
            .any(|(_, w)| w.strong_count() > 0)
        {
            return;
        }
        if let Err(e) = self.store.delete_reader_lease(&self.reader) {
            tracing::warn!(reader = %self.reader, error = %e, "could not remove a reader's lease; it runs out by itself");
        }
    }
}

/// A name for this reader's lease, unique enough: the process, the time, a counter.
fn reader_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:x}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn refuse_snapshot(ro: &ReadOptions<'_>) -> Result<()> {
    if ro.snapshot.is_some() {
        return Err(Error::InvalidArgument(
            "a secondary reads the primary's latest flushed state; it takes no snapshot".into(),
        ));
    }
    Ok(())
}
