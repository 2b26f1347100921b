//! A read-only secondary following a primary on a shared object store (seed 004 §7.1):
//! it reads what the primary flushed once it catches up, keeps reading the tables of
//! its version while the primary compacts them away (they wait out
//! `obsolete_table_delay`), and catches up by itself when a point read finds a table
//! gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::memory::InMemory;
use object_store::ObjectStore;
use phoenix_engine::{
    Db, ObjectTableStore, Options, ReadOptions, Secondary, SharedTableStore, TableStore, WalMode,
    WriteOptions,
};
use phoenix_storage::{MemFs, SharedFs};

mod support;

fn opts(delay: Duration) -> Options {
    Options {
        write_buffer_size: 8 << 10,
        target_file_size_base: 4 << 10,
        disable_auto_compactions: true,
        wal: WalMode::Log,
        obsolete_table_delay: delay,
        ..Options::default()
    }
}

fn primary(bucket: &Arc<dyn ObjectStore>, delay: Duration) -> Arc<Db> {
    let fs: SharedFs = Arc::new(MemFs::new());
    let store = ObjectTableStore::new(Arc::clone(bucket), "db").unwrap();
    Db::open_with_store(fs, Path::new("/db"), Arc::new(store), opts(delay)).unwrap()
}

fn secondary(bucket: &Arc<dyn ObjectStore>) -> Secondary {
    secondary_with_lease(bucket, Options::default().reader_lease)
}

fn secondary_with_lease(bucket: &Arc<dyn ObjectStore>, lease: Duration) -> Secondary {
    let store: SharedTableStore =
        Arc::new(ObjectTableStore::new(Arc::clone(bucket), "db").unwrap());
    // No block cache: every read of a data block goes to the store.
    let opts = Options {
        block_cache_size: 0,
        reader_lease: lease,
        ..opts(Duration::ZERO)
    };
    Secondary::open(store, opts).unwrap()
}

fn leases(bucket: &Arc<dyn ObjectStore>) -> usize {
    ObjectTableStore::new(Arc::clone(bucket), "db")
        .unwrap()
        .reader_leases()
        .unwrap()
        .len()
}

fn key(i: u32) -> Vec<u8> {
    // One group (its 8-byte id first): outputs are cut by size, not at every key.
    let mut k = vec![0, 0, 0, 0, 0, 0, 0, 1];
    k.extend_from_slice(format!("key{i:05}").as_bytes());
    k
}

fn fill(db: &Db, tag: &str) {
    for i in 0..1000u32 {
        db.put(
            &WriteOptions::default(),
            &key(i),
            format!("{tag}{i}").as_bytes(),
        )
        .unwrap();
    }
    db.flush().unwrap();
}

fn all(s: &Secondary) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut it = s.iter(&ReadOptions::default()).unwrap();
    it.seek_to_first();
    let mut out = Vec::new();
    while it.valid() {
        out.push((it.key().to_vec(), it.value().to_vec()));
        it.next();
    }
    it.status().unwrap();
    out
}

fn tables(bucket: &Arc<dyn ObjectStore>) -> Vec<u64> {
    support::table_numbers(&ObjectTableStore::new(Arc::clone(bucket), "db").unwrap())
}

#[test]
fn a_secondary_reads_what_the_primary_flushed_once_it_catches_up() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let empty: SharedTableStore =
        Arc::new(ObjectTableStore::new(Arc::clone(&bucket), "db").unwrap());
    assert!(
        Secondary::open(empty, opts(Duration::ZERO)).is_err(),
        "nothing to follow"
    );
    let db = primary(&bucket, Duration::from_secs(60));
    db.put(&WriteOptions::default(), b"first", b"1").unwrap();
    db.flush().unwrap();
    let s = secondary(&bucket);
    let ro = ReadOptions::default();
    assert_eq!(s.get(&ro, b"first").unwrap(), Some(b"1".to_vec()));

    fill(&db, "a");
    // Not caught up: the state it read.
    assert_eq!(s.get(&ro, &key(1)).unwrap(), None);
    assert!(s.catch_up().unwrap());
    assert!(!s.catch_up().unwrap(), "nothing new");
    assert_eq!(s.get(&ro, &key(1)).unwrap(), Some(b"a1".to_vec()));
    let keys: Vec<Vec<u8>> = (0..1000).step_by(97).map(key).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let got = s.multi_get(&ro, &refs).unwrap();
    for (i, g) in (0..1000).step_by(97).zip(got) {
        assert_eq!(g, Some(format!("a{i}").into_bytes()));
    }
    assert_eq!(all(&s).len(), 1001);
    assert_eq!(all(&s)[1000].0, b"first".to_vec());

    // Written but not flushed: the primary's memtable is not on the store.
    db.put(&WriteOptions::default(), b"unflushed", b"x")
        .unwrap();
    s.catch_up().unwrap();
    assert_eq!(s.get(&ro, b"unflushed").unwrap(), None);
    assert!(s.last_sequence() > 0);
    db.close().unwrap();
}

