//! Behaviour of the log store's API, recovery and error reporting, on `MemFs` and `LocalFs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use phoenix_log::{Error, HardState, LogEntry, LogOptions, LogStore};
use phoenix_storage::{FileSystem, LocalFs, MemFs, SharedFs};

fn opts() -> LogOptions {
    LogOptions {
        segment_size: 16 << 10,
        background_maintenance: false,
        cache_bytes_per_stream: 64,
        ..LogOptions::default()
    }
}

fn entry(index: u64, term: u64) -> LogEntry {
    LogEntry::new(index, term, format!("entry-{index}-{term}").into_bytes())
}

fn entries(range: std::ops::Range<u64>, term: u64) -> Vec<LogEntry> {
    range.map(|i| entry(i, term)).collect()
}

fn dir() -> &'static Path {
    Path::new("/db/log")
}

#[test]
fn append_read_reopen() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let hs = HardState {
        term: 3,
        vote: 2,
        commit: 5,
    };
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        log.append(1, entries(1..11, 1), None).wait().unwrap();
        log.append(2, entries(5..8, 2), Some(hs)).wait().unwrap();
        assert_eq!(log.first_index(1), Some(1));
        assert_eq!(log.last_index(1), Some(10));
        assert_eq!(log.read(1, 3..6).unwrap(), entries(3..6, 1));
        assert_eq!(log.term(1, 4).unwrap(), Some(1));
        assert_eq!(log.term(1, 11).unwrap(), None);
        assert_eq!(log.hard_state(2), Some(hs));
        assert_eq!(log.streams(), vec![1, 2]);
        log.close().unwrap();
    }
    // A clean shutdown and an abrupt one both keep every acknowledged op.
    for crash in [false, true] {
        if crash {
            mem.crash();
        }
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        assert_eq!(log.read(1, 1..11).unwrap(), entries(1..11, 1));
        assert_eq!(log.read(2, 5..8).unwrap(), entries(5..8, 2));
        assert_eq!(log.first_index(2), Some(5));
        assert_eq!(log.hard_state(2), Some(hs));
        assert_eq!(log.hard_state(1), None);
        assert!(matches!(log.read(1, 0..3), Err(Error::Compacted { .. })));
        assert!(matches!(log.read(1, 5..12), Err(Error::Unavailable { .. })));
    }
}

#[test]
fn conflicts_and_truncations_survive_reopen() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        log.append(7, entries(1..21, 1), None).wait().unwrap();
        // Raft conflict: entries from 15 on are replaced by term 2.
        log.append(7, entries(15..18, 2), None).wait().unwrap();
        assert_eq!(log.last_index(7), Some(17));
        log.truncate_prefix(7, 5).unwrap();
        log.truncate_suffix(7, 16).unwrap();
        assert_eq!((log.first_index(7), log.last_index(7)), (Some(5), Some(15)));
        // Gaps and writes below the first index are refused.
        assert!(matches!(
            log.append(7, entries(20..21, 2), None).wait(),
            Err(Error::Gap { .. })
        ));
        assert!(matches!(
            log.append(7, entries(2..3, 2), None).wait(),
            Err(Error::Compacted { .. })
        ));
        assert!(matches!(
            log.append(7, vec![entry(16, 2), entry(18, 2)], None).wait(),
            Err(Error::InvalidArgument(_))
        ));
    }
    mem.crash();
    let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
    let mut want = entries(5..15, 1);
    want.push(entry(15, 2));
    assert_eq!(log.read(7, 5..16).unwrap(), want);
    assert_eq!(log.term(7, 15).unwrap(), Some(2));
    assert!(matches!(log.term(7, 4), Err(Error::Compacted { .. })));
    // Snapshot install: truncating past the end leaves an empty stream starting there.
    log.truncate_prefix(7, 100).unwrap();
    assert_eq!(
        (log.first_index(7), log.last_index(7)),
        (Some(100), Some(99))
    );
    log.append(7, entries(100..102, 3), None).wait().unwrap();
    drop(log);
    mem.crash();
    let log = LogStore::open(fs, dir(), opts()).unwrap();
    assert_eq!(log.read(7, 100..102).unwrap(), entries(100..102, 3));
    assert_eq!(log.first_index(7), Some(100));
}

