//! Range tombstones gathered from many sources, cut into non-overlapping fragments so
//! that "which tombstones cover this key" is a binary search.
//!
//! A fragment `[start, end)` keeps the sequence numbers of every tombstone covering it,
//! newest first. Readers use [`Fragments::max_covering`] at their snapshot; compaction
//! uses [`Fragments::fragments`] to write back what it must keep.

use crate::key::{RangeTombstone, SequenceNumber};

/// One non-overlapping piece of the tombstone set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// First user key covered.
    pub start: Vec<u8>,
    /// First user key not covered.
    pub end: Vec<u8>,
    /// Sequences of the tombstones covering the whole fragment, descending, distinct.
    pub seqs: Vec<SequenceNumber>,
}

/// A fragmented set of range tombstones.
#[derive(Clone, Debug, Default)]
pub struct Fragments {
    frags: Vec<Fragment>,
}

impl Fragments {
    /// Fragments `tombstones`, keeping only those with `seq <= visible_at`.
    pub fn new(tombstones: &[RangeTombstone], visible_at: SequenceNumber) -> Self {
        let ts: Vec<&RangeTombstone> = tombstones
            .iter()
            .filter(|t| t.seq <= visible_at && t.start < t.end)
            .collect();
        if ts.is_empty() {
            return Fragments::default();
        }
        let mut bounds: Vec<&[u8]> = ts
            .iter()
            .flat_map(|t| [t.start.as_slice(), t.end.as_slice()])
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut frags: Vec<Fragment> = bounds
            .windows(2)
            .map(|w| Fragment {
                start: w[0].to_vec(),
                end: w[1].to_vec(),
                seqs: Vec::new(),
            })
            .collect();
        for t in ts {
            let first = frags.partition_point(|f| f.start.as_slice() < t.start.as_slice());
            for f in frags[first..].iter_mut() {
                if f.start.as_slice() >= t.end.as_slice() {
                    break;
                }
                f.seqs.push(t.seq);
            }
        }
        frags.retain(|f| !f.seqs.is_empty());
        for f in &mut frags {
            f.seqs.sort_unstable_by(|a, b| b.cmp(a));
            f.seqs.dedup();
        }
        Fragments { frags }
    }

    /// Whether there are no tombstones.
    pub fn is_empty(&self) -> bool {
        self.frags.is_empty()
    }

    /// The fragments in key order.
    pub fn fragments(&self) -> &[Fragment] {
        &self.frags
    }

    fn find(&self, user_key: &[u8]) -> Option<&Fragment> {
        let i = self.frags.partition_point(|f| f.end.as_slice() <= user_key);
        self.frags.get(i).filter(|f| f.start.as_slice() <= user_key)
    }

    /// The newest tombstone sequence covering `user_key` (0 if none).
    pub fn max_covering(&self, user_key: &[u8]) -> SequenceNumber {
        self.find(user_key)
            .and_then(|f| f.seqs.first().copied())
            .unwrap_or(0)
    }

    /// The newest tombstone sequence covering `user_key` that is `<= at` (0 if none).
    pub fn max_covering_at(&self, user_key: &[u8], at: SequenceNumber) -> SequenceNumber {
        self.find(user_key)
            .and_then(|f| f.seqs.iter().copied().find(|&s| s <= at))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str, e: &str, seq: u64) -> RangeTombstone {
        RangeTombstone {
            start: s.as_bytes().to_vec(),
            end: e.as_bytes().to_vec(),
            seq,
        }
    }

    #[test]
    fn fragments_agree_with_brute_force() {
        let ts = vec![
            t("b", "f", 5),
            t("d", "k", 9),
            t("a", "c", 2),
            t("x", "z", 20),
        ];
        for at in [0u64, 2, 5, 9, 30] {
            let f = Fragments::new(&ts, at);
            for k in [
                "a", "b", "c", "d", "e", "f", "j", "k", "w", "x", "y", "z", "",
            ] {
                let brute = ts
                    .iter()
                    .filter(|x| x.seq <= at && x.covers(k.as_bytes(), 0))
                    .map(|x| x.seq)
                    .max()
                    .unwrap_or(0);
                assert_eq!(f.max_covering(k.as_bytes()), brute, "key {k} at {at}");
                let brute4 = ts
                    .iter()
                    .filter(|x| x.seq <= at.min(4) && x.covers(k.as_bytes(), 0))
                    .map(|x| x.seq)
                    .max()
                    .unwrap_or(0);
                assert_eq!(f.max_covering_at(k.as_bytes(), 4), brute4);
            }
        }
    }
}
