//! Compaction run by a worker elsewhere (seed 004 §7.2): the job an engine hands out,
//! what comes back, and the worker's side that runs it.
//!
//! On shared storage the inputs and outputs of a compaction are objects any process of
//! the bucket reaches, so the merge can run on another machine and leave the node's CPU
//! to its clients. The engine keeps everything that decides *what* the tree is: it picks
//! the compaction, marks its inputs busy, hands out the file numbers the outputs take,
//! and installs the outputs with its own manifest edit. The worker only reads the inputs
//! and writes tables under the numbers it was given ([`execute`]).
//!
//! The numbers a job may use are made durable in the manifest before the job leaves
//! (the counter moves past them): should the engine crash meanwhile, it never hands the
//! same numbers to its own flushes while a worker may still write them. A worker's
//! outputs are trusted only as far as the engine reads them back: each must be a
//! readable table of the stated size under a number of the job's range, inside the
//! inputs' keys and sequences, and the outputs must not overlap one another. Anything
//! else (a worker gone, a refusal, a wrong answer) makes the engine run the compaction
//! itself; the outputs a failed job left are deleted (by the worker when it fails, by
//! the engine when it rejects them, or as strays at the next open).
//!
//! The job and its output travel as bytes of the formats below, each led by its
//! version; a decoder refuses a version it does not know, naming it.
//!
//! ```text
//! job     := varint32(JOB_VERSION) varint32(level) varint32(output_level) u8(bottommost)
//!            varint64(n) varint64(snapshot)*n
//!            varint64(first_file_number) varint64(file_numbers)
//!            varint64(target_file_size) varint64(min_group_file_size)
//!            varint64(readahead_bytes)
//!            varint64(block_size) varint64(restart_interval) varint32(bloom_bits_per_key)
//!            u8(compression) varint64(index_restart_interval) varint64(prefix_len)
//!            varint32(len) version_edit(inputs as new files of `level`)
//!            varint32(len) version_edit(inputs as new files of `output_level`)
//! output  := varint32(OUTPUT_VERSION) varint64(n) (varint64(number) varint64(size))*n
//!            varint64(bytes_read) varint64(bytes_written) varint64(dropped)
//! ```

use std::sync::Arc;

use crate::compaction::{self, Compaction, Reason};
use crate::error::{Error, Result};
use crate::key::SequenceNumber;
use crate::options::LEVELS_MAX;
use crate::table::{Compression, Readahead, TableCache, TableOptions};
use crate::table_store::TableStore;
use crate::version_edit::{FileMeta, VersionEdit};
use crate::write_batch::{
    get_length_prefixed, get_varint32, get_varint64, put_varint32, put_varint64,
};

/// Version of the job format this build writes and reads.
pub const JOB_VERSION: u32 = 1;
/// Version of the output format this build writes and reads.
pub const OUTPUT_VERSION: u32 = 1;
/// Most file numbers one job may hold.
pub const JOB_FILE_NUMBERS_MAX: u64 = 1 << 24;

/// A compaction for a worker to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionJob {
    /// Level of the first input set.
    pub level: usize,
    /// Level the outputs go to.
    pub output_level: usize,
    /// Inputs at `level`.
    pub inputs: Vec<Arc<FileMeta>>,
    /// Inputs at `output_level`.
    pub next_inputs: Vec<Arc<FileMeta>>,
    /// Whether nothing below `output_level` overlaps the inputs.
    pub bottommost: bool,
    /// The engine's live snapshots, ascending.
    pub snapshots: Vec<SequenceNumber>,
    /// First file number the outputs may take.
    pub first_file_number: u64,
    /// How many numbers from `first_file_number` the outputs may take.
    pub file_numbers: u64,
    /// Target output file size.
    pub target_file_size: u64,
    /// From L1 down, a group boundary cuts an output only once it holds this much.
    pub min_group_file_size: u64,
    /// Bytes per read of the input tables (0: block by block).
    pub readahead_bytes: u64,
    /// How the outputs are built.
    pub table: TableOptions,
}

/// What a worker made of a job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobOutput {
    /// The tables written, as (number, size), in key order.
    pub files: Vec<(u64, u64)>,
    /// Bytes read from inputs.
    pub bytes_read: u64,
    /// Bytes written to outputs.
    pub bytes_written: u64,
    /// Entries dropped.
    pub dropped: u64,
}

/// Somewhere a compaction job runs: a worker process (`phoenix compactor`), or one in
/// the same process for tests.
pub trait CompactionService: Send + Sync + std::fmt::Debug {
    /// Runs `job` over the engine's table store and says what it wrote. On an error the
    /// engine runs the compaction itself; the worker should leave no outputs then.
    fn compact(&self, job: &CompactionJob) -> std::result::Result<JobOutput, String>;
}

