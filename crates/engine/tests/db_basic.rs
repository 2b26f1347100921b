//! Behaviour of the Db on MemFs: reads after writes, deletes, range deletes, snapshots,
//! iterators both ways, flush, compaction, reopen, and the WAL off mode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use phoenix_engine::{Db, Options, ReadOptions, WalMode, WriteBatch, WriteOptions};
use phoenix_storage::{MemFs, SharedFs};

fn small_opts(wal: WalMode) -> Options {
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

fn fs() -> (Arc<MemFs>, SharedFs) {
    let m = Arc::new(MemFs::new());
    let s: SharedFs = m.clone();
    (m, s)
}

fn scan(db: &Db, ro: &ReadOptions<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut it = db.iter(ro).unwrap();
    it.seek_to_first();
    let mut out = Vec::new();
    while it.valid() {
        out.push((it.key().to_vec(), it.value().to_vec()));
        it.next();
    }
    it.status().unwrap();
    out
}

fn scan_rev(db: &Db, ro: &ReadOptions<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut it = db.iter(ro).unwrap();
    it.seek_to_last();
    let mut out = Vec::new();
    while it.valid() {
        out.push((it.key().to_vec(), it.value().to_vec()));
        it.prev();
    }
    it.status().unwrap();
    out.reverse();
    out
}

#[test]
fn put_get_delete_and_range_delete() {
    let (_m, fs) = fs();
    let db = Db::open(fs, Path::new("/db"), small_opts(WalMode::None)).unwrap();
    let wo = WriteOptions::default();
    let ro = ReadOptions::default();
    db.put(&wo, b"a", b"1").unwrap();
    db.put(&wo, b"b", b"2").unwrap();
    db.put(&wo, b"c", b"3").unwrap();
    assert_eq!(db.get(&ro, b"b").unwrap(), Some(b"2".to_vec()));
    db.delete(&wo, b"b").unwrap();
    assert_eq!(db.get(&ro, b"b").unwrap(), None);
    db.delete_range(&wo, b"a", b"c").unwrap();
    assert_eq!(db.get(&ro, b"a").unwrap(), None);
    assert_eq!(db.get(&ro, b"c").unwrap(), Some(b"3".to_vec()));
    db.put(&wo, b"a", b"again").unwrap();
    assert_eq!(db.get(&ro, b"a").unwrap(), Some(b"again".to_vec()));
    db.flush().unwrap();
    assert_eq!(db.get(&ro, b"a").unwrap(), Some(b"again".to_vec()));
    assert_eq!(db.get(&ro, b"b").unwrap(), None);
    assert_eq!(db.get_persisted(b"c").unwrap(), Some(b"3".to_vec()));
    assert_eq!(
        scan(&db, &ro),
        vec![
            (b"a".to_vec(), b"again".to_vec()),
            (b"c".to_vec(), b"3".to_vec())
        ]
    );
    let mut bad = WriteBatch::new();
    bad.delete_range(b"z", b"a");
    assert!(db.write(&wo, bad).is_err());
    assert!(db.put(&wo, &vec![0u8; 70_000], b"").is_err());
}

#[test]
fn snapshots_and_iterators_survive_flush_and_compaction() {
    let (_m, fs) = fs();
    let db = Db::open(fs, Path::new("/db"), small_opts(WalMode::None)).unwrap();
    let wo = WriteOptions::default();
    for i in 0..2000u32 {
        db.put(
            &wo,
            format!("k{i:05}").as_bytes(),
            format!("v1-{i}").as_bytes(),
        )
        .unwrap();
    }
    let snap = db.snapshot();
    for i in (0..2000u32).step_by(2) {
        db.put(
            &wo,
            format!("k{i:05}").as_bytes(),
            format!("v2-{i}").as_bytes(),
        )
        .unwrap();
    }
    db.delete_range(&wo, b"k00100", b"k00200").unwrap();
    db.compact_range(None, None).unwrap();
    let ro = ReadOptions::default();
    let old = ReadOptions {
        snapshot: Some(&snap),
        ..Default::default()
    };
    assert_eq!(db.get(&old, b"k00150").unwrap(), Some(b"v1-150".to_vec()));
    assert_eq!(db.get(&ro, b"k00150").unwrap(), None);
    assert_eq!(db.get(&ro, b"k00300").unwrap(), Some(b"v2-300".to_vec()));
    assert_eq!(db.get(&ro, b"k00301").unwrap(), Some(b"v1-301".to_vec()));
    let now = scan(&db, &ro);
    assert_eq!(now.len(), 1900);
    assert_eq!(scan_rev(&db, &ro), now);
    let then = scan(&db, &old);
    assert_eq!(then.len(), 2000);
    assert!(then.iter().all(|(_, v)| v.starts_with(b"v1-")));
    assert_eq!(scan_rev(&db, &old), then);
    // Bounds.
    let bounded = ReadOptions {
        lower_bound: Some(b"k00190".to_vec()),
        upper_bound: Some(b"k00205".to_vec()),
        ..Default::default()
    };
    let b: Vec<_> = scan(&db, &bounded).into_iter().map(|(k, _)| k).collect();
    let want: Vec<Vec<u8>> = (200..205)
        .map(|i| format!("k{i:05}").into_bytes())
        .collect();
    assert_eq!(b, want);
    assert_eq!(
        scan_rev(&db, &bounded)
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>(),
        want
    );
    let stats = db.stats();
    assert!(
        stats.levels.iter().skip(1).any(|l| l.files > 0),
        "{stats:?}"
    );
    drop(snap);
    db.compact_range(None, None).unwrap();
    assert_eq!(scan(&db, &ro), now);
}

#[test]
fn reopen_recovers_with_wal_and_without() {
    for wal in [WalMode::Log, WalMode::None] {
        let (m, fs) = fs();
        {
            let db = Db::open(fs.clone(), Path::new("/db"), small_opts(wal.clone())).unwrap();
            let wo = WriteOptions {
                sync: true,
                ..Default::default()
            };
            for i in 0..500u32 {
                db.put(&wo, format!("key{i}").as_bytes(), &[b'x'; 100])
                    .unwrap();
            }
            db.delete(&wo, b"key7").unwrap();
            if wal == WalMode::None {
                db.flush().unwrap();
            }
            // Crash without a clean close.
            m.crash();
            std::mem::forget(db);
        }
        let db = Db::open(fs.clone(), Path::new("/db2"), small_opts(wal.clone()));
        drop(db);
        let db = Db::open(fs, Path::new("/db"), small_opts(wal.clone())).unwrap();
        let ro = ReadOptions::default();
        assert_eq!(
            db.get(&ro, b"key8").unwrap(),
            Some(vec![b'x'; 100]),
            "{wal:?}"
        );
        assert_eq!(db.get(&ro, b"key7").unwrap(), None);
        assert_eq!(db.get(&ro, b"key499").unwrap(), Some(vec![b'x'; 100]));
        db.close().unwrap();
    }
}

#[test]
fn concurrent_writers_group_commit() {
    let (_m, fs) = fs();
    let db = Db::open(fs, Path::new("/db"), small_opts(WalMode::Log)).unwrap();
    let mut hs = Vec::new();
    for t in 0..4u32 {
        let db = Arc::clone(&db);
        hs.push(std::thread::spawn(move || {
            for i in 0..500u32 {
                let mut b = WriteBatch::new();
                b.put(format!("t{t}-{i:04}").as_bytes(), b"a");
                b.put(format!("u{t}-{i:04}").as_bytes(), b"b");
                db.write(&WriteOptions::default(), b).unwrap();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    let all = scan(&db, &ReadOptions::default());
    assert_eq!(all.len(), 4000);
    assert_eq!(db.latest_sequence(), 4000);
}

#[test]
fn readers_and_writers_during_background_compaction() {
    let (_m, fs) = fs();
    let db = Db::open(
        fs,
        Path::new("/db"),
        Options {
            write_buffer_size: 8 << 10,
            target_file_size_base: 4 << 10,
            max_bytes_for_level_base: 32 << 10,
            level0_file_num_compaction_trigger: 2,
            num_levels: 4,
            max_background_jobs: 4,
            wal_segment_size: 256 << 10,
            ..Options::default()
        },
    )
    .unwrap();
    // Stable keys that readers check while writers churn other keys.
    let wo = WriteOptions::default();
    for i in 0..300u32 {
        db.put(&wo, format!("stable{i:04}").as_bytes(), b"s")
            .unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut hs = Vec::new();
    for t in 0..2u32 {
        let db = Arc::clone(&db);
        hs.push(std::thread::spawn(move || {
            for i in 0..3000u32 {
                let k = format!("churn{:04}", (i * 7 + t) % 500);
                db.put(&WriteOptions::default(), k.as_bytes(), &[b'c'; 64])
                    .unwrap();
                if i % 50 == 0 {
                    db.delete_range(&WriteOptions::default(), b"churn0100", b"churn0150")
                        .unwrap();
                }
            }
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let db = Arc::clone(&db);
        let stop = Arc::clone(&stop);
        readers.push(std::thread::spawn(move || {
            let ro = ReadOptions::default();
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 3 {
                for i in (0..300u32).step_by(13) {
                    assert_eq!(
                        db.get(&ro, format!("stable{i:04}").as_bytes()).unwrap(),
                        Some(b"s".to_vec())
                    );
                }
                let bounded = ReadOptions {
                    lower_bound: Some(b"stable".to_vec()),
                    upper_bound: Some(b"stablf".to_vec()),
                    ..Default::default()
                };
                assert_eq!(scan(&db, &bounded).len(), 300);
                assert_eq!(scan_rev(&db, &bounded).len(), 300);
                rounds += 1;
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let s = db.stats();
    assert!(s.compactions > 0 && s.flushes > 0, "{s:?}");
    db.close().unwrap();
}

#[test]
fn open_deletes_files_the_manifest_does_not_name() {
    let (m, fs) = fs();
    let dir = Path::new("/db");
    {
        let db = Db::open(fs.clone(), dir, small_opts(WalMode::None)).unwrap();
        db.put(&WriteOptions::default(), b"k", b"v").unwrap();
        db.flush().unwrap();
        db.close().unwrap();
    }
    for stray in ["999999.sst", "MANIFEST-999998", "CURRENT.tmp"] {
        let mut f = fs.create(&dir.join(stray), Default::default()).unwrap();
        f.append(b"half-written").unwrap();
        f.sync_all().unwrap();
    }
    fs.sync_dir(dir).unwrap();
    let db = Db::open(fs.clone(), dir, small_opts(WalMode::None)).unwrap();
    let names = fs.list(dir).unwrap();
    for stray in ["999999.sst", "MANIFEST-999998", "CURRENT.tmp"] {
        assert!(
            !names.iter().any(|n| n == stray),
            "{stray} survived: {names:?}"
        );
    }
    assert_eq!(
        db.get(&ReadOptions::default(), b"k").unwrap(),
        Some(b"v".to_vec())
    );
    db.close().unwrap();
    drop(m);
}

/// `check_group_files` takes the files a group's replacement is built from and refuses
/// what the ingest would: a byte changed anywhere (checksum, naming the file), a key of
/// another group, an empty file, two files that overlap.
#[test]
fn group_files_are_checked_as_the_ingest_checks_them() {
    let (_m, fs) = fs();
    let table = small_opts(WalMode::None).table;
    let key = |g: u64, i: u32| {
        let mut k = g.to_be_bytes().to_vec();
        k.extend_from_slice(format!("k{i:04}").as_bytes());
        k
    };
    let write = |name: &str, keys: &mut dyn Iterator<Item = Vec<u8>>| {
        let path = Path::new("/").join(name);
        let mut w = phoenix_engine::SstWriter::create(&fs, &path, &table).unwrap();
        for k in keys {
            w.put(&k, &[b'v'; 40]).unwrap();
        }
        w.finish().unwrap();
        path
    };
    let a = write("a.sst", &mut (0..300).map(|i| key(7, i)));
    let b = write("b.sst", &mut (300..600).map(|i| key(7, i)));
    phoenix_engine::check_group_files(&fs, 7, &[a.clone(), b.clone()]).unwrap();
    let refused = |paths: &[std::path::PathBuf], want: &str| {
        let err = phoenix_engine::check_group_files(&fs, 7, paths).unwrap_err();
        assert!(err.to_string().contains(want), "want {want:?}: {err}");
    };
    let other = write("other.sst", &mut (0..10).map(|i| key(8, i)));
    refused(&[a.clone(), other], "outside group 7");
    let overlap = write("overlap.sst", &mut (250..350).map(|i| key(7, i)));
    refused(&[a.clone(), overlap], "overlap");
    let empty = write("empty.sst", &mut std::iter::empty());
    refused(&[empty], "no entries");
    for at in [10usize, 4000, 12000] {
        let mut data = fs.read_all(&a).unwrap();
        data[at] ^= 0x5a;
        let bad = Path::new("/bad.sst");
        let mut f = fs.create(bad, Default::default()).unwrap();
        f.append(&data).unwrap();
        f.sync_all().unwrap();
        refused(&[bad.to_path_buf()], "bad.sst");
    }
}

#[test]
fn corrupt_table_is_reported_with_file_and_offset() {
    let (m, fs) = fs();
    let dir = Path::new("/db");
    let db = Db::open(fs.clone(), dir, small_opts(WalMode::None)).unwrap();
    for i in 0..200u32 {
        db.put(
            &WriteOptions::default(),
            format!("k{i:04}").as_bytes(),
            &[b'v'; 50],
        )
        .unwrap();
    }
    db.close().unwrap();
    drop(db);
    let sst = fs
        .list(dir)
        .unwrap()
        .into_iter()
        .find(|n| n.ends_with(".sst"))
        .unwrap();
    let path = dir.join(&sst);
    let mut data = fs.read_all(&path).unwrap();
    data[10] ^= 0xff;
    let mut f = fs.create(&path, Default::default()).unwrap();
    f.append(&data).unwrap();
    f.sync_all().unwrap();
    let db = Db::open(fs.clone(), dir, small_opts(WalMode::None)).unwrap();
    let mut it = db.iter(&ReadOptions::default()).unwrap();
    it.seek_to_first();
    while it.valid() {
        it.next();
    }
    let err = it.status().unwrap_err();
    assert!(err.is_corruption(), "{err}");
    assert!(err.to_string().contains(&sst), "{err}");
    drop(m);
}

#[test]
fn wal_off_refuses_a_database_with_unflushed_wal_entries() {
    let (_m, fs) = fs();
    let dir = Path::new("/db");
    {
        let db = Db::open(fs.clone(), dir, small_opts(WalMode::Log)).unwrap();
        db.put(&WriteOptions::default(), b"k", b"v").unwrap();
        db.close().unwrap();
    }
    let err = Db::open(fs.clone(), dir, small_opts(WalMode::None)).unwrap_err();
    assert!(
        matches!(err, phoenix_engine::Error::InvalidArgument(_)),
        "{err}"
    );
    {
        let db = Db::open(fs.clone(), dir, small_opts(WalMode::Log)).unwrap();
        db.flush().unwrap();
        db.close().unwrap();
    }
    let db = Db::open(fs, dir, small_opts(WalMode::None)).unwrap();
    assert_eq!(
        db.get(&ReadOptions::default(), b"k").unwrap(),
        Some(b"v".to_vec())
    );
    db.close().unwrap();
}

/// A write acknowledged with the WAL on and `sync` off is in the WAL file when `put`
/// returns (like RocksDB): a crash of the process right after (the file system freezes,
/// nothing more reaches it) loses none of them, though a power loss could.
#[test]
fn unsynced_writes_survive_a_process_crash() {
    let (m, fs) = fs();
    let opts = Options {
        write_buffer_size: 1 << 20,
        ..small_opts(WalMode::Log)
    };
    let db = Db::open(fs.clone(), Path::new("/db"), opts.clone()).unwrap();
    let wo = WriteOptions::default();
    assert!(!wo.sync && !wo.disable_wal);
    std::thread::scope(|s| {
        for t in 0..3u32 {
            let db = &db;
            let wo = &wo;
            s.spawn(move || {
                for i in 0..300u32 {
                    let k = format!("t{t}-k{i:04}");
                    db.put(wo, k.as_bytes(), k.as_bytes()).unwrap();
                }
            });
        }
    });
    m.freeze_after(0);
    let _ = db.close();
    drop(db);
    m.clear_faults();
    let db = Db::open(fs, Path::new("/db"), opts).unwrap();
    let ro = ReadOptions::default();
    for t in 0..3u32 {
        for i in 0..300u32 {
            let k = format!("t{t}-k{i:04}");
            assert_eq!(
                db.get(&ro, k.as_bytes()).unwrap().as_deref(),
                Some(k.as_bytes()),
                "{k} acknowledged, lost by a process crash"
            );
        }
    }
    db.close().unwrap();
}

/// `fill_cache = false` keeps scans out of the block cache; the default fills it.
#[test]
fn fill_cache_false_leaves_the_block_cache_alone() {
    let (_m, fs) = fs();
    let opts = Options {
        block_cache_size: 8 << 20,
        ..small_opts(WalMode::None)
    };
    let db = Db::open(fs, Path::new("/db"), opts).unwrap();
    let wo = WriteOptions::default();
    for i in 0..2000u32 {
        db.put(&wo, format!("k{i:05}").as_bytes(), &[7u8; 100])
            .unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None, None).unwrap();
    let before = db.stats().block_cache_usage;
    let cold = ReadOptions {
        fill_cache: false,
        ..ReadOptions::default()
    };
    assert_eq!(scan(&db, &cold).len(), 2000);
    for i in (0..2000u32).step_by(7) {
        assert!(db
            .get(&cold, format!("k{i:05}").as_bytes())
            .unwrap()
            .is_some());
    }
    assert_eq!(
        db.stats().block_cache_usage,
        before,
        "a fill_cache=false read filled the cache"
    );
    assert_eq!(scan(&db, &ReadOptions::default()).len(), 2000);
    assert!(
        db.stats().block_cache_usage > before + (100 << 10),
        "a default scan did not fill the cache"
    );
    db.close().unwrap();
}

/// An ingest over existing data (memtable, L0 and lower levels, a range tombstone) shadows
/// it, is invisible to an older snapshot, is durable across reopen in both WAL modes, and
/// later writes shadow it in turn.
#[test]
fn ingest_over_existing_data_takes_a_new_sequence() {
    for wal in [WalMode::Log, WalMode::None] {
        let (_m, fs) = fs();
        let dir = Path::new("/db");
        let db = Db::open(Arc::clone(&fs), dir, small_opts(wal.clone())).unwrap();
        let wo = WriteOptions::default();
        let ro = ReadOptions::default();
        let key = |i: u32| format!("k{i:04}").into_bytes();
        // Old data on several levels, then a memtable, then a range tombstone.
        for i in 0..400 {
            db.put(&wo, &key(i), b"old").unwrap();
        }
        db.compact_range(None, None).unwrap();
        for i in (0..400).step_by(3) {
            db.put(&wo, &key(i), b"newer").unwrap();
        }
        db.flush().unwrap();
        for i in (0..400).step_by(7) {
            db.put(&wo, &key(i), b"mem").unwrap();
        }
        db.delete_range(&wo, &key(390), &key(400)).unwrap();
        let before = scan(&db, &ro);
        let snap = db.snapshot();

        // The file: even keys 100..=398 get "ing"; 101 and 103 are deleted.
        let src = Path::new("/incoming.sst");
        let mut w =
            phoenix_engine::SstWriter::create(&fs, src, &small_opts(wal.clone()).table).unwrap();
        for i in 100..400 {
            if i == 101 || i == 103 {
                w.delete(&key(i)).unwrap();
            } else if i % 2 == 0 {
                w.put(&key(i), b"ing").unwrap();
            }
        }
        w.finish().unwrap();
        let seq_before = db.latest_sequence();
        db.ingest(&[src.to_path_buf()]).unwrap();
        assert!(
            db.latest_sequence() > seq_before,
            "ingest over data takes a sequence"
        );
        assert!(!fs.exists(src).unwrap(), "the source file is moved in");

        let mut want = std::collections::BTreeMap::new();
        for (k, v) in &before {
            want.insert(k.clone(), v.clone());
        }
        for i in 100..400 {
            if i == 101 || i == 103 {
                want.remove(&key(i));
            } else if i % 2 == 0 {
                want.insert(key(i), b"ing".to_vec());
            }
        }
        let want: Vec<_> = want.into_iter().collect();
        assert_eq!(
            scan(&db, &ro),
            want,
            "{wal:?}: ingested data shadows the old"
        );
        assert_eq!(scan_rev(&db, &ro), want);
        let at_snap = ReadOptions {
            snapshot: Some(&snap),
            ..Default::default()
        };
        assert_eq!(
            scan(&db, &at_snap),
            before,
            "{wal:?}: older snapshot sees no ingest"
        );
        assert_eq!(db.get(&at_snap, &key(104)).unwrap(), Some(b"old".to_vec()));
        assert_eq!(db.get(&ro, &key(104)).unwrap(), Some(b"ing".to_vec()));
        drop(snap);

        // A later write shadows the ingested value.
        db.put(&wo, &key(200), b"after").unwrap();
        assert_eq!(db.get(&ro, &key(200)).unwrap(), Some(b"after".to_vec()));
        db.flush().unwrap();
        db.compact_range(None, None).unwrap();
        let mut want = want;
        if let Some(e) = want.iter_mut().find(|(k, _)| *k == key(200)) {
            e.1 = b"after".to_vec();
        }
        assert_eq!(scan(&db, &ro), want);
        db.close().unwrap();
        drop(db);
        let db = Db::open(Arc::clone(&fs), dir, small_opts(wal.clone())).unwrap();
        assert_eq!(scan(&db, &ro), want, "{wal:?}: after reopen");
        db.put(&wo, &key(102), b"reopened").unwrap();
        assert_eq!(db.get(&ro, &key(102)).unwrap(), Some(b"reopened".to_vec()));
        db.close().unwrap();
    }
}

/// Writers keep writing into half of the ingested range during the ingest. The other
/// half (old values in the memtable) reads the ingested values; every key a writer wrote
/// after the ingest returned reads that write; nothing older than the ingest survives.
#[test]
fn ingest_with_concurrent_writers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_m, fs) = fs();
    let db =
        Arc::new(Db::open(Arc::clone(&fs), Path::new("/db"), small_opts(WalMode::None)).unwrap());
    let wo = WriteOptions::default();
    let key = |i: u32| format!("k{i:04}").into_bytes();
    for i in 0..200 {
        db.put(&wo, &key(i), b"old").unwrap();
    }
    let ingested = Arc::new(AtomicBool::new(false));
    // Writer t writes keys t, t+2, ... below 100; returns each key's last value and
    // whether that write began after the ingest had returned.
    let writers: Vec<_> = (0..2u32)
        .map(|t| {
            let db = Arc::clone(&db);
            let ingested = Arc::clone(&ingested);
            std::thread::spawn(move || {
                let mut last = std::collections::BTreeMap::new();
                let mut after = 0;
                let mut n = 0u32;
                // Every key of its half is written at least once after the ingest.
                while after < 100 {
                    let done = ingested.load(Ordering::Acquire);
                    let i = (n * 2 + t) % 100;
                    let v = format!("w{t}-{n}").into_bytes();
                    db.put(&WriteOptions::default(), &key(i), &v).unwrap();
                    last.insert(i, (v, done));
                    if done {
                        after += 1;
                    }
                    n += 1;
                }
                last
            })
        })
        .collect();
    let src = Path::new("/incoming.sst");
    let mut w =
        phoenix_engine::SstWriter::create(&fs, src, &small_opts(WalMode::None).table).unwrap();
    for i in 0..200 {
        w.put(&key(i), b"ing").unwrap();
    }
    w.finish().unwrap();
    db.ingest(&[src.to_path_buf()]).unwrap();
    ingested.store(true, Ordering::Release);
    let mut last = std::collections::BTreeMap::new();
    for h in writers {
        last.extend(h.join().unwrap());
    }
    let ro = ReadOptions::default();
    for i in 0..200 {
        let v = db.get(&ro, &key(i)).unwrap().unwrap();
        let shown = String::from_utf8_lossy(&v).into_owned();
        match last.get(&i) {
            None => assert_eq!(v, b"ing", "key {i} (not written) reads {shown}"),
            Some((w, true)) => assert_eq!(&v, w, "key {i}: a write after the ingest lost"),
            Some((w, false)) => assert!(v == b"ing" || &v == w, "key {i}: {shown}"),
        }
    }
    assert!(scan(&db, &ro).iter().all(|(_, v)| v != b"old"));
}

/// replace_group (and replace_group_by_tombstone) swaps one group's keys for a file's,
/// whatever levels and memtables held the old ones (including L0 files shared with other
/// groups and a range tombstone spanning groups); other groups are untouched; files with
/// keys of other groups are refused; the result survives a reopen. By tombstone, the old
/// keys stay on disk until a compaction drops them.
#[test]
fn replace_group_swaps_exactly_one_group() {
    let modes = [WalMode::Log, WalMode::None]
        .into_iter()
        .flat_map(|w| [(w.clone(), false), (w, true)]);
    for (wal, by_tombstone) in modes {
        let replace = |db: &Db, g: u64, paths: &[std::path::PathBuf]| {
            if by_tombstone {
                db.replace_group_by_tombstone(g, paths)
            } else {
                db.replace_group(g, paths)
            }
        };
        let (_m, fs) = fs();
        let dir = Path::new("/db");
        let db = Db::open(Arc::clone(&fs), dir, small_opts(wal.clone())).unwrap();
        let wo = WriteOptions::default();
        let ro = ReadOptions::default();
        let key = |g: u64, i: u32| {
            let mut k = g.to_be_bytes().to_vec();
            k.extend_from_slice(format!("d{i:04}").as_bytes());
            k
        };
        for round in 0..3u32 {
            for i in 0..300 {
                for g in 1..=3 {
                    db.put(&wo, &key(g, i), format!("old{round}").as_bytes())
                        .unwrap();
                }
            }
            if round == 0 {
                db.compact_range(None, None).unwrap();
            } else {
                db.flush().unwrap();
            }
        }
        // In the memtable: a range tombstone over the end of group 1 and the start of 2.
        db.delete_range(&wo, &key(1, 250), &key(2, 10)).unwrap();
        db.put(&wo, &key(2, 5), b"mem").unwrap();
        let others_before: Vec<_> = scan(&db, &ro)
            .into_iter()
            .filter(|(k, _)| !k.starts_with(&2u64.to_be_bytes()))
            .collect();

        let src = Path::new("/snapshot.sst");
        let table = small_opts(wal.clone()).table;
        let mut w = phoenix_engine::SstWriter::create(&fs, src, &table).unwrap();
        for i in (1000..1100).step_by(2) {
            w.put(&key(2, i), b"new").unwrap();
        }
        w.finish().unwrap();

        // A file holding another group's key is refused and changes nothing.
        let bad = Path::new("/bad.sst");
        let mut w = phoenix_engine::SstWriter::create(&fs, bad, &table).unwrap();
        w.put(&key(2, 1), b"x").unwrap();
        w.put(&key(3, 1), b"x").unwrap();
        w.finish().unwrap();
        let err = replace(&db, 2, &[bad.to_path_buf()]).unwrap_err();
        assert!(err.to_string().contains("outside group 2"), "{err}");

        replace(&db, 2, &[src.to_path_buf()]).unwrap();
        assert!(!fs.exists(src).unwrap(), "the source file is moved in");
        let check = |db: &Db, when: &str| {
            let all = scan(db, &ro);
            let g2: Vec<_> = all
                .iter()
                .filter(|(k, _)| k.starts_with(&2u64.to_be_bytes()))
                .cloned()
                .collect();
            let want: Vec<_> = (1000..1100)
                .step_by(2)
                .map(|i| (key(2, i), b"new".to_vec()))
                .collect();
            assert_eq!(
                g2, want,
                "{wal:?} {when}: group 2 holds exactly the new keys"
            );
            let others: Vec<_> = all
                .into_iter()
                .filter(|(k, _)| !k.starts_with(&2u64.to_be_bytes()))
                .collect();
            assert_eq!(
                others, others_before,
                "{wal:?} {when}: other groups untouched"
            );
            assert_eq!(db.get(&ro, &key(2, 5)).unwrap(), None);
            assert_eq!(db.get(&ro, &key(2, 1000)).unwrap(), Some(b"new".to_vec()));
        };
        check(&db, "after replace");
        if by_tombstone {
            // The old keys (300 a round) are still in the tables; a compaction drops them.
            let entries = |db: &Db| db.group_sizes().unwrap().get(&2).map_or(0, |s| s.entries);
            let before = entries(&db);
            db.compact_range(None, None).unwrap();
            let after = entries(&db);
            assert!(
                before >= after + 300,
                "{wal:?}: old keys on disk until compacted ({before} -> {after} entries)"
            );
            check(&db, "after the tombstone's compaction");
        }
        // Later writes to the group win over the replaced data.
        db.put(&wo, &key(2, 1000), b"later").unwrap();
        assert_eq!(db.get(&ro, &key(2, 1000)).unwrap(), Some(b"later".to_vec()));
        db.delete(&wo, &key(2, 1000)).unwrap();
        db.compact_range(None, None).unwrap();
        db.put(&wo, &key(2, 1000), b"new").unwrap();
        check(&db, "after compaction");
        db.close().unwrap();
        drop(db);
        let db = Db::open(Arc::clone(&fs), dir, small_opts(wal.clone())).unwrap();
        check(&db, "after reopen");
        db.close().unwrap();
    }
}

/// Reads (block reads once the tables are open) an operation makes on `m`.
fn reads_during(m: &MemFs, f: impl FnOnce()) -> u64 {
    let before = m.op_count(phoenix_storage::FaultKind::Read);
    f();
    m.op_count(phoenix_storage::FaultKind::Read) - before
}

/// A prefix seek reads no block of the L0 tables whose prefix filter rules its prefix out,
/// returns only keys of its prefix both ways, and a total-order iterator of the same data
/// sees every table.
#[test]
fn prefix_seek_skips_tables_the_prefix_filter_rules_out() {
    let (m, fs) = fs();
    let mut opts = small_opts(WalMode::None);
    opts.disable_auto_compactions = true;
    opts.block_cache_size = 0;
    opts.table.prefix_len = 4;
    let db = Db::open(fs, Path::new("/db"), opts).unwrap();
    let wo = WriteOptions::default();
    // One L0 table per prefix, each spanning the whole key range of the others' so only
    // the filter can tell them apart: "a-" keys sort under every prefix's range.
    for p in ["aaaa", "bbbb", "cccc", "dddd"] {
        for i in 0..50u32 {
            db.put(&wo, format!("{p}-{i:03}").as_bytes(), &[b'v'; 20])
                .unwrap();
        }
        db.put(&wo, format!("a{p}").as_bytes(), b"low").unwrap();
        db.put(&wo, format!("z{p}").as_bytes(), b"high").unwrap();
        db.flush().unwrap();
    }
    assert_eq!(db.stats().levels[0].files, 4);
    assert_eq!(scan(&db, &ReadOptions::default()).len(), 4 * 52);
    let prefix_ro = ReadOptions {
        prefix_same_as_start: true,
        ..ReadOptions::default()
    };

    let mut got = Vec::new();
    let prefix_reads = reads_during(&m, || {
        let mut it = db.iter(&prefix_ro).unwrap();
        it.seek(b"cccc-010");
        while it.valid() {
            got.push(it.key().to_vec());
            it.next();
        }
        it.status().unwrap();
    });
    let want: Vec<Vec<u8>> = (10..50u32)
        .map(|i| format!("cccc-{i:03}").into_bytes())
        .collect();
    assert_eq!(got, want);
    let total_reads = reads_during(&m, || {
        let mut it = db.iter(&ReadOptions::default()).unwrap();
        it.seek(b"cccc-010");
        for _ in 0..40 {
            assert!(it.valid());
            it.next();
        }
        it.status().unwrap();
    });
    assert!(
        prefix_reads < total_reads && prefix_reads <= 2,
        "prefix seek read {prefix_reads} blocks, total order {total_reads}"
    );

    // A prefix no table holds: nothing read, nothing found.
    let reads = reads_during(&m, || {
        let mut it = db.iter(&prefix_ro).unwrap();
        it.seek(b"bbbc-000");
        assert!(!it.valid());
        it.status().unwrap();
    });
    assert_eq!(
        reads, 0,
        "a prefix ruled out by every filter cost block reads"
    );

    // Backwards, the prefix holds too.
    let mut it = db.iter(&prefix_ro).unwrap();
    it.seek_for_prev(b"bbbb-999");
    let mut back = Vec::new();
    while it.valid() {
        back.push(it.key().to_vec());
        it.prev();
    }
    it.status().unwrap();
    assert_eq!(back.len(), 50);
    assert_eq!(back[0], b"bbbb-049".to_vec());
    assert_eq!(back[49], b"bbbb-000".to_vec());
    // A seek to a key shorter than the prefix reads in total order.
    it.seek(b"zc");
    assert_eq!(it.key(), b"zcccc");
    it.next();
    assert_eq!(it.key(), b"zdddd");

    let no_extractor = Db::open(
        Arc::new(MemFs::new()),
        Path::new("/other"),
        small_opts(WalMode::None),
    )
    .unwrap();
    assert!(no_extractor.iter(&prefix_ro).is_err());
    db.close().unwrap();
}

/// A bounded scan reads no more blocks than an unbounded one stopped at the same key, and
/// fewer whenever the bound is where a block or a file begins: the index separators and
/// the files' key ranges rule the next block out without reading it. The same holds
/// backwards with a lower bound.
#[test]
fn bounded_scans_read_no_block_past_their_bounds() {
    let (m, fs) = fs();
    let mut opts = small_opts(WalMode::None);
    opts.block_cache_size = 0;
    let db = Db::open(fs, Path::new("/db"), opts).unwrap();
    let wo = WriteOptions::default();
    // Group 0 (the first 8 bytes), so files are cut by size, not at every key.
    let key = |i: u32| [&[0u8; 8][..], format!("k{i:05}").as_bytes()].concat();
    for i in 0..3000u32 {
        db.put(&wo, &key(i), &[b'v'; 100]).unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None, None).unwrap();
    let files: usize = db.stats().levels.iter().skip(1).map(|l| l.files).sum();
    assert!(files > 4, "{:?}", db.stats().levels);
    scan(&db, &ReadOptions::default());

    let (mut fewer_fwd, mut fewer_back) = (0, 0);
    for end in 1000..1400u32 {
        let bounded = reads_during(&m, || {
            let ro = ReadOptions {
                lower_bound: Some(key(900)),
                upper_bound: Some(key(end)),
                ..ReadOptions::default()
            };
            assert_eq!(scan(&db, &ro).len(), (end - 900) as usize);
        });
        let stopped = reads_during(&m, || {
            let mut it = db.iter(&ReadOptions::default()).unwrap();
            it.seek(&key(900));
            while it.valid() && it.key() < key(end).as_slice() {
                it.next();
            }
            it.status().unwrap();
        });
        assert!(bounded <= stopped, "bound {end}: {bounded} > {stopped}");
        fewer_fwd += u32::from(bounded < stopped);

        let bounded = reads_during(&m, || {
            let ro = ReadOptions {
                lower_bound: Some(key(end)),
                upper_bound: Some(key(1500)),
                ..ReadOptions::default()
            };
            assert_eq!(scan_rev(&db, &ro).len(), (1500 - end) as usize);
        });
        let stopped = reads_during(&m, || {
            let mut it = db.iter(&ReadOptions::default()).unwrap();
            it.seek_for_prev(&key(1499));
            while it.valid() && it.key() >= key(end).as_slice() {
                it.prev();
            }
            it.status().unwrap();
        });
        assert!(
            bounded <= stopped,
            "lower bound {end}: {bounded} > {stopped}"
        );
        fewer_back += u32::from(bounded < stopped);
    }
    // 400 keys of about 110 bytes span about ten 4 KiB blocks.
    assert!(
        fewer_fwd >= 5,
        "forward: fewer reads at only {fewer_fwd} bounds"
    );
    assert!(
        fewer_back >= 5,
        "backward: fewer reads at only {fewer_back} bounds"
    );
    db.close().unwrap();
}

mod pieces {
    //! A compaction installed in pieces (`Options::compaction_piece_bytes`).
    use super::*;
    use phoenix_storage::FaultKind;
    use std::collections::BTreeMap;

    const GROUPS: u64 = 24;
    const KEYS: u64 = 40;
    /// Groups far larger than the target file size: old and new files cut inside them
    /// at different keys.
    const BIG: [u64; 2] = [5, 17];
    const DIR: &str = "/pieces";
    const PIECE: u64 = 16 << 10;

    type Model = BTreeMap<Vec<u8>, Vec<u8>>;

    fn key(g: u64, i: u64) -> Vec<u8> {
        let mut k = g.to_be_bytes().to_vec();
        k.extend_from_slice(format!("k{i:04}").as_bytes());
        k
    }

    fn keys(g: u64) -> u64 {
        if BIG.contains(&g) {
            KEYS * 12
        } else {
            KEYS
        }
    }

    fn value(tag: &str, g: u64, i: u64) -> Vec<u8> {
        let mut v = format!("{tag} {g} {i} ").into_bytes();
        v.resize(150, b'v');
        v
    }

    fn opts(piece_bytes: u64) -> Options {
        Options {
            write_buffer_size: 256 << 10,
            target_file_size_base: 8 << 10,
            max_bytes_for_level_base: 16 << 20,
            level0_file_num_compaction_trigger: 1,
            num_levels: 3,
            inline_background: true,
            compaction_piece_bytes: piece_bytes,
            ..small_opts(WalMode::Log)
        }
    }

    /// Bytes of the table files (the WAL and the manifest come and go on their own).
    fn table_bytes(mem: &MemFs) -> u64 {
        let fs: &dyn phoenix_storage::FileSystem = mem;
        let dir = Path::new(DIR);
        fs.list(dir)
            .unwrap()
            .iter()
            .filter(|n| n.ends_with(".sst"))
            .map(|n| fs.file_size(&dir.join(n)).unwrap())
            .sum()
    }

    fn all(db: &Db) -> Model {
        scan(db, &ReadOptions::default()).into_iter().collect()
    }

    /// L2 holding old versions of some groups, L1 holding every group, and one L0 file
    /// of overwrites, deletes and a range delete over L1 and L2 data: the next
    /// `compact_range` rewrites all of L1 (L0→L1, not at the bottom, so tombstones are
    /// kept), then L1 into L2. Returns the open Db (auto compactions off), the model,
    /// the table bytes and L1's bytes.
    fn setup(fs: &SharedFs, mem: &MemFs, piece_bytes: u64) -> (Arc<Db>, Model, u64, u64) {
        let dir = Path::new(DIR);
        let wo = WriteOptions::default();
        let mut model = Model::new();
        {
            let db = Db::open(Arc::clone(fs), dir, opts(piece_bytes)).unwrap();
            for g in 8..14 {
                for i in 0..keys(g) {
                    db.put(&wo, &key(g, i), &value("old", g, i)).unwrap();
                }
            }
            db.flush().unwrap();
            db.compact_range(None, None).unwrap();
            for g in 0..GROUPS {
                for i in 0..keys(g) {
                    db.put(&wo, &key(g, i), &value("first", g, i)).unwrap();
                    model.insert(key(g, i), value("first", g, i));
                }
            }
            // L0 to L1 (trigger 1); L1 stays under its target.
            db.flush().unwrap();
            db.close().unwrap();
        }
        let db = Db::open(
            Arc::clone(fs),
            dir,
            Options {
                disable_auto_compactions: true,
                ..opts(piece_bytes)
            },
        )
        .unwrap();
        for g in 0..GROUPS {
            for i in (0..keys(g)).step_by(3) {
                db.put(&wo, &key(g, i), &value("new", g, i)).unwrap();
                model.insert(key(g, i), value("new", g, i));
            }
            db.delete(&wo, &key(g, 1)).unwrap();
            model.remove(&key(g, 1));
        }
        let (lo, hi) = (key(9, 5), key(12, 7));
        db.delete_range(&wo, &lo, &hi).unwrap();
        model.retain(|k, _| !(k.as_slice() >= lo.as_slice() && k.as_slice() < hi.as_slice()));
        db.flush().unwrap();
        let stats = db.stats();
        assert_eq!(stats.levels[0].files, 1);
        assert!(stats.levels[1].files > GROUPS as usize, "{stats:?}");
        assert!(stats.levels[2].files > 0, "{stats:?}");
        assert_eq!(all(&db), model, "setup");
        (db, model, table_bytes(mem), stats.levels[1].bytes)
    }

    fn mem_fs() -> (Arc<MemFs>, SharedFs) {
        super::fs()
    }

    /// File-system operations of class `kind` in the compaction, and its pieces.
    fn count_ops(kind: FaultKind, piece_bytes: u64) -> (u64, u64) {
        let (mem, fs) = mem_fs();
        let (db, model, _, _) = setup(&fs, &mem, piece_bytes);
        let start = mem.op_count(kind);
        db.compact_range(None, None).unwrap();
        assert_eq!(all(&db), model);
        (mem.op_count(kind) - start, db.stats().compaction_pieces)
    }

    /// The most table bytes held over the setup's while the compaction runs: stopped
    /// at each of its operations in turn.
    fn peak_growth(piece_bytes: u64) -> u64 {
        let (ops, _) = count_ops(FaultKind::Any, piece_bytes);
        let mut peak = 0;
        for n in 0..ops {
            let (mem, fs) = mem_fs();
            let (db, _, before, _) = setup(&fs, &mem, piece_bytes);
            mem.freeze_after(n);
            let _ = db.compact_range(None, None);
            mem.clear_faults();
            peak = peak.max(table_bytes(&mem).saturating_sub(before));
            mem.freeze_after(0);
            drop(db);
        }
        peak
    }

    /// A compaction rewriting a whole level holds it twice on disk at its end; in
    /// pieces, about one piece more.
    #[test]
    fn a_compaction_rewriting_a_level_frees_it_piece_by_piece() {
        let l1 = {
            let (mem, fs) = mem_fs();
            setup(&fs, &mem, 0).3
        };
        let whole = peak_growth(0);
        assert!(
            whole > l1 * 8 / 10,
            "one edit at the end holds the old level and the new one: {whole} B more, L1 {l1} B"
        );
        let (_, pieces) = count_ops(FaultKind::Any, PIECE);
        assert!(pieces >= 8, "only {pieces} pieces");
        let pieced = peak_growth(PIECE);
        assert!(
            pieced < 3 * PIECE,
            "pieces of {PIECE} B still held {pieced} B more (L1 {l1} B)"
        );
    }

    /// Recovery, then the next compaction, give exactly the data the setup wrote.
    fn check_recovers(mem: &MemFs, fs: &SharedFs, model: &Model, what: &str) {
        mem.crash();
        let db = Db::open(Arc::clone(fs), Path::new(DIR), opts(PIECE)).unwrap();
        assert!(all(&db) == *model, "{what}: state differs after recovery");
        let mut rev = scan_rev(&db, &ReadOptions::default());
        rev.reverse();
        assert!(
            rev.into_iter().collect::<Model>() == *model,
            "{what}: reverse scan"
        );
        for (k, v) in model.iter().step_by(5) {
            assert_eq!(
                db.get(&ReadOptions::default(), k).unwrap().as_ref(),
                Some(v),
                "{what}"
            );
        }
        db.compact_range(None, None).unwrap();
        assert!(
            all(&db) == *model,
            "{what}: state differs after compacting again"
        );
    }

    /// A crash at any file-system operation of a compaction installed in pieces, a
    /// failed write, sync or name change there, or a failed read of any input, loses
    /// nothing and resurrects nothing (the L0 inputs stay until the last piece; a piece
    /// never counts files it could not read).
    #[test]
    fn a_compaction_in_pieces_survives_a_crash_or_an_io_error_anywhere() {
        let (ops, _) = count_ops(FaultKind::Any, PIECE);
        for n in 0..=ops {
            let (mem, fs) = mem_fs();
            let (db, model, _, _) = setup(&fs, &mem, PIECE);
            mem.freeze_after(n);
            let _ = db.compact_range(None, None);
            mem.freeze_after(0);
            drop(db);
            check_recovers(
                &mem,
                &fs,
                &model,
                &format!("crash after operation {n} of {ops}"),
            );
        }
        for (kind, name) in [(FaultKind::Any, "mutating"), (FaultKind::Read, "read")] {
            let (ops, _) = count_ops(kind, PIECE);
            for n in 1..=ops {
                let (mem, fs) = mem_fs();
                let (db, model, _, _) = setup(&fs, &mem, PIECE);
                mem.inject(kind, n, std::io::ErrorKind::Other, false);
                let r = db.compact_range(None, None);
                mem.clear_faults();
                if r.is_ok() {
                    assert!(
                        all(&db) == model,
                        "{name} fault {n} of {ops} ignored: state differs"
                    );
                }
                mem.freeze_after(0);
                drop(db);
                check_recovers(&mem, &fs, &model, &format!("{name} fault at {n} of {ops}"));
            }
        }
    }
}

/// A flush whose writes fail turns the engine read-only, and `failure` says so as the
/// storage's failure (the node restarts its storage for those, not for corruption);
/// before it, there is none.
#[test]
fn a_failed_flush_is_reported_as_the_storages_failure() {
    let (m, fs) = fs();
    let db = Db::open(fs, Path::new("/db"), small_opts(WalMode::None)).unwrap();
    let wo = WriteOptions::default();
    db.put(&wo, b"k", b"v").unwrap();
    assert_eq!(db.failure(), None);
    m.inject(
        phoenix_storage::FaultKind::Write,
        1,
        std::io::ErrorKind::StorageFull,
        true,
    );
    assert!(db.flush().is_err());
    let f = db.failure().expect("a failure after the flush failed");
    assert!(f.io, "{f:?}");
    assert!(f.message.contains("flush"), "{f:?}");
    assert!(db.put(&wo, b"k2", b"v").is_err(), "writes are refused");
    m.clear_faults();
}

/// An ingest that fails after moving its files in but before its manifest edit (here
/// the store's directory sync fails) gives them back: each file is at its source path
/// again, nothing of it is in the engine, and the same call succeeds afterwards.
#[test]
fn an_ingest_that_fails_before_its_edit_gives_its_files_back() {
    let (mem, fs) = fs();
    let dir = Path::new("/db");
    let db = Db::open(Arc::clone(&fs), dir, small_opts(WalMode::None)).unwrap();
    let table = small_opts(WalMode::None).table;
    let mut paths = Vec::new();
    let mut want = Vec::new();
    for g in [4u64, 5] {
        let path = std::path::PathBuf::from(format!("/in-{g}.sst"));
        let mut w = phoenix_engine::SstWriter::create(&fs, &path, &table).unwrap();
        for i in 0..20u32 {
            let mut k = g.to_be_bytes().to_vec();
            k.extend_from_slice(format!("d{i:04}").as_bytes());
            w.put(&k, b"in").unwrap();
            want.push((k, b"in".to_vec()));
        }
        w.finish().unwrap();
        paths.push(path);
    }
    let ssts = |fs: &SharedFs| {
        fs.list(dir)
            .unwrap()
            .into_iter()
            .filter(|n| n.ends_with(".sst"))
            .count()
    };
    let before = ssts(&fs);
    mem.inject(
        phoenix_storage::FaultKind::Sync,
        1,
        std::io::ErrorKind::Other,
        false,
    );
    db.ingest(&paths).unwrap_err();
    for p in &paths {
        assert!(fs.exists(p).unwrap(), "{} not given back", p.display());
    }
    assert_eq!(ssts(&fs), before, "a table of the failed ingest stays");
    let ro = ReadOptions::default();
    assert!(scan(&db, &ro).is_empty());
    db.ingest(&paths).unwrap();
    assert_eq!(scan(&db, &ro), want);
    db.close().unwrap();
    let db = Db::open(Arc::clone(&fs), dir, small_opts(WalMode::None)).unwrap();
    assert_eq!(scan(&db, &ro), want);
}

/// An ingest whose manifest edit is refused before anything is written — here the
/// version set broke on an earlier failed manifest sync — gives its files back: they
/// were moved (renamed) into the store, and the next open would otherwise delete them
/// as tables no manifest names.
#[test]
fn an_ingest_refused_by_a_broken_manifest_gives_its_files_back() {
    let mut refused = 0;
    for nth in 1..=6 {
        let (mem, fs) = fs();
        let dir = Path::new("/db");
        let db = Db::open(Arc::clone(&fs), dir, small_opts(WalMode::None)).unwrap();
        db.put(&WriteOptions::default(), b"\0\0\0\0\0\0\0\x01a", b"v")
            .unwrap();
        mem.inject(
            phoenix_storage::FaultKind::Sync,
            nth,
            std::io::ErrorKind::Other,
            false,
        );
        let _ = db.flush();
        mem.clear_faults();
        let path = std::path::PathBuf::from("/in.sst");
        let mut w = phoenix_engine::SstWriter::create(&fs, &path, &Default::default()).unwrap();
        w.put(b"\0\0\0\0\0\0\0\x09k", b"in").unwrap();
        w.finish().unwrap();
        if db.ingest(std::slice::from_ref(&path)).is_err() {
            refused += 1;
            assert!(fs.exists(&path).unwrap(), "sync {nth}: the source is gone");
        } else {
            assert!(!fs.exists(&path).unwrap());
        }
        drop(db);
    }
    assert!(
        refused > 0,
        "no ingest was refused: the case is not exercised"
    );
}

/// A write with `disable_wal` on an engine with a WAL is in no log: a clean close
/// flushes it (as RocksDB's does), so it is there after reopening; a crash may lose it.
#[test]
fn a_clean_close_keeps_writes_made_without_the_wal() {
    let (_mem, fs) = fs();
    let dir = Path::new("/db");
    let db = Db::open(fs.clone(), dir, small_opts(WalMode::Log)).unwrap();
    let unlogged = WriteOptions {
        disable_wal: true,
        ..WriteOptions::default()
    };
    db.put(&WriteOptions::default(), b"logged", b"1").unwrap();
    db.put(&unlogged, b"unlogged", b"2").unwrap();
    db.close().unwrap();
    drop(db);
    let db = Db::open(fs, dir, small_opts(WalMode::Log)).unwrap();
    let ro = ReadOptions::default();
    assert_eq!(db.get(&ro, b"logged").unwrap(), Some(b"1".to_vec()));
    assert_eq!(
        db.get(&ro, b"unlogged").unwrap(),
        Some(b"2".to_vec()),
        "a write without the WAL was lost by a clean close"
    );
    db.close().unwrap();
}

#[test]
fn waiting_for_background_work_leaves_nothing_due() {
    let (_mem, fs) = fs();
    let opts = Options {
        write_buffer_size: 4 << 10,
        max_write_buffer_number: 4,
        level0_file_num_compaction_trigger: 2,
        max_bytes_for_level_base: 16 << 10,
        max_bytes_for_level_multiplier: 2,
        target_file_size_base: 4 << 10,
        ..small_opts(WalMode::None)
    };
    let db = Db::open(fs, Path::new("/db"), opts.clone()).unwrap();
    let wo = WriteOptions::default();
    for i in 0..3000u32 {
        db.put(
            &wo,
            format!("k{:05}", (i * 7919) % 3000).as_bytes(),
            &[b'v'; 40],
        )
        .unwrap();
    }
    db.wait_for_background_work().unwrap();
    let st = db.stats();
    assert_eq!(st.immutable_memtables, 0, "{st:?}");
    assert!(st.levels[0].files < 2, "{:?}", st.levels);
    // No level but the last over its target (a compaction would be due).
    for l in 1..st.levels.len() - 1 {
        let target = (16u64 << 10) << (l - 1);
        assert!(st.levels[l].bytes < target, "L{l}: {:?}", st.levels);
    }
    assert!(st.compactions > 0);
    db.close().unwrap();
    assert!(matches!(
        db.wait_for_background_work(),
        Err(phoenix_engine::Error::Closed)
    ));
}
