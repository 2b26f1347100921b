//! Compactions run by a worker (`remote_compaction`): the engine installs what a worker
//! wrote, compacts itself when the worker fails or answers wrongly, and never lets a
//! worker still running a job from before a crash write over a table of the engine
//! after it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use phoenix_engine::{
    CompactionService, Db, FsTableStore, Options, ReadOptions, SharedTableStore, TableStore,
    WalMode, WriteOptions,
};
use phoenix_storage::{MemFs, SharedFs};

mod support;
use support::worker::{Behaviour, Worker};

const DIR: &str = "/db";

fn options(worker: Option<&Arc<Worker>>) -> Options {
    Options {
        write_buffer_size: 8 << 10,
        target_file_size_base: 4 << 10,
        disable_auto_compactions: true,
        wal: WalMode::Log,
        compaction_service: worker.map(|w| Arc::clone(w) as Arc<dyn CompactionService>),
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    // Four groups, so outputs are cut at group boundaries too.
    let mut k = vec![0u8; 8];
    k[7] = (i % 4) as u8 + 1;
    k.extend_from_slice(format!("k{i:05}").as_bytes());
    k
}

/// Writes keys `range` with values tagged `tag`, flushing every 100.
fn fill(db: &Db, range: std::ops::Range<u32>, tag: &str) {
    for i in range {
        db.put(
            &WriteOptions::default(),
            &key(i),
            format!("{tag}-{i}").as_bytes(),
        )
        .unwrap();
        if i % 100 == 99 {
            db.flush().unwrap();
        }
    }
    db.flush().unwrap();
}

fn check(db: &Db, range: std::ops::Range<u32>, tag: &str) {
    for i in range {
        let got = db.get(&ReadOptions::default(), &key(i)).unwrap();
        assert_eq!(
            got.as_deref(),
            Some(format!("{tag}-{i}").as_bytes()),
            "key {i}"
        );
    }
}

fn tables(store: &dyn TableStore) -> Vec<u64> {
    support::table_numbers(store)
}

fn live_tables(db: &Db) -> usize {
    db.stats().levels.iter().map(|l| l.files).sum()
}

#[test]
fn a_worker_s_compaction_is_installed_and_reads_see_it() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), Path::new(DIR)));
    let worker = Worker::new(Arc::clone(&store), Behaviour::default());
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(Some(&worker))).unwrap();
    fill(&db, 0..1000, "a");
    fill(&db, 0..500, "b");
    let before = db.stats();
    assert!(before.levels[0].files >= 10, "{:?}", before.levels);
    db.compact_range(None, None).unwrap();
    let st = db.stats();
    assert_eq!(st.levels[0].files, 0, "{:?}", st.levels);
    assert!(st.remote_compactions >= 1, "{st:?}");
    assert_eq!(st.remote_compaction_fallbacks, 0);
    assert_eq!(worker.done.load(Ordering::SeqCst), st.remote_compactions);
    check(&db, 0..500, "b");
    check(&db, 500..1000, "a");
    // The store holds the tree's tables and nothing else.
    assert_eq!(tables(&*store).len(), live_tables(&db));
    db.close().unwrap();
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
    check(&db, 0..500, "b");
    check(&db, 500..1000, "a");
    db.close().unwrap();
}

#[test]
fn a_failing_or_lying_worker_leaves_the_compaction_to_the_engine() {
    for behaviour in [
        Behaviour {
            fail_every: 1,
            ..Default::default()
        },
        // The outputs are written, but the answer names other tables.
        Behaviour {
            shift_numbers: 1 << 30,
            ..Default::default()
        },
        // The answer leaves a table out: installed, it would lose its keys.
        Behaviour {
            omit_last_output: true,
            ..Default::default()
        },
    ] {
        let what = format!("{behaviour:?}");
        let mem = Arc::new(MemFs::new());
        let fs: SharedFs = mem.clone();
        let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), Path::new(DIR)));
        let worker = Worker::new(Arc::clone(&store), behaviour);
        let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(Some(&worker))).unwrap();
        fill(&db, 0..1000, "a");
        db.compact_range(None, None).unwrap();
        let st = db.stats();
        assert_eq!(st.levels[0].files, 0, "{what}: {:?}", st.levels);
        assert_eq!(st.remote_compactions, 0, "{what}");
        assert!(st.remote_compaction_fallbacks >= 1, "{what}: {st:?}");
        assert_eq!(
            st.remote_compaction_fallbacks,
            worker.jobs.load(Ordering::SeqCst),
            "{what}"
        );
        check(&db, 0..1000, "a");
        db.close().unwrap();
        // What the lying worker wrote is a stray the next open deletes.
        let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
        assert_eq!(tables(&*store).len(), live_tables(&db), "{what}");
        check(&db, 0..1000, "a");
        db.close().unwrap();
    }
}

