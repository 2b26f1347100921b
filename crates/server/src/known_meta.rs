//! The meta members this node last learned from a meta leader (its heartbeat answers
//! name them): file `<data>/meta-members`, a [`crate::small_file`] holding protobuf
//! `KnownMetaMembers` (format 1; a newer format is refused by name).
//!
//! The meta group's membership changes (a dead member is replaced), so the `--meta` a
//! node was first started with may name none of the members a later start must reach.
//! The heartbeat loop is this file's one writer; the node reads it once, at start, and
//! tries its members before `--meta`'s.

use std::path::Path;

use phoenix_proto::{KnownMetaMembers, Replica};
use prost::Message;

use crate::config::MetaMember;
use crate::error::{Error, Result};

/// File name in the data directory.
pub const FILE: &str = "meta-members";

/// Format this binary writes (and the newest it reads).
pub const FORMAT: u32 = 1;

/// The members the file names (empty if there is none yet).
pub fn load(data_dir: &Path) -> Result<Vec<MetaMember>> {
    let p = data_dir.join(FILE);
    let Some(payload) = crate::small_file::read(&p)? else {
        return Ok(Vec::new());
    };
    let known = KnownMetaMembers::decode(payload.as_slice())
        .map_err(|e| Error::Corruption(format!("{}: cannot decode: {e}", p.display())))?;
    if known.format > FORMAT {
        return Err(Error::Corruption(format!(
            "{}: format {} is newer than this binary's ({FORMAT}); run a newer binary",
            p.display(),
            known.format
        )));
    }
    Ok(known
        .members
        .into_iter()
        .filter(|m| m.node_id != 0 && !m.addr.is_empty())
        .map(|m| MetaMember {
            id: m.node_id,
            addr: m.addr,
        })
        .collect())
}

/// Replaces the file with `members`, durably.
pub fn save(data_dir: &Path, members: &[MetaMember]) -> Result<()> {
    let payload = KnownMetaMembers {
        format: FORMAT,
        members: members
            .iter()
            .map(|m| Replica {
                protocol: 0,
                node_id: m.id,
                addr: m.addr.clone(),
            })
            .collect(),
    }
    .encode_to_vec();
    crate::small_file::write(data_dir, FILE, &payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64) -> MetaMember {
        MetaMember {
            id,
            addr: format!("127.0.0.1:{}", 7000 + id),
        }
    }

    #[test]
    fn members_round_trip_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let members = vec![member(1), member(2), member(4)];
        save(dir.path(), &members).unwrap();
        assert_eq!(load(dir.path()).unwrap(), members);
        save(dir.path(), &members[1..]).unwrap();
        assert_eq!(load(dir.path()).unwrap(), members[1..]);
        // One bit flipped anywhere is a checksum mismatch, reported with the file.
        let p = dir.path().join(FILE);
        let good = std::fs::read(&p).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            std::fs::write(&p, &bad).unwrap();
            let e = load(dir.path()).unwrap_err().to_string();
            assert!(e.contains("meta-members") && e.contains("checksum"), "{e}");
        }
        std::fs::write(&p, [1u8, 2]).unwrap();
        assert!(load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("shorter"));
    }

    #[test]
    fn a_newer_format_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let payload = KnownMetaMembers {
            format: FORMAT + 1,
            members: Vec::new(),
        }
        .encode_to_vec();
        crate::small_file::write(dir.path(), FILE, &payload).unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("format 2 is newer"), "{e}");
    }
}
