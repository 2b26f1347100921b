//! [`FaultFs`]: any [`FileSystem`] whose writes and syncs fail while a switch says so, for
//! fault runs against real processes (a disk that starts returning EIO), and whose
//! available space can be capped (a disk filling up). Reads, listings and locks always
//! pass through.
//!
//! Unlike [`crate::MemFs`]'s faults (the Nth operation of a kind, in a test), these are
//! turned on and off from outside at any moment ([`DiskFaults`]), e.g. by a server's
//! fault-injection service.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::{
    Error, FileLock, FileSystem, IoOp, ReadableFile, Result, SharedFs, WritableFile, WriteOptions,
};

/// The switches of a [`FaultFs`].
#[derive(Debug)]
pub struct DiskFaults {
    writes: AtomicBool,
    syncs: AtomicBool,
    /// The space the file system says is available, at most (`u64::MAX`: the real one).
    space: AtomicU64,
}

impl Default for DiskFaults {
    fn default() -> DiskFaults {
        DiskFaults {
            writes: AtomicBool::new(false),
            syncs: AtomicBool::new(false),
            space: AtomicU64::new(u64::MAX),
        }
    }
}

impl DiskFaults {
    /// Sets whether writes (appends, creations, renames, deletions, preallocation,
    /// atomic writes) and syncs (of files and directories) fail.
    pub fn set(&self, fail_writes: bool, fail_syncs: bool) {
        self.writes.store(fail_writes, Ordering::Release);
        self.syncs.store(fail_syncs, Ordering::Release);
    }

