//! Crash test on MemFs: seeded random workloads of writes, deletes, range deletes,
//! flushes, compactions, drop_group, ingest (into an emptied group, and over existing
//! data with a new sequence number) and replace_group (a snapshot install; also by range
//! tombstone, replace_group_by_tombstone) are stopped at a random file-system operation
//! (mid-flush, mid-compaction, mid-manifest, mid-WAL append: the file system freezes,
//! then crashes, optionally tearing unsynced writes), reopened and compared with a model.
//!
//! Every batch also writes a sentinel key holding its op number, so the recovered state
//! names the prefix of the writes it claims to hold. Checks:
//! - the recovered state is exactly the model after that prefix (nothing else appears);
//! - the prefix includes every write acknowledged with `sync` (WAL on), every write before
//!   a completed `flush`, and (WAL off) everything `get_persisted` showed before the crash;
//! - with the WAL off, `get_persisted` of the sentinel names the same prefix;
//! - an ingest that returned is there; one cut by the crash is there whole or not at all;
//!   a group replaced by replace_group holds its old keys or exactly the new ones.
//!
//! The same runs go on an object store too (tables and manifest in an in-memory bucket
//! behind `support/flaky.rs`, the WAL on MemFs), crashed at a store request (whose
//! upload or delete may land with its answer lost) or at a file-system operation.
//!
//! Runs use `inline_background`, so a seed replays exactly. `PHOENIX_ENGINE_CRASH_SEEDS`
//! (default 3000; `PHOENIX_ENGINE_OBJECT_CRASH_SEEDS`, default 300, on the object
//! store) runs from `PHOENIX_ENGINE_CRASH_BASE_SEED` (default 1).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use phoenix_engine::compaction::group_key_range;
use phoenix_engine::{
    Db, ObjectTableStore, Options, ReadOptions, SstWriter, WalMode, WriteBatch, WriteOptions,
};
use phoenix_storage::{FaultKind, MemFs, SharedFs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod support;
use support::flaky::{self, Flaky};

const SENTINEL: &[u8] = &[0xff; 9];

static INGESTS_TRIED: AtomicU64 = AtomicU64::new(0);
static INGESTS_DONE: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Rec {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
    Range(Vec<u8>, Vec<u8>),
}

#[derive(Clone, Debug)]
enum Step {
    Batch(Vec<Rec>, bool),
    Flush,
    Compact,
    DropGroup(u64),
    /// drop_group(g), then ingest `n` keys into g from a file built with SstWriter.
    DropAndIngest(u64, u64),
    /// Ingest `n` keys into g over whatever is there (a new sequence number).
    Ingest(u64, u64),
    /// Replace every key of g with `n` keys (replace_group; with `true`,
    /// replace_group_by_tombstone).
    Replace(u64, u64, bool),
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn key(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let g: u64 = rng.gen_range(0..3);
    let mut k = g.to_be_bytes().to_vec();
    k.push(b'd');
    k.extend_from_slice(format!("{:02}", rng.gen_range(0..60)).as_bytes());
    k
}

fn plan(rng: &mut ChaCha8Rng, wal: bool) -> Vec<Step> {
    let n = rng.gen_range(40..160);
    (0..n)
        .map(|i| match rng.gen_range(0..100) {
            0..=79 => {
                let recs = (0..rng.gen_range(1..5))
                    .map(|_| match rng.gen_range(0..10) {
                        0..=6 => {
                            let len = rng.gen_range(1..120);
                            Rec::Put(key(rng), vec![b'a' + (i % 26) as u8; len])
                        }
                        7..=8 => Rec::Del(key(rng)),
                        _ => {
                            let (a, b) = (key(rng), key(rng));
                            if a < b {
                                Rec::Range(a, b)
                            } else {
                                Rec::Del(a)
                            }
                        }
                    })
                    .collect();
                Step::Batch(recs, wal && rng.gen_bool(0.3))
            }
            80..=87 => Step::Flush,
            88..=92 => Step::Compact,
            93..=95 => Step::DropGroup(rng.gen_range(0..3)),
            96 => Step::Ingest(rng.gen_range(0..3), rng.gen_range(1..30)),
            97 => Step::Replace(rng.gen_range(0..3), rng.gen_range(1..30), rng.gen_bool(0.5)),
            _ => Step::DropAndIngest(rng.gen_range(0..3), rng.gen_range(1..30)),
        })
        .collect()
}

fn options(rng: &mut ChaCha8Rng, wal: bool) -> Options {
    Options {
        write_buffer_size: rng.gen_range(1..6) << 10,
        target_file_size_base: rng.gen_range(1..4) << 10,
        max_bytes_for_level_base: 8 << 10,
        max_bytes_for_level_multiplier: 4,
        level0_file_num_compaction_trigger: 2,
        num_levels: 4,
        block_cache_size: 0,
        wal: if wal { WalMode::Log } else { WalMode::None },
        wal_segment_size: 64 << 10,
        inline_background: true,
        min_group_file_size: if rng.gen_bool(0.5) { 0 } else { 2 << 10 },
        // Pieces of a compaction installed as it goes: none, often, or now and then.
        compaction_piece_bytes: [0, 1 << 10, 4 << 10][rng.gen_range(0..3)],
        table: phoenix_engine::table::TableOptions {
            block_size: 512,
            ..Default::default()
        },
        ..Options::default()
    }
}

type Puts = Vec<(Vec<u8>, Vec<u8>)>;

/// What the workload learned before the crash.
#[derive(Default, Debug)]
struct Outcome {
    /// Batches issued (attempted), numbered from 1.
    issued: u64,
    /// Largest batch number that must survive.
    must_have: u64,
    /// All batches in order (index = number - 1).
    batches: Vec<Vec<Rec>>,
    /// Ingests: (number of batches issued before, puts, whether `ingest` returned Ok,
    /// the group it replaced whole if it was a replace_group).
    ingests: Vec<(u64, Puts, bool, Option<u64>)>,
}

fn batch_of(recs: &[Rec], number: u64) -> WriteBatch {
    let mut b = WriteBatch::new();
    for r in recs {
        match r {
            Rec::Put(k, v) => b.put(k, v),
            Rec::Del(k) => b.delete(k),
            Rec::Range(a, e) => b.delete_range(a, e),
        }
    }
    b.put(SENTINEL, &number.to_le_bytes());
    b
}

fn drop_group(db: &Db, out: &mut Outcome, g: u64, wal: bool) -> bool {
    let (s, e) = group_key_range(g);
    let recs = vec![Rec::Range(s, e.unwrap())];
    out.issued += 1;
    out.batches.push(recs.clone());
    let n = out.issued;
    let r = db.write(
        &WriteOptions {
            sync: wal,
            disable_wal: false,
        },
        batch_of(&recs, n),
    );
    if r.is_ok() && wal {
        out.must_have = n;
    }
    r.is_ok() && db.drop_group(g).is_ok()
}

fn ingest(
    db: &Db,
    fs: &SharedFs,
    out: &mut Outcome,
    (g, n): (u64, u64),
    replace: bool,
    by_tombstone: bool,
) -> bool {
    let path = PathBuf::from(format!("/ingest-{}-{g}.sst", out.issued));
    let puts: Puts = (0..n)
        .map(|i| {
            let mut k = g.to_be_bytes().to_vec();
            k.push(b'd');
            k.extend_from_slice(format!("{:02}", i * 2).as_bytes());
            (k, format!("ingested-{}", out.issued).into_bytes())
        })
        .collect();
    let built = (|| {
        let mut w = SstWriter::create(fs, &path, &Default::default())?;
        for (k, v) in &puts {
            w.put(k, v)?;
        }
        w.finish()
    })();
    if built.is_err() {
        return false;
    }
    out.ingests
        .push((out.issued, puts, false, replace.then_some(g)));
    INGESTS_TRIED.fetch_add(1, Ordering::Relaxed);
    let r = if replace && by_tombstone {
        db.replace_group_by_tombstone(g, &[path])
    } else if replace {
        db.replace_group(g, &[path])
    } else {
        db.ingest(&[path])
    };
    if let Err(e) = &r {
        // An ingest may only fail because the crash point froze the file system.
        assert!(
            !matches!(e, phoenix_engine::Error::InvalidArgument(_)),
            "ingest refused: {e}"
        );
    }
    let ok = r.is_ok();
    if ok {
        INGESTS_DONE.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(last) = out.ingests.last_mut() {
        last.2 = ok;
    }
    if ok && replace {
        // replace_group (either way) flushed every batch before it.
        out.must_have = out.issued;
    }
    ok
}

/// Runs `steps` until the first error; returns what must survive.
fn workload(db: &Db, fs: &SharedFs, steps: &[Step], wal: bool) -> Outcome {
    let mut out = Outcome::default();
    for step in steps {
        let ok = match step {
            Step::Batch(recs, sync) => {
                out.issued += 1;
                out.batches.push(recs.clone());
                let n = out.issued;
                let r = db.write(
                    &WriteOptions {
                        sync: *sync,
                        disable_wal: false,
                    },
                    batch_of(recs, n),
                );
                if r.is_ok() && *sync {
                    out.must_have = n;
                }
                r.is_ok()
            }
            Step::Flush => {
                let r = db.flush();
                if r.is_ok() {
                    out.must_have = out.issued;
                }
                r.is_ok()
            }
            Step::Compact => db.compact_range(None, None).is_ok(),
            Step::DropGroup(g) => drop_group(db, &mut out, *g, wal),
            Step::DropAndIngest(g, n) => {
                drop_group(db, &mut out, *g, wal)
                    && ingest(db, fs, &mut out, (*g, *n), false, false)
            }
            Step::Ingest(g, n) => ingest(db, fs, &mut out, (*g, *n), false, false),
            Step::Replace(g, n, t) => ingest(db, fs, &mut out, (*g, *n), true, *t),
        };
        if !wal {
            if let Ok(Some(v)) = db.get_persisted(SENTINEL) {
                let p = u64::from_le_bytes(v.try_into().unwrap());
                out.must_have = out.must_have.max(p);
            }
        }
        if !ok {
            break;
        }
    }
    out
}

/// The model after batch `n`, with the ingests done in between at their places. A
/// returned ingest is durable, so one issued after batch `n` is there too, applied last:
/// an ingest flushes every memtable when one holds keys of its range, so the batches
/// after `n` that a crash can lose never touch its keys. `with_cut` also applies an
/// ingest the crash interrupted.
fn model_after(out: &Outcome, n: u64, with_cut: bool) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    let apply_ingests = |m: &mut BTreeMap<Vec<u8>, Vec<u8>>, after: u64| {
        for (at, puts, acked, replace) in &out.ingests {
            if *at == after && (*acked || with_cut) {
                if let Some(g) = replace {
                    let (s, e) = group_key_range(*g);
                    m.retain(|k, _| !(s.as_slice() <= k.as_slice() && k < e.as_ref().unwrap()));
                }
                for (k, v) in puts {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
    };
    apply_ingests(&mut m, 0);
    for (i, recs) in out.batches.iter().take(n as usize).enumerate() {
        for r in recs {
            match r {
                Rec::Put(k, v) => {
                    m.insert(k.clone(), v.clone());
                }
                Rec::Del(k) => {
                    m.remove(k);
                }
                Rec::Range(a, e) => m.retain(|k, _| !(a <= k && k < e)),
            }
        }
        m.insert(SENTINEL.to_vec(), (i as u64 + 1).to_le_bytes().to_vec());
        apply_ingests(&mut m, i as u64 + 1);
    }
    for after in n + 1..=out.issued {
        apply_ingests(&mut m, after);
    }
    m
}

fn run(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let wal = rng.gen_bool(0.5);
    let opts = options(&mut rng, wal);
    let steps = plan(&mut rng, wal);
    let torn = rng.gen_bool(0.5);
    let dir = Path::new("/crash");

    // Count the file-system operations of an undisturbed run to pick a crash point.
    let total = {
        let mem = Arc::new(MemFs::new());
        let fs: SharedFs = mem.clone();
        let db = Db::open(Arc::clone(&fs), dir, opts.clone()).unwrap();
        let before = mem.op_count(FaultKind::Any);
        let _ = workload(&db, &fs, &steps, wal);
        let n = mem.op_count(FaultKind::Any) - before;
        mem.freeze_after(0);
        drop(db);
        n
    };
    let freeze_at = rng.gen_range(0..total.max(1) + 5);

    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let db = Db::open(Arc::clone(&fs), dir, opts.clone()).unwrap();
    mem.freeze_after(freeze_at);
    let out = workload(&db, &fs, &steps, wal);
    // Stop the world, then lose power; the old instance can touch nothing after this.
    mem.freeze_after(0);
    drop(db);
    if torn {
        mem.crash_torn(seed);
    } else {
        mem.crash();
    }

    let at = format!("freeze at op {freeze_at} of {total}");
    verify(
        &out,
        wal,
        &|| Db::open(Arc::clone(&fs), dir, opts.clone()).unwrap(),
        &at,
    );
}

/// Reopens (`open`) after a crash and checks the engine against the model of what the
/// workload learned (`out`); `at` names the crash point for messages.
fn verify(out: &Outcome, wal: bool, open: &dyn Fn() -> Arc<Db>, at: &str) {
    let db = open();
    let ro = ReadOptions::default();
    let got_n = db
        .get(&ro, SENTINEL)
        .unwrap()
        .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
    assert!(
        got_n >= out.must_have,
        "recovered prefix {got_n} lost acknowledged batch {} ({at})",
        out.must_have
    );
    assert!(
        got_n <= out.issued,
        "recovered batch {got_n} was never issued"
    );
    if !wal {
        let p = db
            .get_persisted(SENTINEL)
            .unwrap()
            .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
        assert_eq!(
            p, got_n,
            "persisted sentinel differs from the recovered state"
        );
    }
    let want = model_after(out, got_n, false);
    let want_cut = model_after(out, got_n, true);
    let mut it = db.iter(&ro).unwrap();
    it.seek_to_first();
    let mut got = BTreeMap::new();
    while it.valid() {
        got.insert(it.key().to_vec(), it.value().to_vec());
        it.next();
    }
    it.status().unwrap();
    drop(it);
    if got != want && got != want_cut {
        let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let differ: Vec<_> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .map(|(k, _)| k)
            .collect();
        panic!(
            "state after recovery is not the model after batch {got_n}: extra {extra:?}, \
             missing {missing:?}, different {differ:?} ({at})"
        );
    }
    // The recovered database takes writes and survives another clean reopen.
    db.put(&WriteOptions::default(), b"after", b"crash")
        .unwrap();
    db.flush().unwrap();
    db.close().unwrap();
    drop(db);
    let db = open();
    assert_eq!(db.get(&ro, b"after").unwrap(), Some(b"crash".to_vec()));
    assert_eq!(
        db.get(&ro, SENTINEL)
            .unwrap()
            .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap())),
        got_n
    );
}

/// [`run`] with the tables and manifest on an object store (in memory, behind
/// `support/flaky.rs`), the WAL on MemFs. The crash comes at a store request (half the
/// time that request, an upload or a delete, lands and its answer is lost) or at a
/// file-system operation; either way both stop there. Odd seeds run the compactions on
/// an in-process worker (`support/worker.rs`) over the same store.
fn run_on_objects(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let wal = rng.gen_bool(0.5);
    let opts = options(&mut rng, wal);
    let steps = plan(&mut rng, wal);
    let torn = rng.gen_bool(0.5);
    // Every other run hands compactions to a worker writing through the same store: a
    // crash then also comes while it reads and writes.
    let on_worker = seed % 2 == 1;
    let dir = Path::new("/crash");
    let open = |fs: &SharedFs, store: &Arc<Flaky>| {
        let tables =
            ObjectTableStore::new(Arc::clone(store) as Arc<dyn ObjectStore>, "db").unwrap();
        let mut opts = opts.clone();
        if on_worker {
            let own =
                ObjectTableStore::new(Arc::clone(store) as Arc<dyn ObjectStore>, "db").unwrap();
            let worker =
                support::worker::Worker::new(Arc::new(own), support::worker::Behaviour::default());
            WORKERS.lock().unwrap().push(Arc::clone(&worker));
            opts.compaction_service = Some(worker);
        }
        Db::open_with_store(Arc::clone(fs), dir, Arc::new(tables), opts).unwrap()
    };

    // Count the requests and file-system operations of an undisturbed run.
    let (requests, ops) = {
        let mem = Arc::new(MemFs::new());
        let fs: SharedFs = mem.clone();
        let store = Flaky::new(Arc::new(InMemory::new()));
        let db = open(&fs, &store);
        let (r, o) = (store.requests(), mem.op_count(FaultKind::Any));
        let _ = workload(&db, &fs, &steps, wal);
        let counts = (store.requests() - r, mem.op_count(FaultKind::Any) - o);
        store.set_down(flaky::ALL);
        mem.freeze_after(0);
        drop(db);
        counts
    };
    let on_store = rng.gen_bool(0.5);
    let lands = rng.gen_bool(0.5);
    let crash_at = rng.gen_range(0..if on_store { requests } else { ops }.max(1) + 5);

    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let bucket = Arc::new(InMemory::new());
    let store = Flaky::new(Arc::clone(&bucket) as Arc<dyn ObjectStore>);
    let db = open(&fs, &store);
    if on_store {
        let frozen = Arc::clone(&mem);
        store.crash_after(crash_at, lands, move || frozen.freeze_after(0));
    } else {
        mem.freeze_after(crash_at);
    }
    let out = workload(&db, &fs, &steps, wal);
    // Stop the world, then lose power; the old instance can touch nothing after this.
    store.set_down(flaky::ALL);
    mem.freeze_after(0);
    drop(db);
    if torn {
        mem.crash_torn(seed);
    } else {
        mem.crash();
    }
    let at = if on_store {
        format!("crash at store request {crash_at} of {requests}, landing: {lands}")
    } else {
        format!("freeze at op {crash_at} of {ops}")
    };
    // A new process: the same bucket, a store that answers.
    let healed = Flaky::new(bucket as Arc<dyn ObjectStore>);
    verify(&out, wal, &|| open(&fs, &healed), &at);
}

/// The workers of the runs on a worker, to count what they did.
static WORKERS: std::sync::Mutex<Vec<Arc<support::worker::Worker>>> =
    std::sync::Mutex::new(Vec::new());

#[test]
fn crash_recovery_on_an_object_store_matches_model() {
    let base = env_u64("PHOENIX_ENGINE_CRASH_BASE_SEED", 1);
    let seeds = env_u64("PHOENIX_ENGINE_OBJECT_CRASH_SEEDS", 300);
    for seed in base..base + seeds {
        if let Err(e) = std::panic::catch_unwind(|| run_on_objects(seed)) {
            eprintln!(
                "crash run on the object store failed; replay with: \
                 PHOENIX_ENGINE_CRASH_BASE_SEED={seed} PHOENIX_ENGINE_OBJECT_CRASH_SEEDS=1 \
                 cargo test -p phoenix-engine --test crash on_an_object_store"
            );
            std::panic::resume_unwind(e);
        }
    }
    if seeds >= 10 {
        let done: u64 = WORKERS
            .lock()
            .unwrap()
            .iter()
            .map(|w| w.done.load(Ordering::SeqCst))
            .sum();
        assert!(done > 0, "no compaction of the runs on a worker ran there");
        println!("compactions on the worker: {done}");
    }
}

#[test]
fn crash_recovery_matches_model() {
    let base = env_u64("PHOENIX_ENGINE_CRASH_BASE_SEED", 1);
    let seeds = env_u64("PHOENIX_ENGINE_CRASH_SEEDS", 3000);
    for seed in base..base + seeds {
        if let Err(e) = std::panic::catch_unwind(|| run(seed)) {
            eprintln!(
                "crash run failed; replay with: PHOENIX_ENGINE_CRASH_BASE_SEED={seed} \
                 PHOENIX_ENGINE_CRASH_SEEDS=1 cargo test -p phoenix-engine --test crash"
            );
            std::panic::resume_unwind(e);
        }
    }
    println!(
        "ingests: {} returned of {} tried",
        INGESTS_DONE.load(Ordering::Relaxed),
        INGESTS_TRIED.load(Ordering::Relaxed)
    );
}
