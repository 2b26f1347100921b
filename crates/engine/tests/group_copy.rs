//! A group rebuilt on another engine by copying its tables (`Db::export_group`,
//! `write_group_rest`, `copy_in_group`, `replace_group_with_copies`): two engines on one
//! (in-memory) object store, each under its own prefix. After the copy, the other engine
//! reads the group exactly as the source's snapshot did — whatever mix of memtables, L0,
//! deeper levels, overwrites, deletes and range deletes held it — and keeps doing so
//! through more writes, compactions and a reopen; its other groups are untouched.
//!
//! Seeded: `PHOENIX_SEED` picks the first seed (default 1), `PHOENIX_GROUP_COPY_RUNS`
//! the number of runs (default 12); a failure prints the line that replays it.
//!
//! Two tests stop the copy between its steps (failpoints, process-wide): every test here
//! takes its turn (`turn`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use phoenix_engine::{
    Db, ObjectTableStore, Options, ReadOptions, RestEntry, SharedTableStore, SstWriter, WalMode,
    WriteOptions,
};
use phoenix_storage::{MemFs, SharedFs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The group copied; its neighbours stay.
const G: u64 = 2;

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn: the failpoints of one would stop the copies of the others.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn opts() -> Options {
    Options {
        write_buffer_size: 16 << 10,
        target_file_size_base: 8 << 10,
        max_bytes_for_level_base: 64 << 10,
        level0_file_num_compaction_trigger: 4,
        wal: WalMode::Log,
        ..Options::default()
    }
}

fn key(g: u64, i: u32) -> Vec<u8> {
    let mut k = g.to_be_bytes().to_vec();
    k.extend_from_slice(format!("k{i:05}").as_bytes());
    k
}

/// The system keys of the test: past every `key(g, _)` of the group.
fn sys_key(g: u64, name: &str) -> Vec<u8> {
    let mut k = g.to_be_bytes().to_vec();
    k.push(b's');
    k.extend_from_slice(name.as_bytes());
    k
}

fn always_from(g: u64) -> Vec<u8> {
    let mut k = g.to_be_bytes().to_vec();
    k.push(b's');
    k
}

/// Group `g` as `db` reads it (at `snap` if given).
fn group(db: &Db, g: u64, snap: Option<&phoenix_engine::Snapshot>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let ro = ReadOptions {
        snapshot: snap,
        lower_bound: Some(g.to_be_bytes().to_vec()),
        upper_bound: Some((g + 1).to_be_bytes().to_vec()),
        ..ReadOptions::default()
    };
    let mut it = db.iter(&ro).unwrap();
    it.seek_to_first();
    let mut out = BTreeMap::new();
    while it.valid() {
        out.insert(it.key().to_vec(), it.value().to_vec());
        it.next();
    }
    it.status().unwrap();
    out
}

struct Engine {
    fs: SharedFs,
    db: Arc<Db>,
}

fn open(bucket: &Arc<dyn ObjectStore>, prefix: &str, fs: Option<SharedFs>) -> Engine {
    open_with(bucket, prefix, fs, opts())
}

fn open_with(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    fs: Option<SharedFs>,
    opts: Options,
) -> Engine {
    let fs: SharedFs = fs.unwrap_or_else(|| Arc::new(MemFs::new()));
    let store: SharedTableStore =
        Arc::new(ObjectTableStore::new(Arc::clone(bucket), prefix).unwrap());
    let db =
        Db::open_with_store(Arc::clone(&fs), Path::new("/db"), Arc::clone(&store), opts).unwrap();
    Engine { fs, db }
}

/// Random writes to groups `G - 1 ..= G + 1` of `db`, with flushes and compactions
/// between, so the groups end up spread over every kind of source.
fn churn(rng: &mut ChaCha8Rng, db: &Db, ops: usize, tag: &str) {
    let wo = WriteOptions::default();
    for n in 0..ops {
        let g = G - 1 + rng.gen_range(0..3u64);
        let i = rng.gen_range(0..400u32);
        match rng.gen_range(0..100) {
            0..70 => {
                let len = rng.gen_range(1..300);
                let v = format!("{tag}-{n}-{}", "v".repeat(len));
                db.put(&wo, &key(g, i), v.as_bytes()).unwrap();
            }
            70..90 => db.delete(&wo, &key(g, i)).unwrap(),
            90..95 => {
                let end = i + rng.gen_range(1..40);
                db.delete_range(&wo, &key(g, i), &key(g, end)).unwrap();
            }
            95..98 => db.flush().unwrap(),
            _ => db
                .compact_range(Some(&key(g, 0)), Some(&key(g, 400)))
                .unwrap(),
        }
    }
    db.put(&wo, &sys_key(G, "applied"), tag.as_bytes()).unwrap();
}

fn write_rest(
    source: &Db,
    export: &mut phoenix_engine::GroupExport,
    fs: &SharedFs,
    path: &Path,
) -> u64 {
    fs.create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = SstWriter::create(fs, path, &Options::default().table).unwrap();
    let n = source
        .write_group_rest(export, &always_from(G), |e| match e {
            RestEntry::Put(k, v) => w.put(k, v),
            RestEntry::Delete(k) => w.delete(k),
            RestEntry::DeleteRange(s, e) => w.delete_range(s, e),
        })
        .unwrap();
    w.finish().unwrap();
    n
}

fn run(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open(&bucket, "node-b", None);
    churn(&mut rng, &a.db, 3000, "a");
    churn(&mut rng, &b.db, 1500, "b");
    // Some runs move everything of the group below L0 first, some leave it spread.
    let compacted = seed.is_multiple_of(3);
    if compacted {
        a.db.compact_range(None, None).unwrap();
    }
    let b_others: Vec<_> = [G - 1, G + 1]
        .iter()
        .map(|&g| group(&b.db, g, None))
        .collect();

    let mut export = a.db.export_group(G).unwrap();
    let want = group(&a.db, G, Some(export.snapshot()));
    // Writes after the export are not the snapshot's: they must not travel.
    churn(&mut rng, &a.db, 500, "late");
    let rest_path = PathBuf::from("/snap/rest.sst");
    let rest = write_rest(&a.db, &mut export, &b.fs, &rest_path);
    assert!(
        !export.tables().is_empty() || !compacted,
        "seed {seed}: a compacted group exports no table"
    );
    if compacted {
        // Everything below L0: the rest is the system key and what the compaction's
        // output files hold of other sources (nothing).
        assert_eq!(rest, 1, "seed {seed}: rest of a fully compacted group");
    }
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    assert_eq!(copied.len(), export.tables().len());
    b.db.replace_group_with_copies(G, copied, &[rest_path])
        .unwrap();
    drop(export);

    let check = |db: &Db, what: &str, want: &BTreeMap<Vec<u8>, Vec<u8>>| {
        let got = group(db, G, None);
        if &got != want {
            let missing: Vec<_> = want
                .keys()
                .filter(|k| !got.contains_key(*k))
                .take(3)
                .collect();
            let extra: Vec<_> = got
                .keys()
                .filter(|k| !want.contains_key(*k))
                .take(3)
                .collect();
            let differ: Vec<_> = want
                .iter()
                .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
                .map(|(k, _)| k)
                .take(3)
                .collect();
            panic!(
                "seed {seed}: {what}: group differs from the snapshot ({} keys vs {}): \
                 missing {missing:?}, extra {extra:?}, different {differ:?}",
                got.len(),
                want.len()
            );
        }
        for (i, &g) in [G - 1, G + 1].iter().enumerate() {
            assert_eq!(
                group(db, g, None),
                b_others[i],
                "seed {seed}: {what}: group {g}"
            );
        }
    };
    check(&b.db, "after the copy", &want);

    // Writes over the copies are newer than them, through compactions too.
    let mut want = want;
    let wo = WriteOptions::default();
    for i in (0..400).step_by(7) {
        let v = format!("after-{i}");
        b.db.put(&wo, &key(G, i), v.as_bytes()).unwrap();
        want.insert(key(G, i), v.into_bytes());
    }
    for i in (3..400).step_by(11) {
        b.db.delete(&wo, &key(G, i)).unwrap();
        want.remove(&key(G, i));
    }
    check(&b.db, "after writes", &want);
    b.db.compact_range(None, None).unwrap();
    check(&b.db, "after a full compaction", &want);

    // A reopen reads the same.
    b.db.close().unwrap();
    drop(b.db);
    let b = open(&bucket, "node-b", Some(b.fs));
    check(&b.db, "after a reopen", &want);
    // The source is unchanged by the copies made of its tables.
    a.db.compact_range(None, None).unwrap();
    b.db.close().unwrap();
    a.db.close().unwrap();
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_copied_group_reads_as_the_snapshot() {
    let _turn = turn();
    let base = env_u64("PHOENIX_SEED", 1);
    let runs = env_u64("PHOENIX_GROUP_COPY_RUNS", 12);
    for seed in base..base + runs {
        let r = std::panic::catch_unwind(|| run(seed));
        if let Err(e) = r {
            eprintln!(
                "group copy run failed; replay with: PHOENIX_SEED={seed} \
                 PHOENIX_GROUP_COPY_RUNS=1 cargo test -p phoenix-engine --test group_copy -- \
                 --exact a_copied_group_reads_as_the_snapshot"
            );
            std::panic::resume_unwind(e);
        }
    }
}

/// Table objects under `prefix`.
fn tables_under(bucket: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let p = object_store::path::Path::from(prefix);
    let mut v: Vec<String> = rt
        .block_on(bucket.list(Some(&p)).try_collect::<Vec<_>>())
        .unwrap()
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|n| n.ends_with(".sst"))
        .collect();
    v.sort();
    v
}

#[test]
fn copies_not_installed_leave_nothing_behind() {
    let _turn = turn();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open(&bucket, "node-b", None);
    churn(&mut rng, &a.db, 2000, "a");
    a.db.compact_range(None, None).unwrap();
    b.db.put(&WriteOptions::default(), &key(G, 1), b"b's own")
        .unwrap();
    b.db.flush().unwrap();
    let before = tables_under(&bucket, "node-b");
    let export = a.db.export_group(G).unwrap();
    assert!(!export.tables().is_empty());

    // Dropped without an install: the copies go.
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    assert!(tables_under(&bucket, "node-b").len() > before.len());
    drop(copied);
    assert_eq!(
        tables_under(&bucket, "node-b"),
        before,
        "copies left after a drop"
    );

    // A crash between the copies and the install: the next open removes them.
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    std::mem::forget(copied);
    drop(b.db);
    let b = open(&bucket, "node-b", Some(b.fs));
    assert_eq!(
        tables_under(&bucket, "node-b"),
        before,
        "copies left after a crash"
    );
    assert_eq!(
        b.db.get(&ReadOptions::default(), &key(G, 1))
            .unwrap()
            .as_deref(),
        Some(&b"b's own"[..])
    );

    // An install that cannot go through (the rest is not the group's) keeps the
    // group as it was and leaves no copy behind.
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    let wrong = PathBuf::from("/snap/wrong.sst");
    b.fs.create_dir_all(Path::new("/snap")).unwrap();
    let mut w = SstWriter::create(&b.fs, &wrong, &Options::default().table).unwrap();
    w.put(&key(G + 1, 1), b"x").unwrap();
    w.finish().unwrap();
    let e =
        b.db.replace_group_with_copies(G, copied, &[wrong])
            .unwrap_err();
    assert!(e.to_string().contains("outside group"), "{e}");
    assert_eq!(tables_under(&bucket, "node-b"), before);
    assert_eq!(
        b.db.get(&ReadOptions::default(), &key(G, 1))
            .unwrap()
            .as_deref(),
        Some(&b"b's own"[..])
    );
    b.db.close().unwrap();
    a.db.close().unwrap();
}

#[test]
fn copies_are_refused_between_stores_that_cannot_share_tables() {
    let _turn = turn();
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    a.db.put(&WriteOptions::default(), &key(G, 1), b"v")
        .unwrap();
    a.db.compact_range(None, None).unwrap();
    let export = a.db.export_group(G).unwrap();
    assert_eq!(export.tables().len(), 1);

    // Another bucket.
    let other: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let c = open(&other, "node-c", None);
    let e =
        c.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap_err();
    assert!(e.to_string().contains("cannot be copied"), "{e}");
    assert!(tables_under(&other, "node-c").is_empty());

    // A local engine exports nothing.
    let local = Db::open(Arc::new(MemFs::new()), Path::new("/db"), opts()).unwrap();
    let e = local.export_group(G).unwrap_err();
    assert!(e.to_string().contains("cannot be copied"), "{e}");

    // A peer naming something else than a table, or a table of another group.
    let b = open(&bucket, "node-b", None);
    let mut bad = export.tables().to_vec();
    bad[0].object = "node-a/CURRENT".into();
    let e = b.db.copy_in_group(G, export.store_id(), &bad).unwrap_err();
    assert!(e.to_string().contains("does not name a table"), "{e}");
    let e =
        b.db.copy_in_group(G + 1, export.store_id(), export.tables())
            .unwrap_err();
    assert!(e.to_string().contains("not group 3 alone"), "{e}");
    let mut bad = export.tables().to_vec();
    bad[0].size += 1;
    let e = b.db.copy_in_group(G, export.store_id(), &bad).unwrap_err();
    assert!(e.to_string().contains("bytes"), "{e}");
    assert!(
        tables_under(&bucket, "node-b").is_empty(),
        "a refused copy stays"
    );
}

/// An engine whose groups share tables below L0 (`min_group_file_size`) may hold a table
/// spanning the copied group at a copy's level, where the install could not place the
/// copy: the copy is refused before raft hears of it (the snapshot is streamed instead).
#[test]
fn a_copy_that_would_not_fit_is_refused_before_the_install() {
    let _turn = turn();
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open_with(
        &bucket,
        "node-b",
        None,
        Options {
            min_group_file_size: 1 << 30,
            ..opts()
        },
    );
    let wo = WriteOptions::default();
    for g in [G - 1, G, G + 1] {
        for i in 0..20 {
            b.db.put(&wo, &key(g, i), b"b").unwrap();
        }
    }
    for i in 0..20 {
        a.db.put(&wo, &key(G, i), b"a").unwrap();
    }
    a.db.compact_range(None, None).unwrap();
    b.db.compact_range(None, None).unwrap();
    let before = tables_under(&bucket, "node-b");
    let export = a.db.export_group(G).unwrap();
    assert!(!export.tables().is_empty());
    let e =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    assert_eq!(
        tables_under(&bucket, "node-b"),
        before,
        "a refused copy stays"
    );

    // A table reaching into the group from one side alone is rewritten without it by the
    // install: the copy fits.
    let c = open_with(
        &bucket,
        "node-c",
        None,
        Options {
            min_group_file_size: 1 << 30,
            ..opts()
        },
    );
    for g in [G - 1, G] {
        for i in 0..20 {
            c.db.put(&wo, &key(g, i), b"c").unwrap();
        }
    }
    c.db.compact_range(None, None).unwrap();
    a.db.put(&wo, &sys_key(G, "applied"), b"a").unwrap();
    let want = copy_group(&a, &c, Path::new("/snap/rest.sst"));
    assert!(
        group(&c.db, G, None) == want,
        "the copy differs from the snapshot"
    );
    assert_eq!(group(&c.db, G - 1, None).len(), 20, "the neighbour group");
    c.db.close().unwrap();
    b.db.close().unwrap();
    a.db.close().unwrap();
}

/// A range deletion over most of the copied tables (a split's cut, a wide DeleteRange
/// not yet compacted down) travels as a few range tombstones in the rest, not as a
/// deletion per key; and the copy reads as the snapshot.
#[test]
fn a_wide_range_deletion_travels_as_a_range_not_per_key() {
    let _turn = turn();
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open(&bucket, "node-b", None);
    let wo = WriteOptions::default();
    for i in 0..3000 {
        a.db.put(&wo, &key(G, i), format!("a-{i}").as_bytes())
            .unwrap();
    }
    a.db.compact_range(None, None).unwrap();
    // Two deletions over the copies (the second partly over the first), and a write
    // back inside each.
    a.db.delete_range(&wo, &key(G, 10), &key(G, 2000)).unwrap();
    a.db.put(&wo, &key(G, 500), b"back").unwrap();
    a.db.delete_range(&wo, &key(G, 1500), &key(G, 2900))
        .unwrap();
    a.db.put(&wo, &key(G, 2500), b"back too").unwrap();
    a.db.put(&wo, &sys_key(G, "applied"), b"a").unwrap();

    let mut export = a.db.export_group(G).unwrap();
    assert!(!export.tables().is_empty());
    let want = group(&a.db, G, Some(export.snapshot()));
    assert_eq!(want.len(), 10 + 100 + 3, "the snapshot's group");
    let rest_path = PathBuf::from("/snap/rest.sst");
    let rest = write_rest(&a.db, &mut export, &b.fs, &rest_path);
    assert!(
        rest <= 8,
        "the rest holds {rest} entries for 2 range deletions, 2 writes and 1 system key"
    );
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    b.db.replace_group_with_copies(G, copied, &[rest_path])
        .unwrap();
    assert!(
        group(&b.db, G, None) == want,
        "the copy differs from the snapshot"
    );
    b.db.compact_range(None, None).unwrap();
    assert!(
        group(&b.db, G, None) == want,
        "the copy differs after a compaction"
    );
    b.db.close().unwrap();
    a.db.close().unwrap();
}

/// Once the rest is written, an export keeps its tables on the store and nothing else:
/// the tables compactions replace meanwhile (the copies can take minutes) are deleted
/// as usual; the copied ones stay until the export goes.
#[test]
fn an_export_keeps_only_its_tables_once_the_rest_is_written() {
    let _turn = turn();
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open(&bucket, "node-b", None);
    let wo = WriteOptions::default();
    for i in 0..400 {
        a.db.put(&wo, &key(G, i), format!("a-{i}").as_bytes())
            .unwrap();
        a.db.put(&wo, &key(G + 1, i), b"next").unwrap();
    }
    a.db.put(&wo, &sys_key(G, "applied"), b"a").unwrap();
    a.db.compact_range(None, None).unwrap();
    // Tables of other groups in L0 and below when the export is taken.
    a.db.put(&wo, &key(G - 1, 0), b"other").unwrap();
    a.db.flush().unwrap();
    let mut export = a.db.export_group(G).unwrap();
    let rest_path = PathBuf::from("/snap/rest.sst");
    write_rest(&a.db, &mut export, &b.fs, &rest_path);
    // Every group is rewritten: the tables of the export's time leave the version.
    for i in 0..400 {
        a.db.put(&wo, &key(G, i), b"later").unwrap();
        a.db.put(&wo, &key(G - 1, i), b"other").unwrap();
        a.db.put(&wo, &key(G + 1, i), b"next, later").unwrap();
    }
    a.db.flush().unwrap();
    a.db.compact_range(None, None).unwrap();
    let live: usize = a.db.stats().levels.iter().map(|l| l.files).sum();
    let stored = tables_under(&bucket, "node-a").len();
    assert_eq!(
        stored,
        live + export.tables().len(),
        "tables on the store: the live ones and the export's"
    );
    let copied =
        b.db.copy_in_group(G, export.store_id(), export.tables())
            .unwrap();
    b.db.replace_group_with_copies(G, copied, &[rest_path])
        .unwrap();
    drop(export);
    assert_eq!(
        tables_under(&bucket, "node-a").len(),
        live,
        "the export's tables stay once it is gone"
    );
    b.db.close().unwrap();
    a.db.close().unwrap();
}

/// Copies group `G` of `from` into `to` (export, rest, copy, install).
fn copy_group(from: &Engine, to: &Engine, rest_path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut export = from.db.export_group(G).unwrap();
    let want = group(&from.db, G, Some(export.snapshot()));
    write_rest(&from.db, &mut export, &to.fs, rest_path);
    let copied = to
        .db
        .copy_in_group(G, export.store_id(), export.tables())
        .unwrap();
    to.db
        .replace_group_with_copies(G, copied, &[rest_path.to_path_buf()])
        .unwrap();
    want
}

/// Group `G` on `a` (below L0: tables to copy), a newer value of one key in a memtable;
/// `b` holds older values of the same keys.
fn two_engines() -> (Engine, Engine) {
    let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = open(&bucket, "node-a", None);
    let b = open(&bucket, "node-b", None);
    let wo = WriteOptions::default();
    for i in 0..50 {
        a.db.put(&wo, &key(G, i), format!("a-{i}").as_bytes())
            .unwrap();
        b.db.put(&wo, &key(G, i), format!("b-{i}").as_bytes())
            .unwrap();
    }
    b.db.put(&wo, &sys_key(G, "applied"), b"b").unwrap();
    a.db.compact_range(None, None).unwrap();
    b.db.compact_range(None, None).unwrap();
    a.db.put(&wo, &key(G, 1), b"a-newest").unwrap();
    a.db.put(&wo, &sys_key(G, "applied"), b"a").unwrap();
    (a, b)
}

/// A write that lands while the export pins its state (here: the memtable flushed, then
/// a group key overwritten in the new one) is in the copy exactly when the export's
/// snapshot holds it.
#[test]
fn a_write_racing_the_export_travels_iff_its_snapshot_holds_it() {
    let _turn = turn();
    let (a, b) = two_engines();
    let db = Arc::clone(&a.db);
    let raced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = Arc::clone(&raced);
    fail::cfg_callback("engine::export_group::between", move || {
        if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            db.flush().unwrap();
            db.put(&WriteOptions::default(), &key(G, 7), b"raced")
                .unwrap();
        }
    })
    .unwrap();
    let want = copy_group(&a, &b, Path::new("/snap/rest.sst"));
    fail::remove("engine::export_group::between");
    assert!(
        raced.load(std::sync::atomic::Ordering::SeqCst),
        "no race made"
    );
    let got = group(&b.db, G, None);
    let show = |m: &BTreeMap<Vec<u8>, Vec<u8>>| {
        m.get(&key(G, 7))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert!(
        got == want,
        "the copy differs from the export's snapshot: key 7 is {:?}, the snapshot's {:?}",
        show(&got),
        show(&want)
    );
    b.db.close().unwrap();
    a.db.close().unwrap();
}

/// A reader of the group while the copies are installed sees it as it was or as the
/// copy made it, never the copies without the rest above them.
#[test]
fn a_reader_during_the_install_sees_the_group_before_or_after_it() {
    let _turn = turn();
    let (a, b) = two_engines();
    let before = group(&b.db, G, None);
    type Seen = Vec<Option<BTreeMap<Vec<u8>, Vec<u8>>>>;
    let seen: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let (db, seen2) = (Arc::clone(&b.db), Arc::clone(&seen));
    fail::cfg_callback("engine::replace_group::published_half", move || {
        // From another thread: the installer holds the engine's locks here.
        let db = Arc::clone(&db);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(group(&db, G, None));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10)).ok();
        seen2.lock().unwrap().push(got);
    })
    .unwrap();
    let want = copy_group(&a, &b, Path::new("/snap/rest.sst"));
    fail::remove("engine::replace_group::published_half");
    assert_eq!(group(&b.db, G, None), want);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len(), 1, "the install passed its failpoint once");
    for got in seen {
        let got = got.expect("a reader blocked during the install");
        assert!(
            got == before || got == want,
            "a reader during the install saw {} keys, neither the {} before nor the {} after \
             (newest key: {:?})",
            got.len(),
            before.len(),
            want.len(),
            got.get(&key(G, 1))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        );
    }
    b.db.close().unwrap();
    a.db.close().unwrap();
}
