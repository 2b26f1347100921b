//! Low-level pieces of the SST format: varints, block handles, the per-block trailer
//! (compression type and checksum), the footer, and reading one checksummed block.
//!
//! Byte grammar (all integers little-endian):
//!
//! ```text
//! varint64     := LEB128, at most 10 bytes
//! block_handle := offset varint64 ‖ size varint64          // size excludes the trailer
//! block_on_disk:= contents[size] ‖ trailer
//! trailer      := type u8 ‖ masked_crc32c(contents ‖ type) u32
//! type         := 0 none | 1 lz4 | 2 zstd
//! contents     := raw bytes                                 (type 0)
//!               | raw_len varint64 ‖ compressed bytes       (type 1 and 2)
//! footer       := metaindex_handle ‖ index_handle ‖ zero padding to 40 bytes
//!                 ‖ format_version u32 ‖ masked_crc32c(first 44 footer bytes) u32
//!                 ‖ magic u64                               // 56 bytes in all
//! ```
//!
//! The checksum is masked as in LevelDB (rotate right 15, add a constant) so that a
//! checksum stored inside checksummed data does not checksum to a constant.

use std::path::Path;

use phoenix_storage::ReadableFile;

use crate::error::{Error, Result};

/// Length of the trailer after every block.
pub const BLOCK_TRAILER_LEN: usize = 5;
/// Largest encoded block handle (two 10-byte varints).
pub const MAX_BLOCK_HANDLE_LEN: usize = 20;
/// Length of the footer at the end of every table.
pub const FOOTER_LEN: usize = 56;
/// The table magic number ("PHXSST01" read as little-endian bytes).
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"PHXSST01");
/// The format version this code writes. Version 2 (2026-11-25): an index separator may
/// equal a seek key at the newest sequence, so a point lookup must look past its block;
/// a version-1 reader would miss such keys, so it refuses these tables instead.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this code reads (version 1: separators never equal a key
/// that exists).
pub const FORMAT_VERSION_MIN: u32 = 1;
/// Largest block contents a reader accepts after decompression. Blocks are a few KiB;
/// this only stops a corrupt length from allocating gigabytes.
pub const MAX_BLOCK_LEN: usize = 64 << 20;

/// How the contents of one block are compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Stored as is.
    #[default]
    None,
    /// LZ4 block format.
    Lz4,
    /// Zstandard, level 1 by default.
    Zstd,
}

impl Compression {
    /// The trailer's type byte.
    pub fn type_byte(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }

    /// Decodes a trailer's type byte.
    pub fn from_type_byte(b: u8) -> Option<Compression> {
        match b {
            0 => Some(Compression::None),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }
}

const MASK_DELTA: u32 = 0xa282_ead8;

/// Masks a crc32c for storage.
#[inline]
pub fn mask_crc(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Inverts [`mask_crc`].
#[inline]
pub fn unmask_crc(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

/// Appends `v` as a varint.
#[inline]
pub fn put_varint64(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Appends `v` as a varint.
#[inline]
pub fn put_varint32(buf: &mut Vec<u8>, v: u32) {
    put_varint64(buf, u64::from(v));
}

/// Decodes a varint at the start of `data`; returns the value and its length, or `None`
/// if `data` ends inside the varint or the varint is longer than 10 bytes / overflows.
#[inline]
pub fn get_varint64(data: &[u8]) -> Option<(u64, usize)> {
    let mut result: u64 = 0;
    for (i, &b) in data.iter().enumerate().take(10) {
        let bits = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return None;
        }
        result |= bits << (7 * i);
        if b & 0x80 == 0 {
            return Some((result, i + 1));
        }
    }
    None
}

/// Decodes a varint that must fit 32 bits.
#[inline]
pub fn get_varint32(data: &[u8]) -> Option<(u32, usize)> {
    // Fast path: one byte.
    if let Some(&b) = data.first() {
        if b < 0x80 {
            return Some((u32::from(b), 1));
        }
    }
    let (v, n) = get_varint64(data)?;
    Some((u32::try_from(v).ok()?, n))
}

/// Where a block lies in a table file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockHandle {
    /// File offset of the block's first byte.
    pub offset: u64,
    /// Length of the block's contents (without the trailer).
    pub size: u64,
}

impl BlockHandle {
    /// Appends the handle's encoding.
    pub fn encode_to(&self, buf: &mut Vec<u8>) {
        put_varint64(buf, self.offset);
        put_varint64(buf, self.size);
    }

    /// The handle's encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MAX_BLOCK_HANDLE_LEN);
        self.encode_to(&mut v);
        v
    }

    /// Decodes a handle at the start of `data`; returns it and the bytes used.
    pub fn decode(data: &[u8]) -> Option<(BlockHandle, usize)> {
        let (offset, a) = get_varint64(data)?;
        let (size, b) = get_varint64(data.get(a..)?)?;
        Some((BlockHandle { offset, size }, a + b))
    }

    /// Decodes a handle that must fill `data` exactly.
    pub fn decode_exact(data: &[u8]) -> Option<BlockHandle> {
        match BlockHandle::decode(data)? {
            (h, n) if n == data.len() => Some(h),
            _ => None,
        }
    }
}

/// The fixed-size record at the end of every table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    /// The metaindex block.
    pub metaindex: BlockHandle,
    /// The index block.
    pub index: BlockHandle,
}

