//! Engine options and the limits the engine enforces, named in one place.

use crate::db::Snapshot;
use crate::table::TableOptions;

/// Largest user key the engine accepts (bytes).
pub const KEY_LEN_MAX: usize = 64 * 1024;
/// Largest value the engine accepts (bytes).
pub const VALUE_LEN_MAX: usize = 1 << 30;
/// Largest encoded write batch (bytes); a batch is one WAL record and one memtable insert.
pub const BATCH_BYTES_MAX: usize = 2 * VALUE_LEN_MAX;
/// Most levels an LSM tree may have (the manifest rejects edits naming deeper levels).
pub const LEVELS_MAX: usize = 16;
/// Bytes a write group may gather from queued writers before the leader stops adding.
pub const WRITE_GROUP_BYTES_MAX: usize = 1 << 20;

const _: () = assert!(KEY_LEN_MAX <= VALUE_LEN_MAX && VALUE_LEN_MAX <= u32::MAX as usize);
const _: () = assert!(BATCH_BYTES_MAX >= KEY_LEN_MAX + VALUE_LEN_MAX + 64);

/// Where writes are made durable before they are acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalMode {
    /// The engine's own write-ahead log: stream 0 of a `phoenix-log` store in
    /// `<db>/wal`.
    Log,
    /// No WAL: durability comes from an outside log (seed 000). One batch always lands in
    /// one memtable, memtables flush in order, and a flush becomes visible only after its
    /// manifest edit is durable, so the persisted SSTs are always a prefix of the writes.
    None,
}

