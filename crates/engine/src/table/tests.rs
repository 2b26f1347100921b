//! Round-trip, golden-bytes and corruption tests of whole tables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use phoenix_storage::{FileSystem, MemFs, SharedFs, WriteOptions};
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::Result;
use crate::iter::InternalIterator;
use crate::key::{internal_key, seek_key, RangeTombstone, ValueKind, MAX_SEQUENCE};

fn seed() -> u64 {
    std::env::var("PHOENIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42)
}

fn build(
    fs: &MemFs,
    path: &Path,
    entries: &[(Vec<u8>, Vec<u8>)],
    tombstones: &[RangeTombstone],
    opts: &TableOptions,
) -> TableSummary {
    let file = fs.create(path, WriteOptions::default()).unwrap();
    let mut b = TableBuilder::new(file, opts);
    for (k, v) in entries {
        b.add(k, v).unwrap();
    }
    for t in tombstones {
        b.add_range_tombstone(t).unwrap();
    }
    b.finish().unwrap()
}

fn open(fs: &MemFs, path: &Path, cache: Option<Arc<BlockCache>>) -> Result<Arc<Table>> {
    let file = fs.open(path)?;
    let size = file.size();
    Ok(Arc::new(Table::open(file, 7, size, cache)?))
}

/// `n` entries: user keys "k00000".., several versions each, some deletes.
fn entries(n: usize, rng: &mut impl Rng) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut seq = 1_000_000u64;
    for i in 0..n {
        let uk = format!("group{:03}k{:06}", i % 7, i);
        let versions = rng.gen_range(1..4);
        for _ in 0..versions {
            seq -= 1;
            let kind = if rng.gen_bool(0.1) {
                ValueKind::Delete
            } else {
                ValueKind::Put
            };
            let vlen = rng.gen_range(0..200);
            let v: Vec<u8> = (0..vlen).map(|_| rng.gen_range(b'a'..=b'e')).collect();
            out.push((internal_key(uk.as_bytes(), seq, kind), v));
        }
    }
    out.sort_by(|a, b| key::compare_internal(&a.0, &b.0));
    out
}

fn collect_forward(it: &mut TableIter) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    it.seek_to_first();
    while it.valid() {
        out.push((it.key().to_vec(), it.value().to_vec()));
        it.next();
    }
    out
}

