//! Crash tests on `MemFs`: seeded random runs of appends (durable and not), conflicting
//! appends, truncations, removals, hard states, queue resizes and space reclamation,
//! frozen after a random number of file operations and crashed (cleanly or with torn
//! writes), then reopened and compared with a model.
//!
//! The check, per stream: the recovered stream equals the model's state after some prefix
//! of the ops submitted to it, and that prefix contains every op that was acknowledged as
//! durable. So every acknowledged entry is there in order, nothing truncated comes back,
//! and the hard state is the last one synced (or a later unacknowledged one).
//!
//! `PHOENIX_LOG_CRASH_SEEDS` (count) and `PHOENIX_LOG_CRASH_BASE_SEED` choose the seeds;
//! a failure prints the command that replays it. Each op is waited for before the next is
//! issued, so the file operations, and thus the crash point, replay exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use phoenix_log::{HardState, LogEntry, LogOptions, LogStore};
use phoenix_storage::{MemFs, SharedFs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq, Eq)]
struct StreamModel {
    first: u64,
    last: u64,
    /// (term, data) of entries first..=last.
    entries: Vec<(u64, Vec<u8>)>,
    hs: Option<HardState>,
}

impl StreamModel {
    fn new() -> Self {
        StreamModel {
            first: 1,
            last: 0,
            entries: Vec::new(),
            hs: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.last < self.first
    }
}

/// The states a stream went through during one round: `states[0]` is the state at the start
/// of the round, `states[k]` after the k-th submitted op.
struct History {
    states: Vec<Option<StreamModel>>,
    /// Highest k whose op (and thus every earlier one) was acknowledged as durable.
    acked: usize,
}

impl History {
    fn current(&self) -> &Option<StreamModel> {
        self.states.last().expect("history is never empty")
    }
}

fn opts(rng: &mut ChaCha8Rng) -> LogOptions {
    LogOptions {
        queues: rng.gen_range(1..=3),
        segment_size: [12 << 10, 16 << 10, 32 << 10][rng.gen_range(0..3)],
        sync: rng.gen_bool(0.7),
        gc_live_ratio: [0.3, 0.5, 0.8][rng.gen_range(0..3)],
        cache_bytes_per_stream: rng.gen_range(0..2048),
        recycle_per_queue: rng.gen_range(0..3),
        background_maintenance: false,
        ..LogOptions::default()
    }
}

fn dir() -> &'static Path {
    Path::new("/data/log")
}

fn recovered(log: &LogStore, stream: u64) -> Option<StreamModel> {
    let first = log.first_index(stream)?;
    let last = log.last_index(stream)?;
    let entries = log
        .read(stream, first..last + 1)
        .unwrap_or_else(|e| panic!("stream {stream}: reading [{first}, {last}]: {e}"))
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            assert_eq!(e.index, first + i as u64);
            (e.term, e.data.to_vec())
        })
        .collect();
    Some(StreamModel {
        first,
        last,
        entries,
        hs: log.hard_state(stream),
    })
}

/// What a seed exercised, summed over its rounds.
#[derive(Default)]
struct Coverage {
    reclaimed: u64,
    rewrites: u64,
    resizes: u64,
}