/// A reader that stops renewing its lease: its tables wait out the delay and the
/// lease, then go; it catches up by itself.
#[test]
fn a_secondary_keeps_its_tables_while_the_delay_lasts_then_catches_up_itself() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // (Long enough for the checks below on a loaded machine.)
    let delay = Duration::from_secs(2);
    let db = primary(&bucket, delay);
    fill(&db, "a");
    let s = secondary_with_lease(&bucket, Duration::from_secs(1));
    let before = tables(&bucket);
    let ro = ReadOptions::default();

    fill(&db, "b");
    db.compact_range(None, None).unwrap();
    // The primary's compaction replaced every table the secondary reads; they wait.
    let after = tables(&bucket);
    assert!(
        before.iter().all(|n| after.contains(n)),
        "{before:?} {after:?}"
    );
    assert_eq!(s.get(&ro, &key(7)).unwrap(), Some(b"a7".to_vec()));
    assert_eq!(all(&s)[7].1, b"a7".to_vec());
    let stale = s.iter(&ro).unwrap();

    // Once the delay passed they go, without another edit of the primary.
    let deadline = Instant::now() + Duration::from_secs(20);
    while tables(&bucket).iter().any(|n| before.contains(n)) {
        assert!(Instant::now() < deadline, "replaced tables still there");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A point read finds its table gone, catches up and reads the new one.
    assert_eq!(s.get(&ro, &key(7)).unwrap(), Some(b"b7".to_vec()));
    // An iterator made before reads tables that are gone: an error, not a wrong answer.
    let mut stale = stale;
    stale.seek_to_first();
    let mut n = 0;
    while stale.valid() {
        n += 1;
        stale.next();
    }
    assert!(
        stale.status().is_err(),
        "an iterator over deleted tables read {n} keys and no error"
    );
    assert_eq!(all(&s)[7].1, b"b7".to_vec());
    db.close().unwrap();
}