#[test]
fn round_trip_under_every_option_set() {
    let seed = seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let fs = MemFs::new();
    fs.create_dir_all(Path::new("/db")).unwrap();
    let kvs = entries(3000, &mut rng);
    let tombs = vec![
        RangeTombstone {
            start: b"group001".to_vec(),
            end: b"group002".to_vec(),
            seq: 5,
        },
        RangeTombstone {
            start: b"a".to_vec(),
            end: b"b".to_vec(),
            seq: 2_000_000,
        },
    ];
    for (i, (compression, bloom, restart, block_size)) in [
        (Compression::None, 10, 16, 4096),
        (Compression::Lz4, 0, 1, 512),
        (Compression::Zstd, 5, 4, 16 << 10),
    ]
    .into_iter()
    .enumerate()
    {
        let opts = TableOptions {
            block_size,
            restart_interval: restart,
            bloom_bits_per_key: bloom,
            compression,
            index_restart_interval: 1 + i,
            prefix_len: [0, 3, 6][i % 3],
        };
        let path = PathBuf::from(format!("/db/{i}.sst"));
        let summary = build(&fs, &path, &kvs, &tombs, &opts);
        assert_eq!(summary.file_size, fs.file_size(&path).unwrap());
        let p = &summary.properties;
        assert_eq!(p.num_entries, kvs.len() as u64, "seed {seed}");
        assert_eq!(p.num_range_deletions, 2);
        // The tombstone at "a" is the smallest key; "group006..." the largest point key.
        assert_eq!(
            p.smallest_key,
            internal_key(b"a", 2_000_000, ValueKind::RangeDelete)
        );
        assert_eq!(p.largest_key, kvs.last().unwrap().0);
        assert_eq!(p.largest_seq, 2_000_000);

        let cache = BlockCache::new(1 << 20);
        let t = open(&fs, &path, Some(cache.clone())).unwrap();
        assert_eq!(t.properties(), p);
        assert_eq!(t.range_tombstones().len(), 2);
        assert_eq!(t.range_tombstones()[0].start, b"a");

        let mut it = t.iter();
        assert_eq!(collect_forward(&mut it), kvs, "seed {seed}");
        it.seek_to_last();
        let mut back = Vec::new();
        while it.valid() {
            back.push((it.key().to_vec(), it.value().to_vec()));
            it.prev();
        }
        back.reverse();
        assert_eq!(back, kvs);
        it.status().unwrap();
        assert!(cache.usage() > 0 && cache.usage() <= 1 << 20);

        // Point reads: newest version at or below a snapshot, and misses.
        type Versions<'a> = Vec<&'a (Vec<u8>, Vec<u8>)>;
        let by_user: BTreeMap<Vec<u8>, Versions> = kvs.iter().fold(BTreeMap::new(), |mut m, e| {
            m.entry(key::user_key(&e.0).to_vec()).or_default().push(e);
            m
        });
        for _ in 0..2000 {
            let (uk, versions) = by_user.iter().nth(rng.gen_range(0..by_user.len())).unwrap();
            let snap = rng.gen_range(999_000..1_000_001u64);
            let want = versions
                .iter()
                .find(|e| key::parse_internal_key(&e.0).unwrap().seq <= snap)
                .map(|e| (e.0.clone(), e.1.clone()));
            assert_eq!(
                t.get(&seek_key(uk, snap), true).unwrap(),
                want,
                "seed {seed}"
            );
            // At the newest sequence the seek key carries the largest trailer, which an
            // index separator may carry too.
            let newest = versions.first().map(|e| (e.0.clone(), e.1.clone()));
            assert_eq!(
                t.get(&seek_key(uk, MAX_SEQUENCE), true).unwrap(),
                newest,
                "seed {seed}: newest version of {uk:?}"
            );
            let mut missing = uk.clone();
            missing.push(b'x');
            assert_eq!(
                t.get(&seek_key(&missing, MAX_SEQUENCE), true).unwrap(),
                None
            );
        }
        // Seeks both ways against the model.
        for _ in 0..500 {
            let target = seek_key(
                format!(
                    "group{:03}k{:06}",
                    rng.gen_range(0..7),
                    rng.gen_range(0..3100)
                )
                .as_bytes(),
                rng.gen_range(999_000..1_000_001u64),
            );
            it.seek(&target);
            let want = kvs
                .iter()
                .find(|e| key::compare_internal(&e.0, &target) != std::cmp::Ordering::Less);
            assert_eq!(
                it.valid().then(|| it.key().to_vec()),
                want.map(|e| e.0.clone())
            );
            it.seek_for_prev(&target);
            let want = kvs
                .iter()
                .rev()
                .find(|e| key::compare_internal(&e.0, &target) != std::cmp::Ordering::Greater);
            assert_eq!(
                it.valid().then(|| it.key().to_vec()),
                want.map(|e| e.0.clone())
            );
        }
        assert!(t.approximate_offset_of(&kvs[kvs.len() / 2].0) > 0);
        assert!(t.approximate_offset_of(&kvs[0].0) == 0);
    }
}

#[test]
fn builder_rejects_bad_input() {
    let fs = MemFs::new();
    let file = fs
        .create(Path::new("/x.sst"), WriteOptions::default())
        .unwrap();
    let mut b = TableBuilder::new(file, &TableOptions::default());
    b.add(&internal_key(b"b", 1, ValueKind::Put), b"").unwrap();
    assert!(b.add(&internal_key(b"a", 1, ValueKind::Put), b"").is_err());
    assert!(b.add(&internal_key(b"b", 1, ValueKind::Put), b"").is_err());
    assert!(b
        .add(&internal_key(b"c", 1, ValueKind::RangeDelete), b"")
        .is_err());
    assert!(b.add(b"short", b"").is_err());
    let t = RangeTombstone {
        start: b"z".to_vec(),
        end: b"a".to_vec(),
        seq: 1,
    };
    assert!(b.add_range_tombstone(&t).is_err());
    assert_eq!(
        b.last_key(),
        Some(&internal_key(b"b", 1, ValueKind::Put)[..])
    );
}

