//! The table store is the engine's only doorway to its tables and manifest: an engine
//! whose store lives elsewhere than its directory (on another file system, or on an
//! object store) writes, reads, imports and deletes every table there, through the
//! store's calls, and reopens from there after a crash.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use phoenix_engine::{
    Db, FsTableStore, Imported, ObjectTableStore, Options, ReadOptions, Result, SharedTableStore,
    StoredFile, TableStore, WalMode, WriteOptions,
};
use phoenix_storage::{FileSystem, MemFs, ReadableFile, SharedFs, WritableFile};

mod support;

/// A table store over another that counts the calls made to it, and on request
/// fails the pointer's replacement or holds calls until released.
#[derive(Debug)]
struct Tap {
    inner: Box<dyn TableStore>,
    created: AtomicU64,
    opened: AtomicU64,
    deleted: AtomicU64,
    imported: AtomicU64,
    manifests: AtomicU64,
    /// `set_current_manifest` fails as a request whose connection was reset.
    pointer_fails: AtomicBool,
    /// The calls held (they wait until released), and those waiting now.
    gates: Mutex<Gates>,
    released: Condvar,
}

impl Tap {
    fn new(inner: Box<dyn TableStore>) -> Tap {
        Tap {
            inner,
            created: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            imported: AtomicU64::new(0),
            manifests: AtomicU64::new(0),
            pointer_fails: AtomicBool::new(false),
            gates: Mutex::new(Gates::default()),
            released: Condvar::new(),
        }
    }

    /// Makes calls `call` wait (`hold`) or lets them go.
    fn hold(&self, call: Call, hold: bool) {
        let mut g = self.gates.lock().unwrap();
        if hold {
            g.held.insert(call);
        } else {
            g.held.remove(&call);
        }
        self.released.notify_all();
    }

    /// Waits until a call `call` waits at its gate.
    fn wait_held(&self, call: Call) {
        let mut g = self.gates.lock().unwrap();
        while !g.waiting.contains(&call) {
            g = self.released.wait(g).unwrap();
        }
    }

    fn gate(&self, call: Call) {
        let mut g = self.gates.lock().unwrap();
        while g.held.contains(&call) {
            g.waiting.insert(call);
            self.released.notify_all();
            g = self.released.wait(g).unwrap();
        }
        g.waiting.remove(&call);
    }
}

/// Calls of a [`Tap`] that can be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Call {
    CreateTable,
    SetPointer,
    RemoveManifest,
}

#[derive(Debug, Default)]
struct Gates {
    held: std::collections::HashSet<Call>,
    waiting: std::collections::HashSet<Call>,
}

impl TableStore for Tap {
    fn location(&self) -> PathBuf {
        self.inner.location()
    }
    fn table_location(&self, number: u64) -> PathBuf {
        self.inner.table_location(number)
    }
    fn create_table(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        self.gate(Call::CreateTable);
        self.created.fetch_add(1, Ordering::Relaxed);
        self.inner.create_table(number)
    }
    fn open_table(&self, number: u64) -> Result<Arc<dyn ReadableFile>> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.inner.open_table(number)
    }
    fn delete_table(&self, number: u64) -> Result<()> {
        self.deleted.fetch_add(1, Ordering::Relaxed);
        self.inner.delete_table(number)
    }
    fn import_table(&self, from: &dyn FileSystem, src: &Path, number: u64) -> Result<Imported> {
        self.imported.fetch_add(1, Ordering::Relaxed);
        self.inner.import_table(from, src, number)
    }
    fn unimport_table(
        &self,
        from: &dyn FileSystem,
        src: &Path,
        number: u64,
        how: Imported,
    ) -> Result<()> {
        self.inner.unimport_table(from, src, number, how)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn list(&self) -> Result<Vec<StoredFile>> {
        self.inner.list()
    }
    fn remove(&self, file: &StoredFile) -> Result<()> {
        if let StoredFile::Manifest(_) = file {
            self.gate(Call::RemoveManifest);
        }
        self.inner.remove(file)
    }
    fn read_current_manifest(&self) -> Result<Option<(u64, PathBuf, Vec<u8>)>> {
        self.inner.read_current_manifest()
    }
    fn create_manifest(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        self.manifests.fetch_add(1, Ordering::Relaxed);
        self.inner.create_manifest(number)
    }
    fn set_current_manifest(&self, number: u64) -> Result<()> {
        self.gate(Call::SetPointer);
        if self.pointer_fails.load(Ordering::SeqCst) {
            return Err(phoenix_storage::Error::io(
                phoenix_storage::IoOp::Write,
                self.inner.location().join("CURRENT"),
                std::io::Error::other("connection reset (test)"),
            )
            .into());
        }
        self.inner.set_current_manifest(number)
    }
    fn file_number_gap(&self) -> u64 {
        self.inner.file_number_gap()
    }
}