/// A reader's lease holds the tables of every version it still reads (a cursor's
/// included) past the delay; once it moves past them (cursor dropped, caught up, lease
/// renewed) they go. Its lease goes with it.
#[test]
fn a_reader_s_lease_holds_its_tables_until_it_moves_past_them() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let delay = Duration::from_millis(100);
    let db = primary(&bucket, delay);
    fill(&db, "a");
    let s = secondary(&bucket);
    assert_eq!(leases(&bucket), 1);
    let before = tables(&bucket);
    let ro = ReadOptions::default();
    let stale = s.iter(&ro).unwrap();

    fill(&db, "b");
    db.compact_range(None, None).unwrap();
    // Well past the delay (and the clock skew allowed): the lease still holds them.
    std::thread::sleep(Duration::from_millis(2500));
    let t = tables(&bucket);
    assert!(before.iter().all(|n| t.contains(n)), "{before:?} {t:?}");
    let mut stale = stale;
    stale.seek_to_first();
    let mut n = 0;
    while stale.valid() {
        assert_eq!(stale.value(), format!("a{n}").as_bytes());
        n += 1;
        stale.next();
    }
    stale.status().unwrap();
    assert_eq!(n, 1000);
    // Caught up, the old cursor dropped, the lease renewed: they go.
    drop(stale);
    assert!(s.catch_up().unwrap());
    assert!(s.renew_lease().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while tables(&bucket).iter().any(|n| before.contains(n)) {
        assert!(
            Instant::now() < deadline,
            "tables no reader holds still there"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(all(&s)[7].1, b"b7".to_vec());
    drop(s);
    assert_eq!(leases(&bucket), 0, "the lease left with its reader");
    db.close().unwrap();
}

/// A cursor that outlives its secondary keeps the lease (and the tables it reads); a
/// renewal after the lease ran out says so; a reader with a lease of 0 keeps none.
#[test]
fn a_cursor_keeps_the_lease_of_its_dropped_reader_and_a_lapsed_lease_is_told() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let db = primary(&bucket, Duration::from_millis(100));
    fill(&db, "a");
    let s = secondary(&bucket);
    let before = tables(&bucket);
    let cursor = s.iter(&ReadOptions::default()).unwrap();
    drop(s);
    assert_eq!(leases(&bucket), 1, "a cursor still reads");
    fill(&db, "b");
    db.compact_range(None, None).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let t = tables(&bucket);
    assert!(before.iter().all(|n| t.contains(n)), "{before:?} {t:?}");
    let mut cursor = cursor;
    cursor.seek_to_first();
    let mut n = 0;
    while cursor.valid() {
        n += 1;
        cursor.next();
    }
    cursor.status().unwrap();
    assert_eq!(n, 1000);

    let short = secondary_with_lease(&bucket, Duration::from_millis(300));
    assert!(short.renew_lease().unwrap(), "live");
    std::thread::sleep(Duration::from_millis(600));
    assert!(!short.renew_lease().unwrap(), "it had run out");
    assert!(short.renew_lease().unwrap());
    drop(short);
    let none = secondary_with_lease(&bucket, Duration::ZERO);
    assert_eq!(leases(&bucket), 1, "only the cursor's");
    drop(none);
    db.close().unwrap();
}

/// Tables no lease holds go while the engine flushes without pause: the leases are
/// read between flushes, not only when the flush thread idles.
#[test]
fn a_busy_engine_reads_the_leases_and_deletes_its_tables() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let db = primary(&bucket, Duration::from_millis(100));
    fill(&db, "a");
    let before = tables(&bucket);
    fill(&db, "b");
    db.compact_range(None, None).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Writers that keep the 8 KiB memtables rotating: a flush always waits.
    let writers: Vec<_> = (0..3u32)
        .map(|w| {
            let (db, stop) = (Arc::clone(&db), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u32;
                let value = vec![b'v'; 1024];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    db.put(
                        &WriteOptions::default(),
                        &key(10_000 + w * 5000 + i % 5000),
                        &value,
                    )
                    .unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut gone = false;
    while Instant::now() < deadline {
        if !tables(&bucket).iter().any(|n| before.contains(n)) {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert!(gone, "tables no reader holds stayed under a busy engine");
    db.close().unwrap();
}

#[test]
fn without_a_delay_replaced_tables_go_at_once() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let db = primary(&bucket, Duration::ZERO);
    fill(&db, "a");
    let before = tables(&bucket);
    fill(&db, "b");
    db.compact_range(None, None).unwrap();
    let after = tables(&bucket);
    assert!(
        before.iter().all(|n| !after.contains(n)),
        "{before:?} {after:?}"
    );
    db.close().unwrap();
}

/// A table no version names, found at open, waits out the delay too (a follower may
/// read it: a table of the version before a crash), unless its number is still to be
/// handed out (a write that never reached the manifest): that one goes at once, before
/// a new table can take its number.
#[test]
fn a_stray_at_open_waits_out_the_delay_unless_its_number_is_still_free() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let db = primary(&bucket, Duration::ZERO);
    fill(&db, "a");
    db.compact_range(None, None).unwrap();
    db.close().unwrap();
    let gone = 2; // the first flush's table, compacted away
    assert!(!tables(&bucket).contains(&gone));
    let far = 1 << 40; // past any number the counter has handed out
    let store = ObjectTableStore::new(Arc::clone(&bucket), "db").unwrap();
    for n in [gone, far] {
        let mut f = store.create_table(n).unwrap();
        f.append(b"not a table").unwrap();
        f.sync_all().unwrap();
    }
    let db = primary(&bucket, Duration::from_secs(60));
    let t = tables(&bucket);
    assert!(t.contains(&gone), "{t:?}");
    assert!(!t.contains(&far), "{t:?}");
    db.close().unwrap();
    let db = primary(&bucket, Duration::ZERO);
    assert!(!tables(&bucket).contains(&gone));
    db.close().unwrap();
}

/// A table moved down (deleted and added by one edit), a table an iterator holds: with
/// a delay, neither is deleted while held, and the engine keeps serving writes and
/// flushes past the delay (nothing spins on them holding the engine's lock).
#[test]
fn tables_held_past_the_delay_neither_go_nor_stall_the_engine() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let delay = Duration::from_millis(100);
    let db = primary(&bucket, delay);
    // One table of one group, alone in L0: the compaction moves it down.
    db.put(&WriteOptions::default(), &key(1), b"moved").unwrap();
    db.flush().unwrap();
    db.compact_range(None, None).unwrap();
    assert!(db.stats().trivial_moves >= 1, "{:?}", db.stats());
    fill(&db, "a");
    let held = db.iter(&ReadOptions::default()).unwrap();
    db.compact_range(None, None).unwrap();
    std::thread::sleep(delay * 5);
    // Writes and flushes go on (bounded: a stalled engine fails the test, not hangs it).
    let (done, finished) = std::sync::mpsc::channel();
    let writer = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || {
            for i in 0..200u32 {
                db.put(&WriteOptions::default(), &key(5000 + i), b"after")
                    .unwrap();
            }
            db.flush().unwrap();
            let _ = done.send(());
        })
    };
    finished
        .recv_timeout(Duration::from_secs(30))
        .expect("writes stalled while tables waited past the delay");
    writer.join().unwrap();
    // The iterator still reads what it held.
    let mut held = held;
    held.seek_to_first();
    let mut n = 0;
    while held.valid() {
        n += 1;
        held.next();
    }
    held.status().unwrap();
    assert_eq!(n, 1000);
    drop(held);
    assert_eq!(
        db.get(&ReadOptions::default(), &key(1)).unwrap(),
        Some(b"a1".to_vec())
    );
    db.close().unwrap();
}
