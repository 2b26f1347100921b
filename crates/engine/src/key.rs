//! Internal keys: the engine's view of a user key at one point in time.
//!
//! Byte grammar (the same in memtables, SST blocks and the manifest's key ranges):
//!
//! ```text
//! internal_key := user_key trailer
//! trailer      := u64 little-endian, (sequence << 8) | kind
//! kind         := 0 Delete | 1 Put | 2 RangeDelete
//! ```
//!
//! Order: user key ascending (bytewise), then trailer descending, so the newest version
//! of a key comes first and a seek to `(key, snapshot_seq)` lands on the newest version
//! visible to the snapshot.
//!
//! Groups: a user key's first 8 bytes, big-endian, are its replication group id (keys
//! shorter than 8 bytes are zero-padded; the mapping is monotone in key order, so every
//! group is one contiguous key range). See ARCHITECTURE.md, "Key layout inside the engine".

use std::cmp::Ordering;

/// A write's position in the engine's total order of writes.
pub type SequenceNumber = u64;

/// The largest sequence number (56 bits; the low 8 bits of the trailer hold the kind).
pub const MAX_SEQUENCE: SequenceNumber = (1 << 56) - 1;

/// Length of the trailer appended to every user key.
pub const TRAILER_LEN: usize = 8;

/// What an internal key records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum ValueKind {
    /// A point tombstone.
    Delete = 0,
    /// A value.
    Put = 1,
    /// A range tombstone `[user_key, value)`; lives only in range-deletion blocks and in
    /// the memtable's range-deletion list, never among point entries.
    RangeDelete = 2,
}

impl ValueKind {
    /// Decodes a kind byte.
    pub fn from_u8(b: u8) -> Option<ValueKind> {
        match b {
            0 => Some(ValueKind::Delete),
            1 => Some(ValueKind::Put),
            2 => Some(ValueKind::RangeDelete),
            _ => None,
        }
    }
}

/// The kind used when building seek keys: the largest kind, so that a seek to
/// `(key, seq)` lands before every entry of `key` with sequence `seq`.
pub const KIND_FOR_SEEK: ValueKind = ValueKind::RangeDelete;

/// Packs a sequence number and a kind into a trailer.
#[inline]
pub fn pack_trailer(seq: SequenceNumber, kind: ValueKind) -> u64 {
    debug_assert!(seq <= MAX_SEQUENCE, "sequence {seq} overflows 56 bits");
    (seq << 8) | kind as u64
}

/// Appends `user_key ‖ trailer(seq, kind)` to `buf`.
#[inline]
pub fn encode_internal_key(
    buf: &mut Vec<u8>,
    user_key: &[u8],
    seq: SequenceNumber,
    kind: ValueKind,
) {
    buf.reserve(user_key.len() + TRAILER_LEN);
    buf.extend_from_slice(user_key);
    buf.extend_from_slice(&pack_trailer(seq, kind).to_le_bytes());
}

/// Returns `user_key ‖ trailer(seq, kind)` as a new vector.
pub fn internal_key(user_key: &[u8], seq: SequenceNumber, kind: ValueKind) -> Vec<u8> {
    let mut buf = Vec::with_capacity(user_key.len() + TRAILER_LEN);
    encode_internal_key(&mut buf, user_key, seq, kind);
    buf
}

/// The key to seek to for reading `user_key` as of `snapshot` (the newest version with
/// sequence `<= snapshot`).
pub fn seek_key(user_key: &[u8], snapshot: SequenceNumber) -> Vec<u8> {
    internal_key(user_key, snapshot, KIND_FOR_SEEK)
}

/// An internal key split into its parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedInternalKey<'a> {
    /// The user's key.
    pub user_key: &'a [u8],
    /// The write's sequence number.
    pub seq: SequenceNumber,
    /// What the entry records.
    pub kind: ValueKind,
}

/// Splits an internal key; `None` if it is shorter than a trailer or its kind is unknown
/// (callers turn that into a corruption error naming the file and offset).
#[inline]
pub fn parse_internal_key(ikey: &[u8]) -> Option<ParsedInternalKey<'_>> {
    let split = ikey.len().checked_sub(TRAILER_LEN)?;
    let (user_key, trailer) = ikey.split_at(split);
    let trailer = u64::from_le_bytes(trailer.try_into().ok()?);
    let kind = ValueKind::from_u8((trailer & 0xff) as u8)?;
    Some(ParsedInternalKey {
        user_key,
        seq: trailer >> 8,
        kind,
    })
}

/// The user key of an internal key. The caller guarantees `ikey` is at least a trailer
/// long (every internal key the engine builds or has validated is).
#[inline]
pub fn user_key(ikey: &[u8]) -> &[u8] {
    debug_assert!(
        ikey.len() >= TRAILER_LEN,
        "internal key shorter than its trailer"
    );
    &ikey[..ikey.len().saturating_sub(TRAILER_LEN)]
}