#[test]
fn remove_stream_stays_removed_and_id_can_be_reused() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        log.append(1, entries(1..50, 1), None).wait().unwrap();
        log.append(2, entries(1..50, 1), None).wait().unwrap();
        log.remove_stream(1).unwrap();
        assert_eq!(log.streams(), vec![2]);
        log.append(3, entries(1..5, 1), None).wait().unwrap();
    }
    mem.crash();
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        assert_eq!(log.streams(), vec![2, 3]);
        assert_eq!(log.last_index(1), None);
        log.append(1, entries(40..42, 5), None).wait().unwrap();
    }
    mem.crash();
    let log = LogStore::open(fs, dir(), opts()).unwrap();
    assert_eq!(log.streams(), vec![1, 2, 3]);
    assert_eq!(log.read(1, 40..42).unwrap(), entries(40..42, 5));
    assert_eq!(log.first_index(1), Some(40));
}

#[test]
fn gc_deletes_dead_segments_and_rewrites_cold_streams() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let o = LogOptions {
        gc_live_ratio: 0.5,
        recycle_per_queue: 1,
        ..opts()
    };
    let log = LogStore::open(fs.clone(), dir(), o.clone()).unwrap();
    // A cold stream written once, then a hot one that keeps truncating its prefix.
    log.append(9, entries(1..4, 1), Some(HardState::default()))
        .wait()
        .unwrap();
    let value = vec![7u8; 500];
    let mut next = 1u64;
    for round in 0..40 {
        let batch: Vec<LogEntry> = (next..next + 10)
            .map(|i| LogEntry::new(i, 1, value.clone()))
            .collect();
        log.append(1, batch, None).wait().unwrap();
        next += 10;
        log.truncate_prefix(1, next - 5).unwrap();
        if round % 5 == 4 {
            log.gc().unwrap();
        }
    }
    log.gc().unwrap();
    let st = log.stats();
    assert!(st.segments_reclaimed > 0, "{st:?}");
    assert!(
        st.rewrites > 0,
        "the cold stream must have been rewritten: {st:?}"
    );
    assert!(st.segments <= 4, "old segments must be gone: {st:?}");
    assert!(
        mem.total_file_bytes(dir()) < 10 * (16 << 10),
        "disk use must stay bounded"
    );
    drop(log);
    mem.crash();
    let log = LogStore::open(fs, dir(), o).unwrap();
    assert_eq!(log.read(9, 1..4).unwrap(), entries(1..4, 1));
    assert_eq!(log.hard_state(9), Some(HardState::default()));
    assert_eq!(log.first_index(1), Some(next - 5));
    assert_eq!(log.read(1, next - 5..next).unwrap().len(), 5);
}

#[test]
fn torn_tail_is_cut_and_reported_but_damage_before_it_is_an_error() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        log.append(1, entries(1..5, 1), None).wait().unwrap();
        log.append(1, entries(5..6, 1), None).wait().unwrap();
        // Power loss: the store cannot seal its segment on the way down.
        mem.freeze_after(0);
    }
    mem.crash();
    // Damage the last frame: recovery cuts it (it could be a torn write).
    let seg = segment_files(&mem)[0].clone();
    let data = mem.read_all(&seg).unwrap();
    let frames = frame_offsets(&data);
    assert_eq!(frames.len(), 2);
    flip_byte(&mem, &seg, frames[1] + 20);
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        assert_eq!(log.last_index(1), Some(4));
        log.append(1, entries(5..7, 2), None).wait().unwrap();
    }
    // A reopen after that still sees the same state (the cut tail stays cut).
    {
        let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
        assert_eq!(log.read(1, 1..7).unwrap()[4..], entries(5..7, 2)[..]);
    }
    // Damage the first frame, which is followed by a good one: corruption, named.
    flip_byte(&mem, &seg, frames[0] + 30);
    match LogStore::open(fs, dir(), opts()) {
        Err(Error::Corruption { path, offset, .. }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, frames[0]);
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
}

