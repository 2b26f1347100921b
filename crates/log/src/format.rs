//! On-disk format of log segments: the segment header, frames and stream operations.
//!
//! All integers are little-endian. A segment file is
//!
//! ```text
//! segment      := header[HEADER_LEN] frame*  (zero bytes or stale bytes after the last frame)
//! header       := magic "PHXLOGSG" | version u32 (=1) | queue u32 | seq u64 | prev_seq u64
//!                 | opseq_base u64 | crc u32 (crc32c of the 44 bytes before) | zero padding
//! frame        := at an offset that is a multiple of 8:
//!                 magic u32 (=FRAME_MAGIC) | crc u32 | len u32 | type u8 | 0 u8 | 0 u16
//!                 | payload[len]
//!                 crc = crc32c(seq u64 ‖ bytes 8..16 of the frame header ‖ payload), where
//!                 seq is the segment's sequence number from its header
//! type         := 1 (batch: payload is op*) | 2 (pad: payload is ignored)
//!                 | 3 (seal: the segment ends here; payload ignored, anything after is
//!                 stale)
//! op           := kind u8 | flags u8 | 0 u16 | body_len u32 | stream u64 | opseq u64
//!                 | first u64 | last u64 | [term u64 | vote u64 | commit u64 if flags & 1]
//!                 | body[body_len]
//! flags        := bit 0: a hard state follows; bit 1: the stream has no hard state after
//!                 this op (set on removal, and on rewrites of a stream revived after a
//!                 removal, so that the op that cleared it can be pinned and rewritten)
//! kind         := 1 append | 2 truncate-prefix | 3 truncate-suffix | 4 assign | 5 remove
//! append body  := base u64 | count u32 | 0 u32 | entry{count}
//! entry        := term u64 | len u32 | crc u32 (crc32c of data) | data[len]
//!                 (entry i has index base + i)
//! other bodies := empty
//! ```
//!
//! Why this shape:
//! - A frame is one group-commit write (seed 002's "transaction": head, length, checksum),
//!   so recovery needs no file-size metadata: it reads frames until one fails its check,
//!   and a preallocated segment costs one `fdatasync` of data per commit.
//! - The frame checksum covers the segment's sequence number. Segments are recycled and keep
//!   bytes of their previous life; such stale frames fail the check and read as the end of
//!   the log, never as records (the same trick as RocksDB's recyclable log format).
//! - Every op carries the stream's `first` and `last` index *after* the op and a store-wide
//!   operation sequence number `opseq`. Recovery sorts a stream's ops by `opseq` (a stream
//!   may have moved between queues, i.e. between files) and clamps the stream to
//!   `[first, last]` after each op. Because of that clamp, deleting a segment whose ops are
//!   all superseded can never bring truncated entries back (see `gc`).
//! - Entries carry their own checksum so that a single entry read back from disk is
//!   verified without reading its whole frame.

use crate::HardState;

/// Size reserved for the segment header (one direct-I/O block).
pub const HEADER_LEN: u64 = 4096;
/// Bytes of the header that are used (the rest is zero).
pub const HEADER_USED: usize = 48;
/// First 8 bytes of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"PHXLOGSG";
/// Segment format version.
pub const FORMAT_VERSION: u32 = 1;
/// First 4 bytes of every frame ("PXLF").
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"PXLF");
/// Size of a frame header.
pub const FRAME_HEADER_LEN: usize = 16;
/// Frames start at offsets that are multiples of this.
pub const FRAME_ALIGN: u64 = 8;
/// Frame type: a batch of ops.
pub const FRAME_BATCH: u8 = 1;
/// Frame type: padding (direct I/O alignment).
pub const FRAME_PAD: u8 = 2;
/// Frame type: the segment's end; the queue moved on (payload ignored).
pub const FRAME_SEAL: u8 = 3;
/// Largest frame payload accepted (1 GiB); bigger lengths are corruption.
pub const FRAME_LEN_MAX: u32 = 1 << 30;
/// Size of an op header without hard state.
pub const OP_HEADER_LEN: usize = 40;
/// Size of the optional hard state in an op.
pub const OP_HARD_STATE_LEN: usize = 24;
/// Size of an append body's fixed part.
pub const APPEND_HEADER_LEN: usize = 16;
/// Size of an entry header.
pub const ENTRY_HEADER_LEN: usize = 16;

const FLAG_HARD_STATE: u8 = 1;
const FLAG_CLEAR_HARD_STATE: u8 = 2;

