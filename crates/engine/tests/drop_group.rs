//! drop_group frees a group's bytes at once (file bytes drop by the group's share,
//! within 10%), leaves every other key readable, and does not rewrite other groups'
//! files once they are below L0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use phoenix_engine::{Db, Options, ReadOptions, WalMode, WriteOptions};
use phoenix_storage::{FileSystem, MemFs, SharedFs};

const GROUPS: u64 = 6;

fn key(g: u64, i: u64) -> Vec<u8> {
    let mut k = g.to_be_bytes().to_vec();
    k.push(b'd');
    k.extend_from_slice(format!("{i:08}").as_bytes());
    k
}

fn keys_in(g: u64) -> u64 {
    // Unequal groups, so a wrong group's bytes would show.
    400 * (g + 1)
}

fn opts() -> Options {
    Options {
        write_buffer_size: 128 << 10,
        target_file_size_base: 32 << 10,
        min_group_file_size: 0,
        max_bytes_for_level_base: 256 << 10,
        wal: WalMode::None,
        ..Options::default()
    }
}

fn sst_names(fs: &MemFs, dir: &Path) -> BTreeSet<String> {
    fs.list(dir)
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".sst"))
        .collect()
}

fn fill(db: &Db) -> u64 {
    // Interleave the groups so L0 files mix them.
    let wo = WriteOptions::default();
    let max = (0..GROUPS).map(keys_in).max().unwrap();
    let mut total = 0;
    for i in 0..max {
        for g in 0..GROUPS {
            if i < keys_in(g) {
                db.put(&wo, &key(g, i), &[b'v'; 100]).unwrap();
                total += 1;
            }
        }
    }
    total
}

fn check_after_drop(db: &Db, dropped: u64) {
    check_after_drops(db, &[dropped]);
}

fn check_after_drops(db: &Db, dropped: &[u64]) {
    let ro = ReadOptions::default();
    for g in 0..GROUPS {
        for i in (0..keys_in(g)).step_by(7) {
            let got = db.get(&ro, &key(g, i)).unwrap();
            if dropped.contains(&g) {
                assert_eq!(got, None, "dropped group {g} key {i} still visible");
            } else {
                assert_eq!(got, Some(vec![b'v'; 100]), "group {g} key {i} lost");
            }
        }
    }
    let mut it = db.iter(&ro).unwrap();
    it.seek_to_first();
    let mut n = 0;
    while it.valid() {
        assert!(!dropped.contains(&phoenix_engine::key::group_of(it.key())));
        n += 1;
        it.next();
    }
    it.status().unwrap();
    let want: u64 = (0..GROUPS)
        .filter(|g| !dropped.contains(g))
        .map(keys_in)
        .sum();
    assert_eq!(n, want);
}

fn assert_share(before: u64, after: u64, g: u64, total_keys: u64) {
    let share = before as f64 * keys_in(g) as f64 / total_keys as f64;
    let freed = before as f64 - after as f64;
    println!("group {g}: before {before} after {after} freed {freed} expected share {share:.0}");
    assert!(
        (freed - share).abs() <= 0.10 * share,
        "freed {freed} bytes, the group's share is {share:.0} (before {before}, after {after})"
    );
}

#[test]
fn drop_group_after_compaction_frees_its_share_and_touches_nothing_else() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let dir = Path::new("/dg");
    let db = Db::open(fs, dir, opts()).unwrap();
    let total = fill(&db);
    db.compact_range(None, None).unwrap();
    let before = mem.total_file_bytes(dir);
    let names_before = sst_names(&mem, dir);
    let g = 3;
    db.drop_group(g).unwrap();
    let after = mem.total_file_bytes(dir);
    assert_share(before, after, g, total);
    let names_after = sst_names(&mem, dir);
    assert!(
        names_after.is_subset(&names_before),
        "other groups' files were rewritten: new files {:?}",
        names_after.difference(&names_before).collect::<Vec<_>>()
    );
    check_after_drop(&db, g);
    db.close().unwrap();
}

