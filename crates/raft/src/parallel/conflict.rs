//! Conflict sets: what an entry's command reads and writes, as the leader described it at
//! propose time. Two entries whose sets meet must be applied in index order on every
//! replica; entries whose sets are disjoint commute and may be applied in either order.
//!
//! The core never looks inside a command: the server computes the set (docs/parallel-raft.md,
//! "Conflict sets") and the core only compares sets. Over-approximation is always allowed
//! (a false conflict costs order, never safety); a missed conflict is a bug of the caller.

/// One thing a command touches. Items are compared as docs/parallel-raft.md says: points
/// by fingerprint, ranges by inclusive 8-byte prefixes, sessions by client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConflictItem {
    /// One key: a fingerprint of the key and its first 8 bytes (big-endian, zero-padded).
    Point {
        /// Fingerprint of the whole key (equal keys give equal fingerprints).
        fp: u64,
        /// The key's first 8 bytes as a number, for comparison with ranges.
        prefix: u64,
    },
    /// Every key whose prefix lies in `lo..=hi`.
    Range {
        /// Lowest prefix, inclusive.
        lo: u64,
        /// Highest prefix, inclusive.
        hi: u64,
    },
    /// A client's session record.
    Session(u64),
}

impl ConflictItem {
    fn meets(&self, other: &ConflictItem) -> bool {
        use ConflictItem::*;
        match (*self, *other) {
            (Point { fp: a, .. }, Point { fp: b, .. }) => a == b,
            (Point { prefix, .. }, Range { lo, hi }) | (Range { lo, hi }, Point { prefix, .. }) => {
                lo <= prefix && prefix <= hi
            }
            (Range { lo: a, hi: b }, Range { lo: c, hi: d }) => a <= d && c <= b,
            (Session(a), Session(b)) => a == b,
            _ => false,
        }
    }
}

/// What a command touches: everything (a barrier), or a list of items.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConflictSet {
    /// Conflicts with every entry, no-ops included: membership changes, splits and merges, scrub points,
    /// session expiry, and any set the reader does not understand.
    All,
    /// Conflicts with an entry iff some item meets one of the other entry's items. An
    /// empty list (a no-op) conflicts with nothing.
    Items(Vec<ConflictItem>),
}

impl Default for ConflictSet {
    fn default() -> Self {
        ConflictSet::Items(Vec::new())
    }
}

impl ConflictSet {
    /// The empty set (a no-op's).
    pub fn none() -> ConflictSet {
        ConflictSet::default()
    }

    /// Whether two commands must keep their relative order.
    pub fn conflicts(&self, other: &ConflictSet) -> bool {
        match (self, other) {
            // A barrier orders even no-ops, so that it is applied exactly at the
            // watermark (every earlier entry applied, no later one).
            (ConflictSet::All, _) | (_, ConflictSet::All) => true,
            (ConflictSet::Items(a), ConflictSet::Items(b)) => {
                a.iter().any(|x| b.iter().any(|y| x.meets(y)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(fp: u64) -> ConflictItem {
        ConflictItem::Point { fp, prefix: fp }
    }

    #[test]
    fn items_meet_as_documented() {
        let a = ConflictSet::Items(vec![point(1)]);
        let b = ConflictSet::Items(vec![point(2)]);
        let r = ConflictSet::Items(vec![ConflictItem::Range { lo: 2, hi: 5 }]);
        let s = ConflictSet::Items(vec![ConflictItem::Session(7), point(9)]);
        assert!(!a.conflicts(&b));
        assert!(a.conflicts(&a));
        assert!(b.conflicts(&r) && r.conflicts(&b));
        assert!(!a.conflicts(&r));
        assert!(ConflictSet::Items(vec![ConflictItem::Range { lo: 5, hi: 8 }]).conflicts(&r));
        assert!(!ConflictSet::Items(vec![ConflictItem::Range { lo: 6, hi: 8 }]).conflicts(&r));
        assert!(s.conflicts(&ConflictSet::Items(vec![ConflictItem::Session(7)])));
        assert!(!s.conflicts(&ConflictSet::Items(vec![ConflictItem::Session(8)])));
        assert!(ConflictSet::All.conflicts(&a) && a.conflicts(&ConflictSet::All));
        assert!(ConflictSet::All.conflicts(&ConflictSet::All));
        assert!(ConflictSet::All.conflicts(&ConflictSet::none()));
        assert!(!ConflictSet::none().conflicts(&ConflictSet::none()));
    }
}