/// The kind of a stream operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Entries (possibly none) and/or a hard state; replaces any suffix from `base` on.
    Append = 1,
    /// Entries below `first` are dropped.
    TruncatePrefix = 2,
    /// Entries above `last` are dropped.
    TruncateSuffix = 3,
    /// The stream now lives on the queue of the segment holding this op.
    Assign = 4,
    /// The stream is gone.
    Remove = 5,
}

impl OpKind {
    fn from_u8(v: u8) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::Append,
            2 => OpKind::TruncatePrefix,
            3 => OpKind::TruncateSuffix,
            4 => OpKind::Assign,
            5 => OpKind::Remove,
            _ => return None,
        })
    }
}

/// The segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The queue that wrote the segment.
    pub queue: u32,
    /// The segment's sequence number (unique, increasing, also its file name).
    pub seq: u64,
    /// Sequence number of the file's previous life (0 for a fresh file): stale frames
    /// after the end of this life check against it.
    pub prev_seq: u64,
    /// Every op in this segment has an `opseq` at least this.
    pub opseq_base: u64,
}

impl SegmentHeader {
    /// Encodes the header into `HEADER_USED` bytes.
    pub fn encode(&self) -> [u8; HEADER_USED] {
        let mut b = [0u8; HEADER_USED];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.queue.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.prev_seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.opseq_base.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header; `Err` says which check failed.
    pub fn decode(b: &[u8]) -> std::result::Result<SegmentHeader, String> {
        if b.len() < HEADER_USED {
            return Err(format!("header too short ({} bytes)", b.len()));
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err("bad segment magic".into());
        }
        let crc = le_u32(b, 44);
        if crc32c::crc32c(&b[0..44]) != crc {
            return Err("segment header checksum mismatch".into());
        }
        let version = le_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(format!("unsupported segment format version {version}"));
        }
        Ok(SegmentHeader {
            queue: le_u32(b, 12),
            seq: le_u64(b, 16),
            prev_seq: le_u64(b, 24),
            opseq_base: le_u64(b, 32),
        })
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Rounds `v` up to a multiple of `align` (a power of two).
pub fn align_up(v: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (v + align - 1) & !(align - 1)
}

/// Writes a frame header for `payload` (already in place after `hdr`) into `hdr`.
pub fn seal_frame(seq: u64, frame_type: u8, hdr: &mut [u8], payload: &[u8]) {
    assert_eq!(
        hdr.len(),
        FRAME_HEADER_LEN,
        "frame header slot has the wrong size"
    );
    assert!(
        payload.len() <= FRAME_LEN_MAX as usize,
        "frame payload too large"
    );
    hdr[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    hdr[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    hdr[12] = frame_type;
    hdr[13] = 0;
    hdr[14..16].copy_from_slice(&[0, 0]);
    let crc = frame_crc(seq, &hdr[8..16], payload);
    hdr[4..8].copy_from_slice(&crc.to_le_bytes());
}

fn frame_crc(seq: u64, hdr_tail: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&seq.to_le_bytes());
    let c = crc32c::crc32c_append(c, hdr_tail);
    crc32c::crc32c_append(c, payload)
}

/// What sits at one frame position.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameCheck {
    /// A valid frame: its type and payload length.
    Valid {
        /// Frame type.
        frame_type: u8,
        /// Payload length.
        len: u32,
    },
    /// All-zero bytes (or no room for a header): the clean end of a segment.
    Zero,
    /// Something else: a torn, stale or damaged frame. The string says which check failed.
    Invalid(String),
}

/// Encodes a seal frame for segment `seq`, `len` bytes long in total (16, or a whole
/// direct-I/O block).
pub fn seal_frame_bytes(seq: u64, len: usize) -> Vec<u8> {
    assert!(
        len >= FRAME_HEADER_LEN,
        "a seal frame needs room for its header"
    );
    let mut b = vec![0u8; len];
    let (hdr, rest) = b.split_at_mut(FRAME_HEADER_LEN);
    seal_frame(seq, FRAME_SEAL, hdr, rest);
    b
}

/// Checks the frame at the start of `b` for segment `seq`.
pub fn check_frame(seq: u64, b: &[u8]) -> FrameCheck {
    if b.len() < FRAME_HEADER_LEN {
        return if b.iter().all(|&x| x == 0) {
            FrameCheck::Zero
        } else {
            FrameCheck::Invalid("partial frame header at end of file".into())
        };
    }
    let hdr = &b[..FRAME_HEADER_LEN];
    if hdr.iter().all(|&x| x == 0) {
        return FrameCheck::Zero;
    }
    if le_u32(hdr, 0) != FRAME_MAGIC {
        return FrameCheck::Invalid("bad frame magic".into());
    }
    let len = le_u32(hdr, 8);
    if len > FRAME_LEN_MAX {
        return FrameCheck::Invalid(format!("frame length {len} too large"));
    }
    let end = FRAME_HEADER_LEN + len as usize;
    if end > b.len() {
        return FrameCheck::Invalid(format!("frame length {len} runs past the end of the file"));
    }
    let crc = le_u32(hdr, 4);
    if frame_crc(seq, &hdr[8..16], &b[FRAME_HEADER_LEN..end]) != crc {
        return FrameCheck::Invalid("frame checksum mismatch".into());
    }
    let frame_type = hdr[12];
    if !matches!(frame_type, FRAME_BATCH | FRAME_PAD | FRAME_SEAL) {
        return FrameCheck::Invalid(format!("unknown frame type {frame_type}"));
    }
    FrameCheck::Valid { frame_type, len }
}

/// One entry of a decoded append: where its data lies in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryLoc {
    /// The entry's term.
    pub term: u64,
    /// Offset of the data in the segment file.
    pub data_off: u64,
    /// Data length.
    pub len: u32,
    /// crc32c of the data.
    pub crc: u32,
}

/// A decoded stream operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// What the op does.
    pub kind: OpKind,
    /// The stream.
    pub stream: u64,
    /// Store-wide operation sequence number.
    pub opseq: u64,
    /// The stream's first index after the op.
    pub first: u64,
    /// The stream's last index after the op (`first - 1` when empty).
    pub last: u64,
    /// The hard state saved with the op.
    pub hard_state: Option<HardState>,
    /// The op leaves the stream without a hard state.
    pub clears_hard_state: bool,
    /// For appends: index of the first entry.
    pub base: u64,
    /// For appends: the entries, in index order from `base`.
    pub entries: Vec<EntryLoc>,
    /// Offset of the op in the segment file.
    pub offset: u64,
    /// Encoded size of the op in bytes.
    pub size: u32,
}