/// Several groups dropped at once cost one flush (not one each), free the groups'
/// shares, leave the others readable, and stay dropped through a reopen.
#[test]
fn drop_groups_frees_several_groups_with_one_flush() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let dir = Path::new("/dg");
    let db = Db::open(Arc::clone(&fs), dir, opts()).unwrap();
    let total = fill(&db);
    let rewrite_firsts = || {
        for g in 0..GROUPS {
            db.put(&WriteOptions::default(), &key(g, 0), &[b'v'; 100])
                .unwrap();
        }
    };
    // Settled first (one version of each key, in tables cut at groups), so that the
    // bytes freed are the dropped groups' alone: the drop's flush and L0 compaction
    // would otherwise also drop other groups' overwritten versions (the measure was
    // flaky by 13%).
    rewrite_firsts();
    db.compact_range(None, None).unwrap();
    let before = mem.total_file_bytes(dir);
    // Some of every group in the memtable too (the same values: the other groups'
    // bytes stay as they were once the drop's flush puts them down).
    rewrite_firsts();
    let flushes = db.stats().flushes;
    let dropped = [1, 3, 5];
    db.drop_groups(&dropped).unwrap();
    assert_eq!(db.stats().flushes, flushes + 1, "one flush for the drop");
    check_after_drops(&db, &dropped);
    let after = mem.total_file_bytes(dir);
    let share =
        before as f64 * dropped.iter().map(|&g| keys_in(g)).sum::<u64>() as f64 / total as f64;
    let freed = before as f64 - after as f64;
    println!("groups {dropped:?}: before {before} after {after} freed {freed} share {share:.0}");
    assert!(
        (freed - share).abs() <= 0.10 * share,
        "freed {freed} bytes, the groups' share is {share:.0} (before {before}, after {after})"
    );
    db.close().unwrap();
    drop(db);
    let db = Db::open(Arc::clone(&fs), dir, opts()).unwrap();
    check_after_drops(&db, &dropped);
    db.close().unwrap();
}

#[test]
fn drop_group_with_data_in_l0_and_memtable() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let dir = Path::new("/dg");
    let db = Db::open(
        Arc::clone(&fs),
        dir,
        Options {
            disable_auto_compactions: true,
            ..opts()
        },
    )
    .unwrap();
    let total = fill(&db);
    db.flush().unwrap();
    assert!(db.stats().levels[0].files > 1);
    let before = mem.total_file_bytes(dir);
    let g = 4;
    db.drop_group(g).unwrap();
    let after = mem.total_file_bytes(dir);
    assert_share(before, after, g, total);
    check_after_drop(&db, g);
    // Survives a reopen, and the group's range can be filled again by ingest.
    db.close().unwrap();
    drop(db);
    let db = Db::open(Arc::clone(&fs), dir, opts()).unwrap();
    check_after_drop(&db, g);
    let path = Path::new("/ingest-4.sst");
    let mut w = phoenix_engine::SstWriter::create(&fs, path, &Default::default()).unwrap();
    for i in 0..10 {
        w.put(&key(g, i), b"ingested").unwrap();
    }
    w.finish().unwrap();
    db.ingest(&[path.to_path_buf()]).unwrap();
    let ro = ReadOptions::default();
    assert_eq!(db.get(&ro, &key(g, 3)).unwrap(), Some(b"ingested".to_vec()));
    assert_eq!(db.get(&ro, &key(g, 30)).unwrap(), None);
    // A file over data that exists shadows just the keys it holds.
    let neighbour = db.get(&ro, &key(2, 6)).unwrap();
    assert!(neighbour.is_some());
    let path2 = Path::new("/ingest-2.sst");
    let mut w = phoenix_engine::SstWriter::create(&fs, path2, &Default::default()).unwrap();
    w.put(&key(2, 5), b"x").unwrap();
    w.finish().unwrap();
    db.ingest(&[path2.to_path_buf()]).unwrap();
    assert_eq!(db.get(&ro, &key(2, 5)).unwrap(), Some(b"x".to_vec()));
    assert_eq!(db.get(&ro, &key(2, 6)).unwrap(), neighbour);
    db.close().unwrap();
}

/// `group_sizes` shares the tables out by group: after a full compaction each group's
/// share is within 15% of its part of the bytes written, and the unequal groups rank as
/// they were written.
#[test]
fn group_sizes_follow_the_bytes_written() {
    let fs: SharedFs = Arc::new(MemFs::new());
    let db = Db::open(Arc::clone(&fs), Path::new("/db"), opts()).unwrap();
    let total = fill(&db);
    db.compact_range(None, None).unwrap();
    let sizes = db.group_sizes().unwrap();
    let all: u64 = sizes.values().map(|s| s.bytes).sum();
    let entries: u64 = sizes.values().map(|s| s.entries).sum();
    assert_eq!(entries, total, "every entry counted once");
    for g in 0..GROUPS {
        let got = sizes[&g].bytes as f64 / all as f64;
        let want = keys_in(g) as f64 / total as f64;
        assert!(
            (got - want).abs() <= 0.15 * want,
            "group {g}: {got:.3} of the bytes, wrote {want:.3}"
        );
        if g > 0 {
            assert!(sizes[&g].bytes > sizes[&(g - 1)].bytes);
        }
    }
    db.close().unwrap();
}
