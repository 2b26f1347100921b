//! The node's local registry of the replicas it hosts, and of those it hosted
//! (tombstones): file `<data>/replicas`.
//!
//! ```text
//! file := crc32c(payload): u32 LE ‖ payload
//! payload := protobuf LocalReplicas (format 1; 0 from binaries that predate tombstones)
//! ```
//! Replaced atomically (write to `replicas.tmp`, fsync, rename, fsync the directory).
//! [`Registry`] is the node's one copy of it and its one writer.
//!
//! A removed replica leaves a tombstone: its last term and vote, so a replica created
//! here again never votes twice in a term; the membership version that left it out,
//! so an older route does not create it again; and, until its data is gone, that it
//! is being dropped (redone at every start).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use phoenix_proto::{LocalReplica, LocalReplicas, ReplicaTombstone, Route};
use prost::Message;

use crate::error::{Error, Result};

/// The registry as the node holds it: every replica the file names, or may name after a
/// write that failed part way (the rename may have happened). Every write names all of
/// them, so the file never loses a replica it named while the node runs: a creation
/// cut short after its registry write is opened by the next start, or created when the
/// meta service asks again, whatever was asked in between.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    routes: BTreeMap<u64, Route>,
    tombstones: BTreeMap<u64, ReplicaTombstone>,
}

/// Format of the file this binary writes (and the newest it reads).
pub const FORMAT: u32 = 1;

impl Registry {
    /// Loads the registry of `data_dir` (empty if there is none yet).
    pub fn open(data_dir: &Path) -> Result<Registry> {
        let mut routes: BTreeMap<u64, Route> = BTreeMap::new();
        let file = load_file(data_dir)?;
        let tombstones = file
            .tombstones
            .into_iter()
            .map(|t| (t.group_id, t))
            .collect();
        for r in file.replicas.into_iter().filter_map(|r| r.route) {
            // No writer names a group twice; were one to, its newest route holds.
            match routes.get(&r.group_id) {
                Some(old) if old.epoch > r.epoch => {}
                _ => {
                    routes.insert(r.group_id, r);
                }
            }
        }
        Ok(Registry {
            dir: data_dir.to_path_buf(),
            routes,
            tombstones,
        })
    }

    /// The replicas named, by group.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.values()
    }

    /// Whether group `g` is named.
    pub fn contains(&self, g: u64) -> bool {
        self.routes.contains_key(&g)
    }

    /// Names `new` as well, durably, in one write (a route replaces the one of its group).
    /// On an error they stay named here, as the file may name them: the next write
    /// names them for sure.
    pub fn add(&mut self, new: &[Route]) -> Result<()> {
        for r in new {
            self.routes.insert(r.group_id, r.clone());
        }
        self.save()
    }

    /// The tombstone of group `g`, if it was hosted here and removed.
    pub fn tombstone(&self, g: u64) -> Option<&ReplicaTombstone> {
        self.tombstones.get(&g)
    }

    /// The groups whose data is still to be dropped.
    pub fn dropping(&self) -> Vec<u64> {
        self.tombstones
            .values()
            .filter(|t| t.dropping)
            .map(|t| t.group_id)
            .collect()
    }

    /// Removes the replica of `tomb.group_id`, durably: from now on the file names its
    /// tombstone (`dropping` set) instead. On an error nothing changes here (the file
    /// may or may not say it): the caller must not drop the data, and may try again.
    pub fn remove(&mut self, tomb: ReplicaTombstone) -> Result<()> {
        let g = tomb.group_id;
        debug_assert!(tomb.dropping);
        let old_route = self.routes.remove(&g);
        let old_tomb = self.tombstones.insert(g, tomb);
        let saved = self.save();
        if saved.is_err() {
            // Either way the file says is safe: with the replica, its data is whole;
            // as a tombstone, the next start drops it.
            if let Some(r) = old_route {
                self.routes.insert(g, r);
            }
            match old_tomb {
                Some(t) => self.tombstones.insert(g, t),
                None => self.tombstones.remove(&g),
            };
        }
        saved
    }

    /// Records that the data of `groups` is gone (their tombstones stay). An error
    /// leaves them marked dropping in the file: the next start drops them again,
    /// which finds nothing left.
    pub fn dropped(&mut self, groups: &[u64]) -> Result<()> {
        for g in groups {
            if let Some(t) = self.tombstones.get_mut(g) {
                t.dropping = false;
            }
        }
        self.save()
    }

    fn save(&self) -> Result<()> {
        let all: Vec<Route> = self.routes.values().cloned().collect();
        let tombs: Vec<ReplicaTombstone> = self.tombstones.values().cloned().collect();
        save_with(&self.dir, &all, &tombs)
    }
}

/// Path of the registry in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("replicas")
}

/// Loads the routes of the replicas the registry names (empty if the file does not
/// exist).
pub fn load(data_dir: &Path) -> Result<Vec<Route>> {
    Ok(load_file(data_dir)?
        .replicas
        .into_iter()
        .filter_map(|r| r.route)
        .collect())
}

/// Loads the tombstones the registry holds.
pub fn load_tombstones(data_dir: &Path) -> Result<Vec<ReplicaTombstone>> {
    Ok(load_file(data_dir)?.tombstones)
}