impl CompactionJob {
    pub(crate) fn compaction(&self) -> Compaction {
        Compaction {
            level: self.level,
            output_level: self.output_level,
            inputs: self.inputs.clone(),
            next_inputs: self.next_inputs.clone(),
            bottommost: self.bottommost,
            reason: Reason::Manual,
        }
    }

    /// Input bytes.
    pub fn input_bytes(&self) -> u64 {
        self.inputs
            .iter()
            .chain(self.next_inputs.iter())
            .map(|f| f.size)
            .sum()
    }

    /// The job as bytes (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        put_varint32(&mut b, JOB_VERSION);
        put_varint32(&mut b, self.level as u32);
        put_varint32(&mut b, self.output_level as u32);
        b.push(u8::from(self.bottommost));
        put_varint64(&mut b, self.snapshots.len() as u64);
        for &s in &self.snapshots {
            put_varint64(&mut b, s);
        }
        for v in [
            self.first_file_number,
            self.file_numbers,
            self.target_file_size,
            self.min_group_file_size,
            self.readahead_bytes,
            self.table.block_size as u64,
            self.table.restart_interval as u64,
        ] {
            put_varint64(&mut b, v);
        }
        put_varint32(&mut b, self.table.bloom_bits_per_key);
        b.push(self.table.compression.type_byte());
        put_varint64(&mut b, self.table.index_restart_interval as u64);
        put_varint64(&mut b, self.table.prefix_len as u64);
        for (level, files) in [
            (self.level, &self.inputs),
            (self.output_level, &self.next_inputs),
        ] {
            let edit = VersionEdit {
                new_files: files.iter().map(|f| (level, Arc::clone(f))).collect(),
                ..Default::default()
            };
            let mut e = Vec::new();
            edit.encode(&mut e);
            put_varint32(&mut b, e.len() as u32);
            b.extend_from_slice(&e);
        }
        b
    }

    /// Decodes and checks a job (module docs).
    pub fn decode(data: &[u8]) -> Result<CompactionJob> {
        let bad = |what: &str| Error::InvalidArgument(format!("compaction job: {what}"));
        let mut pos = 0;
        let version = get_varint32(data, &mut pos).ok_or_else(|| bad("truncated"))?;
        if version != JOB_VERSION {
            return Err(bad(&format!(
                "format version {version} is not understood (this build reads {JOB_VERSION})"
            )));
        }
        let mut v32 = |what: &str| get_varint32(data, &mut pos).ok_or_else(|| bad(what));
        let level = v32("truncated level")? as usize;
        let output_level = v32("truncated output level")? as usize;
        if output_level >= LEVELS_MAX || level > output_level {
            return Err(bad(&format!(
                "levels {level} → {output_level} are not a compaction"
            )));
        }
        let bottommost = match data.get(pos) {
            Some(0) => false,
            Some(1) => true,
            _ => return Err(bad("bad bottommost flag")),
        };
        pos += 1;
        let mut v64 = |what: &str| get_varint64(data, &mut pos).ok_or_else(|| bad(what));
        let n = v64("truncated snapshots")?;
        if n > data.len() as u64 {
            return Err(bad("snapshot count past the end"));
        }
        let mut snapshots = Vec::with_capacity(n as usize);
        for _ in 0..n {
            snapshots.push(v64("truncated snapshot")?);
        }
        if snapshots.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("snapshots not ascending"));
        }
        let first_file_number = v64("truncated file numbers")?;
        let file_numbers = v64("truncated file numbers")?;
        let target_file_size = v64("truncated target size")?;
        let min_group_file_size = v64("truncated group size")?;
        let readahead_bytes = v64("truncated readahead")?;
        let block_size = v64("truncated block size")?;
        let restart_interval = v64("truncated restart interval")?;
        if file_numbers == 0 || file_numbers > JOB_FILE_NUMBERS_MAX {
            return Err(bad(&format!("{file_numbers} file numbers")));
        }
        if first_file_number
            .checked_add(file_numbers)
            .is_none_or(|_| first_file_number == 0)
        {
            return Err(bad("file numbers out of range"));
        }
        if target_file_size == 0 || !(1..=(64 << 20)).contains(&block_size) {
            return Err(bad("bad sizes"));
        }
        if !(1..=1 << 16).contains(&restart_interval) {
            return Err(bad("bad restart interval"));
        }
        let bloom_bits_per_key =
            get_varint32(data, &mut pos).ok_or_else(|| bad("truncated bloom bits"))?;
        let compression = data
            .get(pos)
            .and_then(|&b| Compression::from_type_byte(b))
            .ok_or_else(|| bad("unknown compression"))?;
        pos += 1;
        let index_restart_interval =
            get_varint64(data, &mut pos).ok_or_else(|| bad("truncated index restarts"))?;
        let prefix_len = get_varint64(data, &mut pos).ok_or_else(|| bad("truncated prefix"))?;
        if bloom_bits_per_key > 64
            || !(1..=1 << 16).contains(&index_restart_interval)
            || prefix_len > 1 << 16
        {
            return Err(bad("bad table options"));
        }
        let mut sets = Vec::new();
        for want in [level, output_level] {
            let e = get_length_prefixed(data, &mut pos).ok_or_else(|| bad("truncated inputs"))?;
            let edit = VersionEdit::decode(e)
                .map_err(|(at, why)| bad(&format!("inputs at byte {at}: {why}")))?;
            if edit
                != (VersionEdit {
                    new_files: edit.new_files.clone(),
                    ..Default::default()
                })
                || edit.new_files.iter().any(|(l, _)| *l != want)
            {
                return Err(bad("inputs hold more than files of their level"));
            }
            sets.push(
                edit.new_files
                    .into_iter()
                    .map(|(_, f)| f)
                    .collect::<Vec<_>>(),
            );
        }
        if pos != data.len() {
            return Err(bad("trailing bytes"));
        }
        let next_inputs = sets.pop().unwrap_or_default();
        let inputs = sets.pop().unwrap_or_default();
        if inputs.is_empty() {
            return Err(bad("no inputs"));
        }
        let range = first_file_number..first_file_number + file_numbers;
        if let Some(f) = inputs
            .iter()
            .chain(next_inputs.iter())
            .find(|f| range.contains(&f.number))
        {
            return Err(bad(&format!(
                "the output numbers {range:?} hold input table {}",
                f.number
            )));
        }
        Ok(CompactionJob {
            level,
            output_level,
            inputs,
            next_inputs,
            bottommost,
            snapshots,
            first_file_number,
            file_numbers,
            target_file_size,
            min_group_file_size,
            readahead_bytes,
            table: TableOptions {
                block_size: block_size as usize,
                restart_interval: restart_interval as usize,
                bloom_bits_per_key,
                compression,
                index_restart_interval: index_restart_interval as usize,
                prefix_len: prefix_len as usize,
            },
        })
    }
}

