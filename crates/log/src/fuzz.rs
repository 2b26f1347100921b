//! Entry points for the fuzz targets (`fuzz/fuzz_targets/log_*.rs`) and for the seeded
//! decoder tests that run the same checks on stable Rust. Whatever the bytes, decoding
//! must not panic, and what decodes must re-encode to the same bytes.

use std::path::Path;

use crate::format::{self, OpHead, SegmentHeader, HEADER_LEN, HEADER_USED};
use crate::recovery::scan_segment;

/// Decodes `data` as a batch payload; a success must re-encode to exactly `data`.
pub fn fuzz_batch(data: &[u8]) {
    let Ok(ops) = format::decode_batch(data, 0) else {
        return;
    };
    let mut out = Vec::with_capacity(data.len());
    for op in &ops {
        let slices: Vec<(u64, &[u8], u32)> = op
            .entries
            .iter()
            .map(|e| {
                let lo = e.data_off as usize;
                (e.term, &data[lo..lo + e.len as usize], e.crc)
            })
            .collect();
        if slices.iter().any(|(_, d, c)| crc32c::crc32c(d) != *c) {
            // The encoder computes entry checksums; bytes with wrong ones cannot round-trip.
            return;
        }
        let head = OpHead {
            kind: op.kind,
            stream: op.stream,
            opseq: op.opseq,
            first: op.first,
            last: op.last,
            hard_state: op.hard_state,
            clears_hard_state: op.clears_hard_state,
        };
        let mut offs = Vec::new();
        format::encode_op(&mut out, &head, op.base, slices.into_iter(), &mut offs);
    }
    assert_eq!(out, data, "decoded ops do not re-encode to the same bytes");
}

/// Scans `data` as the frame area of a segment (behind a valid header for the sequence
/// number in the first 8 bytes) and as a whole file; ops found must lie inside the file.
pub fn fuzz_segment(data: &[u8]) {
    let path = Path::new("fuzz.seg");
    if let Ok((_, scan)) = scan_segment(path, data) {
        check_scan(data.len(), &scan);
    }
    let mut seq_bytes = [0u8; 8];
    let n = data.len().min(8);
    seq_bytes[..n].copy_from_slice(&data[..n]);
    let header = SegmentHeader {
        queue: 0,
        seq: u64::from_le_bytes(seq_bytes),
        prev_seq: 0,
        opseq_base: 0,
    };
    let mut file = vec![0u8; HEADER_LEN as usize];
    file[..HEADER_USED].copy_from_slice(&header.encode());
    file.extend_from_slice(data.get(8..).unwrap_or(&[]));
    match scan_segment(path, &file) {
        Ok((h, scan)) => {
            assert_eq!(h, header);
            check_scan(file.len(), &scan);
        }
        Err(crate::Error::Corruption { offset, .. }) => {
            assert!(
                offset <= file.len() as u64,
                "corruption offset outside the file"
            );
        }
        Err(e) => panic!("unexpected error kind from a scan: {e}"),
    }
}

/// Builds a segment whose frames carry valid checksums around payloads cut from `data`
/// (a length byte, then that many bytes, repeated; a final odd byte picks the frame type),
/// so that the op decoder and the tail handling behind the checksum are reached.
pub fn fuzz_framed_segment(data: &[u8]) {
    let seq = 7;
    let header = SegmentHeader {
        queue: 1,
        seq,
        prev_seq: 3,
        opseq_base: 0,
    };
    let mut file = vec![0u8; HEADER_LEN as usize];
    file[..HEADER_USED].copy_from_slice(&header.encode());
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize * 4).min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        let frame_type = match payload.first().map(|b| b % 7) {
            Some(5) => format::FRAME_PAD,
            Some(6) => format::FRAME_SEAL,
            _ => format::FRAME_BATCH,
        };
        let at = file.len();
        file.resize(at + format::FRAME_HEADER_LEN, 0);
        file.extend_from_slice(payload);
        let (hdr, body) = file[at..].split_at_mut(format::FRAME_HEADER_LEN);
        format::seal_frame(seq, frame_type, hdr, body);
        file.resize(file.len().div_ceil(8) * 8, 0);
    }
    match scan_segment(Path::new("fuzz.seg"), &file) {
        Ok((_, scan)) => check_scan(file.len(), &scan),
        Err(crate::Error::Corruption { offset, .. }) => assert!(offset <= file.len() as u64),
        Err(e) => panic!("unexpected error kind from a scan: {e}"),
    }
}

fn check_scan(len: usize, scan: &crate::recovery::ScanResult) {
    assert!(scan.end <= len as u64);
    for op in &scan.ops {
        assert!(op.offset + u64::from(op.size) <= scan.end);
        for e in &op.entries {
            assert!(e.data_off + u64::from(e.len) <= scan.end);
        }
    }
}