#[test]
fn damaged_entry_is_detected_on_read() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
    log.append(1, entries(1..20, 1), None).wait().unwrap();
    log.append(1, entries(20..21, 1), None).wait().unwrap();
    let seg = segment_files(&mem)[0].clone();
    let data = mem.read_all(&seg).unwrap();
    let needle = b"entry-3-1";
    let at = data
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap() as u64;
    flip_byte(&mem, &seg, at);
    // Entry 3 is no longer cached (the cache holds 64 bytes): its checksum catches it.
    match log.read(1, 1..5) {
        Err(Error::Corruption { path, offset, .. }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, at);
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    assert_eq!(log.read(1, 4..6).unwrap(), entries(4..6, 1));
}

#[test]
fn write_failure_poisons_and_reopen_recovers_acknowledged_ops() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
    log.append(1, entries(1..4, 1), None).wait().unwrap();
    mem.inject(
        phoenix_storage::FaultKind::Sync,
        1,
        std::io::ErrorKind::Other,
        false,
    );
    let r = log.append(1, entries(4..5, 1), None).wait();
    assert!(matches!(r, Err(Error::Storage(_))), "{r:?}");
    assert!(matches!(
        log.append(1, entries(4..5, 1), None).wait(),
        Err(Error::Poisoned(_))
    ));
    drop(log);
    mem.crash();
    let log = LogStore::open(fs, dir(), opts()).unwrap();
    assert_eq!(log.read(1, 1..4).unwrap(), entries(1..4, 1));
    assert_eq!(log.last_index(1), Some(3));
}

/// A store whose sync failed under an append of entries 4..6 (term 2) with a vote, after
/// 1..4 (term 1) were synced; returns where it says its unsynced bytes start.
fn store_with_a_failed_sync(mem: &Arc<MemFs>) -> Vec<phoenix_log::UnsyncedTail> {
    let fs: SharedFs = mem.clone();
    let log = LogStore::open(fs, dir(), opts()).unwrap();
    let hs = HardState {
        term: 1,
        vote: 1,
        commit: 3,
    };
    log.append(1, entries(1..4, 1), Some(hs)).wait().unwrap();
    assert!(log.unsynced_tails().is_empty());
    mem.inject(
        phoenix_storage::FaultKind::Sync,
        1,
        std::io::ErrorKind::Other,
        false,
    );
    let voted = HardState {
        term: 2,
        vote: 3,
        commit: 3,
    };
    let r = log.append(1, entries(4..6, 2), Some(voted)).wait();
    assert!(matches!(r, Err(Error::Storage(_))), "{r:?}");
    let tails = log.unsynced_tails();
    assert_eq!(tails.len(), 1, "{tails:?}");
    drop(log);
    tails
}

#[test]
fn a_reopen_after_a_failed_sync_cuts_what_the_sync_did_not_cover() {
    // Without the cut, a reopen in the same process reads the unsynced entries and the
    // vote back (from the page cache, on a real disk), and would take them as durable.
    let mem = Arc::new(MemFs::new());
    store_with_a_failed_sync(&mem);
    let log = LogStore::open(mem.clone(), dir(), opts()).unwrap();
    assert_eq!(log.last_index(1), Some(5));
    assert_eq!(log.hard_state(1).map(|h| h.vote), Some(3));
    drop(log);

    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let tails = store_with_a_failed_sync(&mem);
    let log = LogStore::open_cutting(fs.clone(), dir(), opts(), &tails).unwrap();
    assert_eq!(log.last_index(1), Some(3));
    assert_eq!(log.read(1, 1..4).unwrap(), entries(1..4, 1));
    let hs = log.hard_state(1).unwrap();
    assert_eq!((hs.term, hs.vote), (1, 1), "the unsynced vote is gone");
    // The cut is durable: the next entries replace the cut ones, and neither a plain
    // reopen nor a power loss brings the cut ones back.
    log.append(1, entries(4..5, 7), None).wait().unwrap();
    drop(log);
    mem.crash();
    let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
    assert_eq!(log.last_index(1), Some(4));
    assert_eq!(log.read(1, 4..5).unwrap(), entries(4..5, 7));
    drop(log);
    // A tail naming a segment that is gone is ignored.
    let gone = [phoenix_log::UnsyncedTail {
        segment: 999,
        offset: 0,
    }];
    let log = LogStore::open_cutting(fs, dir(), opts(), &gone).unwrap();
    assert_eq!(log.last_index(1), Some(4));
}

