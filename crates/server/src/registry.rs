//! The node's local registry of the replicas it hosts: file `<data>/replicas`.
//!
//! ```text
//! file := crc32c(payload): u32 LE ‖ payload
//! payload := protobuf LocalReplicas
//! ```
//! Replaced atomically (write to `replicas.tmp`, fsync, rename, fsync the directory).

use std::io::Write;
use std::path::{Path, PathBuf};

use phoenix_proto::{LocalReplica, LocalReplicas, Route};
use prost::Message;

use crate::error::{Error, Result};

/// Path of the registry in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("replicas")
}

/// Loads the registry (empty if the file does not exist).
pub fn load(data_dir: &Path) -> Result<Vec<Route>> {
    let p = path(data_dir);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", p.display()), e)),
    };
    if bytes.len() < 4 {
        return Err(Error::Corruption(format!(
            "{}: {} bytes, shorter than its checksum",
            p.display(),
            bytes.len()
        )));
    }
    let (crc, payload) = bytes.split_at(4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let got = crc32c::crc32c(payload);
    if want != got {
        return Err(Error::Corruption(format!(
            "{}: checksum mismatch at offset 0 (stored {want:#x}, computed {got:#x})",
            p.display()
        )));
    }
    let list = LocalReplicas::decode(payload)
        .map_err(|e| Error::Corruption(format!("{}: cannot decode: {e}", p.display())))?;
    Ok(list.replicas.into_iter().filter_map(|r| r.route).collect())
}

/// Saves the registry durably.
pub fn save(data_dir: &Path, routes: &[Route]) -> Result<()> {
    let payload = LocalReplicas {
        replicas: routes
            .iter()
            .map(|r| LocalReplica {
                route: Some(r.clone()),
            })
            .collect(),
    }
    .encode_to_vec();
    let p = path(data_dir);
    let tmp = data_dir.join("replicas.tmp");
    let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    f.write_all(&crc32c::crc32c(&payload).to_le_bytes())
        .and_then(|()| f.write_all(&payload))
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", e))?;
    drop(f);
    std::fs::rename(&tmp, &p).map_err(|e| io("renaming", e))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing {}", data_dir.display()), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let r = Route {
            group_id: 3,
            start_key: b"a".to_vec().into(),
            end_key: b"m".to_vec().into(),
            epoch: 1,
            ..Default::default()
        };
        save(dir.path(), std::slice::from_ref(&r)).unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![r]);
        let p = path(dir.path());
        let mut b = std::fs::read(&p).unwrap();
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(&p, b).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }
}
