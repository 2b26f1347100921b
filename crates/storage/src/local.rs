//! [`LocalFs`]: the [`FileSystem`] on the local disk, through `std::fs` and a few `libc`
//! calls (`fallocate`, `O_DIRECT`).
//!
//! The mapping onto POSIX calls is documented on [`LocalFs`].

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::util::{check_direct_append, parent_dir, write_atomic_via};
use crate::{Error, FileLock, FileSystem, IoOp, ReadableFile, Result, WritableFile, WriteOptions};

/// The local disk. Stateless; cheap to create and clone.
///
/// Mapping of the trait onto POSIX:
/// - `create`/`reopen` open a descriptor and write with `pwrite` at a position the writer
///   tracks itself, so `reopen` can overwrite a preallocated segment from any offset.
/// - `sync_data` = `fdatasync`, `sync_all` = `fsync`, `sync_dir` = `fsync` of the directory.
/// - `preallocate(len)` = `fallocate(fd, 0, 0, len)` (extends the size, zero-filled), falling
///   back to writing zeros where the file system does not support it, then `fsync` so the
///   new size is durable.
/// - `direct_io` opens with `O_DIRECT`; every append must then be aligned to
///   [`DIRECT_IO_ALIGN`](crate::DIRECT_IO_ALIGN) in address, length and offset, or it fails with
///   [`Error::InvalidArgument`] before touching the file.
/// - `create_dir_all` fsyncs the parent of every directory it creates; `write_atomic`
///   writes `<path>.tmp`, fsyncs it, renames it over `path` and fsyncs the directory.
/// - `lock` takes an exclusive `flock` (`File::try_lock`) and also refuses a second lock on
///   the same file from this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFs;

impl LocalFs {
    /// A handle on the local file system.
    pub fn new() -> Self {
        LocalFs
    }

    /// Opens `path` for writing, with `O_DIRECT` if asked.
    fn open_for_write(path: &Path, opts: WriteOptions, truncate: bool) -> Result<File> {
        let mut oo = OpenOptions::new();
        oo.write(true);
        if truncate {
            oo.create(true).truncate(true);
        }
        if opts.direct_io {
            oo.custom_flags(libc::O_DIRECT);
        }
        oo.open(path).map_err(|e| {
            let e = if opts.direct_io && e.raw_os_error() == Some(libc::EINVAL) {
                // tmpfs and some others refuse O_DIRECT at open time with EINVAL.
                io::Error::new(
                    e.kind(),
                    format!("the file system refuses O_DIRECT (direct I/O): {e}"),
                )
            } else {
                e
            };
            Error::io(IoOp::Open, path, e)
        })
    }
}

/// Paths this process holds a [`LocalFs::lock`] on (canonical form). `flock` alone would
/// already refuse a second descriptor, but the set makes the rule explicit and portable.
fn held_locks() -> &'static Mutex<HashSet<PathBuf>> {
    static HELD: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(HashSet::new()))
}

impl FileSystem for LocalFs {
    fn create(&self, path: &Path, opts: WriteOptions) -> Result<Box<dyn WritableFile>> {
        let file = Self::open_for_write(path, opts, true)?;
        Ok(Box::new(LocalWritable {
            file,
            path: path.to_path_buf(),
            pos: 0,
            direct_io: opts.direct_io,
        }))
    }