/// The cut itself is safe at every crash point: a reopen that cuts is stopped after each
/// of its mutating file operations in turn (the disk frozen there), then the machine
/// loses power (plain, and with torn writes under several seeds) or only the process
/// dies (the page cache kept, so the same cut is made again). The store always opens
/// with the synced entries and vote whole. Once the cut is done (or made again), it
/// holds nothing else, whatever a power loss keeps of the unsynced bytes; before, a torn
/// power loss may keep a whole prefix of the unsynced entries (and their vote), as after
/// any unsynced write: none was acknowledged.
#[test]
fn a_cut_stopped_at_any_step_leaves_only_the_synced_entries() {
    // `exact`: the cut is sealed, so only the synced entries may be there.
    let check = |log: Arc<LogStore>, exact: bool, at: &str| {
        let last = log.last_index(1).unwrap_or(0);
        let range = if exact { 3..=3 } else { 3..=5 };
        assert!(range.contains(&last), "{at}: last index {last}");
        assert_eq!(log.read(1, 1..4).unwrap(), entries(1..4, 1), "{at}");
        assert_eq!(
            log.read(1, 4..last + 1).unwrap(),
            entries(4..last + 1, 2),
            "{at}"
        );
        let hs = log.hard_state(1).unwrap();
        let votes: &[(u64, u64)] = if exact { &[(1, 1)] } else { &[(1, 1), (2, 3)] };
        assert!(votes.contains(&(hs.term, hs.vote)), "{at}: {hs:?}");
    };
    let open = |fs: &SharedFs, cut: &[phoenix_log::UnsyncedTail], at: &str| {
        LogStore::open_cutting(fs.clone(), dir(), opts(), cut)
            .unwrap_or_else(|e| panic!("{at}: {e}"))
    };
    for step in 0..64u64 {
        let mut done = false;
        for how in 0..10u64 {
            let mem = Arc::new(MemFs::new());
            let fs: SharedFs = mem.clone();
            let tails = store_with_a_failed_sync(&mem);
            mem.freeze_after(step);
            done = LogStore::open_cutting(fs.clone(), dir(), opts(), &tails).is_ok();
            match how {
                // The tails die with the machine: the next start opens plainly.
                0 => {
                    mem.crash();
                    let at = format!("step {step}, power loss");
                    check(open(&fs, &[], &at), true, &at);
                }
                // The node's next run in the process cuts again, with the same tails;
                // then a power loss, torn, keeps the cut.
                1 => {
                    mem.clear_faults();
                    let at = format!("step {step}, process death");
                    check(open(&fs, &tails, &at), true, &at);
                    mem.crash_torn(step);
                    let at = format!("step {step}, process death, then torn power loss");
                    check(open(&fs, &[], &at), true, &at);
                }
                seed => {
                    mem.crash_torn(seed * 64 + step);
                    let at = format!("step {step}, torn power loss (seed {})", seed * 64 + step);
                    check(open(&fs, &[], &at), done, &at);
                }
            }
        }
        if done {
            // (At least the cut, the seal and their syncs were stopped in turn.)
            assert!(step >= 2, "the cut took only {step} file operations");
            eprintln!("the cut finished after {step} file operations");
            return;
        }
    }
    panic!("the cut never finished within 64 file operations");
}