fn opts(wal: WalMode) -> Options {
    Options {
        write_buffer_size: 16 << 10,
        target_file_size_base: 8 << 10,
        max_bytes_for_level_base: 64 << 10,
        level0_file_num_compaction_trigger: 2,
        wal,
        wal_segment_size: 256 << 10,
        ..Options::default()
    }
}

fn key(g: u64, i: u32) -> Vec<u8> {
    let mut k = g.to_be_bytes().to_vec();
    k.extend_from_slice(format!("k{i:05}").as_bytes());
    k
}

fn scan(db: &Db) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut it = db.iter(&ReadOptions::default()).unwrap();
    it.seek_to_first();
    let mut out = BTreeMap::new();
    while it.valid() {
        out.insert(it.key().to_vec(), it.value().to_vec());
        it.next();
    }
    it.status().unwrap();
    out
}

/// Writes a group-`g` file to ingest on `fs` at `path`, and the same keys in `model`.
fn group_file(
    fs: &SharedFs,
    path: &Path,
    g: u64,
    keys: impl Iterator<Item = u32>,
    value: &[u8],
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) {
    let mut w = phoenix_engine::SstWriter::create(fs, path, &Options::default().table).unwrap();
    for i in keys {
        w.put(&key(g, i), value).unwrap();
        model.insert(key(g, i), value.to_vec());
    }
    w.finish().unwrap();
}

