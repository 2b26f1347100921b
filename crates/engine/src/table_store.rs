//! The engine's one doorway to its durable files: the tables (SSTs, by file number) and
//! the manifest with the pointer that names the current one.
//!
//! Flush, compaction, ingest, group replacement, the table cache, the version set and
//! the cleanup at open reach these files only through [`TableStore`]. The engine's
//! other files stay on its [`FileSystem`](phoenix_storage::FileSystem): the `LOCK`, the
//! optional WAL, and the files handed to ingest (built outside the engine, then taken
//! in with [`TableStore::import_table`]).
//!
//! [`FsTableStore`] keeps them as files in a directory of a file system (local disk,
//! `MemFs`), as they have always been laid out (`filename.rs`). A store over an object
//! store fits the same calls: a table is written whole and made durable by its
//! writer's `sync_all` (an upload), an import copies, and the manifest pointer is one
//! small object replaced as a whole.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use phoenix_storage::{FileLock, FileSystem, ReadableFile, SharedFs, WritableFile};

use crate::error::{Error, Result};
use crate::filename::{self, FileKind};

/// A file the store holds, as [`TableStore::list`] names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredFile {
    /// Table `number`.
    Table(u64),
    /// Manifest `number`.
    Manifest(u64),
    /// A temporary left by an interrupted replacement of the manifest pointer.
    Temp(String),
}

impl StoredFile {
    /// The stored file a name in the store stands for (`filename.rs`); `None` for the
    /// pointer, the lock and names the store does not own.
    pub fn from_name(name: &str) -> Option<StoredFile> {
        match filename::parse(name)? {
            FileKind::Table(n) => Some(StoredFile::Table(n)),
            FileKind::Manifest(n) => Some(StoredFile::Manifest(n)),
            FileKind::Temp => Some(StoredFile::Temp(name.to_string())),
            FileKind::Lock | FileKind::Current => None,
        }
    }

    /// Its name in the store.
    pub fn name(&self) -> String {
        match self {
            StoredFile::Table(n) => crate::table::table_file_name(*n),
            StoredFile::Manifest(n) => filename::manifest_name(*n),
            StoredFile::Temp(name) => name.clone(),
        }
    }
}

/// The manifest number `CURRENT` (read from `location`) names.
pub(crate) fn parse_current(cur: &[u8], location: &Path) -> Result<u64> {
    std::str::from_utf8(cur)
        .ok()
        .and_then(|s| s.strip_suffix('\n'))
        .and_then(filename::parse)
        .and_then(|k| match k {
            FileKind::Manifest(n) => Some(n),
            _ => None,
        })
        .ok_or_else(|| Error::corruption(location, 0, "CURRENT does not name a manifest"))
}

/// Where an engine keeps its tables and manifest. See the module docs.
pub trait TableStore: Send + Sync + std::fmt::Debug {
    /// Where the store keeps its files (a directory, a bucket prefix), for messages.
    fn location(&self) -> PathBuf;

    /// Where table `number` lives, for messages (corruption reports name it).
    fn table_location(&self, number: u64) -> PathBuf;

    /// Starts table `number` (replacing a leftover of that number). Its writer's
    /// `sync_all` makes the bytes durable; [`TableStore::sync`] then makes the table's
    /// existence durable.
    fn create_table(&self, number: u64) -> Result<Box<dyn WritableFile>>;

    /// Opens table `number` for reads.
    fn open_table(&self, number: u64) -> Result<Arc<dyn ReadableFile>>;

    /// Deletes table `number`; durable after [`TableStore::sync`]. A table already gone
    /// is an error that [`phoenix_storage::Error::is_not_found`] recognises.
    fn delete_table(&self, number: u64) -> Result<()>;

    /// Takes the finished, synced file `src` of `from` in as table `number`, by a
    /// rename where the store can (`src` is gone then) or a copy (`src` stays: the
    /// caller removes it once a durable manifest names the table, and still has it to
    /// take in again if the edit fails). Durable after [`TableStore::sync`].
    fn import_table(&self, from: &dyn FileSystem, src: &Path, number: u64) -> Result<Imported>;

    /// Undoes an import that no manifest names (its edit was never written): a table
    /// moved in goes back to `src`, a copy is deleted.
    fn unimport_table(
        &self,
        from: &dyn FileSystem,
        src: &Path,
        number: u64,
        how: Imported,
    ) -> Result<()>;

    /// Makes the tables created, imported and deleted so far durable as present or
    /// absent (a directory's sync on a file system).
    fn sync(&self) -> Result<()>;

    /// Every file the store holds: tables, manifests, temporaries. Names it does not
    /// own are left out.
    fn list(&self) -> Result<Vec<StoredFile>>;