#[test]
fn non_durable_appends_and_async_handles() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let log = LogStore::open(fs.clone(), dir(), opts()).unwrap();
    let h1 = log.append_durable(1, entries(1..3, 1), None, false);
    let (tx, rx) = std::sync::mpsc::channel();
    log.append_with(1, entries(3..4, 1), None, move |r| {
        tx.send(r.is_ok()).unwrap();
    });
    h1.wait().unwrap();
    assert!(rx.recv().unwrap());
    // Polling the handle as a future works too.
    let h = log.append(2, entries(1..2, 1), None);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut h = Box::pin(h);
    let mut ready = None;
    for _ in 0..10_000 {
        if let std::task::Poll::Ready(r) = h.as_mut().poll(&mut cx) {
            ready = Some(r);
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    ready.expect("append never completed").unwrap();
    log.sync().unwrap();
    drop(log);
    mem.crash();
    let log = LogStore::open(fs, dir(), opts()).unwrap();
    assert_eq!(log.read(1, 1..4).unwrap(), entries(1..4, 1));
}

#[test]
fn local_fs_round_trip_with_direct_io_and_multiple_queues() {
    let tmp = tempfile::tempdir().unwrap();
    let fs: SharedFs = Arc::new(LocalFs::new());
    for direct_io in [false, true] {
        let d = tmp.path().join(format!("direct-{direct_io}"));
        let o = LogOptions {
            queues: 3,
            direct_io,
            segment_size: 64 << 10,
            ..LogOptions::default()
        };
        {
            let log = match LogStore::open(fs.clone(), &d, o.clone()) {
                Ok(l) => l,
                // Some file systems (tmpfs) refuse O_DIRECT.
                Err(e) if direct_io => {
                    eprintln!("skipping direct I/O: {e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let mut handles = Vec::new();
            for s in 0..6u64 {
                for i in 0..30u64 {
                    handles.push(log.append(s, vec![entry(i + 1, 1)], None));
                }
            }
            for h in handles {
                h.wait().unwrap();
            }
            log.set_queue_count(2).unwrap();
            for s in 0..6u64 {
                log.append(s, vec![entry(31, 2)], None).wait().unwrap();
            }
        }
        let log = LogStore::open(fs.clone(), &d, o).unwrap();
        assert_eq!(log.stats().queues, 2);
        for s in 0..6u64 {
            let got = log.read(s, 1..32).unwrap();
            assert_eq!(got.len(), 31);
            assert_eq!(got[30], entry(31, 2));
            assert_eq!(got[..30], entries(1..31, 1)[..]);
        }
    }
}

fn segment_files(mem: &MemFs) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = mem
        .list(dir())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .map(|n| dir().join(n))
        .collect();
    v.sort();
    v
}

/// Offsets of the valid frames of a segment, by walking the frame headers.
fn frame_offsets(data: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut pos = 4096usize;
    while pos + 16 <= data.len() && data[pos..pos + 4] == *b"PXLF" {
        out.push(pos as u64);
        let len = u32::from_le_bytes(data[pos + 8..pos + 12].try_into().unwrap()) as usize;
        pos = (pos + 16 + len).div_ceil(8) * 8;
    }
    out
}

fn flip_byte(mem: &MemFs, path: &Path, at: u64) {
    let size = mem.file_size(path).unwrap();
    let mut data = mem.read_all(path).unwrap();
    data[at as usize] ^= 0x55;
    let mut f = mem
        .reopen(path, at, phoenix_storage::WriteOptions::default())
        .unwrap();
    f.append(&data[at as usize..at as usize + 1]).unwrap();
    f.sync_all().unwrap();
    assert_eq!(mem.file_size(path).unwrap(), size);
}

#[test]
fn recovery_reads_large_segments_in_growing_prefixes() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let o = LogOptions {
        segment_size: 16 << 20,
        ..opts()
    };
    let value = vec![3u8; 64 << 10];
    {
        let log = LogStore::open(fs.clone(), dir(), o.clone()).unwrap();
        for i in 1..=100u64 {
            log.append(1, vec![LogEntry::new(i, 1, value.clone())], None)
                .wait()
                .unwrap();
        }
        // No seal: the scan of the first 4 MiB ends inside a frame and must read on.
        mem.freeze_after(0);
    }
    mem.crash();
    let log = LogStore::open(fs.clone(), dir(), o.clone()).unwrap();
    assert_eq!(log.last_index(1), Some(100));
    assert_eq!(log.read(1, 99..101).unwrap()[1].data.len(), 64 << 10);
    log.append(1, vec![LogEntry::new(101, 2, value.clone())], None)
        .wait()
        .unwrap();
    drop(log);
    // Sealed segments end inside the first prefix or after it; both reopen.
    let log = LogStore::open(fs, dir(), o).unwrap();
    assert_eq!(log.last_index(1), Some(101));
    assert_eq!(log.term(1, 101).unwrap(), Some(2));
}

#[test]
fn resizing_queues_under_concurrent_appends_keeps_every_stream_in_order() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let o = LogOptions {
        queues: 2,
        segment_size: 64 << 10,
        ..opts()
    };
    let log = LogStore::open(fs.clone(), dir(), o.clone()).unwrap();
    let per_writer = 1500u64;
    let writers: Vec<_> = (0..6u64)
        .map(|s| {
            let log = log.clone();
            std::thread::spawn(move || {
                // Half durable, half not, several in flight at once.
                let mut pending = Vec::new();
                for i in 1..=per_writer {
                    pending.push(log.append_durable(s, vec![entry(i, 1)], None, i % 2 == 0));
                    if pending.len() == 4 {
                        for h in pending.drain(..) {
                            h.wait().unwrap();
                        }
                    }
                }
                for h in pending {
                    h.wait().unwrap();
                }
            })
        })
        .collect();
    // Resize over and over for as long as the writers run.
    let counts = [4usize, 1, 3, 2, 5, 1];
    let mut resizes = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        log.set_queue_count(counts[resizes % counts.len()]).unwrap();
        resizes += 1;
    }
    log.set_queue_count(2).unwrap();
    for w in writers {
        w.join().unwrap();
    }
    assert!(
        resizes >= 3,
        "only {resizes} resizes overlapped the appends"
    );
    for s in 0..6u64 {
        assert_eq!(
            log.read(s, 1..per_writer + 1).unwrap(),
            entries(1..per_writer + 1, 1)
        );
    }
    log.sync().unwrap();
    drop(log);
    mem.crash();
    let log = LogStore::open(fs, dir(), o).unwrap();
    assert_eq!(log.stats().queues, 2);
    for s in 0..6u64 {
        assert_eq!(
            log.read(s, 1..per_writer + 1).unwrap(),
            entries(1..per_writer + 1, 1)
        );
        assert_eq!(log.queue_of(s), Some((s % 2) as usize));
    }
}

