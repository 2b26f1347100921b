//! Small node files replaced whole (the registry, the known meta members):
//!
//! ```text
//! file := crc32c(payload): u32 LE ‖ payload
//! ```
//! Written to `<name>.tmp`, fsynced, renamed over `<name>`, then the directory fsynced:
//! a reader finds the old file or the new one, never a mix. A checksum that does not
//! match is reported as corruption, never read past.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// The payload of `path`, checked; None if the file does not exist.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    if bytes.len() < 4 {
        return Err(Error::Corruption(format!(
            "{}: {} bytes, shorter than its checksum",
            path.display(),
            bytes.len()
        )));
    }
    let (crc, payload) = bytes.split_at(4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let got = crc32c::crc32c(payload);
    if want != got {
        return Err(Error::Corruption(format!(
            "{}: checksum mismatch at offset 0 (stored {want:#x}, computed {got:#x})",
            path.display()
        )));
    }
    Ok(Some(payload.to_vec()))
}

/// Replaces `dir/name` with `payload`, durably.
pub fn write(dir: &Path, name: &str, payload: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    f.write_all(&crc32c::crc32c(payload).to_le_bytes())
        .and_then(|()| f.write_all(payload))
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", e))?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| io("renaming", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))?;
    Ok(())
}