/// Opens an engine at `/db` of `fs` over `store`, writes key (1, 1) = "x", flushes and
/// closes it.
fn write_one_key(fs: &SharedFs, store: &SharedTableStore) {
    let db = Db::open_with_store(
        Arc::clone(fs),
        Path::new("/db"),
        Arc::clone(store),
        opts(WalMode::None),
    )
    .unwrap();
    db.put(&WriteOptions::default(), &key(1, 1), b"x").unwrap();
    db.flush().unwrap();
    db.close().unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn names(fs: &MemFs, dir: &Path) -> Vec<String> {
    fs.list(dir).unwrap_or_default()
}

/// Where the store under test keeps its files.
#[derive(Clone, Debug)]
enum Kind {
    /// A directory of another `MemFs` than the engine's.
    OtherFs,
    /// An in-memory object store (`None`), or the S3 server of a store URL.
    Objects(Option<String>),
}

#[test]
fn every_table_and_the_manifest_live_in_the_store() {
    for wal in [WalMode::Log, WalMode::None] {
        tables_live_in_the_store(Kind::OtherFs, wal.clone());
        tables_live_in_the_store(Kind::Objects(None), wal);
    }
}

#[test]
#[ignore = "needs minio"]
fn every_table_and_the_manifest_live_in_minio() {
    let minio = support::minio::Minio::start();
    for (i, wal) in [WalMode::Log, WalMode::None].into_iter().enumerate() {
        tables_live_in_the_store(Kind::Objects(Some(minio.url(&format!("live/{i}")))), wal);
    }
}

/// Runs flushes, compactions, ingests, group replacements and a drop on an engine whose
/// store is `kind`, then checks every table and the manifest went through the store,
/// and that the engine reopens from it after a crash.
fn tables_live_in_the_store(kind: Kind, wal: WalMode) {
    {
        // The engine's own directory and the store kept apart: a table or manifest
        // reached past the store lands in (or is looked for in) the wrong place.
        let local = Arc::new(MemFs::new());
        let local_fs: SharedFs = local.clone();
        let remote = Arc::new(MemFs::new());
        let remote_fs: SharedFs = remote.clone();
        let db_dir = Path::new("/db");
        let store_dir = Path::new("/tables");
        remote_fs.create_dir_all(store_dir).unwrap();
        let inner: Box<dyn TableStore> = match &kind {
            Kind::OtherFs => {
                let store = FsTableStore::locked(Arc::clone(&remote_fs), store_dir).unwrap();
                // A second engine cannot take the same directory meanwhile.
                let second = FsTableStore::locked(Arc::clone(&remote_fs), store_dir);
                assert!(second.is_err(), "{second:?}");
                Box::new(store)
            }
            Kind::Objects(None) => Box::new(
                ObjectTableStore::new(
                    Arc::new(object_store::memory::InMemory::new()),
                    "cluster/node-1",
                )
                .unwrap(),
            ),
            Kind::Objects(Some(url)) => Box::new(ObjectTableStore::from_url(url).unwrap()),
        };
        let counting = Arc::new(Tap::new(inner));
        let store: SharedTableStore = counting.clone();
        let open = || {
            Db::open_with_store(
                Arc::clone(&local_fs),
                db_dir,
                Arc::clone(&store),
                opts(wal.clone()),
            )
            .unwrap()
        };
        let db = open();
        let wo = WriteOptions::default();
        let mut model = BTreeMap::new();
        for round in 0..3u32 {
            for i in 0..300 {
                for g in 1..=4u64 {
                    let v = format!("v{round}-{i}").into_bytes();
                    db.put(&wo, &key(g, i), &v).unwrap();
                    model.insert(key(g, i), v);
                }
            }
            db.flush().unwrap();
        }
        db.compact_range(None, None).unwrap();
        db.delete_range(&wo, &key(1, 10), &key(1, 20)).unwrap();
        model.retain(|k, _| !(k.as_slice() >= key(1, 10).as_slice() && k < &key(1, 20)));
        assert_eq!(
            scan(&db),
            model,
            "after flushes and a compaction ({kind:?}, {wal:?})"
        );

        // Ingest over existing data (copied in at a new sequence), into an empty range
        // (imported as it is), a group replaced by one manifest edit and by a tombstone.
        let over = Path::new("/over.sst");
        group_file(&local_fs, over, 2, (0..300).step_by(5), b"ing", &mut model);
        db.ingest(&[over.to_path_buf()]).unwrap();
        let empty = Path::new("/empty.sst");
        group_file(&local_fs, empty, 9, 0..50, b"nine", &mut model);
        db.ingest(&[empty.to_path_buf()]).unwrap();
        let snap3 = Path::new("/snap3.sst");
        model.retain(|k, _| !k.starts_with(&3u64.to_be_bytes()));
        group_file(&local_fs, snap3, 3, 1000..1100, b"new3", &mut model);
        db.replace_group(3, &[snap3.to_path_buf()]).unwrap();
        let snap4 = Path::new("/snap4.sst");
        model.retain(|k, _| !k.starts_with(&4u64.to_be_bytes()));
        group_file(&local_fs, snap4, 4, 2000..2050, b"new4", &mut model);
        db.replace_group_by_tombstone(4, &[snap4.to_path_buf()])
            .unwrap();
        db.drop_groups(&[1]).unwrap();
        model.retain(|k, _| !k.starts_with(&1u64.to_be_bytes()));
        db.compact_range(None, None).unwrap();
        assert_eq!(
            scan(&db),
            model,
            "after ingests, replaces and a drop ({kind:?}, {wal:?})"
        );
        for p in [over, empty, snap3, snap4] {
            assert!(!local_fs.exists(p).unwrap(), "{} taken in", p.display());
        }
        db.close().unwrap();
        drop(db);

        // Nothing of the tables or the manifest in the engine's directory; all of them
        // in the store's, and each made through the store.
        let here = names(&local, db_dir);
        assert!(
            here.iter().all(|n| n == "LOCK" || n == "wal"),
            "the engine's directory holds {here:?}"
        );
        let there = counting.list().unwrap();
        assert!(
            counting.read_current_manifest().unwrap().is_some(),
            "{there:?}"
        );
        assert_eq!(
            there
                .iter()
                .filter(|f| matches!(f, StoredFile::Manifest(_)))
                .count(),
            1,
            "{there:?}"
        );
        assert!(
            there.iter().any(|f| matches!(f, StoredFile::Table(_))),
            "{there:?}"
        );
        if let Kind::Objects(_) = kind {
            let other = names(&remote, store_dir);
            assert!(other.is_empty(), "{other:?}");
        }
        let c = &counting;
        assert!(c.created.load(Ordering::Relaxed) > 0);
        assert!(c.opened.load(Ordering::Relaxed) > 0);
        assert!(
            c.deleted.load(Ordering::Relaxed) > 0,
            "compaction deletes inputs"
        );
        assert_eq!(
            c.imported.load(Ordering::Relaxed),
            2,
            "the empty-range ingest and replace_group"
        );
        assert!(c.manifests.load(Ordering::Relaxed) >= 1);

        // Both file systems lose what was not synced (an upload that returned is
        // durable); the engine reopens from the store.
        local.crash();
        remote.crash();
        let db = open();
        assert_eq!(
            scan(&db),
            model,
            "after a crash and reopen ({kind:?}, {wal:?})"
        );
        db.close().unwrap();
    }
}

#[test]
fn open_clears_the_stores_strays_and_refuses_an_empty_store() {
    let local: SharedFs = Arc::new(MemFs::new());
    // The engine's directory exists (its lock is taken there); the store is empty.
    local.create_dir_all(Path::new("/db")).unwrap();
    let remote = Arc::new(MemFs::new());
    let remote_fs: SharedFs = remote.clone();
    let store_dir = Path::new("/tables");
    remote_fs.create_dir_all(store_dir).unwrap();
    let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&remote_fs), store_dir));
    let no_create = Options {
        create_if_missing: false,
        ..opts(WalMode::None)
    };
    let err = Db::open_with_store(
        Arc::clone(&local),
        Path::new("/db"),
        Arc::clone(&store),
        no_create.clone(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("/tables holds no database"),
        "{err}"
    );

    write_one_key(&local, &store);
    for stray in ["999999.sst", "MANIFEST-999998", "CURRENT.tmp"] {
        let mut f = remote_fs
            .create(&store_dir.join(stray), Default::default())
            .unwrap();
        f.append(b"junk").unwrap();
        f.sync_all().unwrap();
    }
    let db = Db::open_with_store(Arc::clone(&local), Path::new("/db"), store, no_create).unwrap();
    let left = names(&remote, store_dir);
    for stray in ["999999.sst", "MANIFEST-999998", "CURRENT.tmp"] {
        assert!(!left.iter().any(|n| n == stray), "{stray} left: {left:?}");
    }
    assert_eq!(
        db.get(&ReadOptions::default(), &key(1, 1)).unwrap(),
        Some(b"x".to_vec())
    );
    db.close().unwrap();
}