impl Footer {
    /// The footer's 56 bytes.
    pub fn encode(&self) -> [u8; FOOTER_LEN] {
        let mut handles = Vec::with_capacity(2 * MAX_BLOCK_HANDLE_LEN);
        self.metaindex.encode_to(&mut handles);
        self.index.encode_to(&mut handles);
        let mut out = [0u8; FOOTER_LEN];
        out[..handles.len()].copy_from_slice(&handles);
        out[40..44].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let crc = mask_crc(crc32c::crc32c(&out[..44]));
        out[44..48].copy_from_slice(&crc.to_le_bytes());
        out[48..56].copy_from_slice(&TABLE_MAGIC.to_le_bytes());
        out
    }

    /// Decodes the footer found at `offset` of `file`.
    pub fn decode(data: &[u8], file: &Path, offset: u64) -> Result<Footer> {
        let bad = |at: u64, what: &str| Error::corruption(file, offset + at, what.to_string());
        if data.len() != FOOTER_LEN {
            return Err(bad(0, "footer has the wrong length"));
        }
        let magic = u64::from_le_bytes(arr8(&data[48..56]));
        if magic != TABLE_MAGIC {
            return Err(bad(48, "bad table magic (not an SST file or truncated)"));
        }
        let stored = unmask_crc(u32::from_le_bytes(arr4(&data[44..48])));
        if stored != crc32c::crc32c(&data[..44]) {
            return Err(bad(44, "footer checksum mismatch"));
        }
        let version = u32::from_le_bytes(arr4(&data[40..44]));
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return Err(bad(40, &format!("unknown table format version {version}")));
        }
        let (metaindex, a) =
            BlockHandle::decode(&data[..40]).ok_or_else(|| bad(0, "bad metaindex handle"))?;
        let (index, b) = BlockHandle::decode(&data[a..40])
            .ok_or_else(|| bad(a as u64, "bad index block handle"))?;
        if data[a + b..40].iter().any(|&x| x != 0) {
            return Err(bad((a + b) as u64, "footer padding is not zero"));
        }
        Ok(Footer { metaindex, index })
    }
}

#[inline]
fn arr4(s: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    a
}

#[inline]
fn arr8(s: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    a
}

/// Reads a little-endian u32 at `pos` of `data`, if it is in bounds.
#[inline]
pub fn read_u32_le(data: &[u8], pos: usize) -> Option<u32> {
    let end = pos.checked_add(4)?;
    data.get(pos..end).map(|s| u32::from_le_bytes(arr4(s)))
}

