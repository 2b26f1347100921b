//! Entry points for fuzzing the SST decoders (used by the `sst_*` cargo-fuzz targets in
//! `fuzz/` and by a seeded stable test). Each takes arbitrary bytes and must never panic,
//! loop forever or read out of bounds; errors must be corruption errors naming the file
//! and an offset inside the input.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use phoenix_storage::{FileSystem, MemFs, WriteOptions};

use crate::error::Error;
use crate::iter::InternalIterator;
use crate::key::{self, compare_internal};
use crate::table::block::{bytewise, Block, KeyCmp};
use crate::table::filter::Filter;
use crate::table::format::{
    block_trailer, decode_block, BlockHandle, Compression, Footer, BLOCK_TRAILER_LEN,
};
use crate::table::Table;

const FUZZ_PATH: &str = "/fuzz/000001.sst";

fn check_error(e: &Error, len: usize) {
    match e {
        Error::Corruption { file, offset, .. } => {
            assert_eq!(file, Path::new(FUZZ_PATH), "{e}");
            assert!(*offset <= len as u64, "offset past the input: {e}");
        }
        Error::InvalidArgument(_) => {}
        other => panic!("decoder gave a non-corruption error: {other}"),
    }
}

/// Walks a block both ways and seeks to keys taken from the input.
fn walk(block: Block, cmp: KeyCmp, min_key_len: usize, len: usize, index: bool) {
    let block = Arc::new(block);
    let mut it = block.iter(cmp, min_key_len);
    // Every entry takes at least 3 bytes, so a walk longer than this is a loop.
    let bound = len / 3 + 2;
    let mut keys = Vec::new();
    it.seek_to_first();
    let mut n = 0;
    while it.valid() {
        assert!(n <= bound, "forward walk does not end");
        if keys.len() < 8 {
            keys.push(it.key().to_vec());
        }
        if index {
            let _ = BlockHandle::decode_exact(it.value());
        }
        it.next();
        n += 1;
    }
    if let Err(e) = it.status() {
        check_error(&e, len);
    }
    it.seek_to_last();
    let mut m = 0;
    while it.valid() {
        assert!(m <= bound, "backward walk does not end");
        it.prev();
        m += 1;
    }
    for k in &keys {
        it.seek(k);
        it.seek_for_prev(k);
    }
    it.seek(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00");
    it.seek_for_prev(&[0xff; 12]);
    if let Err(e) = it.status() {
        check_error(&e, len);
    }
}

/// A data block's contents (bytewise and internal-key order).
pub fn fuzz_block(data: &[u8]) {
    let path = Arc::new(PathBuf::from(FUZZ_PATH));
    match Block::new(data.to_vec(), Arc::clone(&path), 0) {
        Ok(b) => walk(b, compare_internal, key::TRAILER_LEN, data.len(), false),
        Err(e) => check_error(&e, data.len()),
    }
    if let Ok(b) = Block::new(data.to_vec(), path, 0) {
        walk(b, bytewise, 0, data.len(), false);
    }
}

/// An index block's contents (values decoded as block handles).
pub fn fuzz_index(data: &[u8]) {
    let path = Arc::new(PathBuf::from(FUZZ_PATH));
    match Block::new(data.to_vec(), path, 0) {
        Ok(b) => walk(b, compare_internal, key::TRAILER_LEN, data.len(), true),
        Err(e) => check_error(&e, data.len()),
    }
}

/// A bloom filter block's contents.
pub fn fuzz_filter(data: &[u8]) {
    if let Ok(f) = Filter::new(data.to_vec()) {
        for k in data.chunks(9).take(16) {
            let _ = f.may_contain(k);
        }
        let _ = f.may_contain(b"");
    }
}

/// A footer (the input is padded or cut to the footer's length after its first byte
/// decides whether to keep it as is).
pub fn fuzz_footer(data: &[u8]) {
    if let Err(e) = Footer::decode(data, Path::new(FUZZ_PATH), 0) {
        check_error(&e, data.len().max(crate::table::format::FOOTER_LEN));
    }
}

/// A block with a valid checksum around arbitrary contents and the compression type given
/// by the first input byte: exercises the decompressors and the length checks behind the
/// checksum.
pub fn fuzz_block_contents(data: &[u8]) {
    let Some((&t, contents)) = data.split_first() else {
        return;
    };
    let c = match t % 3 {
        0 => Compression::None,
        1 => Compression::Lz4,
        _ => Compression::Zstd,
    };
    let mut buf = contents.to_vec();
    buf.extend_from_slice(&block_trailer(contents, c));
    let h = BlockHandle {
        offset: 0,
        size: contents.len() as u64,
    };
    debug_assert_eq!(buf.len(), contents.len() + BLOCK_TRAILER_LEN);
    match decode_block(buf, h, Path::new(FUZZ_PATH)) {
        Ok(raw) => {
            if let Ok(b) = Block::new(raw, Arc::new(PathBuf::from(FUZZ_PATH)), 0) {
                let len = b.charge();
                walk(b, compare_internal, key::TRAILER_LEN, len, false);
            }
        }
        Err(e) => check_error(&e, contents.len()),
    }
}

/// A whole table file: open, iterate both ways, point reads.
pub fn fuzz_table(data: &[u8]) {
    let fs = MemFs::new();
    let path = Path::new(FUZZ_PATH);
    let written = fs.create_dir_all(Path::new("/fuzz")).and_then(|()| {
        let mut f = fs.create(path, WriteOptions::default())?;
        f.append(data)?;
        fs.open(path)
    });
    let Ok(file) = written else {
        return;
    };
    let table = match Table::open(file, 1, data.len() as u64, None) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            check_error(&e, data.len());
            return;
        }
    };
    let mut it = table.iter();
    it.seek_to_first();
    let mut keys = Vec::new();
    let mut n = 0usize;
    while it.valid() {
        assert!(n <= data.len(), "table walk does not end");
        if keys.len() < 16 {
            keys.push(it.key().to_vec());
        }
        it.next();
        n += 1;
    }
    if let Err(e) = it.status() {
        check_error(&e, data.len());
    }
    let mut it = table.iter();
    it.seek_to_last();
    while it.valid() && n > 0 {
        it.prev();
        n -= 1;
    }
    for k in &keys {
        match table.get(k, true) {
            Ok(_) => {}
            Err(e) => check_error(&e, data.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::key::{internal_key, RangeTombstone, ValueKind};
    use crate::table::block::BlockBuilder;
    use crate::table::filter::FilterBuilder;
    use crate::table::{TableBuilder, TableOptions};

    fn seed_and_count() -> (u64, usize) {
        let seed = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let count = std::env::var("PHOENIX_FUZZ_COUNT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10_000);
        (seed, count)
    }

    /// Random bytes, or a valid sample with a few bytes changed, inserted or cut.
    fn mutate(rng: &mut impl Rng, sample: &[u8]) -> Vec<u8> {
        if rng.gen_bool(0.2) {
            let n = rng.gen_range(0..200);
            return (0..n).map(|_| rng.gen()).collect();
        }
        let mut d = sample.to_vec();
        for _ in 0..rng.gen_range(1..4) {
            match rng.gen_range(0..4) {
                0 | 1 if !d.is_empty() => {
                    let i = rng.gen_range(0..d.len());
                    d[i] = rng.gen();
                }
                2 if !d.is_empty() => {
                    let n = rng.gen_range(0..d.len());
                    d.truncate(n);
                }
                _ => {
                    let i = rng.gen_range(0..=d.len());
                    d.insert(i, rng.gen());
                }
            }
        }
        d
    }

    fn sample_block() -> Vec<u8> {
        let mut b = BlockBuilder::new(3);
        for i in 0..20u64 {
            b.add(
                &internal_key(format!("key{i:03}").as_bytes(), 100 - i, ValueKind::Put),
                b"value",
            );
        }
        b.finish().to_vec()
    }

    fn sample_index() -> Vec<u8> {
        let mut b = BlockBuilder::new(1);
        for i in 0..10u64 {
            let h = BlockHandle {
                offset: i * 4096,
                size: 4000,
            };
            b.add(
                &internal_key(format!("k{i}").as_bytes(), 1, ValueKind::Put),
                &h.encode(),
            );
        }
        b.finish().to_vec()
    }

    fn sample_table() -> Vec<u8> {
        let fs = MemFs::new();
        fs.create_dir_all(Path::new("/s")).unwrap();
        let f = fs
            .create(Path::new("/s/t.sst"), WriteOptions::default())
            .unwrap();
        let opts = TableOptions {
            block_size: 128,
            ..TableOptions::default()
        };
        let mut b = TableBuilder::new(f, &opts);
        for i in 0..30u64 {
            b.add(
                &internal_key(format!("key{i:03}").as_bytes(), 5, ValueKind::Put),
                b"vvvv",
            )
            .unwrap();
        }
        b.add_range_tombstone(&RangeTombstone {
            start: b"key010".to_vec(),
            end: b"key020".to_vec(),
            seq: 9,
        })
        .unwrap();
        b.finish().unwrap();
        fs.read_all(Path::new("/s/t.sst")).unwrap()
    }

    #[test]
    fn decoders_survive_random_and_mutated_inputs() {
        let (seed, count) = seed_and_count();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let block = sample_block();
        let index = sample_index();
        let mut filter = FilterBuilder::new(10);
        for i in 0..50u32 {
            filter.add(&i.to_le_bytes());
        }
        let filter = filter.finish();
        let footer = Footer {
            metaindex: BlockHandle {
                offset: 100,
                size: 40,
            },
            index: BlockHandle {
                offset: 145,
                size: 300,
            },
        }
        .encode();
        let table = sample_table();
        let mut contents = vec![1u8];
        contents.extend_from_slice(&block);
        eprintln!("fuzz decoders: PHOENIX_SEED={seed} PHOENIX_FUZZ_COUNT={count}");
        for _ in 0..count {
            fuzz_block(&mutate(&mut rng, &block));
            fuzz_index(&mutate(&mut rng, &index));
            fuzz_filter(&mutate(&mut rng, &filter));
            fuzz_footer(&mutate(&mut rng, &footer));
            fuzz_block_contents(&mutate(&mut rng, &contents));
        }
        for _ in 0..count / 5 {
            fuzz_table(&mutate(&mut rng, &table));
        }
        // The unmutated samples decode without error.
        fuzz_table(&table);
    }
}
