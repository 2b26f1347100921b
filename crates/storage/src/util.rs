//! Helpers shared by the implementations: the `write_atomic` recipe, direct-I/O checks and
//! path arithmetic.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::{Error, FileSystem, Result, WriteOptions, DIRECT_IO_ALIGN};

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `<path>.tmp`: where `write_atomic` stages the new content.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// The `write_atomic` recipe, in terms of the trait's own operations so that `MemFs` can
/// crash or fail between any two of its steps: create `<path>.tmp`, write, `fsync`, rename
/// over `path`, `fsync` the directory. A crash anywhere leaves the old or the new content.
pub(crate) fn write_atomic_via(fs: &dyn FileSystem, path: &Path, data: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let staged = (|| {
        let mut f = fs.create(&tmp, WriteOptions::default())?;
        f.append(data)?;
        f.sync_all()
    })();
    if let Err(e) = staged {
        // Best effort: a leftover temporary is harmless (the next attempt truncates it),
        // and the first error is the one worth reporting.
        let _ = fs.delete(&tmp);
        return Err(e);
    }
    fs.rename(&tmp, path)?;
    fs.sync_dir(parent_dir(path))
}

/// Checks the `O_DIRECT` contract for an append of `data` at file offset `pos`.
pub(crate) fn check_direct_append(path: &Path, data: &[u8], pos: u64) -> Result<()> {
    let align = DIRECT_IO_ALIGN;
    if data.is_empty() {
        // Nothing reaches the device; an empty slice's address is meaningless.
        return Ok(());
    }
    let reason = if !(data.as_ptr() as usize).is_multiple_of(align) {
        Some(format!(
            "direct I/O buffer address {:p} is not aligned to {align}",
            data.as_ptr()
        ))
    } else if !data.len().is_multiple_of(align) {
        Some(format!(
            "direct I/O length {} is not a multiple of {align}",
            data.len()
        ))
    } else if !pos.is_multiple_of(align as u64) {
        Some(format!(
            "direct I/O file offset {pos} is not a multiple of {align}"
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidArgument {
            path: path.to_path_buf(),
            reason,
        }),
        None => Ok(()),
    }
}