fn load_file(data_dir: &Path) -> Result<LocalReplicas> {
    let p = path(data_dir);
    let Some(payload) = crate::small_file::read(&p)? else {
        return Ok(LocalReplicas::default());
    };
    let list = LocalReplicas::decode(payload.as_slice())
        .map_err(|e| Error::Corruption(format!("{}: cannot decode: {e}", p.display())))?;
    if list.format > FORMAT {
        return Err(Error::Corruption(format!(
            "{}: format {} is newer than this binary's ({FORMAT}); run a newer binary",
            p.display(),
            list.format
        )));
    }
    Ok(list)
}

/// Saves a registry of `routes` (and no tombstone) durably.
pub fn save(data_dir: &Path, routes: &[Route]) -> Result<()> {
    save_with(data_dir, routes, &[])
}

fn save_with(data_dir: &Path, routes: &[Route], tombstones: &[ReplicaTombstone]) -> Result<()> {
    let payload = LocalReplicas {
        replicas: routes
            .iter()
            .map(|r| LocalReplica {
                route: Some(r.clone()),
            })
            .collect(),
        format: FORMAT,
        tombstones: tombstones.to_vec(),
    }
    .encode_to_vec();
    crate::small_file::write(data_dir, "replicas", &payload)
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

    fn route(g: u64) -> Route {
        Route {
            group_id: g,
            epoch: 1,
            ..Default::default()
        }
    }

    /// A later write names every replica an earlier one named, whatever it adds (the
    /// driver once rewrote the file from the replicas it had opened, so a creation cut
    /// short after its write lost its groups from the file at the next creation).
    #[test]
    fn a_write_keeps_every_replica_named_before() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        reg.add(&[route(1), route(2), route(3), route(4)]).unwrap();
        reg.add(&[route(1)]).unwrap();
        reg.add(&[route(5), route(2)]).unwrap();
        let ids = |v: Vec<Route>| v.iter().map(|r| r.group_id).collect::<Vec<_>>();
        assert_eq!(ids(load(dir.path()).unwrap()), vec![1, 2, 3, 4, 5]);
        let again = Registry::open(dir.path()).unwrap();
        assert_eq!(ids(again.routes().cloned().collect()), vec![1, 2, 3, 4, 5]);
        assert!(again.contains(4) && !again.contains(6));
    }

    /// A write that failed leaves its routes named: the next write names them.
    #[test]
    fn a_failed_write_is_named_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        reg.add(&[route(1)]).unwrap();
        // The temporary file's place taken by a directory: creating it fails.
        std::fs::create_dir(dir.path().join("replicas.tmp")).unwrap();
        let err = reg.add(&[route(2)]).unwrap_err().to_string();
        assert!(err.contains("replicas.tmp"), "{err}");
        std::fs::remove_dir(dir.path().join("replicas.tmp")).unwrap();
        reg.add(&[route(3)]).unwrap();
        let ids: Vec<u64> = load(dir.path())
            .unwrap()
            .iter()
            .map(|r| r.group_id)
            .collect();
        assert_eq!(ids, vec![1, 2, 3]);
    }

    /// A removal turns the replica into a tombstone, durably; a failed removal changes
    /// nothing; the drop's end is recorded; a newer format is refused.
    #[test]
    fn removals_leave_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        reg.add(&[route(1), route(2)]).unwrap();
        let tomb = |g| ReplicaTombstone {
            group_id: g,
            conf_version: 40,
            term: 7,
            vote: 3,
            dropping: true,
        };
        reg.remove(tomb(1)).unwrap();
        let again = Registry::open(dir.path()).unwrap();
        assert!(!again.contains(1) && again.contains(2));
        assert_eq!(again.tombstone(1), Some(&tomb(1)));
        assert_eq!(again.dropping(), vec![1]);
        // The temporary file's place taken: the removal fails and changes nothing.
        std::fs::create_dir(dir.path().join("replicas.tmp")).unwrap();
        assert!(reg.remove(tomb(2)).is_err());
        assert!(reg.contains(2) && reg.tombstone(2).is_none());
        std::fs::remove_dir(dir.path().join("replicas.tmp")).unwrap();
        reg.dropped(&[1]).unwrap();
        let again = Registry::open(dir.path()).unwrap();
        assert!(again.dropping().is_empty());
        assert_eq!(again.tombstone(1).map(|t| (t.term, t.vote)), Some((7, 3)));
        assert!(again.contains(2));
        // Created here again: a replica and its tombstone.
        reg.add(&[route(1)]).unwrap();
        let again = Registry::open(dir.path()).unwrap();
        assert!(again.contains(1) && again.tombstone(1).is_some());
        // A file from a newer binary is refused, by name.
        let payload = LocalReplicas {
            format: FORMAT + 1,
            ..LocalReplicas::default()
        }
        .encode_to_vec();
        let mut b = crc32c::crc32c(&payload).to_le_bytes().to_vec();
        b.extend_from_slice(&payload);
        std::fs::write(path(dir.path()), b).unwrap();
        let err = Registry::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("newer than this binary"), "{err}");
    }

    #[test]
    fn a_group_named_twice_opens_with_its_newest_route() {
        let dir = tempfile::tempdir().unwrap();
        let newer = Route {
            epoch: 2,
            ..route(1)
        };
        save(dir.path(), &[newer.clone(), route(1)]).unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        assert_eq!(reg.routes().cloned().collect::<Vec<_>>(), vec![newer]);
    }
}
