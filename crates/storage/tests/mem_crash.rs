//! `MemFs` crash, durability and fault-injection rules (see the `mem` module docs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use phoenix_storage::{Error, FaultKind, FileSystem, IoOp, MemFs, WriteOptions};

const OPTS: WriteOptions = WriteOptions { direct_io: false };

/// A fresh file system with a durable directory `/d`.
fn setup() -> (MemFs, PathBuf) {
    let fs = MemFs::new();
    let d = PathBuf::from("/d");
    fs.create_dir_all(&d).unwrap();
    (fs, d)
}

/// Creates `path` with `data`, syncs the file and its directory.
fn durable_file(fs: &MemFs, path: &Path, data: &[u8]) {
    let mut f = fs.create(path, OPTS).unwrap();
    f.append(data).unwrap();
    f.sync_all().unwrap();
    fs.sync_dir(path.parent().unwrap()).unwrap();
}

#[test]
fn unsynced_data_is_lost() {
    let (fs, d) = setup();
    let p = d.join("f");
    let mut f = fs.create(&p, OPTS).unwrap();
    fs.sync_dir(&d).unwrap();
    f.append(b"synced").unwrap();
    f.sync_data().unwrap();
    f.append(b"+unsynced").unwrap();
    assert_eq!(fs.read_all(&p).unwrap(), b"synced+unsynced");
    assert_eq!(fs.durable_size(&p), Some(6));
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"synced");
}

#[test]
fn never_synced_file_is_empty_after_crash() {
    let (fs, d) = setup();
    let p = d.join("f");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"data").unwrap();
    fs.sync_dir(&d).unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"");
}

#[test]
fn unsynced_dir_entry_is_lost() {
    let (fs, d) = setup();
    let p = d.join("f");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"data").unwrap();
    f.sync_all().unwrap();
    assert_eq!(fs.durable_size(&p), None, "name not durable yet");
    fs.crash();
    assert!(
        !fs.exists(&p).unwrap(),
        "file synced but its directory never was"
    );
    assert!(fs.list(&d).unwrap().is_empty());
}

#[test]
fn unsynced_directory_is_lost_with_its_files() {
    let fs = MemFs::new();
    // The trait makes directories durably; an unsynced rename of one is the way to get a
    // directory whose name is not durable.
    fs.create_dir_all(Path::new("/a/b")).unwrap();
    durable_file(&fs, Path::new("/a/b/f"), b"x");
    fs.rename(Path::new("/a/b"), Path::new("/a/c")).unwrap();
    assert!(fs.exists(Path::new("/a/c/f")).unwrap());
    fs.crash();
    assert!(fs.exists(Path::new("/a/b/f")).unwrap());
    assert!(!fs.exists(Path::new("/a/c")).unwrap());
}

#[test]
fn create_dir_all_is_durable() {
    let fs = MemFs::new();
    fs.create_dir_all(Path::new("/x/y/z")).unwrap();
    fs.crash();
    assert!(fs.exists(Path::new("/x/y/z")).unwrap());
}

#[test]
fn rename_is_durable_only_after_sync_dir() {
    let (fs, d) = setup();
    durable_file(&fs, &d.join("old"), b"payload");
    fs.rename(&d.join("old"), &d.join("new")).unwrap();
    fs.crash();
    assert_eq!(fs.list(&d).unwrap(), ["old"]);

    fs.rename(&d.join("old"), &d.join("new")).unwrap();
    fs.sync_dir(&d).unwrap();
    fs.crash();
    assert_eq!(fs.list(&d).unwrap(), ["new"]);
    assert_eq!(fs.read_all(&d.join("new")).unwrap(), b"payload");
}

#[test]
fn delete_is_durable_only_after_sync_dir() {
    let (fs, d) = setup();
    durable_file(&fs, &d.join("f"), b"payload");
    fs.delete(&d.join("f")).unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&d.join("f")).unwrap(), b"payload");
    fs.delete(&d.join("f")).unwrap();
    fs.sync_dir(&d).unwrap();
    fs.crash();
    assert!(!fs.exists(&d.join("f")).unwrap());
}

#[test]
fn unsynced_truncation_is_undone() {
    let (fs, d) = setup();
    let p = d.join("f");
    durable_file(&fs, &p, b"old content");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"new").unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"old content");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"new").unwrap();
    f.sync_data().unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"new");
}

#[test]
fn reopen_overwrite_is_durable_only_after_sync() {
    let (fs, d) = setup();
    let p = d.join("seg");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.preallocate(16).unwrap();
    fs.sync_dir(&d).unwrap();
    drop(f);
    assert_eq!(
        fs.durable_size(&p),
        Some(16),
        "preallocate makes the size durable"
    );

    let mut f = fs.reopen(&p, 4, OPTS).unwrap();
    f.append(b"abcd").unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), vec![0u8; 16]);

    let mut f = fs.reopen(&p, 4, OPTS).unwrap();
    f.append(b"abcd").unwrap();
    f.sync_data().unwrap();
    f.append(b"efgh").unwrap();
    fs.crash();
    let mut want = vec![0u8; 16];
    want[4..8].copy_from_slice(b"abcd");
    assert_eq!(fs.read_all(&p).unwrap(), want);
}

