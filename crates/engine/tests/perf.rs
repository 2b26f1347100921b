//! A quick throughput probe on the local disk (ignored by default; the real benchmark is
//! `phoenix bench engine`). Run with
//! `cargo test --release -p phoenix-engine --test perf -- --ignored --nocapture`;
//! `PHOENIX_PERF_NUM` (default 1000000), `PHOENIX_PERF_THREADS` (1), `PHOENIX_PERF_VALUE`
//! (100), `PHOENIX_PERF_WAL` (1 = WAL on, sync off; 0 = off), `PHOENIX_PERF_DIR`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use phoenix_engine::{Db, Options, ReadOptions, WalMode, WriteOptions};
use phoenix_storage::{LocalFs, SharedFs};

fn env(name: &str, d: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn key(i: u64) -> [u8; 16] {
    let mut k = [b'0'; 16];
    let s = format!("{i:016}");
    k.copy_from_slice(s.as_bytes());
    k
}

fn report(name: &str, ops: u64, secs: f64, bytes: u64) {
    println!(
        "{name:<12} : {:>10.3} micros/op {:>10.0} ops/sec; {:>7.1} MB/s",
        secs * 1e6 / ops as f64,
        ops as f64 / secs,
        bytes as f64 / secs / 1048576.0
    );
}

#[test]
#[ignore]
fn throughput() {
    let num = env("PHOENIX_PERF_NUM", 1_000_000);
    let threads = env("PHOENIX_PERF_THREADS", 1);
    let vsize = env("PHOENIX_PERF_VALUE", 100) as usize;
    let wal = env("PHOENIX_PERF_WAL", 1) == 1;
    let dir = PathBuf::from(
        std::env::var("PHOENIX_PERF_DIR").unwrap_or_else(|_| "/work/bench-tmp/phoenix-perf".into()),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let fs: SharedFs = Arc::new(LocalFs::new());
    let opts = Options {
        wal: if wal { WalMode::Log } else { WalMode::None },
        ..Options::default()
    };
    let db = Db::open(Arc::clone(&fs), &dir, opts.clone()).unwrap();
    let per = num / threads;
    let value = vec![b'x'; vsize];
    let run = |name: &str, f: &(dyn Fn(u64, u64) + Sync)| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for th in 0..threads {
                s.spawn(move || f(th, per));
            }
        });
        let secs = t.elapsed().as_secs_f64();
        report(
            name,
            per * threads,
            secs,
            per * threads * (16 + vsize as u64),
        );
    };
    let wo = WriteOptions::default();
    run("fillrandom", &|th, n| {
        let mut x = 0x9e3779b97f4a7c15u64 ^ th;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            db.put(&wo, &key(x % num), &value).unwrap();
        }
    });
    run("overwrite", &|th, n| {
        let mut x = 0x2545f4914f6cdd1du64 ^ th;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            db.put(&wo, &key(x % num), &value).unwrap();
        }
    });
    db.flush().unwrap();
    let ro = ReadOptions::default();
    run("readrandom", &|th, n| {
        let mut x = 0x1234567u64 ^ th;
        let mut found = 0;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if db.get(&ro, &key(x % num)).unwrap().is_some() {
                found += 1;
            }
        }
        assert!(found > 0);
    });
    run("readseq", &|_, n| {
        let mut it = db.iter(&ro).unwrap();
        it.seek_to_first();
        let mut i = 0;
        while it.valid() && i < n {
            i += 1;
            it.next();
        }
    });
    println!("{:?}", db.stats());
    db.close().unwrap();
}