/// `append_written` returns only once the bytes are in the file: a process crash right
/// after (the file system freezes, nothing more reaches it) loses no acknowledged entry.
#[test]
fn append_written_survives_process_crash() {
    let mem = Arc::new(MemFs::new());
    let fs: SharedFs = mem.clone();
    let o = LogOptions {
        sync: false,
        ..opts()
    };
    let log = LogStore::open(fs.clone(), dir(), o.clone()).unwrap();
    std::thread::scope(|s| {
        for stream in 1..=4u64 {
            let log = &log;
            s.spawn(move || {
                for i in 1..=150 {
                    log.append_written(stream, vec![entry(i, stream)], None)
                        .unwrap();
                }
            });
        }
    });
    // Each acknowledged entry is already in a file the moment the call returns.
    for i in 1..=50u64 {
        let payload = format!("written-at-once-{i}");
        log.append_written(
            9,
            vec![LogEntry::new(i, 1, payload.clone().into_bytes())],
            None,
        )
        .unwrap();
        let found = fs.list(dir()).unwrap().iter().any(|name| {
            let bytes = fs.read_all(&dir().join(name)).unwrap();
            bytes
                .windows(payload.len())
                .any(|w| w == payload.as_bytes())
        });
        assert!(found, "entry {i} acknowledged but not in any segment file");
    }
    mem.freeze_after(0);
    // Closing on a frozen file system fails; what was written before stays.
    let _ = log.close();
    drop(log);
    mem.clear_faults();
    let log = LogStore::open(fs, dir(), o).unwrap();
    for stream in 1..=4u64 {
        let want: Vec<LogEntry> = (1..=150).map(|i| entry(i, stream)).collect();
        assert_eq!(log.read(stream, 1..151).unwrap(), want, "stream {stream}");
    }
    log.close().unwrap();
}