#[test]
fn preallocate_syncs_earlier_writes() {
    let (fs, d) = setup();
    let p = d.join("seg");
    let mut f = fs.create(&p, OPTS).unwrap();
    fs.sync_dir(&d).unwrap();
    f.append(b"head").unwrap();
    f.preallocate(8).unwrap();
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"head\0\0\0\0");
}

#[test]
fn handles_are_dead_after_crash() {
    let (fs, d) = setup();
    let p = d.join("f");
    durable_file(&fs, &p, b"abc");
    let mut w = fs.reopen(&p, 3, OPTS).unwrap();
    let r = fs.open(&p).unwrap();
    fs.crash();
    let errs = [
        w.append(b"x").unwrap_err(),
        w.sync_data().unwrap_err(),
        w.sync_all().unwrap_err(),
        w.preallocate(100).unwrap_err(),
        r.read_exact_at(0, &mut [0u8; 1]).unwrap_err(),
        r.read_at(0, &mut [0u8; 1]).unwrap_err(),
    ];
    for e in errs {
        match &e {
            Error::Io { path, source, .. } => {
                assert_eq!(path, &p);
                assert!(source.to_string().contains("stale"), "{e}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        fs.read_all(&p).unwrap(),
        b"abc",
        "stale handles changed nothing"
    );
    // New handles work.
    let mut w = fs.reopen(&p, 3, OPTS).unwrap();
    w.append(b"d").unwrap();
    assert_eq!(fs.read_all(&p).unwrap(), b"abcd");
}

#[test]
fn write_atomic_is_all_or_nothing_at_every_crash_point() {
    let old = b"old manifest pointer".as_slice();
    let new = b"the new one, longer than the old".as_slice();
    let p = PathBuf::from("/d/CURRENT");
    // Count the mutating operations of one write_atomic.
    let ops = {
        let (fs, _) = setup();
        fs.write_atomic(&p, old).unwrap();
        let before = fs.op_count(FaultKind::Any);
        fs.write_atomic(&p, new).unwrap();
        fs.op_count(FaultKind::Any) - before
    };
    assert_eq!(ops, 5, "create, append, sync_all, rename, sync_dir");
    for n in 0..=ops {
        for torn_seed in [None, Some(1), Some(2), Some(3)] {
            let (fs, _) = setup();
            fs.write_atomic(&p, old).unwrap();
            fs.freeze_after(n);
            let res = fs.write_atomic(&p, new);
            assert_eq!(res.is_ok(), n == ops, "n={n}: {res:?}");
            match torn_seed {
                None => fs.crash(),
                Some(s) => fs.crash_torn(s),
            }
            let got = fs.read_all(&p).unwrap();
            assert!(
                got == old || got == new,
                "n={n} seed={torn_seed:?}: mixed content {got:?}"
            );
            if n == ops {
                assert_eq!(got, new, "a completed write_atomic is durable");
            }
        }
    }
}

#[test]
fn fault_fires_exactly_at_nth_op_and_has_no_effect() {
    let (fs, d) = setup();
    let p = d.join("f");
    let mut f = fs.create(&p, OPTS).unwrap();
    fs.inject(FaultKind::Write, 3, ErrorKind::StorageFull, false);
    f.append(b"1").unwrap();
    f.append(b"2").unwrap();
    let err = f.append(b"3").unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::StorageFull));
    match &err {
        Error::Io { op, path, .. } => {
            assert_eq!(*op, IoOp::Write);
            assert_eq!(path, &p);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(f.position(), 2, "a failed append does not move");
    assert_eq!(fs.read_all(&p).unwrap(), b"12");
    f.append(b"4").unwrap();
    assert_eq!(
        fs.read_all(&p).unwrap(),
        b"124",
        "one-shot fault fires once"
    );
}

#[test]
fn sticky_fault_fails_every_later_op() {
    let (fs, d) = setup();
    let mut f = fs.create(&d.join("f"), OPTS).unwrap();
    fs.inject(FaultKind::Sync, 2, ErrorKind::Other, true);
    f.sync_data().unwrap();
    for _ in 0..5 {
        assert!(f.sync_data().is_err());
        assert!(f.sync_all().is_err());
        assert!(fs.sync_dir(&d).is_err());
    }
    // Other classes are unaffected.
    f.append(b"x").unwrap();
    fs.clear_faults();
    f.sync_data().unwrap();
}

#[test]
fn failed_sync_leaves_data_unsynced() {
    let (fs, d) = setup();
    let p = d.join("f");
    let mut f = fs.create(&p, OPTS).unwrap();
    fs.sync_dir(&d).unwrap();
    f.append(b"data").unwrap();
    fs.inject(FaultKind::Sync, 1, ErrorKind::Other, false);
    assert!(f.sync_data().is_err());
    assert_eq!(fs.durable_size(&p), Some(0));
    fs.crash();
    assert_eq!(fs.read_all(&p).unwrap(), b"");
}

#[test]
fn failed_meta_ops_have_no_effect() {
    let (fs, d) = setup();
    durable_file(&fs, &d.join("a"), b"a");
    fs.inject(FaultKind::Meta, 1, ErrorKind::PermissionDenied, false);
    assert!(fs.create(&d.join("b"), OPTS).is_err());
    assert!(!fs.exists(&d.join("b")).unwrap());
    fs.inject(FaultKind::Meta, 1, ErrorKind::PermissionDenied, false);
    assert!(fs.rename(&d.join("a"), &d.join("c")).is_err());
    assert_eq!(fs.list(&d).unwrap(), ["a"]);
    fs.inject(FaultKind::Meta, 1, ErrorKind::PermissionDenied, false);
    assert!(fs.delete(&d.join("a")).is_err());
    assert_eq!(fs.list(&d).unwrap(), ["a"]);
    fs.inject(FaultKind::Meta, 1, ErrorKind::PermissionDenied, false);
    assert!(fs.create(&d.join("a"), OPTS).is_err());
    assert_eq!(fs.read_all(&d.join("a")).unwrap(), b"a", "not truncated");
    fs.inject(FaultKind::Meta, 2, ErrorKind::PermissionDenied, false);
    assert!(fs.create_dir_all(&d.join("x/y")).is_err());
    assert!(fs.exists(&d.join("x")).unwrap());
    assert!(!fs.exists(&d.join("x/y")).unwrap());
    fs.inject(FaultKind::Write, 1, ErrorKind::StorageFull, false);
    let mut f = fs.reopen(&d.join("a"), 1, OPTS).unwrap();
    assert!(f.preallocate(100).is_err());
    assert_eq!(fs.file_size(&d.join("a")).unwrap(), 1);
}

#[test]
fn read_faults() {
    let (fs, d) = setup();
    durable_file(&fs, &d.join("a"), b"abc");
    let r = fs.open(&d.join("a")).unwrap();
    fs.inject(FaultKind::Read, 2, ErrorKind::InvalidData, false);
    r.read_exact_at(0, &mut [0u8; 3]).unwrap();
    let err = r.read_exact_at(0, &mut [0u8; 3]).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::InvalidData));
    r.read_exact_at(0, &mut [0u8; 3]).unwrap();
    // Reads are not mutating: an Any fault ignores them.
    fs.inject(FaultKind::Any, 1, ErrorKind::Other, true);
    r.read_exact_at(0, &mut [0u8; 3]).unwrap();
    assert_eq!(fs.list(&d).unwrap(), ["a"]);
    assert!(fs.sync_dir(&d).is_err());
}

#[test]
fn op_counts_by_class() {
    let (fs, d) = setup();
    let base: Vec<u64> = [
        FaultKind::Write,
        FaultKind::Sync,
        FaultKind::Read,
        FaultKind::Meta,
        FaultKind::Any,
    ]
    .iter()
    .map(|k| fs.op_count(*k))
    .collect();
    let mut f = fs.create(&d.join("f"), OPTS).unwrap(); // meta
    f.append(b"x").unwrap(); // write
    f.preallocate(10).unwrap(); // write
    f.sync_data().unwrap(); // sync
    fs.sync_dir(&d).unwrap(); // sync
    fs.list(&d).unwrap(); // read
    fs.read_all(&d.join("f")).unwrap(); // read x2 (open + read)
    fs.rename(&d.join("f"), &d.join("g")).unwrap(); // meta
    let now: Vec<u64> = [
        FaultKind::Write,
        FaultKind::Sync,
        FaultKind::Read,
        FaultKind::Meta,
        FaultKind::Any,
    ]
    .iter()
    .map(|k| fs.op_count(*k))
    .collect();
    let delta: Vec<u64> = now.iter().zip(&base).map(|(a, b)| a - b).collect();
    assert_eq!(delta, [2, 2, 3, 2, 6]);
}

#[test]
fn freeze_after_stops_every_mutating_op() {
    let (fs, d) = setup();
    let mut f = fs.create(&d.join("f"), OPTS).unwrap();
    fs.freeze_after(2);
    f.append(b"a").unwrap();
    f.append(b"b").unwrap();
    let err = f.append(b"c").unwrap_err();
    assert!(err.to_string().contains("frozen"), "{err}");
    assert!(f.sync_data().is_err());
    assert!(fs.create(&d.join("g"), OPTS).is_err());
    assert!(fs.sync_dir(&d).is_err());
    assert!(fs.write_atomic(&d.join("h"), b"x").is_err());
    // Reads still work; the crash lifts the freeze.
    assert_eq!(fs.read_all(&d.join("f")).unwrap(), b"ab");
    fs.crash();
    fs.create(&d.join("g"), OPTS).unwrap();
}

#[test]
fn torn_crash_keeps_a_prefix_and_is_deterministic() {
    let run = |seed: u64| -> Vec<Vec<u8>> {
        let (fs, d) = setup();
        let mut outs = Vec::new();
        let mut files = Vec::new();
        for i in 0..8u8 {
            let p = d.join(format!("f{i}"));
            let mut f = fs.create(&p, OPTS).unwrap();
            f.append(&[i; 10]).unwrap();
            f.sync_data().unwrap();
            f.append(&[i + 100; 200]).unwrap();
            files.push((p, f));
        }
        fs.sync_dir(&d).unwrap();
        fs.crash_torn(seed);
        for (p, _) in &files {
            outs.push(fs.read_all(p).unwrap());
        }
        outs
    };
    let mut lens = std::collections::BTreeSet::new();
    for seed in 0..20 {
        let a = run(seed);
        assert_eq!(a, run(seed), "seed {seed} replays exactly");
        for (i, content) in a.iter().enumerate() {
            let i = i as u8;
            let mut full = vec![i; 10];
            full.extend(vec![i + 100; 200]);
            assert!(content.len() >= 10 && content.len() <= 210);
            assert_eq!(content[..], full[..content.len()], "seed {seed}: a prefix");
            lens.insert(content.len());
        }
    }
    assert!(lens.len() > 20, "torn lengths vary with the seed: {lens:?}");
}

#[test]
fn torn_crash_tears_overwrites_in_place() {
    let (fs, d) = setup();
    let p = d.join("seg");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.preallocate(100).unwrap();
    fs.sync_dir(&d).unwrap();
    f.append(&[7u8; 50]).unwrap();
    fs.crash_torn(42);
    let got = fs.read_all(&p).unwrap();
    assert_eq!(got.len(), 100, "the size was durable");
    let k = got.iter().take_while(|&&b| b == 7).count();
    assert!(
        got[k..].iter().all(|&b| b == 0),
        "a prefix of the write: {got:?}"
    );
}

#[test]
fn crash_releases_locks_and_stale_guards_do_not_release_new_ones() {
    let (fs, d) = setup();
    let p = d.join("LOCK");
    let old = fs.lock(&p).unwrap();
    assert!(matches!(fs.lock(&p), Err(Error::Locked { .. })));
    fs.sync_dir(&d).unwrap();
    fs.crash();
    let new = fs.lock(&p).unwrap();
    drop(old);
    assert!(
        matches!(fs.lock(&p), Err(Error::Locked { .. })),
        "dropping a pre-crash guard must not release the new lock"
    );
    drop(new);
    fs.lock(&p).unwrap();
}

#[test]
fn total_file_bytes_counts_current_sizes_recursively() {
    let (fs, d) = setup();
    fs.create_dir_all(&d.join("sub/deeper")).unwrap();
    let mut f = fs.create(&d.join("a"), OPTS).unwrap();
    f.append(&[1; 100]).unwrap();
    let mut g = fs.create(&d.join("sub/deeper/b"), OPTS).unwrap();
    g.preallocate(1000).unwrap();
    assert_eq!(fs.total_file_bytes(&d), 1100);
    assert_eq!(fs.total_file_bytes(&d.join("sub")), 1000);
    assert_eq!(fs.total_file_bytes(Path::new("/")), 1100);
    assert_eq!(fs.total_file_bytes(&d.join("missing")), 0);
    fs.delete(&d.join("a")).unwrap();
    assert_eq!(fs.total_file_bytes(&d), 1000);
}

#[test]
fn concurrent_readers_and_writer() {
    let (fs, d) = setup();
    let p = d.join("log");
    let mut w = fs.create(&p, OPTS).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let fs = fs.clone();
            let p = p.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let r = fs.open(&p).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let n = r.size();
                    let mut buf = vec![0u8; n as usize];
                    r.read_exact_at(0, &mut buf).unwrap();
                    // Every record is 8 bytes of its own index.
                    for (i, chunk) in buf.chunks(8).enumerate() {
                        assert!(chunk.iter().all(|&b| b == i as u8));
                    }
                }
            })
        })
        .collect();
    for i in 0..2000u32 {
        w.append(&[i as u8; 8]).unwrap();
        if i % 100 == 0 {
            w.sync_data().unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}