/// Options of an engine instance.
#[derive(Clone, Debug)]
pub struct Options {
    /// Create the directory and an empty database if none exists.
    pub create_if_missing: bool,
    /// Bytes a memtable may hold before it becomes immutable.
    pub write_buffer_size: usize,
    /// Memtables (mutable + immutable) held at most; writers stall beyond.
    pub max_write_buffer_number: usize,
    /// L0 files that trigger an L0 → L1 compaction.
    pub level0_file_num_compaction_trigger: usize,
    /// L0 files at which writes are slowed to `delayed_write_rate`.
    pub level0_slowdown_writes_trigger: usize,
    /// Bytes per second let through while L0 is at the slowdown trigger (RocksDB's
    /// `delayed_write_rate`).
    pub delayed_write_rate: u64,
    /// L0 files at which writes wait for compaction.
    pub level0_stop_writes_trigger: usize,
    /// Target size of L1 in bytes.
    pub max_bytes_for_level_base: u64,
    /// Each level below L1 targets this many times the size of the level above.
    pub max_bytes_for_level_multiplier: u64,
    /// Target size of compaction output files.
    pub target_file_size_base: u64,
    /// From L1 down, an output file is cut at a group boundary once it holds this many
    /// bytes. The default, 0, cuts at every boundary: no file of L1+ holds points of two
    /// groups, so `drop_group` frees a group by deleting files. A positive value (TiKV's
    /// compaction-guard minimum) lets groups smaller than it share files, trading fewer
    /// tiny files for a rewrite of the shared ones in `drop_group`; worth it only with
    /// very many tiny groups (e.g. db_bench's key layout, where every key is a group).
    pub min_group_file_size: u64,
    /// A compaction installs its work in pieces of about this many input bytes: once
    /// the inputs of the output level (and, below L0, of the input level) wholly behind
    /// the write position reach it, the outputs so far replace them in one manifest
    /// edit, and their bytes are freed before the rest is read. A compaction rewriting
    /// a whole level (an L0 compaction under a full L1) then holds at most one piece
    /// twice on disk, not the level. L0 inputs go at the end. 0: one edit at the end.
    pub compaction_piece_bytes: u64,
    /// Levels of the tree (L0 included).
    pub num_levels: usize,
    /// Background threads: one flushes, the others compact (on disjoint files, several
    /// at once). At least 2.
    pub max_background_jobs: usize,
    /// How SST files are written.
    pub table: TableOptions,
    /// With a prefix extractor (`table.prefix_len`), each memtable gets a filter over
    /// its keys' prefixes of this fraction of `write_buffer_size` (RocksDB's option of
    /// the same name); a prefix seek skips a memtable that rules its prefix out.
    /// 0: none. At most 0.25.
    pub memtable_prefix_bloom_size_ratio: f64,
    /// Bytes of decoded blocks cached (0 = no cache).
    pub block_cache_size: usize,
    /// Tables kept open at most.
    pub max_open_files: usize,
    /// Write-ahead log mode.
    pub wal: WalMode,
    /// Size of the WAL's segment files (`WalMode::Log`).
    pub wal_segment_size: u64,
    /// Keep what the WAL replays at open in memtables (RocksDB's option of the same
    /// name). Default false: it is flushed to L0 before `open` returns.
    pub avoid_flush_during_recovery: bool,
    /// Start no background compactions (tests of L0 behaviour; `compact_range` still works).
    pub disable_auto_compactions: bool,
    /// Run flushes and compactions on the writing thread when a memtable fills, with no
    /// background threads: slower, but every run with the same inputs does the same file
    /// operations in the same order (deterministic crash tests and simulation).
    pub inline_background: bool,
    /// First wait before background work that failed on an unavailable table store is
    /// tried again (at least 1 ms); it doubles at each failure in a row, up to
    /// `retry_backoff_max` (or stays at this one if that is smaller).
    pub retry_backoff_min: std::time::Duration,
    /// On a table store whose reads are requests (an object store), a compaction (and
    /// `replace_group`'s rewrite of a shared file) reads its input tables this many bytes
    /// per request
    /// (seed 004 §4.1.4 reads 4–8 MiB at a time on Tectonic); 0 reads block by block.
    /// Tables on a local file system are read block by block (the kernel reads ahead).
    pub compaction_readahead_bytes: usize,
    /// Longest wait between two tries of background work that failed on an unavailable
    /// table store.
    pub retry_backoff_max: std::time::Duration,
    /// Where background compactions run when not here: a worker reaching the same table
    /// store (`remote_compaction`). A compaction the worker fails or answers wrongly runs
    /// here after all. `None`: every compaction runs in this process.
    pub compaction_service: Option<std::sync::Arc<dyn crate::remote_compaction::CompactionService>>,
    /// How long a table a compaction (or a drop, an ingest's rewrite) replaced stays in
    /// the store before it is deleted: read-only followers of this engine (`Secondary`)
    /// that catch up more often than this never find a table of their version gone.
    /// 0: deleted once no version of this engine holds it.
    pub obsolete_table_delay: std::time::Duration,
    /// How long a read-only follower's lease holds the tables of the versions it reads
    /// without being renewed (`Secondary`; [`crate::reader_lease`]). On the primary,
    /// with `obsolete_table_delay` set, on a store that keeps leases, a table also waits
    /// for every live lease to have moved past it. 0: a follower keeps no lease (it
    /// reads with the deletion delay alone). At most a day.
    pub reader_lease: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            create_if_missing: true,
            write_buffer_size: 64 << 20,
            max_write_buffer_number: 2,
            level0_file_num_compaction_trigger: 4,
            level0_slowdown_writes_trigger: 20,
            delayed_write_rate: 16 << 20,
            level0_stop_writes_trigger: 36,
            max_bytes_for_level_base: 256 << 20,
            max_bytes_for_level_multiplier: 10,
            target_file_size_base: 64 << 20,
            min_group_file_size: 0,
            compaction_piece_bytes: 8 << 20,
            num_levels: 7,
            max_background_jobs: 2,
            table: TableOptions::default(),
            memtable_prefix_bloom_size_ratio: 0.0,
            block_cache_size: 8 << 20,
            max_open_files: 1000,
            wal: WalMode::Log,
            wal_segment_size: 64 << 20,
            avoid_flush_during_recovery: false,
            disable_auto_compactions: false,
            inline_background: false,
            retry_backoff_min: std::time::Duration::from_millis(100),
            compaction_readahead_bytes: 2 << 20,
            retry_backoff_max: std::time::Duration::from_secs(10),
            compaction_service: None,
            obsolete_table_delay: std::time::Duration::ZERO,
            reader_lease: std::time::Duration::from_secs(60),
        }
    }
}