impl JobOutput {
    /// The output as bytes (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        put_varint32(&mut b, OUTPUT_VERSION);
        put_varint64(&mut b, self.files.len() as u64);
        for &(n, s) in &self.files {
            put_varint64(&mut b, n);
            put_varint64(&mut b, s);
        }
        put_varint64(&mut b, self.bytes_read);
        put_varint64(&mut b, self.bytes_written);
        put_varint64(&mut b, self.dropped);
        b
    }

    /// Decodes an output (module docs).
    pub fn decode(data: &[u8]) -> Result<JobOutput> {
        let bad = |what: &str| Error::InvalidArgument(format!("compaction output: {what}"));
        let mut pos = 0;
        let version = get_varint32(data, &mut pos).ok_or_else(|| bad("truncated"))?;
        if version != OUTPUT_VERSION {
            return Err(bad(&format!(
                "format version {version} is not understood (this build reads {OUTPUT_VERSION})"
            )));
        }
        let mut v64 = || get_varint64(data, &mut pos).ok_or_else(|| bad("truncated"));
        let n = v64()?;
        if n > data.len() as u64 {
            return Err(bad("file count past the end"));
        }
        let mut files = Vec::with_capacity(n as usize);
        for _ in 0..n {
            files.push((v64()?, v64()?));
        }
        let out = JobOutput {
            files,
            bytes_read: v64()?,
            bytes_written: v64()?,
            dropped: v64()?,
        };
        if pos != data.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(out)
    }
}

/// How many file numbers a job over `inputs` asks for: room for the outputs the bytes
/// make at the target size, a cut at every group boundary the inputs may hold, and the
/// tombstone-only files between them, twice over.
pub(crate) fn file_numbers_for(c: &Compaction, target_file_size: u64) -> u64 {
    let files = c.inputs.iter().chain(c.next_inputs.iter());
    let bytes: u64 = files.clone().map(|f| f.size).sum();
    // (A group is a key's first 8 bytes: keys without a group prefix make the span
    // huge, but a file cuts no more often than it has entries.)
    let groups: u64 = files
        .clone()
        .map(|f| {
            f.max_group
                .saturating_sub(f.min_group)
                .saturating_add(1)
                .min(f.num_entries.max(1))
        })
        .fold(0u64, u64::saturating_add);
    let tombstones: u64 = files.map(|f| f.num_range_deletions).sum();
    let n = (bytes / target_file_size.max(1))
        .saturating_add(groups)
        .saturating_add(tombstones)
        .saturating_add(8)
        .saturating_mul(2);
    n.min(JOB_FILE_NUMBERS_MAX)
}

