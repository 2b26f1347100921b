//! Model-based test: seeded random operations on the Db and on a `BTreeMap`, compared
//! after every read — gets, multi-gets, iterators in both directions with bounds, at the
//! latest state and at snapshots, prefix seeks with and without prefix filters — across
//! flushes, compactions, drop_group, ingests over
//! existing data and reopens.
//!
//! The same runs go on with the tables and manifest on an (in-memory) object store
//! (`ObjectTableStore`), fewer of them, and on a MinIO server (fewer still; needs MinIO).
//! On an object store that fails (`support::flaky`) now and then for a few operations
//! (every request, or reads, or uploads refused) or loses the answer to an upload (a
//! table's, a manifest's, `CURRENT`'s), the operations that touch no store go on, and
//! those that may fail fail as retryable and change nothing (a write refused when its
//! flush could not run is not in the engine; a read that failed is not compared).
//!
//! `PHOENIX_SEED` picks the first seed (default 1), `PHOENIX_ENGINE_MODEL_RUNS` the number
//! of runs (default 100; on the object store `PHOENIX_ENGINE_MODEL_OBJECT_RUNS`, default
//! 20; with faults `PHOENIX_ENGINE_MODEL_FAULT_RUNS`, default 10; on MinIO
//! `PHOENIX_ENGINE_MODEL_MINIO_RUNS`, default 3); a failure prints the line that replays
//! it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use phoenix_engine::{
    Db, FlashCache, ObjectTableStore, Options, ReadOptions, SharedTableStore, Snapshot, SstWriter,
    WalMode, WriteBatch, WriteOptions,
};
use phoenix_storage::{MemFs, SharedFs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod support;
use support::flaky::{self, Flaky};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn random_key(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.gen_ratio(1, 20) {
        // Short keys are zero-padded into group 0.
        return vec![0u8; rng.gen_range(1..8)];
    }
    if rng.gen_ratio(1, 40) {
        // 0xff bytes where prefixes end: the prefix's successor carries (group 3), or
        // there is none (the last group).
        let mut k = if rng.gen_bool(0.5) {
            3u64.to_be_bytes().to_vec()
        } else {
            vec![0xff; 8]
        };
        k.extend_from_slice(&[0xff, 0xff]);
        k.push(b'0' + rng.gen_range(0..3));
        return k;
    }
    let g: u64 = rng.gen_range(0..4);
    let mut k = g.to_be_bytes().to_vec();
    k.push(b'd');
    k.extend_from_slice(format!("{:03}", rng.gen_range(0..120)).as_bytes());
    k
}

fn random_value(rng: &mut ChaCha8Rng, op: u64) -> Vec<u8> {
    let len = rng.gen_range(0..200);
    let mut v = format!("v{op}-").into_bytes();
    v.resize(v.len() + len, b'a' + (op % 26) as u8);
    v
}

fn options(rng: &mut ChaCha8Rng) -> Options {
    Options {
        write_buffer_size: rng.gen_range(2..16) << 10,
        target_file_size_base: rng.gen_range(1..8) << 10,
        max_bytes_for_level_base: 16 << 10,
        max_bytes_for_level_multiplier: 4,
        level0_file_num_compaction_trigger: 2,
        level0_slowdown_writes_trigger: 8,
        level0_stop_writes_trigger: 12,
        num_levels: 4,
        block_cache_size: if rng.gen_bool(0.5) { 64 << 10 } else { 0 },
        wal: if rng.gen_bool(0.5) {
            WalMode::Log
        } else {
            WalMode::None
        },
        disable_auto_compactions: rng.gen_bool(0.3),
        inline_background: rng.gen_bool(0.3),
        max_background_jobs: rng.gen_range(2..5),
        min_group_file_size: if rng.gen_bool(0.5) { 0 } else { 4 << 10 },
        // Pieces of a compaction installed as it goes: none, often, or now and then.
        compaction_piece_bytes: [0, 1 << 10, 4 << 10][rng.gen_range(0..3)],
        table: phoenix_engine::table::TableOptions {
            block_size: rng.gen_range(1..4) << 9,
            bloom_bits_per_key: if rng.gen_bool(0.8) { 10 } else { 0 },
            // Keys are group (8) ‖ 'd' ‖ 3 digits (000-119): 9 puts a group's keys under
            // one prefix, 10 splits it in 2 and 11 in 12.
            prefix_len: [0, 9, 10, 11][rng.gen_range(0..4)],
            ..Default::default()
        },
        wal_segment_size: 256 << 10,
        memtable_prefix_bloom_size_ratio: if rng.gen_bool(0.5) { 0.1 } else { 0.0 },
        // Keeping what the WAL replays in memtables reads them (and their prefix
        // filters) after a reopen.
        avoid_flush_during_recovery: rng.gen_bool(0.5),
        // (Faults: tries come back soon.)
        // Background work tried again soon after the store's outage (a few operations
        // long) ends: the run's operations wait on it, not on the clock.
        retry_backoff_min: std::time::Duration::from_millis(2),
        retry_backoff_max: std::time::Duration::from_millis(20),
        ..Options::default()
    }
}

fn check_iter(
    db: &Db,
    prefix_len: usize,
    model: &Model,
    snap: Option<&Snapshot>,
    rng: &mut ChaCha8Rng,
) {
    let mut lower = None;
    let mut upper = None;
    if rng.gen_bool(0.3) {
        lower = Some(random_key(rng));
    }
    if rng.gen_bool(0.3) {
        upper = Some(random_key(rng));
    }
    let prefix_mode = prefix_len > 0 && rng.gen_bool(0.5);
    let ro = ReadOptions {
        snapshot: snap,
        lower_bound: lower.clone(),
        upper_bound: upper.clone(),
        prefix_same_as_start: prefix_mode,
        ..Default::default()
    };
    let lo = lower.clone().map_or(Bound::Unbounded, Bound::Included);
    let hi = upper.clone().map_or(Bound::Unbounded, Bound::Excluded);
    let in_bounds: Vec<(&Vec<u8>, &Vec<u8>)> = if matches!((&lower, &upper), (Some(l), Some(u)) if l >= u)
    {
        Vec::new()
    } else {
        model.range((lo, hi)).collect()
    };
    let mut it = db.iter(&ro).unwrap();
    // Position the same iterator a few times (a prefix seek, then another prefix, a short
    // key, the first key...), wandering after each, comparing with the model.
    for _ in 0..rng.gen_range(1..4) {
        let how = rng.gen_range(0..4);
        let target = random_key(rng);
        // In prefix mode a seek sees only the prefix of its target clamped to the bounds
        // (to the lower bound going forward, the upper going backward), when that is at
        // least `prefix_len` long.
        let clamped = match (how, &lower, &upper) {
            (2, Some(l), _) if target < *l => l.clone(),
            (3, _, Some(u)) if target >= *u => u.clone(),
            _ => target.clone(),
        };
        let prefix = (prefix_mode && how >= 2)
            .then(|| clamped.get(..prefix_len))
            .flatten();
        let view: Vec<(&Vec<u8>, &Vec<u8>)> = in_bounds
            .iter()
            .filter(|(k, _)| prefix.is_none_or(|p| k.starts_with(p)))
            .copied()
            .collect();
        let mut pos: Option<usize> = match how {
            0 => {
                it.seek_to_first();
                (!view.is_empty()).then_some(0)
            }
            1 => {
                it.seek_to_last();
                view.len().checked_sub(1)
            }
            2 => {
                it.seek(&target);
                let t = match &lower {
                    Some(l) if target < *l => l,
                    _ => &target,
                };
                let i = view.partition_point(|(k, _)| *k < t);
                (i < view.len()).then_some(i)
            }
            _ => {
                it.seek_for_prev(&target);
                let i = view.partition_point(|(k, _)| **k <= target);
                i.checked_sub(1)
            }
        };
        let what = format!(
            "prefix mode {prefix_mode}, len {prefix_len}, positioned by {how} at {target:?}, \
             lower {lower:?}, upper {upper:?}"
        );
        for _ in 0..rng.gen_range(1..40) {
            it.status().unwrap();
            let Some(i) = pos else {
                assert!(
                    !it.valid(),
                    "iterator valid at {:?}, model exhausted ({what})",
                    it.key()
                );
                break;
            };
            assert!(
                it.valid(),
                "iterator exhausted, model at {:?} ({what})",
                view[i].0
            );
            assert_eq!(it.key(), view[i].0.as_slice(), "{what}");
            assert_eq!(it.value(), view[i].1.as_slice(), "{what}");
            if rng.gen_bool(0.5) {
                it.next();
                pos = (i + 1 < view.len()).then_some(i + 1);
            } else {
                it.prev();
                pos = i.checked_sub(1);
            }
        }
    }
}

/// Where a run keeps the tables and manifest.
#[derive(Clone, Copy, Debug)]
enum Tables<'a> {
    /// In the database directory (`Db::open`).
    Directory,
    /// On an in-memory object store.
    Objects,
    /// On an in-memory object store that fails now and then.
    FlakyObjects,
    /// On an in-memory object store, compactions run by a worker (`support::worker`)
    /// that refuses some jobs.
    ObjectsWithWorker,
    /// On a MinIO server, a prefix for each run.
    Minio(&'a support::minio::Minio),
}

fn run(seed: u64, tables: Tables) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let dir = Path::new("/model");
    let mut opts = options(&mut rng);
    let in_memory: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::memory::InMemory::new());
    // The worker's own store over the same objects (it takes no writer's place).
    let fail_every = rng.gen_range(0..6);
    let worker = matches!(tables, Tables::ObjectsWithWorker).then(|| {
        let store = ObjectTableStore::new(Arc::clone(&in_memory), "db/model").unwrap();
        support::worker::Worker::new(
            Arc::new(store),
            support::worker::Behaviour {
                fail_every,
                ..Default::default()
            },
        )
    });
    if let Some(w) = &worker {
        opts.compaction_service = Some(Arc::clone(w) as Arc<dyn phoenix_engine::CompactionService>);
    }
    let flaky = matches!(tables, Tables::FlakyObjects)
        .then(|| Flaky::new(Arc::new(object_store::memory::InMemory::new())));
    let object_store = match tables {
        Tables::Directory => None,
        Tables::Objects | Tables::ObjectsWithWorker => {
            Some(ObjectTableStore::new(Arc::clone(&in_memory), "db/model").unwrap())
        }
        Tables::FlakyObjects => Some(
            ObjectTableStore::new(
                Arc::clone(flaky.as_ref().unwrap()) as Arc<dyn object_store::ObjectStore>,
                "db/model",
            )
            .unwrap(),
        ),
        Tables::Minio(m) => {
            Some(ObjectTableStore::from_url(&m.url(&format!("model/{seed}"))).unwrap())
        }
    };
    // Reads go through a flash cache small enough to evict (and, every other run, none
    // at all: the store's own reads).
    if let Some(store) = &object_store {
        if seed.is_multiple_of(2) {
            let cache = FlashCache::open(Arc::clone(&fs), Path::new("/flash"), 1 << 20).unwrap();
            store.set_flash_cache(cache).unwrap();
        }
    }
    let objects: Option<SharedTableStore> = object_store.map(|s| Arc::new(s) as SharedTableStore);
    let open = |opts: &Options| match &objects {
        Some(store) => {
            Db::open_with_store(Arc::clone(&fs), dir, Arc::clone(store), opts.clone()).unwrap()
        }
        None => Db::open(Arc::clone(&fs), dir, opts.clone()).unwrap(),
    };
    let mut db = open(&opts);
    // Compactions the worker ran, and those it failed, over the run's engines.
    let mut remote = (0u64, 0u64, 0u64);
    let mut model = Model::new();
    let mut snaps: Vec<(Snapshot, Model)> = Vec::new();
    let wo = WriteOptions::default();
    let ops = env_u64("PHOENIX_ENGINE_MODEL_OPS", 1500);
    // Operations left of the store's outage (with faults).
    let mut outage = 0u32;
    for op in 0..ops {
        let mut pick = rng.gen_range(0..100);
        // Whether the store may fail this operation: then only operations that fail
        // cleanly run (no iterators, no group drop, no ingest, no reopen), and, with
        // background threads, writes only while the memtable has room (a write that
        // waits for a flush would wait for the store).
        let mut faulty = false;
        if let Some(f) = &flaky {
            if outage > 0 {
                outage -= 1;
                if outage == 0 {
                    f.set_down(0);
                }
            } else if rng.gen_ratio(1, 50) {
                f.set_down([flaky::ALL, flaky::GET, flaky::PUT][rng.gen_range(0..3)]);
                outage = rng.gen_range(1..8);
            } else if rng.gen_ratio(1, 30) {
                f.lose_answers_to(["MANIFEST", "CURRENT", ".sst"][rng.gen_range(0..3)], 1);
            }
            faulty = outage > 0 || f.losses_pending();
            let room = opts.inline_background || {
                let s = db.stats();
                s.immutable_memtables == 0 && s.memtable_bytes + (2 << 10) < opts.write_buffer_size
            };
            if faulty && (matches!(pick, 71..=80 | 92..=97) || pick <= 50 && !room) {
                pick = 99;
            }
        }
        // An operation's result: what the store's failure may excuse is let go.
        let excused = |r: Result<(), phoenix_engine::Error>, what: &str| -> bool {
            match r {
                Ok(()) => true,
                Err(e) if faulty && e.is_retryable() => false,
                Err(e) => panic!("seed {seed}: {what}: {e}"),
            }
        };
        match pick {
            0..=34 => {
                let k = random_key(&mut rng);
                let v = random_value(&mut rng, op);
                if excused(db.put(&wo, &k, &v), "put") {
                    model.insert(k, v);
                }
            }
            35..=42 => {
                let k = random_key(&mut rng);
                if excused(db.delete(&wo, &k), "delete") {
                    model.remove(&k);
                }
            }
            43..=45 => {
                let a = random_key(&mut rng);
                let b = random_key(&mut rng);
                if a < b && excused(db.delete_range(&wo, &a, &b), "delete_range") {
                    let doomed: Vec<Vec<u8>> = model.range(a..b).map(|(k, _)| k.clone()).collect();
                    for k in doomed {
                        model.remove(&k);
                    }
                }
            }
            46..=50 => {
                let mut b = WriteBatch::new();
                let mut staged = model.clone();
                for _ in 0..rng.gen_range(1..8) {
                    let k = random_key(&mut rng);
                    if rng.gen_bool(0.7) {
                        let v = random_value(&mut rng, op);
                        b.put(&k, &v);
                        staged.insert(k, v);
                    } else {
                        b.delete(&k);
                        staged.remove(&k);
                    }
                }
                if excused(db.write(&wo, b), "write") {
                    model = staged;
                }
            }
            51..=70 => {
                let k = random_key(&mut rng);
                let (snap, m) = if !snaps.is_empty() && rng.gen_bool(0.3) {
                    let (s, m) = &snaps[rng.gen_range(0..snaps.len())];
                    (Some(s), m)
                } else {
                    (None, &model)
                };
                let ro = ReadOptions {
                    snapshot: snap,
                    ..Default::default()
                };
                match db.get(&ro, &k) {
                    Ok(got) => assert_eq!(got, m.get(&k).cloned(), "get {k:?}"),
                    Err(e) => assert!(faulty && e.is_retryable(), "seed {seed}: get: {e}"),
                }
                if rng.gen_bool(0.2) {
                    // Up to 10 keys (repeats allowed), their blocks read at once or not.
                    let mut keys = vec![k.clone()];
                    keys.extend((0..rng.gen_range(1..10)).map(|_| random_key(&mut rng)));
                    let ro = ReadOptions {
                        parallel_io: rng.gen_bool(0.5),
                        ..ro
                    };
                    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                    match db.multi_get(&ro, &refs) {
                        Ok(got) => {
                            let want: Vec<_> = keys.iter().map(|k| m.get(k).cloned()).collect();
                            assert_eq!(got, want, "multi_get {keys:?}");
                        }
                        Err(e) => assert!(faulty && e.is_retryable(), "seed {seed}: {e}"),
                    }
                }
            }
            71..=80 => {
                if !snaps.is_empty() && rng.gen_bool(0.3) {
                    let i = rng.gen_range(0..snaps.len());
                    let (s, m) = &snaps[i];
                    check_iter(&db, opts.table.prefix_len, m, Some(s), &mut rng);
                } else {
                    check_iter(&db, opts.table.prefix_len, &model, None, &mut rng);
                }
            }
            81..=84 => {
                if snaps.len() < 4 {
                    snaps.push((db.snapshot(), model.clone()));
                } else {
                    snaps.remove(rng.gen_range(0..snaps.len()));
                }
            }
            85..=88 => {
                if !excused(db.flush(), "flush") {
                    continue;
                }
                // Everything is in tables now: the persisted view is the model.
                for _ in 0..8 {
                    let k = random_key(&mut rng);
                    match db.get_persisted(&k) {
                        Ok(got) => assert_eq!(
                            got,
                            model.get(&k).cloned(),
                            "seed {seed}: get_persisted {k:?} after a flush"
                        ),
                        Err(e) => assert!(faulty && e.is_retryable(), "seed {seed}: {e}"),
                    }
                }
                if opts.min_group_file_size == 0 {
                    let st = db.stats();
                    for (l, ls) in st.levels.iter().enumerate().skip(1) {
                        assert_eq!(ls.mixed_group_files, 0, "seed {seed}: L{l} mixes groups");
                    }
                }
            }
            89..=91 => {
                let r = if rng.gen_bool(0.5) {
                    db.compact_range(None, None)
                } else {
                    let a = random_key(&mut rng);
                    let b = random_key(&mut rng);
                    db.compact_range(Some(&a.clone().min(b.clone())), Some(&a.max(b)))
                };
                excused(r, "compact_range");
            }
            92..=93 => {
                // drop_group does not preserve older snapshots' view.
                snaps.clear();
                let g: u64 = rng.gen_range(0..4);
                db.drop_group(g).unwrap();
                model.retain(|k, _| phoenix_engine::key::group_of(k) != g);
            }
            94..=95 => {
                snaps.clear();
                db.close().unwrap();
                // (After the close: a compaction under way finishes first.)
                let st = db.stats();
                remote.0 += st.remote_compactions;
                remote.1 += st.remote_compaction_fallbacks;
                remote.2 += st.remote_compactions_given_way;
                drop(db);
                if rng.gen_bool(0.3) {
                    // Another prefix length: tables keep filters of the old one, which
                    // must not be used.
                    opts.table.prefix_len = [0, 9, 10, 11][rng.gen_range(0..4)];
                }
                db = open(&opts);
            }
            96..=97 => {
                // A table built outside, ingested over whatever is there: its puts and
                // deletes shadow older versions.
                let mut keys: Vec<Vec<u8>> = (0..rng.gen_range(1..40))
                    .map(|_| random_key(&mut rng))
                    .collect();
                keys.sort();
                keys.dedup();
                let path = format!("/ingest-{op}.sst");
                let mut w = SstWriter::create(&fs, Path::new(&path), &opts.table).unwrap();
                let mut staged = model.clone();
                for k in &keys {
                    if rng.gen_bool(0.8) {
                        let v = random_value(&mut rng, op);
                        w.put(k, &v).unwrap();
                        staged.insert(k.clone(), v);
                    } else {
                        w.delete(k).unwrap();
                        staged.remove(k);
                    }
                }
                w.finish().unwrap();
                let (lo, hi) = (keys[0].clone(), keys[keys.len() - 1].clone());
                if model.range(lo..=hi).next().is_none() {
                    // The range may be empty in the engine too: then the file keeps
                    // sequence 0 and older snapshots see it as well.
                    snaps.clear();
                }
                db.ingest(&[path.clone().into()]).unwrap();
                assert!(
                    !fs.exists(Path::new(&path)).unwrap(),
                    "ingested source left behind"
                );
                model = staged;
            }
            _ => {
                let k = random_key(&mut rng);
                let ro = ReadOptions::default();
                match db.get(&ro, &k) {
                    Ok(got) => assert_eq!(got, model.get(&k).cloned()),
                    Err(e) => assert!(faulty && e.is_retryable(), "seed {seed}: get: {e}"),
                }
            }
        }
    }
    if let Some(f) = &flaky {
        f.heal();
        assert_eq!(
            db.failure(),
            None,
            "seed {seed}: the store's faults stopped the engine"
        );
    }
    // Full comparison at the end, both directions.
    let ro = ReadOptions::default();
    let mut it = db.iter(&ro).unwrap();
    it.seek_to_first();
    let mut got = Vec::new();
    while it.valid() {
        got.push((it.key().to_vec(), it.value().to_vec()));
        it.next();
    }
    let want: Vec<_> = model.clone().into_iter().collect();
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
    drop(it);
    drop(snaps);
    db.close().unwrap();
    let mut st = db.stats();
    if let Some(w) = &worker {
        // (A job given up on is counted by the worker once its thread reaches it.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while st.remote_compactions_given_way_pending > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "seed {seed}: a job given up on never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
            st = db.stats();
        }
        let (ran, fell_back, gave_way) = (
            remote.0 + st.remote_compactions,
            remote.1 + st.remote_compaction_fallbacks,
            remote.2 + st.remote_compactions_given_way,
        );
        let jobs = w.jobs.load(std::sync::atomic::Ordering::SeqCst);
        let done = w.done.load(std::sync::atomic::Ordering::SeqCst);
        // Every job was installed, compacted here instead, or given up to an exclusive
        // operation (finished by the worker or not: its outputs are strays); every job
        // the worker finished and the engine waited for was installed (none rejected).
        assert_eq!(ran + fell_back + gave_way, jobs, "seed {seed}");
        assert!(
            ran <= done && done <= ran + gave_way,
            "seed {seed}: {ran} installed, {gave_way} given way, {done} done"
        );
        assert!(jobs > 0, "seed {seed}: no compaction went to the worker");
        assert!(
            done > 0 || fail_every == 1,
            "seed {seed}: the worker ran none"
        );
    }
}

