//! phoenix-engine: PhoenixKV's LSM-tree storage engine.

pub mod error;
pub mod iter;
pub mod key;
pub mod table;

pub mod compaction;
pub mod db;
pub mod db_iter;
pub mod filename;
pub mod flash_cache;
mod io_class;
pub mod memtable;
pub mod merge;
pub mod object_table_store;
pub mod options;
pub mod range_del;
pub mod reader_lease;
pub mod remote_compaction;
pub mod sst_writer;
pub mod table_store;
pub mod version;
pub mod version_edit;
pub mod version_set;
pub mod wal;
pub mod write_batch;
mod write_delay;

pub use db::{
    check_group_files, CopiedTables, Db, Failure, GroupExport, GroupSize, LevelStats, RestEntry,
    Secondary, SharedTable, Snapshot, Stats, GROUP_SIZE_SPAN_MAX,
};
pub use db_iter::DbIterator;
pub use error::{Error, Result};
pub use flash_cache::{FlashCache, FlashCacheStats};
pub use object_table_store::{ObjectTableStore, S3Prefix};
pub use options::{Options, ReadOptions, WalMode, WriteOptions};
pub use remote_compaction::{CompactionJob, CompactionService, JobOutput};
pub use sst_writer::{sst_get, SstWriter};
pub use table_store::{FsTableStore, Imported, SharedTableStore, StoredFile, TableStore};
pub use write_batch::WriteBatch;