/// Runs `job` over `store` (the worker's side): merges the inputs, writes the outputs
/// under the job's numbers and syncs them. On an error the outputs written so far are
/// deleted. `tables` opens the inputs (a cache over the same store).
pub fn execute(
    store: &dyn TableStore,
    tables: &Arc<TableCache>,
    job: &CompactionJob,
) -> Result<JobOutput> {
    let next = std::sync::atomic::AtomicU64::new(job.first_file_number);
    let end = job.first_file_number + job.file_numbers;
    let alloc = || {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n < end {
            Ok(n)
        } else {
            Err(Error::InvalidArgument(format!(
                "compaction job: its {} file numbers are not enough",
                job.file_numbers
            )))
        }
    };
    let env = compaction::Env {
        store,
        table: &job.table,
        tables,
        target_file_size: job.target_file_size,
        min_group_file_size: job.min_group_file_size,
        piece_bytes: 0,
        readahead: match job.readahead_bytes {
            0 => Readahead::Off,
            n => Readahead::Fixed(usize::try_from(n).unwrap_or(usize::MAX)),
        },
        new_file_number: &alloc,
    };
    let c = job.compaction();
    let mut no_pieces = |_: compaction::Piece| -> Result<()> {
        Err(Error::InvalidArgument(
            "a remote compaction installs no pieces".into(),
        ))
    };
    let out = compaction::run(&env, &c, &job.snapshots, &mut no_pieces)?;
    for f in c.inputs.iter().chain(c.next_inputs.iter()) {
        tables.evict(f.number);
    }
    Ok(JobOutput {
        files: out.files.iter().map(|f| (f.number, f.size)).collect(),
        bytes_read: out.bytes_read,
        bytes_written: out.bytes_written,
        dropped: out.dropped,
    })
}