/// Two engines on one object-store prefix (the node moved while the old one still runs):
/// the newer takes the store over, the older stops at its next manifest write with
/// `Fenced`, and what the store holds is exactly the newer writer's.
#[test]
fn a_second_writer_fences_the_first() {
    second_writer_fences_the_first(&|| Arc::new(object_store::memory::InMemory::new()));
}

#[test]
#[ignore = "needs minio"]
fn a_second_writer_fences_the_first_on_minio() {
    let minio = support::minio::Minio::start();
    second_writer_fences_the_first(&|| minio.bucket());
}

/// The fencing runs, each on a prefix of its own of a bucket `bucket` gives.
fn second_writer_fences_the_first(bucket: &dyn Fn() -> Arc<dyn object_store::ObjectStore>) {
    for (run, (wal, foreground)) in [
        (WalMode::Log, false),
        (WalMode::None, false),
        (WalMode::None, true),
    ]
    .into_iter()
    .enumerate()
    {
        let bucket = bucket();
        let prefix = format!("cluster/group-store-{run}");
        let engine = |node: &str| -> (SharedTableStore, Arc<Db>) {
            let fs: SharedFs = Arc::new(MemFs::new());
            let store: SharedTableStore =
                Arc::new(ObjectTableStore::new(Arc::clone(&bucket), &prefix).unwrap());
            let db = Db::open_with_store(
                fs,
                &Path::new("/").join(node),
                Arc::clone(&store),
                opts(wal.clone()),
            )
            .unwrap();
            (store, db)
        };
        let wo = WriteOptions::default();
        let mut model = BTreeMap::new();
        let (_a_store, a) = engine("a");
        for i in 0..200 {
            a.put(&wo, &key(1, i), b"a").unwrap();
            model.insert(key(1, i), b"a".to_vec());
        }
        a.flush().unwrap();

        // B opens the same prefix: it sees A's flushed data and takes the store over.
        let (_b_store, b) = engine("b");
        assert_eq!(scan(&b), model, "{wal:?}");

        // A's next manifest write (its flush, or a compaction it asks for) is refused as
        // fenced; so is all that follows.
        if !foreground {
            a.put(&wo, &key(2, 1), b"lost").unwrap();
        }
        let err = if foreground {
            a.compact_range(None, None).unwrap_err()
        } else {
            a.flush().unwrap_err()
        };
        assert!(err.is_fenced(), "{wal:?}: {err}");
        let err = a.put(&wo, &key(2, 2), b"lost").unwrap_err();
        assert!(err.is_fenced(), "{wal:?}: {err}");
        let failure = a.failure().unwrap();
        assert!(failure.message.contains("fenced"), "{failure:?}");
        assert!(
            !failure.io,
            "a fenced engine is not to be reopened: {failure:?}"
        );

        // B goes on: writes, flushes, compacts.
        for i in 0..300 {
            b.put(&wo, &key(3, i), b"b").unwrap();
            model.insert(key(3, i), b"b".to_vec());
        }
        b.flush().unwrap();
        b.compact_range(None, None).unwrap();
        assert_eq!(scan(&b), model, "{wal:?}");
        let _ = a.close();
        b.close().unwrap();
        drop((a, b));

        // The store holds B's state: a third engine finds B's data and nothing of A's
        // after the takeover, and every table object is one its manifest names.
        let (c_store, c) = engine("c");
        assert_eq!(scan(&c), model, "{wal:?}");
        let live: usize = c.stats().levels.iter().map(|l| l.files).sum();
        let tables = c_store
            .list()
            .unwrap()
            .into_iter()
            .filter(|f| matches!(f, StoredFile::Table(_)))
            .count();
        assert_eq!(tables, live, "{wal:?}: a table object no manifest names");
        // B's tables are numbered past the gap (A's never are).
        assert!(
            c_store.list().unwrap().iter().any(
                |f| matches!(f, StoredFile::Table(n) if *n > phoenix_engine::object_table_store::FENCE_FILE_GAP)
            ),
            "{wal:?}"
        );
        c.close().unwrap();
    }
}