/// The header fields of an op to encode.
#[derive(Clone, Copy, Debug)]
pub struct OpHead {
    /// What the op does.
    pub kind: OpKind,
    /// The stream.
    pub stream: u64,
    /// Operation sequence number.
    pub opseq: u64,
    /// First index after the op.
    pub first: u64,
    /// Last index after the op.
    pub last: u64,
    /// Hard state to save.
    pub hard_state: Option<HardState>,
    /// The op leaves the stream without a hard state (exclusive with `hard_state`).
    pub clears_hard_state: bool,
}

/// Size of an encoded op.
pub fn op_size(hard_state: bool, entry_lens: impl Iterator<Item = usize>, append: bool) -> usize {
    let mut n = OP_HEADER_LEN;
    if hard_state {
        n += OP_HARD_STATE_LEN;
    }
    if append {
        n += APPEND_HEADER_LEN;
        for len in entry_lens {
            n += ENTRY_HEADER_LEN + len;
        }
    }
    n
}

/// Appends an encoded op to `out`. For appends, `entries` gives (term, data, crc) from
/// index `base`.
/// The entries' checksums are given (computed by the caller outside any lock); the
/// offset within `out` of each entry's data is pushed to `data_offsets`.
pub fn encode_op<'a>(
    out: &mut Vec<u8>,
    head: &OpHead,
    base: u64,
    entries: impl ExactSizeIterator<Item = (u64, &'a [u8], u32)> + Clone,
    data_offsets: &mut Vec<usize>,
) {
    let append = head.kind == OpKind::Append;
    let body_len = if append {
        APPEND_HEADER_LEN
            + entries
                .clone()
                .map(|(_, d, _)| ENTRY_HEADER_LEN + d.len())
                .sum::<usize>()
    } else {
        0
    };
    assert!(body_len <= FRAME_LEN_MAX as usize, "op body too large");
    out.push(head.kind as u8);
    assert!(
        !(head.clears_hard_state && head.hard_state.is_some()),
        "an op cannot both set and clear the hard state"
    );
    out.push(if head.hard_state.is_some() {
        FLAG_HARD_STATE
    } else if head.clears_hard_state {
        FLAG_CLEAR_HARD_STATE
    } else {
        0
    });
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&head.stream.to_le_bytes());
    out.extend_from_slice(&head.opseq.to_le_bytes());
    out.extend_from_slice(&head.first.to_le_bytes());
    out.extend_from_slice(&head.last.to_le_bytes());
    if let Some(hs) = head.hard_state {
        out.extend_from_slice(&hs.term.to_le_bytes());
        out.extend_from_slice(&hs.vote.to_le_bytes());
        out.extend_from_slice(&hs.commit.to_le_bytes());
    }
    if append {
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        for (term, data, crc) in entries {
            debug_assert_eq!(
                crc,
                crc32c::crc32c(data),
                "caller passed a wrong entry checksum"
            );
            out.extend_from_slice(&term.to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc.to_le_bytes());
            data_offsets.push(out.len());
            out.extend_from_slice(data);
        }
    }
}