    fn reopen(
        &self,
        path: &Path,
        offset: u64,
        opts: WriteOptions,
    ) -> Result<Box<dyn WritableFile>> {
        let file = Self::open_for_write(path, opts, false)?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(IoOp::Stat, path, e))?
            .len();
        if offset > size {
            return Err(Error::InvalidArgument {
                path: path.to_path_buf(),
                reason: format!("reopen at offset {offset} past the end of the file ({size})"),
            });
        }
        Ok(Box::new(LocalWritable {
            file,
            path: path.to_path_buf(),
            pos: offset,
            direct_io: opts.direct_io,
        }))
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn ReadableFile>> {
        let file = File::open(path).map_err(|e| Error::io(IoOp::Open, path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(IoOp::Stat, path, e))?;
        if meta.is_dir() {
            return Err(Error::io(
                IoOp::Open,
                path,
                io::Error::new(io::ErrorKind::IsADirectory, "is a directory"),
            ));
        }
        Ok(Arc::new(LocalReadable {
            file,
            path: path.to_path_buf(),
        }))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        let rd = fs::read_dir(dir).map_err(|e| Error::io(IoOp::List, dir, e))?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(IoOp::List, dir, e))?;
            let name = entry.file_name().into_string().map_err(|raw| {
                Error::io(
                    IoOp::List,
                    dir,
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("entry name is not UTF-8: {raw:?}"),
                    ),
                )
            })?;
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        match fs::metadata(path) {
            Ok(_) => Ok(true),
            // A missing parent or a file used as a directory: the path names nothing.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(Error::io(IoOp::Stat, path, e)),
        }
    }

    fn file_size(&self, path: &Path) -> Result<u64> {
        let meta = fs::metadata(path).map_err(|e| Error::io(IoOp::Stat, path, e))?;
        if meta.is_dir() {
            return Err(Error::io(
                IoOp::Stat,
                path,
                io::Error::new(io::ErrorKind::IsADirectory, "is a directory"),
            ));
        }
        Ok(meta.len())
    }

    fn delete(&self, path: &Path) -> Result<()> {
        fs::remove_file(path).map_err(|e| Error::io(IoOp::Delete, path, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        fs::rename(from, to).map_err(|e| {
            Error::io(
                IoOp::Rename,
                from,
                io::Error::new(e.kind(), format!("to {}: {e}", to.display())),
            )
        })
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        // Find the missing ancestors, then create them top-down, each followed by an fsync
        // of its parent so the new entry is durable before anything is put inside it.
        let mut missing = Vec::new();
        let mut cur = dir;
        loop {
            match fs::metadata(cur) {
                Ok(meta) if meta.is_dir() => break,
                Ok(_) => {
                    return Err(Error::io(
                        IoOp::CreateDir,
                        cur,
                        io::Error::new(
                            io::ErrorKind::NotADirectory,
                            "exists and is not a directory",
                        ),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing.push(cur);
                    match cur.parent() {
                        Some(p) if !p.as_os_str().is_empty() => cur = p,
                        _ => break,
                    }
                }
                Err(e) => return Err(Error::io(IoOp::Stat, cur, e)),
            }
        }
        for d in missing.into_iter().rev() {
            match fs::create_dir(d) {
                Ok(()) => {}
                // Someone else created it meanwhile; its parent sync is still ours to do.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
                Err(e) => return Err(Error::io(IoOp::CreateDir, d, e)),
            }
            self.sync_dir(parent_dir(d))?;
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        // O_DIRECTORY: syncing a file by mistake must fail, not silently succeed.
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| Error::io(IoOp::Sync, dir, e))?;
        f.sync_all().map_err(|e| Error::io(IoOp::Sync, dir, e))
    }

    fn write_atomic(&self, path: &Path, data: &[u8]) -> Result<()> {
        write_atomic_via(self, path, data)
    }

    fn available_space(&self, dir: &Path) -> Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
            Error::InvalidArgument {
                path: dir.to_path_buf(),
                reason: "the path holds a NUL byte".into(),
            }
        })?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: `c` is a NUL-terminated path that outlives the call, and `st` points to
        // memory for one `statvfs`, which the call fills on success.
        let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::io(IoOp::Stat, dir, io::Error::last_os_error()));
        }
        // SAFETY: the call succeeded, so it wrote the whole structure (which was zeroed
        // before in any case).
        let st = unsafe { st.assume_init() };
        #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }

    fn lock(&self, path: &Path) -> Result<Box<dyn FileLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(IoOp::Lock, path, e))?;
        let key = fs::canonicalize(path).map_err(|e| Error::io(IoOp::Lock, path, e))?;
        {
            let mut held = held_locks().lock();
            if held.contains(&key) {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                });
            }
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(Error::Locked {
                        path: path.to_path_buf(),
                    })
                }
                Err(fs::TryLockError::Error(e)) => return Err(Error::io(IoOp::Lock, path, e)),
            }
            held.insert(key.clone());
        }
        Ok(Box::new(LocalLock { file, key }))
    }
}

/// A file opened for writing at a tracked position.
#[derive(Debug)]
struct LocalWritable {
    file: File,
    path: PathBuf,
    pos: u64,
    direct_io: bool,
}