/// A crash while a worker runs a job, then the engine opened again, writes and
/// flushes: the worker, still running, then writes its outputs. They must not land on
/// a table of the new engine (the job's numbers were made durable before it left), and
/// the next open deletes them as strays.
#[test]
fn a_worker_running_past_a_crash_never_writes_over_the_engine_s_tables() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), Path::new(DIR)));
    let worker = Worker::new(Arc::clone(&store), Behaviour::default());
    let (release, held) = std::sync::mpsc::channel();
    *worker.hold.lock().unwrap() = Some(held);
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(Some(&worker))).unwrap();
    fill(&db, 0..1000, "a");
    let compacting = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.compact_range(None, None))
    };
    while worker.jobs.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let job = worker.seen.lock().unwrap()[0].clone();
    let job_numbers = job.first_file_number..job.first_file_number + job.file_numbers;
    mem.crash();
    let db2 = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
    check(&db2, 0..1000, "a");
    fill(&db2, 0..300, "b");
    for n in tables(&*store) {
        assert!(
            !job_numbers.contains(&n),
            "table {n} of the reopened engine takes a number of the job {job_numbers:?}"
        );
    }
    // The worker goes on: its outputs land beside the new engine's tables.
    release.send(()).unwrap();
    let _ = compacting.join().unwrap();
    assert_eq!(worker.done.load(Ordering::SeqCst), 1);
    check(&db2, 0..300, "b");
    check(&db2, 300..1000, "a");
    db2.close().unwrap();
    drop(db);
    let db3 = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
    assert_eq!(tables(&*store).len(), live_tables(&db3));
    check(&db3, 0..300, "b");
    check(&db3, 300..1000, "a");
    db3.close().unwrap();
}

/// A job whose numbers cover a table that is not its own (a job built wrong, two
/// engines on one prefix): the worker's upload of that number is refused (tables are
/// created only if absent on an object store), the job fails, the engine compacts
/// itself, and the job's cleanup leaves the other table alone.
#[test]
fn a_job_over_numbers_in_use_fails_and_leaves_their_tables_alone() {
    let bucket: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::memory::InMemory::new());
    let store = || -> SharedTableStore {
        Arc::new(phoenix_engine::ObjectTableStore::new(Arc::clone(&bucket), "db").unwrap())
    };
    let worker = Worker::new(store(), Behaviour::default());
    let (release, held) = std::sync::mpsc::channel();
    *worker.hold.lock().unwrap() = Some(held);
    let fs: SharedFs = Arc::new(MemFs::new());
    let db = Db::open_with_store(fs, Path::new(DIR), store(), options(Some(&worker))).unwrap();
    fill(&db, 0..1000, "a");
    let compacting = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.compact_range(None, None))
    };
    while worker.jobs.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let first = worker.seen.lock().unwrap()[0].first_file_number;
    // Someone else's table at the job's first number, written while the job waits.
    let other = store();
    let mut f = other.create_table(first).unwrap();
    f.append(b"someone else's table").unwrap();
    f.sync_all().unwrap();
    release.send(()).unwrap();
    compacting.join().unwrap().unwrap();
    let st = db.stats();
    // The first job failed; the compactions after it went to the worker as before.
    let (jobs, done) = (
        worker.jobs.load(Ordering::SeqCst),
        worker.done.load(Ordering::SeqCst),
    );
    assert_eq!(
        (jobs - done, st.remote_compaction_fallbacks),
        (1, 1),
        "{st:?}"
    );
    assert_eq!(st.levels[0].files, 0);
    check(&db, 0..1000, "a");
    let got = other.open_table(first).unwrap();
    let mut buf = vec![0u8; 20];
    got.read_exact_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"someone else's table");
    db.close().unwrap();
}