    /// Removes a file [`TableStore::list`] named; durable after [`TableStore::sync`].
    fn remove(&self, file: &StoredFile) -> Result<()>;

    /// The manifest the pointer names: its number, its location (for messages) and its
    /// bytes. `None` when the store holds no database (no pointer).
    fn read_current_manifest(&self) -> Result<Option<(u64, PathBuf, Vec<u8>)>>;

    /// Starts manifest `number`, to which records are appended and synced.
    fn create_manifest(&self, number: u64) -> Result<Box<dyn WritableFile>>;

    /// Points the store at manifest `number`, durably and atomically: after a crash the
    /// pointer names the old manifest or this one. The manifest's first record must be
    /// synced before. A store that fences other writers takes the store over here (see
    /// `object_table_store`).
    fn set_current_manifest(&self, number: u64) -> Result<()>;

    /// File numbers an engine opening an existing store skips past the manifest's
    /// counter: a writer it fences may still be writing tables numbered from that
    /// counter until its next manifest write fails. 0 where two writers cannot meet.
    fn file_number_gap(&self) -> u64 {
        0
    }

    /// Whether each manifest write uploads the whole manifest again (an object store:
    /// nothing appends), so that a long manifest makes every edit costly: it is then
    /// rolled sooner (`version_set::WHOLE_MANIFEST_ROLL_FLOOR`).
    fn rewrites_manifest_whole(&self) -> bool {
        false
    }

    /// Whether reads of its tables are requests to a remote store that serves many at
    /// once (each waits a round trip): readers then gain by issuing them together.
    fn reads_at_once(&self) -> bool {
        false
    }

    /// Names the shared store (an object store's bucket and endpoint) when other
    /// engines' stores on it can copy this one's tables in ([`TableStore::copy_table`]);
    /// `None` where tables cannot be copied between engines (a local file system).
    fn shared_id(&self) -> Option<String> {
        None
    }

    /// The name of table `number` on the shared store, as another engine's
    /// [`TableStore::copy_table`] takes it; `None` without a shared store.
    fn table_object(&self, _number: u64) -> Option<String> {
        None
    }

    /// Copies `object`, a table of another engine on the same shared store (named by its
    /// [`TableStore::table_object`]), in as table `number`, by a copy the store makes
    /// itself: the bytes do not pass through this process. Durable once it returns.
    fn copy_table(&self, object: &str, number: u64) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "{}: cannot copy table {object:?} in as table {number}: \
             tables are copied only between engines on one object store",
            self.location().display()
        )))
    }

    /// Whether followers keep leases here ([`crate::reader_lease`]): a store others
    /// read from elsewhere (an object store).
    fn supports_reader_leases(&self) -> bool {
        false
    }

    /// Writes (or replaces) reader `reader`'s lease. A no-op where leases are not kept.
    fn put_reader_lease(&self, _reader: &str, _lease: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Removes reader `reader`'s lease (gone already is fine).
    fn delete_reader_lease(&self, _reader: &str) -> Result<()> {
        Ok(())
    }

    /// Every reader's lease: `(reader, bytes)`.
    fn reader_leases(&self) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(Vec::new())
    }

    /// Copies table `number` out to `object`, elsewhere on the shared store (a backup),
    /// by a copy the store makes itself. `object` must be a table name under a
    /// `tables` directory, outside this store's own prefix, and not exist. Refused where
    /// tables cannot be copied ([`TableStore::shared_id`] `None`).
    fn copy_table_out(&self, number: u64, object: &str) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "{}: cannot copy table {number} out to {object:?}: \
             tables are copied only on an object store",
            self.location().display()
        )))
    }
}

/// How [`TableStore::import_table`] took a file in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Renamed into the store: the source is gone.
    Moved,
    /// Copied: the source stays until the caller removes it.
    Copied,
}

/// Tables and manifest as files in directory `dir` of `fs` (the layout of `filename.rs`).
#[derive(Debug, Clone)]
pub struct FsTableStore {
    fs: SharedFs,
    dir: PathBuf,
    /// The store's own lock when it is not the engine's directory ([`FsTableStore::locked`]).
    _lock: Option<Arc<dyn FileLock>>,
}

impl FsTableStore {
    /// Whether `fs` is the store's own file system (a rename can take a file in).
    fn same_fs(&self, fs: &dyn FileSystem) -> bool {
        std::ptr::addr_eq(fs as *const dyn FileSystem, Arc::as_ptr(&self.fs))
    }