/// Compresses `raw` with `compression` into `out` (cleared first) and returns the type
/// actually used: blocks that do not shrink by at least 1/8 are stored uncompressed, so
/// reads of incompressible data do not pay for decompression.
pub fn compress_block(raw: &[u8], compression: Compression, out: &mut Vec<u8>) -> Compression {
    out.clear();
    let compressed = match compression {
        Compression::None => None,
        Compression::Lz4 => {
            put_varint64(out, raw.len() as u64);
            out.extend_from_slice(&lz4_flex::block::compress(raw));
            Some(())
        }
        Compression::Zstd => match zstd::bulk::compress(raw, 1) {
            Ok(c) => {
                put_varint64(out, raw.len() as u64);
                out.extend_from_slice(&c);
                Some(())
            }
            // Compression failing is not an error of the data: store the block raw.
            Err(_) => None,
        },
    };
    if compressed.is_some() && out.len() < raw.len() - raw.len() / 8 {
        compression
    } else {
        out.clear();
        out.extend_from_slice(raw);
        Compression::None
    }
}

/// Builds the 5-byte trailer of a block whose (possibly compressed) contents are `data`.
pub fn block_trailer(data: &[u8], compression: Compression) -> [u8; BLOCK_TRAILER_LEN] {
    let t = compression.type_byte();
    let crc = crc32c::crc32c_append(crc32c::crc32c(data), &[t]);
    let mut out = [0u8; BLOCK_TRAILER_LEN];
    out[0] = t;
    out[1..].copy_from_slice(&mask_crc(crc).to_le_bytes());
    out
}

/// Verifies the trailer of the block `handle` (`buf` = contents ‖ trailer, as read from
/// `file`) and returns the uncompressed contents.
pub fn decode_block(mut buf: Vec<u8>, handle: BlockHandle, file: &Path) -> Result<Vec<u8>> {
    let size = buf.len().saturating_sub(BLOCK_TRAILER_LEN);
    if buf.len() < BLOCK_TRAILER_LEN || size as u64 != handle.size {
        return Err(Error::corruption(
            file,
            handle.offset,
            "block read has the wrong length",
        ));
    }
    let trailer_at = handle.offset + size as u64;
    let t = buf[size];
    let stored = unmask_crc(u32::from_le_bytes(arr4(&buf[size + 1..])));
    let actual = crc32c::crc32c(&buf[..size + 1]);
    if stored != actual {
        return Err(Error::corruption(
            file,
            handle.offset,
            format!("block checksum mismatch (block of {size} bytes, trailer at {trailer_at})"),
        ));
    }
    let compression = Compression::from_type_byte(t).ok_or_else(|| {
        Error::corruption(
            file,
            trailer_at,
            format!("unknown block compression type {t}"),
        )
    })?;
    buf.truncate(size);
    match compression {
        Compression::None => Ok(buf),
        Compression::Lz4 | Compression::Zstd => {
            let bad = |what: String| Error::corruption(file, handle.offset, what);
            let (raw_len, n) =
                get_varint64(&buf).ok_or_else(|| bad("bad uncompressed length".into()))?;
            let raw_len = usize::try_from(raw_len)
                .ok()
                .filter(|&l| l <= MAX_BLOCK_LEN)
                .ok_or_else(|| bad(format!("uncompressed length {raw_len} is too large")))?;
            let body = &buf[n..];
            let out = if compression == Compression::Lz4 {
                lz4_flex::block::decompress(body, raw_len)
                    .map_err(|e| bad(format!("lz4 block does not decompress: {e}")))?
            } else {
                zstd::bulk::decompress(body, raw_len)
                    .map_err(|e| bad(format!("zstd block does not decompress: {e}")))?
            };
            if out.len() != raw_len {
                return Err(bad(format!(
                    "block decompressed to {} bytes, expected {raw_len}",
                    out.len()
                )));
            }
            Ok(out)
        }
    }
}

/// Reads block `handle` of `file` (of `file_size` bytes), checks its trailer and returns
/// the uncompressed contents.
pub fn read_block(
    file: &dyn ReadableFile,
    file_size: u64,
    handle: BlockHandle,
    path: &Path,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; block_len(file_size, handle, path)?];
    file.read_exact_at(handle.offset, &mut buf)?;
    decode_block(buf, handle, path)
}

