//! [`PowerLossFs`]: any [`FileSystem`] whose files hold, on the inner file system, only
//! what was synced; every byte appended since a file's last sync lives in this process's
//! memory. Killing the process is then a power loss for file contents: the bytes the
//! process never synced are gone, as they would be from a disk's volatile cache, whereas
//! over a plain local disk a killed process's writes survive in the OS page cache. The
//! process itself reads its files whole (synced bytes from the inner file, the rest from
//! memory), so it behaves as over the inner file system until it dies.
//!
//! Only file contents are modelled: creations, renames and deletions reach the inner
//! file system at once (a real power loss can also undo those until their directory is
//! synced; [`crate::MemFs`] models that, in tests).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{
    Error, FileLock, FileSystem, IoOp, ReadableFile, Result, SharedFs, WritableFile, WriteOptions,
};

/// The unsynced tail of one file: bytes `[base, base + buf.len())`, not yet on the inner
/// file system. Invariant: the inner file holds (synced) everything below `base`.
#[derive(Debug, Default)]
struct Tail {
    base: u64,
    buf: Vec<u8>,
}

impl Tail {
    fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }
}

type Tails = Mutex<HashMap<PathBuf, Arc<Mutex<Tail>>>>;

/// A file system over `inner` that keeps unsynced bytes in memory (see the module doc).
#[derive(Debug)]
pub struct PowerLossFs {
    inner: SharedFs,
    tails: Arc<Tails>,
}