#[test]
fn an_object_store_open_clears_strays() {
    let bucket = Arc::new(object_store::memory::InMemory::new());
    let store: SharedTableStore = Arc::new(ObjectTableStore::new(bucket.clone(), "p").unwrap());
    let fs: SharedFs = Arc::new(MemFs::new());
    write_one_key(&fs, &store);
    let put = |name: &str| {
        runtime()
            .block_on(object_store::ObjectStore::put(
                &*bucket,
                &object_store::path::Path::from(name),
                object_store::PutPayload::from_static(b"junk"),
            ))
            .unwrap();
    };
    // Strays of the store, and objects past its prefix (another store's, or deeper).
    for name in [
        "p/999999.sst",
        "p/MANIFEST-999998",
        "p/CURRENT.tmp",
        "q/000001.sst",
        "p/x/000001.sst",
    ] {
        put(name);
    }
    let before = store.list().unwrap();
    assert!(before.contains(&StoredFile::Table(999_999)), "{before:?}");
    assert!(!before.contains(&StoredFile::Table(1)), "{before:?}");
    let db = Db::open_with_store(
        fs,
        Path::new("/db"),
        Arc::clone(&store),
        opts(WalMode::None),
    )
    .unwrap();
    let after = store.list().unwrap();
    for stray in [
        StoredFile::Table(999_999),
        StoredFile::Manifest(999_998),
        StoredFile::Temp("CURRENT.tmp".into()),
    ] {
        assert!(!after.contains(&stray), "{stray:?} left: {after:?}");
    }
    assert_eq!(
        db.get(&ReadOptions::default(), &key(1, 1)).unwrap(),
        Some(b"x".to_vec())
    );
    db.close().unwrap();
    // A table the manifest names and that is gone is "not found".
    let err = store.delete_table(123_456).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// An open that uploaded its fresh manifest and then failed to name it (a crash, a
/// network error) leaves that manifest behind under the number the next open would take
/// again: the next open takes another number (even where the leftover holds the bytes
/// it meant to upload: an open's uploads are never taken as its own), and the leftover
/// goes as a stray.
#[test]
fn an_open_that_failed_part_way_leaves_the_store_usable() {
    let bucket: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::memory::InMemory::new());
    let store = || ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
    let wo = WriteOptions::default();
    let local: SharedFs = Arc::new(MemFs::new());
    let db = Db::open_with_store(
        Arc::clone(&local),
        Path::new("/a"),
        Arc::new(store()),
        opts(WalMode::None),
    )
    .unwrap();
    db.put(&wo, &key(1, 1), b"x").unwrap();
    db.flush().unwrap();
    db.close().unwrap();
    drop(db);
    for _ in 0..2 {
        let err = Db::open_with_store(
            Arc::clone(&local),
            Path::new("/b"),
            {
                let tap = Tap::new(Box::new(store()));
                tap.pointer_fails.store(true, Ordering::SeqCst);
                Arc::new(tap)
            },
            opts(WalMode::None),
        )
        .unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
    }
    let manifests = |s: &ObjectTableStore| {
        s.list()
            .unwrap()
            .into_iter()
            .filter(|f| matches!(f, StoredFile::Manifest(_)))
            .count()
    };
    assert_eq!(manifests(&store()), 3, "the current one and two leftovers");
    let s = Arc::new(store());
    let db = Db::open_with_store(
        Arc::clone(&local),
        Path::new("/b"),
        s.clone(),
        opts(WalMode::None),
    )
    .unwrap();
    assert_eq!(
        db.get(&ReadOptions::default(), &key(1, 1)).unwrap(),
        Some(b"x".to_vec())
    );
    db.put(&wo, &key(1, 2), b"y").unwrap();
    db.flush().unwrap();
    assert_eq!(manifests(&s), 1, "the leftovers are strays");
    db.close().unwrap();
}