/// [`read_block`] of block `handle` from `ahead`, bytes `start..` of the file read
/// earlier (ahead of a cursor); `None` if they do not hold all of the block.
pub fn block_from(
    ahead: &[u8],
    start: u64,
    file_size: u64,
    handle: BlockHandle,
    path: &Path,
) -> Option<Result<Vec<u8>>> {
    let len = match block_len(file_size, handle, path) {
        Ok(len) => len,
        Err(e) => return Some(Err(e)),
    };
    let from = usize::try_from(handle.offset.checked_sub(start)?).ok()?;
    let bytes = ahead.get(from..from.checked_add(len)?)?;
    Some(decode_block(bytes.to_vec(), handle, path))
}

/// [`read_block`] of every handle, the reads issued together
/// ([`ReadableFile::read_many`]).
pub fn read_blocks(
    file: &dyn ReadableFile,
    file_size: u64,
    handles: &[BlockHandle],
    path: &Path,
) -> Result<Vec<Vec<u8>>> {
    let mut bufs = handles
        .iter()
        .map(|&h| Ok(vec![0u8; block_len(file_size, h, path)?]))
        .collect::<Result<Vec<_>>>()?;
    let mut reads: Vec<(u64, &mut [u8])> = handles
        .iter()
        .zip(bufs.iter_mut())
        .map(|(h, b)| (h.offset, b.as_mut_slice()))
        .collect();
    file.read_many(&mut reads)?;
    drop(reads);
    handles
        .iter()
        .zip(bufs)
        .map(|(&h, b)| decode_block(b, h, path))
        .collect()
}

/// The bytes block `handle` takes with its trailer; corruption if it does not fit in a
/// file of `file_size` bytes.
fn block_len(file_size: u64, handle: BlockHandle, path: &Path) -> Result<usize> {
    let end = handle
        .offset
        .checked_add(handle.size)
        .and_then(|e| e.checked_add(BLOCK_TRAILER_LEN as u64));
    match end {
        Some(end) if end <= file_size && handle.size <= MAX_BLOCK_LEN as u64 => {
            Ok(handle.size as usize + BLOCK_TRAILER_LEN)
        }
        _ => Err(Error::corruption(
            path,
            handle.offset,
            format!(
                "block handle (offset {}, size {}) points past the end of the {file_size}-byte file",
                handle.offset, handle.size
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_truncation() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint64(&mut b, v);
            assert_eq!(get_varint64(&b), Some((v, b.len())));
            assert_eq!(get_varint64(&b[..b.len() - 1]), None);
        }
        assert_eq!(get_varint32(&[0xff, 0xff, 0xff, 0xff, 0x1f]), None);
        assert_eq!(get_varint64(&[0xff; 11]), None);
    }

    #[test]
    fn footer_round_trips_and_detects_flips() {
        let f = Footer {
            metaindex: BlockHandle {
                offset: 1000,
                size: 50,
            },
            index: BlockHandle {
                offset: 1055,
                size: 4000,
            },
        };
        let bytes = f.encode();
        assert_eq!(Footer::decode(&bytes, Path::new("x"), 0).unwrap(), f);
        for i in 0..FOOTER_LEN {
            let mut b = bytes;
            b[i] ^= 0x20;
            let err = Footer::decode(&b, Path::new("x"), 100).unwrap_err();
            assert!(err.is_corruption(), "{err}");
        }
    }

    #[test]
    fn blocks_round_trip_under_every_compression() {
        let raw: Vec<u8> = (0..5000u32).flat_map(|i| (i % 17).to_le_bytes()).collect();
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut out = Vec::new();
            let used = compress_block(&raw, c, &mut out);
            assert_eq!(used, c);
            let mut buf = out.clone();
            buf.extend_from_slice(&block_trailer(&out, used));
            let h = BlockHandle {
                offset: 7,
                size: out.len() as u64,
            };
            assert_eq!(decode_block(buf.clone(), h, Path::new("f")).unwrap(), raw);
            buf[3] ^= 1;
            assert!(decode_block(buf, h, Path::new("f"))
                .unwrap_err()
                .is_corruption());
        }
    }
}