#[test]
fn groups_in_properties() {
    let fs = MemFs::new();
    let g = |g: u64, rest: &[u8]| {
        let mut k = g.to_be_bytes().to_vec();
        k.extend_from_slice(rest);
        k
    };
    let kvs = vec![
        (internal_key(&g(3, b"da"), 9, ValueKind::Put), b"1".to_vec()),
        (internal_key(&g(4, b"db"), 9, ValueKind::Put), b"1".to_vec()),
    ];
    let tomb = RangeTombstone {
        start: g(4, b""),
        end: g(5, b""),
        seq: 10,
    };
    let s = build(
        &fs,
        Path::new("/g.sst"),
        &kvs,
        &[tomb],
        &TableOptions::default(),
    );
    assert_eq!((s.properties.min_group, s.properties.max_group), (3, 4));
    let s = build(
        &fs,
        Path::new("/h.sst"),
        &kvs,
        &[],
        &TableOptions::default(),
    );
    assert_eq!((s.properties.min_group, s.properties.max_group), (3, 4));
}

/// A tiny table's bytes, fixed forever: a change here is a format change.
#[test]
fn golden_bytes_of_a_tiny_table() {
    let fs = MemFs::new();
    let kvs = vec![
        (internal_key(b"apple", 3, ValueKind::Put), b"red".to_vec()),
        (internal_key(b"apricot", 2, ValueKind::Delete), Vec::new()),
    ];
    let tomb = RangeTombstone {
        start: b"b".to_vec(),
        end: b"c".to_vec(),
        seq: 4,
    };
    let opts = TableOptions {
        bloom_bits_per_key: 1,
        ..TableOptions::default()
    };
    build(&fs, Path::new("/golden.sst"), &kvs, &[tomb], &opts);
    let bytes = fs.read_all(Path::new("/golden.sst")).unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // Regenerate only on purpose (a format change bumps FORMAT_VERSION).
    let golden = concat!(
        // data block: "apple"#3 Put -> "red"; then 2 shared bytes + "ricot"#2 Delete -> "";
        // restart array [0], one restart; trailer: type 0 + masked crc
        "000d036170706c650103000000000000726564",
        "020d007269636f74",
        "0002000000000000",
        "00000000",
        "01000000",
        "00",
        "80dc9127",
    );
    assert!(hex.starts_with(golden), "data block changed:\n{hex}");
    assert_eq!(hex, GOLDEN_TABLE, "table bytes changed");
    // The footer ends with version 2, a checksum and the magic "PHXSST01".
    assert!(hex.ends_with("5048585353543031"));
    let t = open(&fs, Path::new("/golden.sst"), None).unwrap();
    assert_eq!(collect_forward(&mut t.iter()), kvs);

    // A table of format version 1 still reads; an unknown version is refused by name.
    let unhex = |h: &str| -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    };
    let mut f = fs.create(Path::new("/v1.sst"), Default::default()).unwrap();
    f.append(&unhex(GOLDEN_TABLE_V1)).unwrap();
    f.sync_all().unwrap();
    let t = open(&fs, Path::new("/v1.sst"), None).unwrap();
    assert_eq!(collect_forward(&mut t.iter()), kvs);
    let mut v3 = bytes.clone();
    let at = v3.len() - 16;
    v3[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
    let crc = crate::table::format::mask_crc(crc32c::crc32c(&v3[v3.len() - 56..at + 4]));
    v3[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    let mut f = fs.create(Path::new("/v3.sst"), Default::default()).unwrap();
    f.append(&v3).unwrap();
    f.sync_all().unwrap();
    let err = open(&fs, Path::new("/v3.sst"), None).unwrap_err();
    assert!(
        err.to_string().contains("unknown table format version 3"),
        "{err}"
    );
}

const GOLDEN_TABLE: &str = "000d036170706c650103000000000000726564020d007269636f74000200000000000000000000010000000080dc91270000000000000000000000000010000000000000000000000000000000000000000000000000000000000000000000000000004000000000000000000000000001010000000001c4a41d00090162020400000000000063000000000100000000350c76430d6170706c650103000000000000096302ffffffffffffff02040201011c0330214a808080a8c68d9cb86180808080808080806300d28734c4000d0270686f656e69782e626c6f6f6d304500120370686f656e69782e70726f7065727469657394013400110270686f656e69782e72616e67655f64656c7a1500000000120000002a000000030000000083452442000f0261707269636f740002000000000000002b000000000100000000e9987f55cd0150a2021c0000000000000000000000000000000000000000000000000000000000000000000002000000a4e5f6c25048585353543031";

/// The same table as written by format version 1 (before 2026-11-25): still read.
const GOLDEN_TABLE_V1: &str = "000d036170706c650103000000000000726564020d007269636f74000200000000000000000000010000000080dc91270000000000000000000000000010000000000000000000000000000000000000000000000000000000000000000000000000004000000000000000000000000001010000000001c4a41d00090162020400000000000063000000000100000000350c76430d6170706c650103000000000000096302ffffffffffffff02040201011c0330214a808080a8c68d9cb86180808080808080806300d28734c4000d0270686f656e69782e626c6f6f6d304500120370686f656e69782e70726f7065727469657394013400110270686f656e69782e72616e67655f64656c7a1500000000120000002a000000030000000083452442000f0261707269636f740002000000000000002b000000000100000000e9987f55cd0150a2021c0000000000000000000000000000000000000000000000000000000000000000000001000000612984d45048585353543031";

/// Flips every byte of a small table in turn: open, get and iterate either give the right
/// answer (the byte did not matter) or a corruption error naming the file and an offset
/// inside it; they never panic and never return wrong data.
#[test]
fn every_flipped_byte_is_detected_or_harmless() {
    let fs = MemFs::new();
    fs.create_dir_all(Path::new("/db")).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed());
    let kvs = entries(60, &mut rng);
    let tomb = RangeTombstone {
        start: b"group002".to_vec(),
        end: b"group003".to_vec(),
        seq: 7,
    };
    let opts = TableOptions {
        block_size: 256,
        ..TableOptions::default()
    };
    let path = Path::new("/db/000007.sst");
    build(&fs, path, &kvs, std::slice::from_ref(&tomb), &opts);
    let good = fs.read_all(path).unwrap();
    let size = good.len() as u64;
    let check_err = |e: &Error| match e {
        Error::Corruption { file, offset, .. } => {
            assert_eq!(file, path, "{e}");
            assert!(*offset < size, "{e}");
        }
        other => panic!("not a corruption error: {other}"),
    };
    let shared: SharedFs = Arc::new(fs.clone());
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x40;
        let mut f = shared.create(path, WriteOptions::default()).unwrap();
        f.append(&bad).unwrap();
        drop(f);
        let t = match open(&fs, path, None) {
            Ok(t) => t,
            Err(e) => {
                check_err(&e);
                continue;
            }
        };
        assert_eq!(t.range_tombstones(), &[tomb.clone()][..], "byte {i}");
        let mut it = t.iter();
        let got = collect_forward(&mut it);
        match it.status() {
            Ok(()) => assert_eq!(got, kvs, "byte {i} changed the data silently"),
            Err(e) => check_err(&e),
        }
        for (k, v) in kvs.iter().step_by(7) {
            match t.get(k, true) {
                Ok(Some(got)) => assert_eq!(&got, &(k.clone(), v.clone()), "byte {i}"),
                Ok(None) => panic!("byte {i}: key lost silently"),
                Err(e) => check_err(&e),
            }
        }
    }
}

