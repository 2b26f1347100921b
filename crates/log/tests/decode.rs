//! The fuzz targets' checks, run on stable with seeded inputs: valid segments and batches
//! built by the encoder, then damaged (bit flips, truncations, splices, random bytes).
//! `PHOENIX_SEED` picks the seed, `PHOENIX_DECODE_CASES` the number of cases.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use phoenix_log::format::{self, OpHead, OpKind, SegmentHeader, FRAME_BATCH, FRAME_HEADER_LEN};
use phoenix_log::fuzz::{fuzz_batch, fuzz_framed_segment, fuzz_segment};
use phoenix_log::HardState;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn random_batch(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(0..5) {
        let kind = [
            OpKind::Append,
            OpKind::TruncatePrefix,
            OpKind::TruncateSuffix,
            OpKind::Assign,
            OpKind::Remove,
        ][rng.gen_range(0..5)];
        let first = rng.gen_range(1..100);
        let hs = rng.gen_bool(0.3).then(|| HardState {
            term: rng.gen(),
            vote: rng.gen(),
            commit: rng.gen(),
        });
        let head = OpHead {
            kind,
            stream: rng.gen(),
            opseq: rng.gen(),
            first,
            last: first + rng.gen_range(0..10) - 1,
            hard_state: hs,
            clears_hard_state: hs.is_none() && rng.gen_bool(0.2),
        };
        let datas: Vec<Vec<u8>> = if kind == OpKind::Append {
            (0..rng.gen_range(0..4))
                .map(|_| (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect())
                .collect()
        } else {
            Vec::new()
        };
        let entries: Vec<(u64, &[u8], u32)> = datas
            .iter()
            .map(|d| (rng.gen(), &d[..], crc32c::crc32c(d)))
            .collect();
        let mut offs = Vec::new();
        format::encode_op(&mut out, &head, first, entries.into_iter(), &mut offs);
    }
    out
}

fn random_segment(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let seq: u64 = rng.gen_range(1..1000);
    let h = SegmentHeader {
        queue: 0,
        seq,
        prev_seq: 0,
        opseq_base: 0,
    };
    let mut file = vec![0u8; 4096];
    file[..format::HEADER_USED].copy_from_slice(&h.encode());
    for _ in 0..rng.gen_range(0..4) {
        let payload = random_batch(rng);
        let at = file.len();
        file.resize(at + FRAME_HEADER_LEN, 0);
        file.extend_from_slice(&payload);
        let (hdr, rest) = file[at..].split_at_mut(FRAME_HEADER_LEN);
        format::seal_frame(seq, FRAME_BATCH, hdr, rest);
        file.resize(file.len().div_ceil(8) * 8, 0);
    }
    file.resize(file.len() + rng.gen_range(0..64), 0);
    file
}

fn damage(rng: &mut ChaCha8Rng, mut b: Vec<u8>) -> Vec<u8> {
    match rng.gen_range(0..4) {
        0 if !b.is_empty() => {
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len());
                b[i] ^= 1 << rng.gen_range(0..8);
            }
        }
        1 => {
            let n = rng.gen_range(0..=b.len());
            b.truncate(n);
        }
        2 if b.len() > 8 => {
            let i = rng.gen_range(0..b.len() - 4);
            b[i..i + 4].copy_from_slice(&rng.gen::<u32>().to_le_bytes());
        }
        _ => {}
    }
    b
}

#[test]
fn decoders_never_panic_and_round_trip() {
    let seed = env_u64("PHOENIX_SEED", 0xDEC0DE);
    let cases = env_u64("PHOENIX_DECODE_CASES", 3000);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..cases {
            let batch = random_batch(&mut rng);
            // Undamaged batches decode and round-trip.
            assert!(format::decode_batch(&batch, 0).is_ok());
            fuzz_batch(&batch);
            fuzz_batch(&damage(&mut rng, batch));
            let seg = random_segment(&mut rng);
            let (_, scan) = phoenix_log::scan_segment(std::path::Path::new("t.seg"), &seg).unwrap();
            assert!(scan.torn.is_none());
            fuzz_segment(&damage(&mut rng, seg.clone()));
            fuzz_segment(&seg[4096..]);
            let noise: Vec<u8> = (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect();
            fuzz_batch(&noise);
            fuzz_segment(&noise);
            fuzz_framed_segment(&noise);
            // Valid batches behind valid checksums, one length byte (in 4-byte units) each.
            let mut framed = Vec::new();
            for _ in 0..rng.gen_range(0..4) {
                let mut b = random_batch(&mut rng);
                b.truncate(255 * 4);
                b.truncate(b.len() / 4 * 4);
                framed.push((b.len() / 4) as u8);
                framed.extend_from_slice(&b);
            }
            fuzz_framed_segment(&framed);
            fuzz_framed_segment(&damage(&mut rng, framed));
        }
    }));
    if let Err(e) = result {
        eprintln!("decoder test failed; replay with PHOENIX_SEED={seed}");
        std::panic::resume_unwind(e);
    }
}