impl Options {
    /// Checks the options against each other.
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |what: &str| Err(crate::Error::InvalidArgument(what.to_string()));
        if self.reader_lease > std::time::Duration::from_secs(24 * 3600) {
            return bad("reader_lease must be at most a day (a reader that died holds its tables that long)");
        }
        if self.num_levels < 2 || self.num_levels > LEVELS_MAX {
            return bad("num_levels must be in 2..=16");
        }
        if self.write_buffer_size < 1024 {
            return bad("write_buffer_size must be at least 1 KiB");
        }
        if self.max_write_buffer_number < 2 {
            return bad("max_write_buffer_number must be at least 2");
        }
        if self.level0_file_num_compaction_trigger == 0
            || self.level0_slowdown_writes_trigger < self.level0_file_num_compaction_trigger
            || self.level0_stop_writes_trigger < self.level0_slowdown_writes_trigger
        {
            return bad("need 0 < l0 compaction trigger <= slowdown trigger <= stop trigger");
        }
        if self.max_bytes_for_level_multiplier < 2 || self.max_bytes_for_level_base == 0 {
            return bad("level sizes must grow (multiplier >= 2, base > 0)");
        }
        if self.target_file_size_base == 0 {
            return bad("target_file_size_base must be positive");
        }
        if self.max_background_jobs < 2 {
            return bad("max_background_jobs must be at least 2 (one flush, one compaction)");
        }
        if !(0.0..=0.25).contains(&self.memtable_prefix_bloom_size_ratio) {
            return bad("memtable_prefix_bloom_size_ratio must be in 0..=0.25");
        }
        if self.table.prefix_len > crate::options::KEY_LEN_MAX {
            return bad("table.prefix_len must be at most the largest key length");
        }
        if self.max_open_files < 8 {
            return bad("max_open_files must be at least 8");
        }
        Ok(())
    }
}

/// Options of one write.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// Return only after the write is durable in the WAL (fsync).
    pub sync: bool,
    /// Skip the WAL for this write: a crash loses it unless a flush came first (a clean
    /// `close` flushes).
    pub disable_wal: bool,
}

/// Options of one read.
#[derive(Clone)]
pub struct ReadOptions<'a> {
    /// Read as of this snapshot (default: the latest state).
    pub snapshot: Option<&'a Snapshot>,
    /// Iterators: first user key included.
    pub lower_bound: Option<Vec<u8>>,
    /// Iterators: first user key excluded.
    pub upper_bound: Option<Vec<u8>>,
    /// Whether data blocks read from files enter the block cache (default true). A
    /// long scan with `false` leaves the cache to the hot point reads.
    pub fill_cache: bool,
    /// Iterators: a seek returns only keys with the sought key's prefix (RocksDB's
    /// option of the same name), and skips tables whose prefix filter rules the prefix
    /// out. Needs a prefix extractor (`Options::table.prefix_len`); a seek to a key
    /// shorter than the prefix reads in total order.
    pub prefix_same_as_start: bool,
    /// Tables on an object store are read side by side rather than one after the
    /// other (default true; seed 004's parallel I/O): the data blocks of one table a
    /// `multi_get` needs, and the tables an iterator's seek reads (one per level and L0
    /// file). Tables on a local file system are read one after the other either way.
    pub parallel_io: bool,
    /// Iterators: on a table store whose reads are requests (an object store), a
    /// forward scan reads ahead of itself, more as it goes on, up to this many bytes per
    /// request and never past `upper_bound` (seed 004 §4.1.4's adaptive readahead,
    /// seeded from how far the table's earlier iterators read); 0 reads block by block.
    /// Default 256 KiB.
    pub readahead_max: usize,
}

impl Default for ReadOptions<'_> {
    fn default() -> Self {
        ReadOptions {
            snapshot: None,
            lower_bound: None,
            upper_bound: None,
            fill_cache: true,
            prefix_same_as_start: false,
            parallel_io: true,
            readahead_max: 256 << 10,
        }
    }
}