impl PowerLossFs {
    /// `inner`, with unsynced bytes kept in memory.
    pub fn new(inner: SharedFs) -> PowerLossFs {
        PowerLossFs {
            inner,
            tails: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn writable(&self, path: &Path, inner: Box<dyn WritableFile>) -> Box<dyn WritableFile> {
        let tail = Arc::new(Mutex::new(Tail {
            base: inner.position(),
            buf: Vec::new(),
        }));
        self.tails
            .lock()
            .insert(path.to_path_buf(), Arc::clone(&tail));
        Box::new(TailWritable {
            inner,
            tail,
            tails: Arc::clone(&self.tails),
            path: path.to_path_buf(),
            failed: false,
        })
    }
}

/// Buffers are plain `Vec`s: direct I/O (aligned buffers) is not offered.
fn buffered(_opts: WriteOptions) -> WriteOptions {
    WriteOptions { direct_io: false }
}

impl FileSystem for PowerLossFs {
    fn create(&self, path: &Path, opts: WriteOptions) -> Result<Box<dyn WritableFile>> {
        let inner = self.inner.create(path, buffered(opts))?;
        Ok(self.writable(path, inner))
    }

    fn reopen(
        &self,
        path: &Path,
        offset: u64,
        opts: WriteOptions,
    ) -> Result<Box<dyn WritableFile>> {
        let end = self.file_size(path)?;
        if offset > end {
            return Err(Error::InvalidArgument {
                path: path.to_path_buf(),
                reason: format!("reopen at offset {offset} past the end of the file ({end})"),
            });
        }
        // What is still unsynced at or below `offset` must reach the inner file first
        // (the reopened writer's syncs cover only what it writes itself).
        let tail = self.tails.lock().get(path).cloned();
        if let Some(t) = tail {
            if !t.lock().buf.is_empty() {
                return Err(Error::InvalidArgument {
                    path: path.to_path_buf(),
                    reason: "reopened while unsynced bytes of an earlier writer remain".into(),
                });
            }
        }
        let inner = self.inner.reopen(path, offset, buffered(opts))?;
        Ok(self.writable(path, inner))
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn ReadableFile>> {
        Ok(Arc::new(TailReadable {
            inner: self.inner.open(path)?,
            tails: Arc::clone(&self.tails),
            path: path.to_path_buf(),
        }))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        self.inner.exists(path)
    }

    fn file_size(&self, path: &Path) -> Result<u64> {
        let size = self.inner.file_size(path)?;
        // (The map's lock is not held while a tail's is taken.)
        let tail = self.tails.lock().get(path).cloned();
        let tail_end = tail.map(|t| t.lock().end());
        Ok(size.max(tail_end.unwrap_or(0)))
    }

    fn delete(&self, path: &Path) -> Result<()> {
        self.inner.delete(path)?;
        self.tails.lock().remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.rename(from, to)?;
        let mut tails = self.tails.lock();
        tails.remove(to);
        if let Some(t) = tails.remove(from) {
            tails.insert(to.to_path_buf(), t);
        }
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.inner.sync_dir(dir)
    }

    fn write_atomic(&self, path: &Path, data: &[u8]) -> Result<()> {
        // Synced before it returns: nothing to keep in memory.
        self.inner.write_atomic(path, data)?;
        self.tails.lock().remove(path);
        Ok(())
    }

    fn lock(&self, path: &Path) -> Result<Box<dyn FileLock>> {
        self.inner.lock(path)
    }

    fn available_space(&self, dir: &Path) -> Result<u64> {
        self.inner.available_space(dir)
    }
}

#[derive(Debug)]
struct TailWritable {
    inner: Box<dyn WritableFile>,
    tail: Arc<Mutex<Tail>>,
    /// The file system's map, to forget the tail once this writer is gone and nothing
    /// is left unsynced.
    tails: Arc<Tails>,
    path: PathBuf,
    /// Set by a failed flush: a retry could write part of the tail twice over, so
    /// nothing more is accepted (as after any failed sync).
    failed: bool,
}

impl TailWritable {
    fn check(&self) -> Result<()> {
        if self.failed {
            return Err(Error::Io {
                op: IoOp::Write,
                path: self.path.clone(),
                source: std::io::Error::other("an earlier sync of this file failed"),
            });
        }
        Ok(())
    }

    /// Moves the unsynced bytes to the inner file and syncs it with `sync`. Readers go on
    /// meanwhile: the memory copy still covers those bytes until they are synced.
    fn flush(&mut self, sync: fn(&mut dyn WritableFile) -> Result<()>) -> Result<()> {
        self.check()?;
        // Only this writer appends, and it is here: the tail cannot grow meanwhile.
        let bytes = {
            let t = self.tail.lock();
            debug_assert_eq!(
                t.base,
                self.inner.position(),
                "inner file ahead of the tail"
            );
            t.buf.clone()
        };
        let mut done = Ok(());
        if !bytes.is_empty() {
            done = self.inner.append(&bytes);
        }
        if done.is_ok() {
            done = sync(self.inner.as_mut());
        }
        if let Err(e) = done {
            // What reached the inner file stays there (the inner file cannot be cut
            // back): after a failed sync the bytes may survive a power loss or not, as
            // on a real disk, and the process must not count on either (the log store
            // and the engine stop writing after a failed sync).
            self.failed = true;
            return Err(e);
        }
        let mut t = self.tail.lock();
        t.base = self.inner.position();
        // A new buffer: `clear` would keep the whole file's worth of capacity.
        t.buf = Vec::new();
        Ok(())
    }
}

impl Drop for TailWritable {
    fn drop(&mut self) {
        // Unsynced bytes stay readable (and are lost with the process); a fully synced
        // file needs no tail.
        let mut tails = self.tails.lock();
        let forget = tails
            .get(&self.path)
            .is_some_and(|t| Arc::ptr_eq(t, &self.tail) && self.tail.lock().buf.is_empty());
        if forget {
            tails.remove(&self.path);
        }
    }
}

impl WritableFile for TailWritable {
    fn append(&mut self, data: &[u8]) -> Result<()> {
        self.check()?;
        self.tail.lock().buf.extend_from_slice(data);
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        self.flush(|f| f.sync_data())
    }

    fn sync_all(&mut self) -> Result<()> {
        self.flush(|f| f.sync_all())
    }

    fn preallocate(&mut self, len: u64) -> Result<()> {
        // Zeros past the synced bytes, on the inner file; the tail still overlays them.
        self.inner.preallocate(len)
    }

    fn position(&self) -> u64 {
        self.tail.lock().end()
    }

    fn path(&self) -> &Path {
        self.inner.path()
    }
}

#[derive(Debug)]
struct TailReadable {
    inner: Arc<dyn ReadableFile>,
    tails: Arc<Tails>,
    path: PathBuf,
}

impl TailReadable {
    fn tail(&self) -> Option<Arc<Mutex<Tail>>> {
        self.tails.lock().get(&self.path).cloned()
    }
}

impl ReadableFile for TailReadable {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let n = self.read_at(offset, buf)?;
        if n < buf.len() {
            return Err(Error::Io {
                op: IoOp::Read,
                path: self.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at {offset}: only {n} before the end",
                        buf.len()
                    ),
                ),
            });
        }
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let Some(tail) = self.tail() else {
            return self.inner.read_at(offset, buf);
        };
        // Held across both reads: a sync moving the tail to the inner file waits.
        let t = tail.lock();
        let mut n = 0;
        // The inner file as far as it goes (it may end before the request does).
        while n < buf.len() {
            let got = self.inner.read_at(offset + n as u64, &mut buf[n..])?;
            if got == 0 {
                break;
            }
            n += got;
        }
        let end = offset + buf.len() as u64;
        let (lo, hi) = (offset.max(t.base), end.min(t.end()));
        if lo < hi {
            let src = &t.buf[(lo - t.base) as usize..(hi - t.base) as usize];
            buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(src);
            n = n.max((hi - offset) as usize);
        }
        Ok(n)
    }