/// Checks a worker's outputs for `job` against what `tables` reads of them; their
/// metas, in key order, if they may replace the inputs.
pub(crate) fn check_outputs(
    job: &CompactionJob,
    out: &JobOutput,
    tables: &TableCache,
) -> Result<Vec<Arc<FileMeta>>> {
    let bad = |what: String| Error::InvalidArgument(format!("compaction worker's output: {what}"));
    let range = job.first_file_number..job.first_file_number + job.file_numbers;
    let mut seen = std::collections::HashSet::new();
    let inputs: Vec<&Arc<FileMeta>> = job.inputs.iter().chain(job.next_inputs.iter()).collect();
    let lo = inputs
        .iter()
        .map(|f| f.smallest_user_key())
        .min()
        .unwrap_or_default();
    // The inputs' upper bound, and whether it is only a range tombstone's exclusive end
    // (then no output may hold a point at it).
    let (hi, hi_exclusive) = inputs
        .iter()
        .map(|f| (f.largest_user_key(), f.largest_is_exclusive()))
        .max_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)))
        .unwrap_or_default();
    let points = |f: &FileMeta| f.num_entries.saturating_sub(f.num_range_deletions);
    let in_points: u64 = inputs.iter().map(|f| points(f)).sum();
    if out.bytes_read != job.input_bytes() {
        return Err(bad(format!(
            "it read {} bytes of inputs holding {}",
            out.bytes_read,
            job.input_bytes()
        )));
    }
    let max_seq = inputs.iter().map(|f| f.largest_seq).max().unwrap_or(0);
    let min_seq = inputs.iter().map(|f| f.smallest_seq).min().unwrap_or(0);
    let mut metas = Vec::with_capacity(out.files.len());
    for &(number, size) in &out.files {
        if !range.contains(&number) || !seen.insert(number) {
            return Err(bad(format!(
                "table {number} is not one of the job's numbers {range:?} (or named twice)"
            )));
        }
        let t = tables.get(number, size)?;
        let m = Arc::new(FileMeta::from_properties(number, size, t.properties()));
        let past_hi = m.largest_user_key() > hi
            || (m.largest_user_key() == hi && hi_exclusive && !m.largest_is_exclusive());
        if m.smallest_user_key() < lo
            || past_hi
            || m.largest_seq > max_seq
            || (m.num_entries > 0 && m.smallest_seq < min_seq)
        {
            return Err(bad(format!(
                "table {number} holds keys or sequences the inputs do not"
            )));
        }
        metas.push(m);
    }
    // Every point entry of the inputs is written once or dropped.
    let out_points: u64 = metas.iter().map(|f| points(f)).sum();
    if out_points.checked_add(out.dropped) != Some(in_points) {
        return Err(bad(format!(
            "{out_points} entries written and {} dropped of the inputs' {in_points}",
            out.dropped
        )));
    }
    metas.sort_by(|a, b| crate::key::compare_internal(&a.smallest, &b.smallest));
    for w in metas.windows(2) {
        let apart = if w[0].largest_is_exclusive() {
            w[0].largest_user_key() <= w[1].smallest_user_key()
        } else {
            w[0].largest_user_key() < w[1].smallest_user_key()
        };
        if !apart {
            return Err(bad(format!(
                "tables {} and {} overlap",
                w[0].number, w[1].number
            )));
        }
    }
    Ok(metas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{internal_key, ValueKind};

    fn meta(number: u64, lo: &[u8], hi: &[u8]) -> Arc<FileMeta> {
        Arc::new(FileMeta {
            number,
            size: 100 + number,
            smallest: internal_key(lo, 5, ValueKind::Put),
            largest: internal_key(hi, 3, ValueKind::Put),
            smallest_seq: 3,
            largest_seq: 5,
            min_group: 1,
            max_group: 2,
            num_entries: 7,
            num_range_deletions: 0,
        })
    }

    fn job() -> CompactionJob {
        CompactionJob {
            level: 1,
            output_level: 2,
            inputs: vec![meta(4, b"a", b"c")],
            next_inputs: vec![meta(5, b"a", b"b"), meta(6, b"b2", b"d")],
            bottommost: true,
            snapshots: vec![3, 9],
            first_file_number: 100,
            file_numbers: 40,
            target_file_size: 1 << 20,
            min_group_file_size: 0,
            readahead_bytes: 4 << 20,
            table: TableOptions {
                compression: Compression::Lz4,
                prefix_len: 3,
                ..Default::default()
            },
        }
    }

    #[test]
    fn keys_without_a_group_prefix_ask_for_few_numbers() {
        let mut f = (*meta(4, b"a", b"c")).clone();
        // Keys of 1 to 8 bytes of any value span nearly every group id.
        f.min_group = 0;
        f.max_group = u64::MAX;
        f.num_entries = 100;
        let c = Compaction {
            level: 0,
            output_level: 1,
            inputs: vec![Arc::new(f)],
            next_inputs: Vec::new(),
            bottommost: true,
            reason: Reason::Manual,
        };
        let n = file_numbers_for(&c, 1 << 20);
        assert!(n <= 2 * (100 + 1 + 8), "{n}");
    }

    #[test]
    fn a_job_and_its_output_travel_as_they_are() {
        let j = job();
        assert_eq!(CompactionJob::decode(&j.encode()).unwrap(), j);
        let o = JobOutput {
            files: vec![(100, 5000), (101, 77)],
            bytes_read: 9,
            bytes_written: 5077,
            dropped: 3,
        };
        assert_eq!(JobOutput::decode(&o.encode()).unwrap(), o);
    }

    #[test]
    fn a_damaged_or_newer_job_is_refused_by_name() {
        let bytes = job().encode();
        for cut in 0..bytes.len() {
            assert!(
                CompactionJob::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut newer = bytes.clone();
        newer[0] = 2;
        let e = CompactionJob::decode(&newer).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(CompactionJob::decode(&longer).is_err());
        let mut no_numbers = job();
        no_numbers.file_numbers = 0;
        assert!(CompactionJob::decode(&no_numbers.encode()).is_err());
        let mut over_inputs = job();
        over_inputs.first_file_number = 5;
        let e = CompactionJob::decode(&over_inputs.encode())
            .unwrap_err()
            .to_string();
        assert!(e.contains("input table 5"), "{e}");
        let mut bad_levels = job();
        bad_levels.output_level = 0;
        assert!(CompactionJob::decode(&bad_levels.encode()).is_err());
        let mut bad_snaps = job();
        bad_snaps.snapshots = vec![9, 3];
        assert!(CompactionJob::decode(&bad_snaps.encode()).is_err());
        let o = JobOutput::default().encode();
        let mut newer = o.clone();
        newer[0] = 9;
        assert!(JobOutput::decode(&newer)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
    }
}