fn runs(tables: Tables, runs_var: &str, default_runs: u64, test: &str) {
    let base = env_u64("PHOENIX_SEED", 1);
    let runs = env_u64(runs_var, default_runs);
    for seed in base..base + runs {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, tables)));
        if let Err(e) = r {
            eprintln!(
                "model run failed ({tables:?}); replay with: PHOENIX_SEED={seed} {runs_var}=1 \
                 cargo test -p phoenix-engine --test model -- --exact {test}"
            );
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn db_matches_model() {
    runs(
        Tables::Directory,
        "PHOENIX_ENGINE_MODEL_RUNS",
        100,
        "db_matches_model",
    );
}

#[test]
fn db_matches_model_with_tables_on_an_object_store() {
    runs(
        Tables::Objects,
        "PHOENIX_ENGINE_MODEL_OBJECT_RUNS",
        20,
        "db_matches_model_with_tables_on_an_object_store",
    );
}

#[test]
fn db_matches_model_with_compactions_on_a_worker() {
    runs(
        Tables::ObjectsWithWorker,
        "PHOENIX_ENGINE_MODEL_OBJECT_RUNS",
        20,
        "db_matches_model_with_compactions_on_a_worker",
    );
}

#[test]
fn db_matches_model_on_an_object_store_that_fails() {
    runs(
        Tables::FlakyObjects,
        "PHOENIX_ENGINE_MODEL_FAULT_RUNS",
        10,
        "db_matches_model_on_an_object_store_that_fails",
    );
}

#[test]
#[ignore = "needs minio"]
fn db_matches_model_with_tables_on_minio() {
    let minio = support::minio::Minio::start();
    runs(
        Tables::Minio(&minio),
        "PHOENIX_ENGINE_MODEL_MINIO_RUNS",
        3,
        "db_matches_model_with_tables_on_minio --ignored",
    );
}