/// A manifest write that failed in a foreground call (an ingest here) while a flush was
/// under way: the flush, finding the manifest refused, does not bury the storage's
/// failure under its own — `failure` still says the storage failed (`io`), which a
/// node cures by reopening the engine.
#[test]
fn a_flush_after_a_failed_ingest_keeps_the_storages_failure() {
    let m = MemFs::new();
    let fs: SharedFs = Arc::new(m.clone());
    fs.create_dir_all(Path::new("/db")).unwrap();
    let tap = Arc::new(Tap::new(Box::new(FsTableStore::new(
        Arc::clone(&fs),
        Path::new("/db"),
    ))));
    let store: SharedTableStore = tap.clone();
    let db = Arc::new(
        Db::open_with_store(
            Arc::clone(&fs),
            Path::new("/db"),
            store,
            opts(WalMode::None),
        )
        .unwrap(),
    );
    let wo = WriteOptions::default();
    db.put(&wo, &key(2, 1), b"x").unwrap();
    tap.hold(Call::CreateTable, true);
    let flushing = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.flush())
    };
    tap.wait_held(Call::CreateTable);
    // The flush waits to create its table; the ingest's manifest write fails.
    let mut model = BTreeMap::new();
    let file = Path::new("/three.sst");
    group_file(&fs, file, 3, 0..10, b"three", &mut model);
    m.inject(
        phoenix_storage::FaultKind::Write,
        1,
        std::io::ErrorKind::StorageFull,
        false,
    );
    assert!(db.ingest(&[file.to_path_buf()]).is_err());
    m.clear_faults();
    let before = db
        .failure()
        .expect("a failure after the manifest write failed");
    assert!(before.io, "{before:?}");
    tap.hold(Call::CreateTable, false);
    assert!(
        flushing.join().unwrap().is_err(),
        "the flush cannot record its table"
    );
    assert!(db.put(&wo, &key(2, 2), b"y").is_err(), "writes are refused");
    // Closing joins the background flush, which has tried to record its table by then.
    assert!(db.close().is_err());
    assert_eq!(
        tap.created.load(Ordering::SeqCst),
        1,
        "the held flush went on"
    );
    let after = db.failure().expect("still failed");
    assert!(after.io, "the storage's failure, still: {after:?}");
}