/// The reservation of a job's file numbers is the engine's own manifest write: when it
/// fails, the compaction fails with that error. No worker failure is counted, and no
/// compaction here is tried on a manifest that cannot be written; with the store back,
/// the next compaction goes to the worker.
#[test]
fn a_failed_reservation_is_the_engine_s_error_not_the_worker_s() {
    use support::flaky::{self, Flaky};
    let flaky = Flaky::new(Arc::new(object_store::memory::InMemory::new()));
    let bucket: Arc<dyn object_store::ObjectStore> = flaky.clone();
    let store: SharedTableStore =
        Arc::new(phoenix_engine::ObjectTableStore::new(bucket, "db").unwrap());
    let worker = Worker::new(Arc::clone(&store), Behaviour::default());
    let fs: SharedFs = Arc::new(MemFs::new());
    let db = Db::open_with_store(
        fs,
        Path::new(DIR),
        Arc::clone(&store),
        options(Some(&worker)),
    )
    .unwrap();
    fill(&db, 0..1000, "a");
    flaky.only_uploads_to(Some("MANIFEST"));
    flaky.set_down(flaky::PUT);
    let err = db.compact_range(None, None).unwrap_err();
    let st = db.stats();
    assert_eq!(st.remote_compaction_fallbacks, 0, "{err}: {st:?}");
    assert_eq!(worker.jobs.load(Ordering::SeqCst), 0, "{err}");
    flaky.set_down(0);
    db.compact_range(None, None).unwrap();
    let st = db.stats();
    assert!(st.remote_compactions >= 1, "{st:?}");
    assert_eq!(st.remote_compaction_fallbacks, 0, "{st:?}");
    check(&db, 0..1000, "a");
    db.close().unwrap();
}

/// A background compaction waiting on a worker gives way to the engine's exclusive
/// operations: `close` (as a group drop or an ingest) does not wait out a hung worker,
/// and sends it no more jobs. The worker's late outputs, written after the engine gave
/// up on them, are removed when it answers; nothing of the data is lost.
#[test]
fn a_background_job_on_a_hung_worker_gives_way_to_close() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), Path::new(DIR)));
    let worker = Worker::new(Arc::clone(&store), Behaviour::default());
    let (release, held) = std::sync::mpsc::channel();
    *worker.hold.lock().unwrap() = Some(held);
    let opts = Options {
        disable_auto_compactions: false,
        level0_file_num_compaction_trigger: 4,
        ..options(Some(&worker))
    };
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), opts).unwrap();
    fill(&db, 0..1000, "a");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while worker.jobs.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no job reached the worker"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let closing = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.close())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !closing.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let closed_first = closing.is_finished();
    // The worker goes on and writes its outputs.
    release.send(()).unwrap();
    closing.join().unwrap().unwrap();
    assert!(closed_first, "close waited for the hung worker");
    let st = db.stats();
    assert!(st.remote_compactions_given_way >= 1, "{st:?}");
    // The job's thread removes what the worker wrote for it once it answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while db.stats().remote_compactions_given_way_pending > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the given-up job never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(worker.done.load(Ordering::SeqCst), 1);
    drop(db);
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
    assert_eq!(tables(&*store).len(), live_tables(&db));
    check(&db, 0..1000, "a");
    db.close().unwrap();
}

/// `close` whose flush finds L0 full, while the worker hangs on a background job
/// (WAL off, as on a node): the job gives way, and the compaction that lets the flush
/// through runs here. Before, the engine gave way and sent the same job again, over and
/// over, and `close` never returned while the worker hung.
#[test]
fn close_with_a_full_l0_compacts_here_while_the_worker_hangs() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let store: SharedTableStore = Arc::new(FsTableStore::new(Arc::clone(&fs), Path::new(DIR)));
    let worker = Worker::new(Arc::clone(&store), Behaviour::default());
    let (release, held) = std::sync::mpsc::channel();
    *worker.hold.lock().unwrap() = Some(held);
    let opts = Options {
        wal: WalMode::None,
        disable_auto_compactions: false,
        level0_file_num_compaction_trigger: 4,
        level0_slowdown_writes_trigger: 5,
        level0_stop_writes_trigger: 5,
        ..options(Some(&worker))
    };
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), opts).unwrap();
    fill(&db, 0..500, "a");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while worker.jobs.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no job reached the worker"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(db.stats().levels[0].files, 5);
    for i in 500..510 {
        db.put(
            &WriteOptions::default(),
            &key(i),
            format!("b-{i}").as_bytes(),
        )
        .unwrap();
    }
    let closing = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.close())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !closing.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let closed_first = closing.is_finished();
    release.send(()).unwrap();
    closing.join().unwrap().unwrap();
    assert!(closed_first, "close waited for the hung worker");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while db.stats().remote_compactions_given_way_pending > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the given-up job never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // One job went to the worker: none after it gave way.
    assert_eq!(worker.jobs.load(Ordering::SeqCst), 1);
    drop(db);
    let db = Db::open(Arc::clone(&fs), Path::new(DIR), options(None)).unwrap();
    assert_eq!(tables(&*store).len(), live_tables(&db));
    check(&db, 0..500, "a");
    check(&db, 500..510, "b");
    db.close().unwrap();
}
