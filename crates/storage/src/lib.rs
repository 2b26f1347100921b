//! The storage layer: every byte PhoenixKV keeps goes through the [`FileSystem`] trait.
//!
//! This crate owns the contract between the upper layers (`log`, `engine`) and whatever
//! holds the bytes: the local disk ([`LocalFs`]) or, in tests, an in-memory file system
//! ([`MemFs`]) that keeps synced and unsynced bytes apart, can "crash" (lose everything
//! that was never synced, directory changes included) and can fail the Nth operation of
//! a kind with a chosen error; for fault runs of real servers, [`FaultFs`] (writes and
//! syncs fail while a switch is on) and [`PowerLossFs`] (unsynced bytes kept in the
//! process's memory, so killing it is a power loss).
//!
//! Durability contract (the same for every implementation, and what `MemFs` models):
//! 1. Bytes written to a file are durable only after `sync_data`/`sync_all` on that file.
//! 2. A file's *name* (creation, rename, deletion) is durable only after `sync_dir` on its
//!    parent directory. `write_atomic` and `create_dir_all` do their own directory syncs.
//! 3. `sync_data` (`fdatasync`) persists the data and whatever metadata is needed to read
//!    it back (the size, when it grew); it is cheaper than `sync_all` when the size did not
//!    change, which is why log segments are preallocated (seed 002).
//! 4. `write_atomic(path, data)` replaces a small file so that after a crash either the old
//!    or the new content is there, never a mix.
//!
//! Paths are plain `Path`s; implementations keep no notion of a current directory.

#![deny(missing_docs)]

mod error;
mod fault;
mod local;
mod mem;
mod power_loss;
mod util;

use std::path::Path;
use std::sync::Arc;

pub use error::{Error, IoOp, Result};
pub use fault::{DiskFaults, FaultFs};
pub use local::LocalFs;
pub use mem::{FaultKind, MemFs};
pub use power_loss::PowerLossFs;

/// Options for opening a file for writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Open with `O_DIRECT` where supported. The caller must then append only buffers whose
    /// address, length and file offset are multiples of [`DIRECT_IO_ALIGN`].
    pub direct_io: bool,
}

/// Alignment of buffers, lengths and offsets for direct I/O.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A file system holding PhoenixKV's files. Object-safe; shared as `Arc<dyn FileSystem>`.
pub trait FileSystem: Send + Sync + std::fmt::Debug {
    /// Creates `path` (truncating it if it exists) and opens it for appending at offset 0.
    fn create(&self, path: &Path, opts: WriteOptions) -> Result<Box<dyn WritableFile>>;

    /// Opens the existing file `path` for writing starting at byte `offset` (which must be
    /// at most the file's size). Later appends overwrite from there on; bytes past the
    /// write position are left as they are. Used to reuse preallocated log segments.
    fn reopen(&self, path: &Path, offset: u64, opts: WriteOptions)
        -> Result<Box<dyn WritableFile>>;

    /// Opens `path` for random-access reads.
    fn open(&self, path: &Path) -> Result<Arc<dyn ReadableFile>>;

    /// Returns the names (not paths) of the entries of directory `dir`, sorted.
    fn list(&self, dir: &Path) -> Result<Vec<String>>;

    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> Result<bool>;

    /// Size of the file `path` in bytes.
    fn file_size(&self, path: &Path) -> Result<u64>;

    /// Deletes the file `path`. Durable after `sync_dir` of its parent.
    fn delete(&self, path: &Path) -> Result<()>;

    /// Renames `from` to `to`, replacing `to` if it exists. Durable after `sync_dir`.
    fn rename(&self, from: &Path, to: &Path) -> Result<()>;

    /// Creates `dir` and its missing parents, durably.
    fn create_dir_all(&self, dir: &Path) -> Result<()>;

    /// Makes the directory entries of `dir` (creations, renames, deletions) durable.
    fn sync_dir(&self, dir: &Path) -> Result<()>;

    /// Atomically and durably replaces the content of the small file `path` with `data`
    /// (write a temporary file, sync it, rename it over `path`, sync the directory).
    fn write_atomic(&self, path: &Path, data: &[u8]) -> Result<()>;

    /// Reads a whole (small) file.
    fn read_all(&self, path: &Path) -> Result<Vec<u8>> {
        let file = self.open(path)?;
        let len = usize::try_from(file.size()).map_err(|_| Error::TooLarge {
            path: path.to_path_buf(),
        })?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(0, &mut buf)?;
        Ok(buf)
    }

    /// Takes an exclusive lock on `path` (created if missing), so that two processes never
    /// open the same data directory. The lock is held until the guard is dropped.
    fn lock(&self, path: &Path) -> Result<Box<dyn FileLock>>;

    /// Bytes this process may still write on the file system holding `dir` (`statvfs`:
    /// blocks available to unprivileged users times the fragment size). A server refuses
    /// writes while it is under a reserve, before a write can fail for lack of space.
    fn available_space(&self, dir: &Path) -> Result<u64>;
}

/// An open file written by appending. Not shared between threads at once (`&mut self`).
pub trait WritableFile: Send + std::fmt::Debug {
    /// Writes `data` at the current position and advances it.
    fn append(&mut self, data: &[u8]) -> Result<()>;

    /// Makes the written bytes durable (`fdatasync`); see the crate docs, rule 3.
    fn sync_data(&mut self) -> Result<()>;

    /// Makes the written bytes and the file's metadata (size) durable (`fsync`).
    fn sync_all(&mut self) -> Result<()>;

    /// Reserves space so that the file is at least `len` bytes long, zero-filled past the
    /// old end (`fallocate`), and makes the new size durable. Later writes inside the
    /// region need only `sync_data`.
    fn preallocate(&mut self, len: u64) -> Result<()>;

    /// The current write position (bytes from the file's start).
    fn position(&self) -> u64;

    /// The path the file was opened with (for error messages).
    fn path(&self) -> &Path;
}

/// An open file read at arbitrary offsets; shared between threads.
pub trait ReadableFile: Send + Sync + std::fmt::Debug {
    /// Fills `buf` with the bytes at `offset..offset + buf.len()`; reading past the end of
    /// the file is an error of kind `UnexpectedEof`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at EOF).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize>;

    /// The file's size in bytes at the time of the call.
    fn size(&self) -> u64;

    /// Fills each buffer with the bytes at its offset, as
    /// [`ReadableFile::read_exact_at`] does, one after the other; a file whose reads
    /// wait on a remote answer does them at once (seed 004's parallel I/O).
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_exact_at(*offset, buf)?;
        }
        Ok(())
    }

    /// Whether [`ReadableFile::read_many`] does its reads at once, so that a reader
    /// gains by gathering its reads first.
    fn reads_at_once(&self) -> bool {
        false
    }

    /// Whether reading `len` bytes at `offset` waits on a remote store (a local file, or
    /// bytes a local cache holds, do not).
    fn read_waits(&self, _offset: u64, _len: usize) -> bool {
        false
    }

    /// The path the file was opened with (for error messages).
    fn path(&self) -> &Path;
}

/// A held directory lock; released on drop.
pub trait FileLock: Send + Sync + std::fmt::Debug {}

/// A shared file system handle.
pub type SharedFs = Arc<dyn FileSystem>;
