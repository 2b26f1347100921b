//! Recovery: scan every segment, rebuild each stream's index, hard state and queue.
//!
//! Per segment, frames are read from `HEADER_LEN` until the first one that is not valid
//! for this segment's sequence number:
//! - all-zero bytes: the clean end (never-written space of a preallocated file);
//! - an invalid frame with a valid frame of this segment somewhere after it: corruption,
//!   reported with the segment and offset (a queue syncs a frame before writing the next,
//!   so a damaged frame followed by a good one is not a torn write);
//! - a seal frame: the clean end of a segment its queue moved on from (what follows is
//!   stale bytes of the file's earlier lives);
//! - otherwise the end: stale frames of the file's previous life (they check against the
//!   header's `prev_seq`) end it quietly, anything else is a torn tail, cut and reported
//!   with `tracing::warn!`.
//!
//! Every segment found without a seal (the ones being written at the crash) is sealed at
//! the end of its valid frames and synced, so a torn tail is cut once and for all.
//!
//! Then every stream's ops (from all segments: a stream may have changed queue) are
//! replayed in `opseq` order, clamping the stream to the op's `[first, last]` after each
//! op. Finally every stream must hold every index of `[first, last]`, or recovery fails
//! with [`Error::LostEntries`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use phoenix_storage::SharedFs;

use crate::error::{Error, Result};
use crate::format::{
    self, align_up, FrameCheck, Op, OpKind, SegmentHeader, ENTRY_HEADER_LEN, FRAME_ALIGN,
    FRAME_BATCH, FRAME_HEADER_LEN, FRAME_SEAL, HEADER_LEN,
};
use crate::segment::{parse_name, FreeFile, Segment};
use crate::store::{EntryMeta, StreamState};

/// What recovery hands to the store.
pub(crate) struct Recovered {
    pub segments: BTreeMap<u64, Arc<Segment>>,
    pub streams: HashMap<u64, StreamState>,
    pub free: Vec<FreeFile>,
    pub max_seq: u64,
    pub max_opseq: u64,
}

/// The result of scanning one segment's bytes.
#[derive(Debug)]
pub struct ScanResult {
    /// The decoded ops, in file order.
    pub ops: Vec<Op>,
    /// Offset of the end of the last valid frame.
    pub end: u64,
    /// Whether a torn tail was cut at `end`.
    pub torn: Option<String>,
    /// Whether the segment ends with a seal frame (at `end`).
    pub sealed: bool,
    /// Whether the scan stopped at a frame header of zeros (a clean end without a seal).
    pub zero_end: bool,
}