    /// A store over `dir`, which must exist. Nothing keeps a second engine out: for the
    /// engine's own directory, whose lock the engine holds (`Db::open`).
    pub fn new(fs: SharedFs, dir: &Path) -> FsTableStore {
        FsTableStore {
            fs,
            dir: dir.to_path_buf(),
            _lock: None,
        }
    }

    /// A store over `dir` (created if missing) that holds `<dir>/LOCK` while it lives, so
    /// no second engine uses it at once: for a directory other than the engine's.
    pub fn locked(fs: SharedFs, dir: &Path) -> Result<FsTableStore> {
        fs.create_dir_all(dir)?;
        let lock: Arc<dyn FileLock> = Arc::from(fs.lock(&filename::lock_path(dir))?);
        Ok(FsTableStore {
            fs,
            dir: dir.to_path_buf(),
            _lock: Some(lock),
        })
    }
}

impl TableStore for FsTableStore {
    fn location(&self) -> PathBuf {
        self.dir.clone()
    }

    fn table_location(&self, number: u64) -> PathBuf {
        filename::table_path(&self.dir, number)
    }

    fn create_table(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        Ok(self
            .fs
            .create(&self.table_location(number), Default::default())?)
    }

    fn open_table(&self, number: u64) -> Result<Arc<dyn ReadableFile>> {
        Ok(self.fs.open(&self.table_location(number))?)
    }

    fn delete_table(&self, number: u64) -> Result<()> {
        Ok(self.fs.delete(&self.table_location(number))?)
    }

    fn import_table(&self, from: &dyn FileSystem, src: &Path, number: u64) -> Result<Imported> {
        let dest = self.table_location(number);
        // A rename where the source is on the store's file system; a synced copy
        // otherwise (another file system, or a rename refused across devices). Any
        // other failure of the rename is the caller's to see.
        if self.same_fs(from) {
            match self.fs.rename(src, &dest) {
                Ok(()) => return Ok(Imported::Moved),
                Err(e) if e.io_kind() == Some(std::io::ErrorKind::CrossesDevices) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let copied = (|| -> Result<()> {
            let data = from.read_all(src)?;
            let mut f = self.fs.create(&dest, Default::default())?;
            f.append(&data)?;
            f.sync_all()?;
            // The copy's name is durable before the caller removes the source: a power
            // loss between the two would otherwise leave the table in neither place.
            self.fs.sync_dir(&self.dir)?;
            Ok(())
        })();
        if let Err(e) = copied {
            // Best effort; a leftover is removed at the next open as not in the manifest.
            let _ = self.fs.delete(&dest);
            return Err(e);
        }
        Ok(Imported::Copied)
    }

    fn unimport_table(
        &self,
        from: &dyn FileSystem,
        src: &Path,
        number: u64,
        how: Imported,
    ) -> Result<()> {
        let dest = self.table_location(number);
        match how {
            Imported::Moved => {
                debug_assert!(
                    self.same_fs(from),
                    "a table moved in from another file system"
                );
                self.fs.rename(&dest, src)?;
                if let Some(parent) = src.parent() {
                    self.fs.sync_dir(parent)?;
                }
                Ok(())
            }
            Imported::Copied => Ok(self.fs.delete(&dest)?),
        }
    }

    fn sync(&self) -> Result<()> {
        Ok(self.fs.sync_dir(&self.dir)?)
    }

    fn list(&self) -> Result<Vec<StoredFile>> {
        Ok(self
            .fs
            .list(&self.dir)?
            .iter()
            .filter_map(|name| StoredFile::from_name(name))
            .collect())
    }

    fn remove(&self, file: &StoredFile) -> Result<()> {
        Ok(self.fs.delete(&self.dir.join(file.name()))?)
    }

    fn read_current_manifest(&self) -> Result<Option<(u64, PathBuf, Vec<u8>)>> {
        let current_path = filename::current_path(&self.dir);
        if !self.fs.exists(&current_path)? {
            return Ok(None);
        }
        let number = parse_current(&self.fs.read_all(&current_path)?, &current_path)?;
        let path = filename::manifest_path(&self.dir, number);
        let data = self.fs.read_all(&path)?;
        Ok(Some((number, path, data)))
    }

    fn create_manifest(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        Ok(self.fs.create(
            &filename::manifest_path(&self.dir, number),
            Default::default(),
        )?)
    }

    fn set_current_manifest(&self, number: u64) -> Result<()> {
        // The new manifest's name must be durable before CURRENT can name it.
        self.fs.sync_dir(&self.dir)?;
        let current = format!("{}\n", filename::manifest_name(number));
        self.fs
            .write_atomic(&filename::current_path(&self.dir), current.as_bytes())?;
        Ok(())
    }
}

/// A shared table store.
pub type SharedTableStore = Arc<dyn TableStore>;