/// The trailer of an internal key (0 if the key is malformed, which sorts it last among
/// versions of its user key).
#[inline]
pub fn trailer(ikey: &[u8]) -> u64 {
    ikey.len()
        .checked_sub(TRAILER_LEN)
        .and_then(|split| ikey[split..].try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// Compares byte strings exactly as `<[u8]>::cmp` does, eight bytes at a time as
/// big-endian words. Our keys are short and start with the 8-byte group id, so an inline
/// word compare (the first word usually ties) beats a call to `memcmp` on every step of a
/// skiplist or block search.
#[inline]
pub fn compare_bytes(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let (x, y) = (be_word(a, i), be_word(b, i));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    a[i..].cmp(&b[i..])
}

#[inline(always)]
fn be_word(s: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[i..i + 8]);
    u64::from_be_bytes(w)
}

/// Compares two internal keys: user key ascending, then trailer descending.
#[inline]
pub fn compare_internal(a: &[u8], b: &[u8]) -> Ordering {
    match compare_bytes(user_key(a), user_key(b)) {
        Ordering::Equal => trailer(b).cmp(&trailer(a)),
        other => other,
    }
}

/// A range tombstone: an entry `(k, s)` with
/// `start <= k < end` and `s < seq` is hidden by it (when the reader's snapshot can see
/// `seq`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RangeTombstone {
    /// First user key deleted.
    pub start: Vec<u8>,
    /// First user key past the deleted range (exclusive).
    pub end: Vec<u8>,
    /// Sequence number of the deletion.
    pub seq: SequenceNumber,
}

impl RangeTombstone {
    /// Whether this tombstone hides version `seq` of `user_key` (ignoring snapshots).
    #[inline]
    pub fn covers(&self, user_key: &[u8], seq: SequenceNumber) -> bool {
        seq < self.seq && self.start.as_slice() <= user_key && user_key < self.end.as_slice()
    }
}

/// Length of the group-id prefix of a user key.
pub const GROUP_PREFIX_LEN: usize = 8;

/// The replication group a user key belongs to (first 8 bytes big-endian, zero-padded).
#[inline]
pub fn group_of(user_key: &[u8]) -> u64 {
    let mut prefix = [0u8; GROUP_PREFIX_LEN];
    let n = user_key.len().min(GROUP_PREFIX_LEN);
    prefix[..n].copy_from_slice(&user_key[..n]);
    u64::from_be_bytes(prefix)
}

/// The user-key range `[start, end)` holding exactly group `g`; `end` is `None` for the
/// last possible group.
pub fn group_range(g: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let start = g.to_be_bytes().to_vec();
    let end = g.checked_add(1).map(|n| n.to_be_bytes().to_vec());
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `compare_bytes` agrees with the slice order on random short strings over a tiny
    /// alphabet (many shared prefixes, all lengths around the word size).
    #[test]
    fn compare_bytes_matches_slice_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..200_000 {
            let gen = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u8> {
                let len = rng.gen_range(0..26);
                (0..len)
                    .map(|_| [0u8, 1, 0x7f, 0x80, 0xff][rng.gen_range(0..5)])
                    .collect()
            };
            let a = gen(&mut rng);
            let b = if rng.gen_bool(0.3) {
                let mut b = a.clone();
                b.truncate(rng.gen_range(0..=a.len()));
                b
            } else {
                gen(&mut rng)
            };
            assert_eq!(compare_bytes(&a, &b), a.cmp(&b), "{a:?} vs {b:?}");
            assert_eq!(compare_bytes(&b, &a), b.cmp(&a), "{b:?} vs {a:?}");
        }
    }

    #[test]
    fn order_is_user_key_then_newest_first() {
        let a1 = internal_key(b"a", 1, ValueKind::Put);
        let a2 = internal_key(b"a", 2, ValueKind::Put);
        let b1 = internal_key(b"b", 1, ValueKind::Put);
        let ab = internal_key(b"ab", 9, ValueKind::Put);
        assert_eq!(compare_internal(&a2, &a1), Ordering::Less);
        assert_eq!(compare_internal(&a1, &ab), Ordering::Less);
        assert_eq!(compare_internal(&ab, &b1), Ordering::Less);
        // A seek key at snapshot 1 lands after the version at 2 and before the one at 1.
        let s = seek_key(b"a", 1);
        assert_eq!(compare_internal(&a2, &s), Ordering::Less);
        assert_eq!(compare_internal(&s, &a1), Ordering::Less);
    }

    #[test]
    fn parse_round_trips_and_rejects_garbage() {
        let k = internal_key(b"key", 42, ValueKind::Delete);
        let p = parse_internal_key(&k).unwrap();
        assert_eq!(
            (p.user_key, p.seq, p.kind),
            (&b"key"[..], 42, ValueKind::Delete)
        );
        assert!(parse_internal_key(b"short").is_none());
        let mut bad = internal_key(b"k", 1, ValueKind::Put);
        let n = bad.len();
        bad[n - TRAILER_LEN] = 7;
        assert!(parse_internal_key(&bad).is_none());
    }

    #[test]
    fn group_mapping_is_monotone() {
        let keys: [&[u8]; 6] = [
            b"",
            b"\x00",
            b"ab",
            b"ab\x00",
            b"ab\x00\x00\x00\x00\x00\x00z",
            b"ac",
        ];
        for w in keys.windows(2) {
            assert!(w[0] <= w[1]);
            assert!(group_of(w[0]) <= group_of(w[1]));
        }
        let (s, e) = group_range(5);
        assert_eq!(group_of(&s), 5);
        assert_eq!(group_of(&e.unwrap()), 6);
        assert!(group_range(u64::MAX).1.is_none());
    }
}