#[test]
fn table_cache_bounds_open_tables_and_evicts() {
    let fs = MemFs::new();
    fs.create_dir_all(Path::new("/db")).unwrap();
    let kvs = vec![(internal_key(b"k", 1, ValueKind::Put), b"v".to_vec())];
    let mut sizes = Vec::new();
    for n in 1..=10u64 {
        let path = Path::new("/db").join(table_file_name(n));
        sizes.push(build(&fs, &path, &kvs, &[], &TableOptions::default()).file_size);
    }
    let shared: SharedFs = Arc::new(fs.clone());
    let tc = TableCache::new(
        Arc::new(crate::table_store::FsTableStore::new(
            shared,
            Path::new("/db"),
        )),
        4,
        Some(BlockCache::new(1 << 20)),
    );
    for n in 1..=10u64 {
        let t = tc.get(n, sizes[n as usize - 1]).unwrap();
        assert_eq!(t.number(), n);
        assert!(t.get(&seek_key(b"k", 5), true).unwrap().is_some());
    }
    assert!(tc.open_tables() <= 4);
    let a = tc.get(10, sizes[9]).unwrap();
    let b = tc.get(10, sizes[9]).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    tc.evict(10);
    let c = tc.get(10, sizes[9]).unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
    assert!(tc.get(99, 100).is_err());
}