    /// Caps the space [`FileSystem::available_space`] reports (None: the real space), so a
    /// server believes its disk is (nearly) full while writes still work.
    pub fn set_space(&self, space: Option<u64>) {
        self.space
            .store(space.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The cap on the reported space, if any.
    pub fn space(&self) -> Option<u64> {
        match self.space.load(Ordering::Acquire) {
            u64::MAX => None,
            s => Some(s),
        }
    }

    /// (writes fail, syncs fail) now.
    pub fn get(&self) -> (bool, bool) {
        (
            self.writes.load(Ordering::Acquire),
            self.syncs.load(Ordering::Acquire),
        )
    }

    fn check(&self, op: IoOp, path: &Path) -> Result<()> {
        let on = match op {
            IoOp::Sync => self.syncs.load(Ordering::Acquire),
            _ => self.writes.load(Ordering::Acquire),
        };
        if on {
            return Err(Error::Io {
                op,
                path: path.to_path_buf(),
                source: std::io::Error::other("injected disk error (fault injection)"),
            });
        }
        Ok(())
    }
}

/// A file system over `inner` that fails writes and syncs while [`DiskFaults`] says so.
#[derive(Debug)]
pub struct FaultFs {
    inner: SharedFs,
    faults: Arc<DiskFaults>,
}

impl FaultFs {
    /// `inner` behind the switches `faults`.
    pub fn new(inner: SharedFs, faults: Arc<DiskFaults>) -> FaultFs {
        FaultFs { inner, faults }
    }
}

impl FileSystem for FaultFs {
    fn create(&self, path: &Path, opts: WriteOptions) -> Result<Box<dyn WritableFile>> {
        self.faults.check(IoOp::Open, path)?;
        Ok(Box::new(FaultFile {
            inner: self.inner.create(path, opts)?,
            faults: Arc::clone(&self.faults),
        }))
    }

    fn reopen(
        &self,
        path: &Path,
        offset: u64,
        opts: WriteOptions,
    ) -> Result<Box<dyn WritableFile>> {
        self.faults.check(IoOp::Open, path)?;
        Ok(Box::new(FaultFile {
            inner: self.inner.reopen(path, offset, opts)?,
            faults: Arc::clone(&self.faults),
        }))
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn ReadableFile>> {
        self.inner.open(path)
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        self.inner.exists(path)
    }

    fn file_size(&self, path: &Path) -> Result<u64> {
        self.inner.file_size(path)
    }

    fn delete(&self, path: &Path) -> Result<()> {
        self.faults.check(IoOp::Delete, path)?;
        self.inner.delete(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.faults.check(IoOp::Rename, from)?;
        self.inner.rename(from, to)
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        self.faults.check(IoOp::CreateDir, dir)?;
        self.inner.create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.faults.check(IoOp::Sync, dir)?;
        self.inner.sync_dir(dir)
    }

    fn write_atomic(&self, path: &Path, data: &[u8]) -> Result<()> {
        self.faults.check(IoOp::Write, path)?;
        self.faults.check(IoOp::Sync, path)?;
        self.inner.write_atomic(path, data)
    }

    fn lock(&self, path: &Path) -> Result<Box<dyn FileLock>> {
        self.inner.lock(path)
    }

    fn available_space(&self, dir: &Path) -> Result<u64> {
        let real = self.inner.available_space(dir)?;
        Ok(self.faults.space().map_or(real, |s| s.min(real)))
    }
}

#[derive(Debug)]
struct FaultFile {
    inner: Box<dyn WritableFile>,
    faults: Arc<DiskFaults>,
}

impl WritableFile for FaultFile {
    fn append(&mut self, data: &[u8]) -> Result<()> {
        self.faults.check(IoOp::Write, self.inner.path())?;
        self.inner.append(data)
    }

    fn sync_data(&mut self) -> Result<()> {
        self.faults.check(IoOp::Sync, self.inner.path())?;
        self.inner.sync_data()
    }

    fn sync_all(&mut self) -> Result<()> {
        self.faults.check(IoOp::Sync, self.inner.path())?;
        self.inner.sync_all()
    }

    fn preallocate(&mut self, len: u64) -> Result<()> {
        // It makes the new size durable: a sync as well as a write.
        self.faults.check(IoOp::Preallocate, self.inner.path())?;
        self.faults.check(IoOp::Sync, self.inner.path())?;
        self.inner.preallocate(len)
    }

    fn position(&self) -> u64 {
        self.inner.position()
    }

    fn path(&self) -> &Path {
        self.inner.path()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::MemFs;

    #[test]
    fn writes_and_syncs_fail_while_switched_on_and_reads_pass() {
        let faults = Arc::new(DiskFaults::default());
        let fs = FaultFs::new(Arc::new(MemFs::new()), Arc::clone(&faults));
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let p = dir.join("f");
        let mut f = fs.create(&p, WriteOptions::default()).unwrap();
        f.append(b"abc").unwrap();
        f.sync_data().unwrap();

        faults.set(false, true);
        let e = f.sync_data().unwrap_err();
        assert!(e.to_string().contains("injected disk error"), "{e}");
        assert!(fs.sync_dir(dir).is_err());
        f.append(b"d").unwrap();

        faults.set(true, false);
        assert!(f.append(b"e").is_err());
        assert!(fs.create(&dir.join("g"), WriteOptions::default()).is_err());
        assert!(fs.rename(&p, &dir.join("h")).is_err());
        assert!(fs.delete(&p).is_err());
        // Reads still work.
        assert_eq!(fs.read_all(&p).unwrap(), b"abcd");
        assert_eq!(faults.get(), (true, false));

        faults.set(false, false);
        f.append(b"e").unwrap();
        f.sync_data().unwrap();
        assert_eq!(fs.read_all(&p).unwrap(), b"abcde");
    }

    #[test]
    fn the_space_cap_lowers_the_reported_space_and_writes_still_work() {
        let faults = Arc::new(DiskFaults::default());
        let fs = FaultFs::new(Arc::new(crate::LocalFs::new()), Arc::clone(&faults));
        let dir = tempfile::tempdir().unwrap();
        let real = fs.available_space(dir.path()).unwrap();
        assert!(real > 0 && real < u64::MAX, "{real}");
        faults.set_space(Some(1000));
        assert_eq!(faults.space(), Some(1000));
        assert_eq!(fs.available_space(dir.path()).unwrap(), 1000.min(real));
        let mut f = fs
            .create(&dir.path().join("f"), WriteOptions::default())
            .unwrap();
        f.append(&[7u8; 4096]).unwrap();
        f.sync_data().unwrap();
        faults.set_space(None);
        assert_eq!(faults.space(), None);
        let back = fs.available_space(dir.path()).unwrap();
        assert!(back > 1000 || real <= 1000, "{back}");
        let e = fs
            .available_space(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("stat") && e.contains("missing"), "{e}");
    }
}
