//! Leases of read-only followers ([`crate::Secondary`]) on the tables they read: a
//! deletion delay that readers renew. A follower keeps one small object in the store
//! (`readers/<id>`, [`crate::TableStore::put_reader_lease`]) saying when the oldest
//! version it still reads was read and until when the lease holds; it writes it before
//! each read of the primary's manifest, so whatever version it reads is covered from
//! the start. The primary, whose deletion delay is on, deletes a table an edit removed
//! at `since` only once it has read the leases after `since` and every live lease's
//! oldest version was read later than `since` plus [`CLOCK_SKEW_MAX`]: no live reader
//! can hold it. A lease not renewed by its expiry stops counting (its reader finds the
//! tables of an old version gone and catches up).
//!
//! Format (20 bytes, big-endian): `format: u32 (1) ‖ oldest_view_ms: u64 ‖
//! expires_ms: u64`, times in ms since the Unix epoch by the reader's clock. A lease
//! that does not decode (another format, damage) counts as live and as old as can be:
//! tables wait rather than vanish under a reader this binary does not understand.

/// The lease format written.
pub const FORMAT: u32 = 1;

/// How far a reader's clock may run ahead of the primary's.
pub const CLOCK_SKEW_MAX_MS: u64 = 1_000;

/// [`CLOCK_SKEW_MAX_MS`] as a duration.
pub const CLOCK_SKEW_MAX: std::time::Duration = std::time::Duration::from_millis(CLOCK_SKEW_MAX_MS);

/// One reader's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// When the oldest version the reader still reads was read (before its manifest
    /// read began).
    pub oldest_view_ms: u64,
    /// Until when the lease holds.
    pub expires_ms: u64,
}

impl Lease {
    /// The lease's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20);
        out.extend_from_slice(&FORMAT.to_be_bytes());
        out.extend_from_slice(&self.oldest_view_ms.to_be_bytes());
        out.extend_from_slice(&self.expires_ms.to_be_bytes());
        out
    }

    /// Decodes a lease; `None` for another format or a damaged one.
    pub fn decode(b: &[u8]) -> Option<Lease> {
        if b.len() != 20 || u32::from_be_bytes(b[..4].try_into().ok()?) != FORMAT {
            return None;
        }
        Some(Lease {
            oldest_view_ms: u64::from_be_bytes(b[4..12].try_into().ok()?),
            expires_ms: u64::from_be_bytes(b[12..20].try_into().ok()?),
        })
    }
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the primary learned from the leases it read at `read_ms` (and `read_at` by its
/// monotonic clock): the oldest version a live reader still reads (`u64::MAX`: no live
/// reader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    pub read_ms: u64,
    pub read_at: std::time::Instant,
    pub oldest_view_ms: u64,
}

impl Floor {
    /// The floor of `leases` (as stored: `(reader, bytes)`) read at `read_ms` /
    /// `read_at`. A lease counts while its expiry plus the skew allowed is ahead (a
    /// reader whose clock is behind keeps its tables); one that says it read a version
    /// later than the skew allows is a reader whose clock is too far ahead, and holds
    /// every table (reported), as one that does not decode.
    pub fn of(leases: &[(String, Vec<u8>)], read_ms: u64, read_at: std::time::Instant) -> Floor {
        let mut oldest = u64::MAX;
        for (reader, bytes) in leases {
            match Lease::decode(bytes) {
                Some(l) if l.expires_ms.saturating_add(CLOCK_SKEW_MAX_MS) <= read_ms => {}
                Some(l) if l.oldest_view_ms > read_ms.saturating_add(CLOCK_SKEW_MAX_MS) => {
                    tracing::error!(
                        reader,
                        oldest_view_ms = l.oldest_view_ms,
                        read_ms,
                        "a reader's clock runs ahead of this engine's by more than the skew \
                         allowed; its lease holds every table"
                    );
                    oldest = 0;
                }
                Some(l) => oldest = oldest.min(l.oldest_view_ms),
                None => {
                    tracing::error!(
                        reader,
                        len = bytes.len(),
                        "a reader lease that does not decode holds every table; remove it if \
                         no reader of a newer binary follows this engine"
                    );
                    oldest = 0;
                }
            }
        }
        Floor {
            read_ms,
            read_at,
            oldest_view_ms: oldest,
        }
    }

    /// Whether no live reader can read a table an edit removed at `since_ms` (`since`
    /// by the monotonic clock: the leases must have been read after it by both clocks,
    /// so a wall clock stepped back cannot order them wrong).
    pub fn frees(&self, since_ms: u64, since: std::time::Instant) -> bool {
        self.read_at > since
            && self.read_ms > since_ms
            && self.oldest_view_ms > since_ms.saturating_add(CLOCK_SKEW_MAX_MS)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn leases_round_trip_and_decide() {
        let l = Lease {
            oldest_view_ms: 5_000,
            expires_ms: 70_000,
        };
        assert_eq!(Lease::decode(&l.encode()), Some(l));
        let mut later = l.encode();
        later[3] = 2;
        assert_eq!(Lease::decode(&later), None);
        assert_eq!(Lease::decode(&l.encode()[..19]), None);

        let t0 = std::time::Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(1);
        let floor = |leases: &[(String, Vec<u8>)], read_ms| Floor::of(leases, read_ms, t1);
        let leases = vec![("a".to_string(), l.encode())];
        // Read before the removal: tells nothing about it.
        assert!(!floor(&leases, 3_000).frees(3_500, t0));
        // A live reader whose oldest version is older than the removal holds it.
        assert!(!floor(&leases, 10_000).frees(4_500, t0));
        // Read within the skew after the removal: still held.
        assert!(!floor(&leases, 10_000).frees(4_000, t0));
        assert!(floor(&leases, 10_000).frees(3_999, t0));
        // Read before the removal by the monotonic clock (the wall clock stepped back):
        // tells nothing.
        assert!(!floor(&leases, 10_000).frees(3_999, t1));
        // A lease counts until its expiry plus the skew.
        assert!(!floor(&leases, 70_500).frees(60_000, t0));
        assert!(floor(&leases, 71_000).frees(60_000, t0));
        // No lease: free once read after the removal.
        assert!(floor(&[], 10_000).frees(9_999, t0));
        // A lease that does not decode, or one from a clock too far ahead, holds all.
        assert!(!floor(&[("b".into(), later)], 10_000).frees(1, t0));
        let ahead = Lease {
            oldest_view_ms: 12_000,
            expires_ms: 70_000,
        };
        assert!(!floor(&[("c".into(), ahead.encode())], 10_000).frees(1, t0));
    }
}