/// Runs one seed; returns a description of the first mismatch.
fn run_seed(seed: u64, cov: &mut Coverage) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let o = opts(&mut rng);
    let streams: u64 = rng.gen_range(1..=6);
    let mut models: BTreeMap<u64, Option<StreamModel>> = (0..streams).map(|s| (s, None)).collect();
    let mut term = 1u64;
    let rounds = rng.gen_range(2..=4);
    for round in 0..rounds {
        let log = LogStore::open(fs.clone(), dir(), o.clone())
            .map_err(|e| format!("round {round}: reopen failed: {e}"))?;
        // Compare with the model: some prefix at or after the last acknowledged op.
        let mut hist: BTreeMap<u64, History> = BTreeMap::new();
        for (&s, m) in &models {
            hist.insert(
                s,
                History {
                    states: vec![m.clone()],
                    acked: 0,
                },
            );
        }
        // Freeze the file system after a random number of mutating operations: from
        // there on the store fails, like a machine that lost power mid-run.
        let freeze = rng.gen_bool(0.85);
        if freeze {
            mem.freeze_after(rng.gen_range(0..300));
        }
        let ops = rng.gen_range(10..80);
        for _ in 0..ops {
            let s = rng.gen_range(0..streams);
            let h = hist.get_mut(&s).expect("stream in history");
            let cur = h.current().clone();
            let roll = rng.gen_range(0..100);
            let outcome: Result<(), phoenix_log::Error>;
            let durable;
            let next: Option<StreamModel>;
            if roll < 55 {
                // Append, sometimes replacing a suffix, sometimes with a hard state.
                let mut m = cur.clone().unwrap_or_else(StreamModel::new);
                let b = if m.is_empty() {
                    m.first + rng.gen_range(0..3)
                } else {
                    rng.gen_range(m.last.saturating_sub(3).max(m.first)..=m.last + 1)
                };
                if rng.gen_bool(0.1) {
                    term += 1;
                }
                let n = rng.gen_range(1..=5u64);
                let entries: Vec<LogEntry> = (b..b + n)
                    .map(|i| {
                        let len = rng.gen_range(0..400);
                        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        LogEntry::new(i, term, data)
                    })
                    .collect();
                let hs = rng.gen_bool(0.3).then(|| HardState {
                    term,
                    vote: rng.gen_range(0..3),
                    commit: rng.gen_range(0..b + n),
                });
                if m.is_empty() {
                    m.first = b;
                    m.entries.clear();
                } else {
                    m.entries.truncate((b - m.first) as usize);
                }
                m.entries
                    .extend(entries.iter().map(|e| (e.term, e.data.to_vec())));
                m.last = b + n - 1;
                if hs.is_some() {
                    m.hs = hs;
                }
                durable = rng.gen_bool(0.8);
                outcome = if !durable && rng.gen_bool(0.5) {
                    // Written on this thread (the store's `sync` may still make it durable).
                    log.append_written(s, entries, hs)
                } else {
                    log.append_durable(s, entries, hs, durable).wait()
                };
                next = Some(m);
            } else if roll < 62 {
                let mut m = cur.clone().unwrap_or_else(StreamModel::new);
                let hs = HardState {
                    term,
                    vote: rng.gen_range(0..3),
                    commit: m.last,
                };
                m.hs = Some(hs);
                durable = o.sync;
                outcome = log.append(s, Vec::new(), Some(hs)).wait();
                next = Some(m);
            } else if roll < 75 {
                let Some(mut m) = cur.clone() else { continue };
                let upto = rng.gen_range(m.first..=m.last + 2);
                if upto <= m.first {
                    continue;
                }
                let drop_n = ((upto - m.first) as usize).min(m.entries.len());
                m.entries.drain(..drop_n);
                m.first = upto;
                m.last = m.last.max(upto - 1);
                durable = o.sync;
                outcome = log.truncate_prefix(s, upto);
                next = Some(m);
            } else if roll < 85 {
                let Some(mut m) = cur.clone() else { continue };
                if m.is_empty() {
                    continue;
                }
                let from = rng.gen_range(m.first..=m.last);
                m.entries.truncate((from - m.first) as usize);
                m.last = from - 1;
                durable = o.sync;
                outcome = log.truncate_suffix(s, from);
                next = Some(m);
            } else if roll < 89 {
                if cur.is_none() {
                    continue;
                }
                durable = o.sync;
                outcome = log.remove_stream(s);
                next = None;
            } else if roll < 95 {
                if let Err(e) = log.gc() {
                    if e.to_string().contains("frozen")
                        || matches!(e, phoenix_log::Error::Poisoned(_))
                    {
                        break;
                    }
                    // Reclamation may fail on the frozen file system; anything else is a bug.
                    return Err(format!("round {round}: gc failed: {e}"));
                }
                continue;
            } else {
                let n = rng.gen_range(1..=3);
                if log.set_queue_count(n).is_err() {
                    break;
                }
                cov.resizes += 1;
                continue;
            }
            h.states.push(next);
            match outcome {
                Ok(()) => {
                    if durable {
                        h.acked = h.states.len() - 1;
                    }
                }
                Err(_) => break,
            }
        }
        let st = log.stats();
        cov.reclaimed += st.segments_reclaimed;
        cov.rewrites += st.rewrites;
        drop(log);
        if rng.gen_bool(0.5) {
            mem.crash_torn(rng.gen());
        } else {
            mem.crash();
        }
        let log = LogStore::open(fs.clone(), dir(), o.clone())
            .map_err(|e| format!("round {round}: recovery failed: {e}"))?;
        for (&s, h) in &hist {
            let got = recovered(&log, s);
            let ok = h.states[h.acked..].contains(&got);
            if !ok {
                let want: Vec<String> = h.states[h.acked..].iter().map(summary).collect();
                return Err(format!(
                    "round {round}: stream {s} recovered as {} but must be one of [{}] \
                     (acked op {} of {})",
                    summary(&got),
                    want.join(", "),
                    h.acked,
                    h.states.len() - 1
                ));
            }
            models.insert(s, got);
        }
        drop(log);
    }
    Ok(())
}

fn summary(st: &Option<StreamModel>) -> String {
    match st {
        None => "absent".into(),
        Some(m) => format!(
            "[{}..={}] terms {:?} hs {:?}",
            m.first,
            m.last,
            m.entries.iter().map(|e| e.0).collect::<Vec<_>>(),
            m.hs
        ),
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run_range(part: u64, parts: u64) {
    let count = env_u64("PHOENIX_LOG_CRASH_SEEDS", 5000);
    let base = env_u64("PHOENIX_LOG_CRASH_BASE_SEED", 0x5EED_0000);
    let mut cov = Coverage::default();
    for i in (0..count).filter(|i| i % parts == part) {
        let seed = base + i;
        if let Err(msg) = run_seed(seed, &mut cov) {
            panic!(
                "crash test failed for seed {seed}: {msg}\nreplay with: \
                 PHOENIX_LOG_CRASH_BASE_SEED={seed} PHOENIX_LOG_CRASH_SEEDS=1 \
                 cargo test -p phoenix-log --test crash"
            );
        }
    }
    // The runs must have reached the machinery they are meant to test.
    if count >= 200 {
        assert!(cov.reclaimed > 0, "no run reclaimed a segment");
        assert!(cov.rewrites > 0, "no run rewrote a cold stream");
        assert!(cov.resizes > 0, "no run resized the queues");
    }
    eprintln!(
        "crash seeds {part}/{parts}: {} segments reclaimed, {} rewrites, {} resizes",
        cov.reclaimed, cov.rewrites, cov.resizes
    );
}

// Two tests so that the seeds run on both cores.
#[test]
fn crash_recovery_matches_model_even_seeds() {
    run_range(0, 2);
}

#[test]
fn crash_recovery_matches_model_odd_seeds() {
    run_range(1, 2);
}
