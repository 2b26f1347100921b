//! The table's bloom filter: one "full" filter over the user keys of the whole table,
//! cache-line local (every probe of a key falls in one 64-byte line, so a lookup costs one
//! cache miss), as RocksDB's FastLocalBloom.
//!
//! Byte grammar:
//!
//! ```text
//! filter := lines[num_lines * 64] ‖ num_probes u8 ‖ num_lines u32 little-endian
//! ```
//!
//! Hash: h = xxh3_64(user_key). The line is `((h >> 32) * num_lines) >> 32`; the probes
//! use `g = h as u32`: probe i sets bit `g_i >> 23` of the line (9 bits = 512 bit
//! positions), with `g_{i+1} = g_i * 0x9e3779b9` (wrapping). `num_probes` is
//! `round(bits_per_key * ln 2)` clamped to 1..=30.

use crate::table::format::read_u32_le;

const LINE_BYTES: usize = 64;
const LINE_BITS: u64 = 512;
/// Length of the filter's trailer.
pub const FILTER_TRAILER_LEN: usize = 5;

#[inline]
fn hash(user_key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(user_key)
}

/// Collects the hashes of a table's user keys and builds its filter.
#[derive(Debug, Default)]
pub struct FilterBuilder {
    hashes: Vec<u64>,
    bits_per_key: u32,
}

impl FilterBuilder {
    /// A builder spending about `bits_per_key` bits per distinct key.
    pub fn new(bits_per_key: u32) -> Self {
        FilterBuilder {
            hashes: Vec::new(),
            bits_per_key,
        }
    }

    /// Adds a user key (consecutive duplicates are skipped).
    pub fn add(&mut self, user_key: &[u8]) {
        let h = hash(user_key);
        if self.hashes.last() != Some(&h) {
            self.hashes.push(h);
        }
    }

    /// Number of keys added.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no key was added.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Encodes the filter.
    pub fn finish(&self) -> Vec<u8> {
        let bits = (self.hashes.len() as u64).saturating_mul(u64::from(self.bits_per_key));
        let num_lines = bits.div_ceil(LINE_BITS).clamp(1, u64::from(u32::MAX)) as u32;
        let probes = (f64::from(self.bits_per_key) * std::f64::consts::LN_2)
            .round()
            .clamp(1.0, 30.0) as u8;
        let mut out = vec![0u8; num_lines as usize * LINE_BYTES + FILTER_TRAILER_LEN];
        for &h in &self.hashes {
            let line = line_of(h, num_lines) * LINE_BYTES;
            for bit in probe_bits(h, u32::from(probes)) {
                out[line + bit / 8] |= 1 << (bit % 8);
            }
        }
        let t = num_lines as usize * LINE_BYTES;
        out[t] = probes;
        out[t + 1..].copy_from_slice(&num_lines.to_le_bytes());
        out
    }
}

/// The bits (0..512) of its line that key hash `h` sets: `probes` of them, each the top
/// 9 bits of `g_i`, with `g_0 = h as u32` and `g_{i+1} = g_i * 0x9e3779b9`.
#[inline]
fn probe_bits(h: u64, probes: u32) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(h as u32), |g| Some(g.wrapping_mul(0x9e37_79b9)))
        .take(probes as usize)
        .map(|g| (g >> 23) as usize)
}

#[inline]
fn line_of(h: u64, num_lines: u32) -> usize {
    (((h >> 32) * u64::from(num_lines)) >> 32) as usize
}

/// A decoded filter.
#[derive(Debug)]
pub struct Filter {
    data: Vec<u8>,
    num_lines: u32,
    probes: u8,
}

impl Filter {
    /// Checks the filter's grammar; `Err(what)` says what is wrong (the caller adds the
    /// file and offset).
    pub fn new(data: Vec<u8>) -> std::result::Result<Filter, String> {
        if data.len() < FILTER_TRAILER_LEN {
            return Err(format!("filter of {} bytes is too short", data.len()));
        }
        let t = data.len() - FILTER_TRAILER_LEN;
        let probes = data[t];
        let num_lines = read_u32_le(&data, t + 1).unwrap_or(0);
        if num_lines == 0 || num_lines as usize * LINE_BYTES != t {
            return Err(format!(
                "filter claims {num_lines} lines but holds {t} bytes of lines"
            ));
        }
        if !(1..=30).contains(&probes) {
            return Err(format!("filter has {probes} probes (1..=30 allowed)"));
        }
        Ok(Filter {
            data,
            num_lines,
            probes,
        })
    }