impl WritableFile for LocalWritable {
    fn append(&mut self, data: &[u8]) -> Result<()> {
        if self.direct_io {
            check_direct_append(&self.path, data, self.pos)?;
        }
        let len = data.len() as u64;
        let end = self
            .pos
            .checked_add(len)
            .ok_or_else(|| Error::InvalidArgument {
                path: self.path.clone(),
                reason: format!("append of {len} bytes at {} overflows u64", self.pos),
            })?;
        self.file.write_all_at(data, self.pos).map_err(|e| {
            Error::io(
                IoOp::Write,
                &self.path,
                io::Error::new(e.kind(), format!("at offset {}: {e}", self.pos)),
            )
        })?;
        self.pos = end;
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(IoOp::Sync, &self.path, e))
    }

    fn sync_all(&mut self) -> Result<()> {
        self.file
            .sync_all()
            .map_err(|e| Error::io(IoOp::Sync, &self.path, e))
    }

    fn preallocate(&mut self, len: u64) -> Result<()> {
        let off_len = libc::off_t::try_from(len).map_err(|_| Error::InvalidArgument {
            path: self.path.clone(),
            reason: format!("preallocate length {len} does not fit off_t"),
        })?;
        // fallocate refuses a zero length (EINVAL); there is nothing to reserve then.
        if len > 0 {
            self.fallocate(off_len, len)?;
        }
        // fallocate changes the size (metadata): only fsync makes it durable.
        self.file
            .sync_all()
            .map_err(|e| Error::io(IoOp::Preallocate, &self.path, e))
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl LocalWritable {
    /// `fallocate(fd, 0, 0, len)`, retried on EINTR, falling back to writing zeros where
    /// the file system does not support it.
    fn fallocate(&self, off_len: libc::off_t, len: u64) -> Result<()> {
        let fd = self.file.as_raw_fd();
        loop {
            // SAFETY: `fd` is a valid descriptor owned by `self.file` for the whole call;
            // fallocate reads no memory of ours.
            let rc = unsafe { libc::fallocate(fd, 0, 0, off_len) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) => return self.preallocate_by_writing(len),
                _ => return Err(Error::io(IoOp::Preallocate, &self.path, err)),
            }
        }
    }

    /// Fallback of `preallocate` where `fallocate` is unsupported: write zeros from the
    /// current end to `len`. Uses a buffered (non-direct) descriptor so that `O_DIRECT`
    /// alignment rules do not apply to the zero fill.
    fn preallocate_by_writing(&self, len: u64) -> Result<()> {
        let size = self
            .file
            .metadata()
            .map_err(|e| Error::io(IoOp::Preallocate, &self.path, e))?
            .len();
        if size >= len {
            return Ok(());
        }
        let f = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .map_err(|e| Error::io(IoOp::Preallocate, &self.path, e))?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
        let mut off = size;
        while off < len {
            let n = (len - off).min(CHUNK);
            // `n <= CHUNK`, which fits usize.
            let chunk = zeros.get(..n as usize).unwrap_or(&zeros);
            f.write_all_at(chunk, off)
                .map_err(|e| Error::io(IoOp::Preallocate, &self.path, e))?;
            off += n;
        }
        f.sync_all()
            .map_err(|e| Error::io(IoOp::Preallocate, &self.path, e))
    }
}

/// A file opened for positional reads.
#[derive(Debug)]
struct LocalReadable {
    file: File,
    path: PathBuf,
}

impl ReadableFile for LocalReadable {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        // pread refuses offsets past i64::MAX with EINVAL; no file is that long, so such
        // a read is past the end like any other.
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > i64::MAX as u64) {
            return Err(Error::io(
                IoOp::Read,
                &self.path,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes at offset {offset}: past the end of the file",
                        buf.len()
                    ),
                ),
            ));
        }
        self.file.read_exact_at(buf, offset).map_err(|e| {
            Error::io(
                IoOp::Read,
                &self.path,
                io::Error::new(
                    e.kind(),
                    format!("{} bytes at offset {offset}: {e}", buf.len()),
                ),
            )
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset > i64::MAX as u64 {
            return Ok(0);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let Some(rest) = buf.get_mut(done..) else {
                break;
            };
            match self.file.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::io(
                        IoOp::Read,
                        &self.path,
                        io::Error::new(e.kind(), format!("at offset {offset}: {e}")),
                    ))
                }
            }
        }
        Ok(done)
    }

    fn size(&self) -> u64 {
        // fstat on an open descriptor fails only on a broken kernel or descriptor; 0 then
        // makes every later read report UnexpectedEof instead of inventing data.
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// An exclusive `flock` on a lock file; released (and forgotten by this process) on drop.
#[derive(Debug)]
struct LocalLock {
    file: File,
    key: PathBuf,
}

impl FileLock for LocalLock {}

impl Drop for LocalLock {
    fn drop(&mut self) {
        // Unlock before forgetting the key so that a racing `lock` in this process cannot
        // pass the set and then fail on the still-held flock.
        let _ = self.file.unlock();
        held_locks().lock().remove(&self.key);
    }
}