    fn size(&self) -> u64 {
        let tail_end = self.tail().map(|t| t.lock().end()).unwrap_or(0);
        self.inner.size().max(tail_end)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::LocalFs;

    /// What the process sees while it runs, and what a "power loss" (a new file system
    /// over the same directory, the memory gone) leaves: exactly the synced bytes.
    #[test]
    fn unsynced_bytes_are_read_back_and_lost_with_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let fs = PowerLossFs::new(Arc::new(LocalFs::new()));
        let mut f = fs.create(&p, WriteOptions::default()).unwrap();
        f.append(b"synced").unwrap();
        f.sync_data().unwrap();
        f.append(b"+tail").unwrap();
        assert_eq!(f.position(), 11);
        assert_eq!(fs.read_all(&p).unwrap(), b"synced+tail");
        assert_eq!(fs.file_size(&p).unwrap(), 11);
        let r = fs.open(&p).unwrap();
        let mut b = [0u8; 4];
        r.read_exact_at(5, &mut b).unwrap();
        assert_eq!(&b, b"d+ta");
        assert!(r.read_exact_at(9, &mut b).is_err());
        // Power loss: the memory is gone, the disk keeps what was synced.
        drop(f);
        drop(fs);
        let after = PowerLossFs::new(Arc::new(LocalFs::new()));
        assert_eq!(after.read_all(&p).unwrap(), b"synced");
    }

    /// A writer dropped with everything synced leaves no tail behind (memory stays
    /// bounded by what is unsynced); one dropped with unsynced bytes keeps them readable.
    #[test]
    fn tails_are_kept_only_while_something_is_unsynced() {
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerLossFs::new(Arc::new(LocalFs::new()));
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let mut f = fs.create(&a, WriteOptions::default()).unwrap();
        f.append(b"xyz").unwrap();
        f.sync_all().unwrap();
        drop(f);
        let mut g = fs.create(&b, WriteOptions::default()).unwrap();
        g.append(b"unsynced").unwrap();
        drop(g);
        let tails = fs.tails.lock();
        assert!(!tails.contains_key(&a));
        assert!(tails.contains_key(&b));
        drop(tails);
        assert_eq!(fs.read_all(&a).unwrap(), b"xyz");
        assert_eq!(fs.read_all(&b).unwrap(), b"unsynced");
    }

    /// After a failed sync the writer takes nothing more (a retry could write part of
    /// the tail twice over), even once the disk works again; what was synced before
    /// stays readable.
    #[test]
    fn a_failed_sync_latches_the_writer() {
        use crate::{DiskFaults, FaultFs};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let faults = Arc::new(DiskFaults::default());
        let inner = Arc::new(FaultFs::new(Arc::new(LocalFs::new()), Arc::clone(&faults)));
        let fs = PowerLossFs::new(inner);
        let mut f = fs.create(&p, WriteOptions::default()).unwrap();
        f.append(b"kept").unwrap();
        f.sync_data().unwrap();
        f.append(b"+lost?").unwrap();
        faults.set(false, true);
        assert!(f.sync_data().is_err());
        faults.set(false, false);
        assert!(f.append(b"more").is_err(), "append after a failed sync");
        assert!(f.sync_data().is_err(), "sync after a failed sync");
        assert!(f.sync_all().is_err());
        assert!(fs.read_all(&p).unwrap().starts_with(b"kept"));
    }

    /// A preallocated, reopened file: the tail overlays the zeros past the synced bytes,
    /// and reads beyond the tail see the inner file's bytes.
    #[test]
    fn tail_overlays_a_preallocated_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let fs = PowerLossFs::new(Arc::new(LocalFs::new()));
        let mut f = fs.create(&p, WriteOptions::default()).unwrap();
        f.preallocate(16).unwrap();
        f.append(b"abcd").unwrap();
        f.sync_data().unwrap();
        f.append(b"ef").unwrap();
        let mut all = vec![0xffu8; 16];
        fs.open(&p).unwrap().read_exact_at(0, &mut all).unwrap();
        assert_eq!(&all[..6], b"abcdef");
        assert!(all[6..].iter().all(|&b| b == 0));
        drop(f);
        // Renamed, the tail goes with the file; deleted, it goes.
        let q = dir.path().join("seg2");
        fs.rename(&p, &q).unwrap();
        assert_eq!(&fs.read_all(&q).unwrap()[..6], b"abcdef");
        fs.delete(&q).unwrap();
        assert!(!fs.exists(&q).unwrap());
    }
}