/// An import from another file system copies the table, then removes the source: the
/// copy's name is durable in the store's directory before the source goes, so a power
/// loss right after finds the table in one of the two places.
#[test]
fn an_import_across_file_systems_keeps_the_table_through_a_power_loss() {
    let local = MemFs::new();
    let local_fs: SharedFs = Arc::new(local.clone());
    let remote = MemFs::new();
    let remote_fs: SharedFs = Arc::new(remote.clone());
    remote_fs.create_dir_all(Path::new("/store")).unwrap();
    remote_fs.sync_dir(Path::new("/")).unwrap();
    let store = FsTableStore::new(Arc::clone(&remote_fs), Path::new("/store"));
    let src = Path::new("/in.sst");
    group_file(&local_fs, src, 4, 0..20, b"four", &mut BTreeMap::new());
    local_fs.sync_dir(Path::new("/")).unwrap();

    store.import_table(&*local_fs, src, 7).unwrap();
    // The source's removal reaches the disk (a later sync of its directory, by anyone);
    // the store's own sync has not come yet.
    local_fs.sync_dir(Path::new("/")).unwrap();
    local.crash();
    remote.crash();

    let in_store = remote_fs.exists(&store.table_location(7)).unwrap();
    let at_source = local_fs.exists(src).unwrap();
    assert!(
        in_store || at_source,
        "the table is in neither place after the power loss"
    );
}

/// Two engines opening one store at the same moment, in lockstep: both read the same
/// manifest, so both mean to upload the same fresh manifest, takeover record and
/// pointer. Only one open may succeed — two writers that each think they own the store
/// would delete each other's tables as strays and write the same table numbers.
#[test]
fn of_two_opens_at_once_only_one_succeeds() {
    let bucket: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::memory::InMemory::new());
    let store = || ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
    let first: SharedTableStore = Arc::new(store());
    let local: SharedFs = Arc::new(MemFs::new());
    write_one_key(&local, &first);
    drop(first);

    let tap = |call: Call| {
        let t = Arc::new(Tap::new(Box::new(store())));
        t.hold(call, true);
        t
    };
    let open = |node: &'static str, tap: &Arc<Tap>| {
        let local = Arc::clone(&local);
        let store: SharedTableStore = tap.clone();
        std::thread::spawn(move || {
            Db::open_with_store(local, Path::new(node), store, opts(WalMode::None))
        })
    };
    // B reads the store and uploads its fresh manifest, then waits to take the pointer.
    let b_tap = tap(Call::SetPointer);
    let b = open("/b", &b_tap);
    b_tap.wait_held(Call::SetPointer);
    // A does the same from the same state, takes the store over, and waits to remove
    // the manifest it took over.
    let a_tap = tap(Call::RemoveManifest);
    let a = open("/a", &a_tap);
    a_tap.wait_held(Call::RemoveManifest);
    // Now B goes on, then A.
    b_tap.hold(Call::SetPointer, false);
    let b = b.join().unwrap();
    a_tap.hold(Call::RemoveManifest, false);
    let a = a.join().unwrap();
    match (&a, &b) {
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => assert!(e.is_fenced(), "{e}"),
        (Ok(_), Ok(_)) => panic!("both opens succeeded: two writers own the store"),
        (Err(a), Err(b)) => panic!("neither open succeeded: {a}; {b}"),
    }
    let db = a.or(b).unwrap();
    assert_eq!(
        db.get(&ReadOptions::default(), &key(1, 1)).unwrap(),
        Some(b"x".to_vec())
    );
    db.put(&WriteOptions::default(), &key(1, 2), b"y").unwrap();
    db.flush().unwrap();
    db.close().unwrap();
}