/// Scans the frames of a segment whose bytes are `data` (the whole file). Public for the
/// fuzz target: it must never panic, whatever the bytes.
pub fn scan_segment(path: &Path, data: &[u8]) -> Result<(SegmentHeader, ScanResult)> {
    let corrupt = |offset: u64, reason: String| Error::Corruption {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let header = SegmentHeader::decode(data).map_err(|r| corrupt(0, r))?;
    let seq = header.seq;
    let mut ops = Vec::new();
    let mut pos = HEADER_LEN as usize;
    let mut torn = None;
    let mut sealed = false;
    let mut zero_end = false;
    while pos < data.len() {
        match format::check_frame(seq, &data[pos..]) {
            FrameCheck::Valid {
                frame_type: FRAME_SEAL,
                ..
            } => {
                sealed = true;
                break;
            }
            FrameCheck::Valid { frame_type, len } => {
                let payload_at = pos + FRAME_HEADER_LEN;
                let payload = &data[payload_at..payload_at + len as usize];
                if frame_type == FRAME_BATCH {
                    let decoded =
                        format::decode_batch(payload, payload_at as u64).map_err(|(off, r)| {
                            corrupt(off, format!("undecodable op in a checksummed frame: {r}"))
                        })?;
                    ops.extend(decoded);
                }
                pos = align_up((payload_at + len as usize) as u64, FRAME_ALIGN) as usize;
            }
            FrameCheck::Zero => {
                zero_end = true;
                break;
            }
            FrameCheck::Invalid(reason)
                if !data[pos..].starts_with(&format::FRAME_MAGIC.to_le_bytes()) =>
            {
                // Not even a frame start: bytes of an earlier life of a recycled file (a
                // torn write keeps a prefix of the frame, magic first). Still, a valid frame
                // of this segment after it means damage.
                if let Some(p) = next_valid_frame(seq, data, pos) {
                    return Err(corrupt(
                        pos as u64,
                        format!("{reason}, but a valid frame follows at offset {p}"),
                    ));
                }
                break;
            }
            FrameCheck::Invalid(reason) => {
                if let Some(p) = next_valid_frame(seq, data, pos) {
                    return Err(corrupt(
                        pos as u64,
                        format!("{reason}, but a valid frame follows at offset {p}"),
                    ));
                }
                let stale = header.prev_seq != 0
                    && matches!(
                        format::check_frame(header.prev_seq, &data[pos..]),
                        FrameCheck::Valid { .. }
                    );
                if !stale {
                    torn = Some(reason);
                }
                break;
            }
        }
    }
    Ok((
        header,
        ScanResult {
            ops,
            end: pos.min(data.len()) as u64,
            torn,
            sealed,
            zero_end,
        },
    ))
}

/// Reads as much of a segment as recovery needs: growing prefixes until a scan of the
/// prefix ends cleanly (seal or zeros) inside it, else the whole file (a damaged frame
/// needs the rest of the file to tell a torn tail from corruption). Preallocated segments
/// are mostly zeros past their end, so this avoids reading them whole.
fn read_segment(fs: &SharedFs, path: &Path) -> Result<Vec<u8>> {
    let f = fs.open(path)?;
    let size = f.size();
    let mut len = (4u64 << 20).min(size);
    loop {
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(0, &mut buf)?;
        if len == size {
            return Ok(buf);
        }
        if let Ok((_, scan)) = scan_segment(path, &buf) {
            if (scan.sealed || scan.zero_end) && scan.end + FRAME_HEADER_LEN as u64 <= len {
                return Ok(buf);
            }
        }
        len = (len * 4).min(size);
    }
}

/// The offset of the first valid frame of segment `seq` after `pos`, if any.
fn next_valid_frame(seq: u64, data: &[u8], pos: usize) -> Option<usize> {
    let magic = format::FRAME_MAGIC.to_le_bytes();
    let mut p = pos + FRAME_ALIGN as usize;
    while p + FRAME_HEADER_LEN <= data.len() {
        if data[p..p + 4] == magic {
            if let FrameCheck::Valid { .. } = format::check_frame(seq, &data[p..]) {
                return Some(p);
            }
        }
        p += FRAME_ALIGN as usize;
    }
    None
}

/// One op of a stream during replay, with the segment holding it.
struct PendingOp {
    op: Op,
    seg: Arc<Segment>,
}

/// Rebuilds the store's state from the files in `dir`. `queues` is the current queue count.
pub(crate) fn recover(
    fs: &SharedFs,
    dir: &Path,
    queues: usize,
    cut: &[crate::UnsyncedTail],
) -> Result<Recovered> {
    let names = fs.list(dir)?;
    let mut max_seq = 0u64;
    let mut max_opseq = 0u64;
    let mut free = Vec::new();
    let mut seg_seqs = Vec::new();
    for name in &names {
        if let Some(id) = parse_name(name, "free") {
            let path = dir.join(name);
            max_seq = max_seq.max(id);
            // The file's header says which life its bytes are from (a segment whose rename
            // back to `.seg` was lost, or a recycled one); zero for a fresh file.
            let mut prev_seq = 0;
            let f = fs.open(&path)?;
            let mut b = [0u8; format::HEADER_USED];
            if f.read_at(0, &mut b)? == b.len() {
                if let Ok(h) = SegmentHeader::decode(&b) {
                    prev_seq = h.seq;
                    max_seq = max_seq.max(h.seq);
                }
            }
            free.push(FreeFile { path, prev_seq });
        } else if let Some(seq) = parse_name(name, "seg") {
            seg_seqs.push(seq);
        }
    }
    seg_seqs.sort_unstable();
    let mut segments = BTreeMap::new();
    let mut per_stream: HashMap<u64, Vec<PendingOp>> = HashMap::new();
    let mut unsealed: Vec<(u64, u64, Option<String>)> = Vec::new();
    for &seq in &seg_seqs {
        let path = crate::segment::seg_path(dir, seq);
        let data = read_segment(fs, &path)?;
        if let Ok(h) = SegmentHeader::decode(&data) {
            if h.seq > seq {
                // A dead segment being recycled: its new header was synced but the renames
                // (to `.free`, then to the new name) were not durable. Nothing was written
                // in its new life, so it is a free file (its frames are from life `seq`).
                max_seq = max_seq.max(h.seq);
                free.push(FreeFile {
                    path,
                    prev_seq: seq,
                });
                continue;
            }
        }
        let mut data = &data[..];
        let cut_at = cut
            .iter()
            .filter(|c| c.segment == seq)
            .map(|c| c.offset.max(HEADER_LEN))
            .min()
            .filter(|&at| at < data.len() as u64);
        if let Some(at) = cut_at {
            // (`at` < the file's length, so it fits a usize.)
            data = &data[..at as usize];
        }
        let (header, mut scan) = scan_segment(&path, data)?;
        if let Some(at) = cut_at {
            tracing::warn!(
                segment = %path.display(),
                offset = at,
                "log recovery: cutting the bytes written after the last successful sync \
                 before the store failed (none of them was acknowledged)"
            );
            // Sealed anew at the cut, even if a seal followed it (that seal was not synced).
            scan.sealed = false;
        }
        if header.seq != seq {
            return Err(Error::Corruption {
                path,
                offset: 0,
                reason: format!(
                    "header says segment {} but the file is named {seq}",
                    header.seq
                ),
            });
        }
        max_seq = max_seq.max(seq).max(header.prev_seq);
        max_opseq = max_opseq.max(header.opseq_base);
        let seg = Arc::new(Segment::new(dir, seq, header.queue, scan.end));
        seg.sealed.store(true, Ordering::Release);
        if !scan.sealed {
            unsealed.push((seq, scan.end, scan.torn));
        }
        for op in scan.ops {
            max_opseq = max_opseq.max(op.opseq);
            per_stream.entry(op.stream).or_default().push(PendingOp {
                op,
                seg: seg.clone(),
            });
        }
        segments.insert(seq, seg);
    }
    for (seq, off, torn) in unsealed {
        let path = crate::segment::seg_path(dir, seq);
        if let Some(reason) = torn {
            tracing::warn!(
                segment = %path.display(),
                offset = off,
                "log recovery: cutting torn tail ({reason}); ops after it were never acknowledged"
            );
        }
        // Seal the segment where its valid frames end (over the torn bytes, if any) and
        // sync it: what was recovered is durable before new ops, possibly of other queues,
        // follow it, and a later recovery stops at the seal instead of meeting the torn
        // bytes again.
        let mut f = fs.reopen(&path, off, phoenix_storage::WriteOptions::default())?;
        f.append(&format::seal_frame_bytes(seq, FRAME_HEADER_LEN))?;
        f.sync_data()?;
    }
    let mut streams = HashMap::new();
    for (id, mut ops) in per_stream {
        ops.sort_by_key(|p| p.op.opseq);
        if let Some(st) = replay(id, ops, queues)? {
            streams.insert(id, st);
        }
    }
    Ok(Recovered {
        segments,
        streams,
        free,
        max_seq,
        max_opseq,
    })
}

/// Replays one stream's ops (sorted by opseq). Returns `None` if nothing of it remains.
fn replay(id: u64, ops: Vec<PendingOp>, queues: usize) -> Result<Option<StreamState>> {
    let mut entries: BTreeMap<u64, EntryMeta> = BTreeMap::new();
    let mut first = 1u64;
    let mut last = 0u64;
    let mut hs = None;
    let mut hs_seg: Option<Arc<Segment>> = None;
    let mut latest_seg: Option<Arc<Segment>> = None;
    let mut removed = false;
    let mut rec_segs: Vec<Arc<Segment>> = Vec::new();
    for p in ops {
        let op = p.op;
        if !rec_segs.iter().any(|s| Arc::ptr_eq(s, &p.seg)) {
            rec_segs.push(p.seg.clone());
        }
        match op.kind {
            OpKind::Append => {
                let _ = entries.split_off(&op.base);
                for (i, e) in op.entries.iter().enumerate() {
                    entries.insert(
                        op.base + i as u64,
                        EntryMeta {
                            term: e.term,
                            seg: p.seg.clone(),
                            off: e.data_off,
                            len: e.len,
                            crc: e.crc,
                            cached: None,
                        },
                    );
                }
                removed = false;
            }
            OpKind::Remove => {
                entries.clear();
                removed = true;
            }
            OpKind::TruncatePrefix | OpKind::TruncateSuffix | OpKind::Assign => {
                removed = false;
            }
        }
        if op.hard_state.is_some() || op.clears_hard_state {
            hs = op.hard_state;
            hs_seg = Some(p.seg.clone());
        }
        first = op.first;
        last = op.last;
        // The clamp: whatever older ops left outside [first, last] is gone.
        let _ = entries.split_off(&(last.saturating_add(1)));
        entries = entries.split_off(&first);
        latest_seg = Some(p.seg.clone());
    }
    rec_segs.sort_by_key(|s| s.seq);
    let Some(latest) = latest_seg else {
        return Ok(None);
    };
    let queue = if (latest.queue as usize) < queues {
        latest.queue
    } else {
        (id % queues as u64) as u32
    };
    let mut st = StreamState::new(id, queue);
    if removed {
        // A tombstone only while older ops of the stream are still on disk.
        if rec_segs.len() <= 1 {
            return Ok(None);
        }
        latest.pins.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &hs_seg {
            s.pins.fetch_add(1, Ordering::AcqRel);
        }
        st.removed = true;
        st.hs_seg = hs_seg;
        st.latest_seg = Some(latest);
        st.rec_segs = rec_segs;
        return Ok(Some(st));
    }
    let expected = if last >= first { last - first + 1 } else { 0 };
    if entries.len() as u64 != expected {
        let mut missing = first;
        for &k in entries.keys() {
            if k != missing {
                break;
            }
            missing += 1;
        }
        return Err(Error::LostEntries {
            stream: id,
            first,
            last,
            missing,
        });
    }
    for m in entries.values() {
        m.seg
            .live
            .fetch_add(ENTRY_HEADER_LEN as u64 + u64::from(m.len), Ordering::AcqRel);
    }
    latest.pins.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = &hs_seg {
        s.pins.fetch_add(1, Ordering::AcqRel);
    }
    st.first = first;
    st.last = last;
    st.cache_from = last + 1;
    st.entries = entries.into_values().collect();
    st.hs = hs;
    st.hs_seg = hs_seg;
    st.latest_seg = Some(latest);
    st.rec_segs = rec_segs;
    Ok(Some(st))
}