/// Decodes the ops of a batch frame's payload. `payload_off` is the payload's offset in
/// the segment file (op and entry offsets are reported in file terms). `Err` gives the
/// file offset and what is wrong; a frame whose checksum passed but whose ops do not
/// parse is corruption (or a bug), never a torn write.
pub fn decode_batch(
    payload: &[u8],
    payload_off: u64,
) -> std::result::Result<Vec<Op>, (u64, String)> {
    let mut ops = Vec::new();
    let mut pos = 0usize;
    while pos < payload.len() {
        let at = payload_off + pos as u64;
        let rest = &payload[pos..];
        if rest.len() < OP_HEADER_LEN {
            return Err((
                at,
                format!("op header truncated ({} bytes left)", rest.len()),
            ));
        }
        let kind =
            OpKind::from_u8(rest[0]).ok_or_else(|| (at, format!("unknown op kind {}", rest[0])))?;
        let flags = rest[1];
        if rest[2] != 0 || rest[3] != 0 {
            return Err((at, "nonzero reserved op bytes".into()));
        }
        if flags & !(FLAG_HARD_STATE | FLAG_CLEAR_HARD_STATE) != 0
            || flags == FLAG_HARD_STATE | FLAG_CLEAR_HARD_STATE
        {
            return Err((at, format!("invalid op flags {flags:#x}")));
        }
        let body_len = le_u32(rest, 4) as usize;
        let stream = le_u64(rest, 8);
        let opseq = le_u64(rest, 16);
        let first = le_u64(rest, 24);
        let last = le_u64(rest, 32);
        let mut p = OP_HEADER_LEN;
        let hard_state = if flags & FLAG_HARD_STATE != 0 {
            if rest.len() < p + OP_HARD_STATE_LEN {
                return Err((at, "op hard state truncated".into()));
            }
            let hs = HardState {
                term: le_u64(rest, p),
                vote: le_u64(rest, p + 8),
                commit: le_u64(rest, p + 16),
            };
            p += OP_HARD_STATE_LEN;
            Some(hs)
        } else {
            None
        };
        let end = p
            .checked_add(body_len)
            .filter(|&e| e <= rest.len())
            .ok_or_else(|| (at, format!("op body length {body_len} runs past the frame")))?;
        if last.checked_add(1).is_none_or(|l| l < first) {
            return Err((
                at,
                format!("op has last index {last} below first index {first} - 1"),
            ));
        }
        let mut base = 0;
        let mut entries = Vec::new();
        match kind {
            OpKind::Append => {
                if body_len < APPEND_HEADER_LEN {
                    return Err((at, "append body too short".into()));
                }
                base = le_u64(rest, p);
                let count = le_u32(rest, p + 8) as usize;
                if le_u32(rest, p + 12) != 0 {
                    return Err((at, "nonzero reserved append bytes".into()));
                }
                let mut q = p + APPEND_HEADER_LEN;
                for i in 0..count {
                    if q + ENTRY_HEADER_LEN > end {
                        return Err((at, format!("entry {i} header runs past the op")));
                    }
                    let term = le_u64(rest, q);
                    let len = le_u32(rest, q + 8);
                    let crc = le_u32(rest, q + 12);
                    let data_at = q + ENTRY_HEADER_LEN;
                    let data_end = data_at
                        .checked_add(len as usize)
                        .filter(|&e| e <= end)
                        .ok_or_else(|| (at, format!("entry {i} data runs past the op")))?;
                    entries.push(EntryLoc {
                        term,
                        data_off: payload_off + (pos + data_at) as u64,
                        len,
                        crc,
                    });
                    q = data_end;
                }
                if q != end {
                    return Err((at, format!("append body has {} trailing bytes", end - q)));
                }
                if count > 0 && base.checked_add(count as u64).is_none() {
                    return Err((at, "entry indexes overflow".into()));
                }
            }
            _ => {
                if body_len != 0 {
                    return Err((at, format!("{kind:?} op with a body of {body_len} bytes")));
                }
            }
        }
        ops.push(Op {
            kind,
            stream,
            opseq,
            first,
            last,
            hard_state,
            clears_hard_state: flags & FLAG_CLEAR_HARD_STATE != 0,
            base,
            entries,
            offset: at,
            size: end as u32,
        });
        pos += end;
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_checks() {
        let h = SegmentHeader {
            queue: 3,
            seq: 77,
            prev_seq: 5,
            opseq_base: 1234,
        };
        let b = h.encode();
        assert_eq!(SegmentHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[20] ^= 1;
        assert!(SegmentHeader::decode(&bad).is_err());
        assert!(SegmentHeader::decode(&[0u8; HEADER_USED]).is_err());
    }

    #[test]
    fn golden_frame_bytes() {
        // A fixed op so that an accidental format change shows up as a diff here.
        let mut payload = Vec::new();
        let mut offs = Vec::new();
        let head = OpHead {
            kind: OpKind::Append,
            stream: 7,
            opseq: 9,
            first: 1,
            last: 1,
            hard_state: Some(HardState {
                term: 2,
                vote: 3,
                commit: 1,
            }),
            clears_hard_state: false,
        };
        encode_op(
            &mut payload,
            &head,
            1,
            [(2u64, &b"ab"[..], crc32c::crc32c(b"ab"))].into_iter(),
            &mut offs,
        );
        let mut frame = vec![0u8; FRAME_HEADER_LEN];
        frame.extend_from_slice(&payload);
        let (h, p) = frame.split_at_mut(FRAME_HEADER_LEN);
        seal_frame(42, FRAME_BATCH, h, p);
        assert_eq!(frame.len(), 16 + 40 + 24 + 16 + 16 + 2);
        assert_eq!(&frame[0..4], b"PXLF");
        assert_eq!(&frame[8..12], &98u32.to_le_bytes());
        assert_eq!(frame[12], FRAME_BATCH);
        assert_eq!(frame[16], 1, "op kind append");
        assert_eq!(frame[17], 1, "hard state flag");
        assert_eq!(&frame[20..24], &34u32.to_le_bytes(), "body len");
        assert_eq!(&frame[frame.len() - 2..], b"ab");
        assert_eq!(
            check_frame(42, &frame),
            FrameCheck::Valid {
                frame_type: FRAME_BATCH,
                len: 98
            }
        );
        // The same bytes in a segment of another sequence number are stale.
        assert!(matches!(check_frame(43, &frame), FrameCheck::Invalid(_)));
        let ops = decode_batch(&frame[16..], 4096 + 16).unwrap();
        assert_eq!(ops.len(), 1);
        let op = &ops[0];
        assert_eq!(
            (op.stream, op.opseq, op.first, op.last, op.base),
            (7, 9, 1, 1, 1)
        );
        assert_eq!(op.entries[0].len, 2);
        assert_eq!(op.entries[0].data_off, 4096 + frame.len() as u64 - 2);
        assert_eq!(offs, vec![payload.len() - 2]);
    }

    #[test]
    fn decoder_rejects_truncations_without_panicking() {
        let mut payload = Vec::new();
        let head = OpHead {
            kind: OpKind::Append,
            stream: 1,
            opseq: 1,
            first: 5,
            last: 6,
            hard_state: None,
            clears_hard_state: false,
        };
        let mut offs = Vec::new();
        encode_op(
            &mut payload,
            &head,
            5,
            [
                (1u64, &b"xyz"[..], crc32c::crc32c(b"xyz")),
                (1, &b""[..], 0),
            ]
            .into_iter(),
            &mut offs,
        );
        assert_eq!(decode_batch(&payload, 0).unwrap()[0].entries.len(), 2);
        for cut in 0..payload.len() {
            assert!(decode_batch(&payload[..cut], 0).is_err() || cut == 0);
        }
        assert_eq!(check_frame(1, &[0u8; 8]), FrameCheck::Zero);
        assert_eq!(check_frame(1, &[0u8; 64]), FrameCheck::Zero);
    }
}
