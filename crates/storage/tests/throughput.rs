//! Throughput measurements (ignored by default; they measure, they do not check):
//! `cargo test -p phoenix-storage --release --test throughput -- --ignored --nocapture --test-threads 1`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Instant;

use phoenix_storage::{FileSystem, LocalFs, MemFs, WriteOptions};

const OPTS: WriteOptions = WriteOptions { direct_io: false };
const MIB: f64 = 1024.0 * 1024.0;

/// Appends `total` bytes in `record`-byte appends into a preallocated segment, syncing
/// every `sync_every` appends; returns (MiB/s, syncs/s).
fn append_run(
    fs: &dyn FileSystem,
    dir: &Path,
    total: usize,
    record: usize,
    sync_every: usize,
) -> (f64, f64) {
    let p = dir.join("seg");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.preallocate(total as u64).unwrap();
    fs.sync_dir(dir).unwrap();
    let buf = vec![0x5Au8; record];
    let n = total / record;
    let mut syncs = 0u64;
    let start = Instant::now();
    for i in 0..n {
        f.append(&buf).unwrap();
        if (i + 1) % sync_every == 0 {
            f.sync_data().unwrap();
            syncs += 1;
        }
    }
    f.sync_data().unwrap();
    let secs = start.elapsed().as_secs_f64();
    ((n * record) as f64 / MIB / secs, syncs as f64 / secs)
}

#[test]
#[ignore = "measurement"]
fn memfs_append_and_sync() {
    for (record, every) in [(4096, 1), (4096, 16), (256, 64)] {
        let fs = MemFs::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let (mibs, syncs) = append_run(&fs, Path::new("/d"), 64 << 20, record, every);
        println!(
            "MemFs: {record} B appends, sync every {every}: {mibs:.0} MiB/s, {syncs:.0} syncs/s"
        );
    }
}

#[test]
#[ignore = "measurement"]
fn localfs_append_and_fdatasync() {
    for (total, record, every) in [(8 << 20, 4096, 1), (64 << 20, 4096, 256)] {
        let dir = tempfile::tempdir().unwrap();
        let (mibs, syncs) = append_run(&LocalFs::new(), dir.path(), total, record, every);
        println!(
            "LocalFs: {record} B appends, sync every {every}: {mibs:.1} MiB/s, {syncs:.0} syncs/s"
        );
    }
}

#[test]
#[ignore = "measurement"]
fn memfs_crash_cost() {
    let fs = MemFs::new();
    let d = Path::new("/d");
    fs.create_dir_all(d).unwrap();
    let chunk = vec![1u8; 1 << 20];
    for i in 0..256 {
        let mut f = fs.create(&d.join(format!("{i:06}.sst")), OPTS).unwrap();
        f.append(&chunk).unwrap();
        f.sync_all().unwrap();
    }
    fs.sync_dir(d).unwrap();
    let start = Instant::now();
    fs.crash();
    println!(
        "MemFs: crash with 256 files of 1 MiB: {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
}