    /// Whether `user_key` may be in the table (false means surely not).
    #[inline]
    pub fn may_contain(&self, user_key: &[u8]) -> bool {
        let h = hash(user_key);
        let line = line_of(h, self.num_lines) * LINE_BYTES;
        let Some(bytes) = self.data.get(line..line + LINE_BYTES) else {
            return true;
        };
        probe_bits(h, u32::from(self.probes)).all(|bit| bytes[bit / 8] & (1 << (bit % 8)) != 0)
    }

    /// Bytes of memory held.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the filter holds no bytes (never true for a decoded filter).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A bloom filter keys are added to while it is read (the memtable's prefix filter):
/// fixed size, same hashing and line layout as the table filter, bits set with atomic
/// ORs. A bit set before a reader's acquire of the entry it stands for is seen by it.
#[derive(Debug)]
pub struct DynamicFilter {
    words: Vec<std::sync::atomic::AtomicU64>,
    num_lines: u32,
}

/// Probes per key of a [`DynamicFilter`] (RocksDB's memtable bloom uses 6).
const DYNAMIC_PROBES: u32 = 6;

impl DynamicFilter {
    /// A filter of about `bytes` bytes (at least one 64-byte line).
    pub fn new(bytes: usize) -> Self {
        let num_lines = (bytes / LINE_BYTES).clamp(1, u32::MAX as usize) as u32;
        let words = (0..num_lines as usize * LINE_BYTES / 8)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        DynamicFilter { words, num_lines }
    }

    /// Adds `key`.
    pub fn add(&self, key: &[u8]) {
        let h = hash(key);
        let line = line_of(h, self.num_lines) * (LINE_BYTES / 8);
        for bit in probe_bits(h, DYNAMIC_PROBES) {
            if let Some(w) = self.words.get(line + bit / 64) {
                w.fetch_or(1 << (bit % 64), std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Whether `key` may have been added (false means surely not).
    pub fn may_contain(&self, key: &[u8]) -> bool {
        let h = hash(key);
        let line = line_of(h, self.num_lines) * (LINE_BYTES / 8);
        probe_bits(h, DYNAMIC_PROBES).all(|bit| {
            self.words.get(line + bit / 64).is_none_or(|w| {
                w.load(std::sync::atomic::Ordering::Relaxed) & (1 << (bit % 64)) != 0
            })
        })
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.words.len() * 8
    }

    /// Whether the filter holds no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_about_one_percent_false_positives() {
        let mut b = FilterBuilder::new(10);
        for i in 0..10_000u32 {
            b.add(format!("key{i}").as_bytes());
        }
        let f = Filter::new(b.finish()).unwrap();
        for i in 0..10_000u32 {
            assert!(f.may_contain(format!("key{i}").as_bytes()));
        }
        let fp = (0..10_000u32)
            .filter(|i| f.may_contain(format!("other{i}").as_bytes()))
            .count();
        assert!(fp < 250, "false positive rate {fp}/10000");
    }

    #[test]
    fn dynamic_filter_has_no_false_negatives() {
        let f = DynamicFilter::new(16 << 10);
        for i in 0..10_000u32 {
            f.add(format!("key{i}").as_bytes());
        }
        for i in 0..10_000u32 {
            assert!(f.may_contain(format!("key{i}").as_bytes()));
        }
        let fp = (0..10_000u32)
            .filter(|i| f.may_contain(format!("other{i}").as_bytes()))
            .count();
        assert!(fp < 1000, "false positive rate {fp}/10000");
        assert!(!DynamicFilter::new(0).may_contain(b"x"));
    }

    #[test]
    fn rejects_bad_trailers() {
        assert!(Filter::new(vec![0; 3]).is_err());
        let mut d = FilterBuilder::new(10).finish();
        assert!(Filter::new(d.clone()).is_ok());
        let t = d.len() - FILTER_TRAILER_LEN;
        d[t] = 0;
        assert!(Filter::new(d.clone()).is_err());
        d[t] = 5;
        d[t + 1] = 9;
        assert!(Filter::new(d).is_err());
    }
}
