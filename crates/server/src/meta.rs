//! The meta group's state machine (raft group 0): node registry and routing table.
//!
//! Stored in the engine under group 0's data namespace, applied like any group:
//! ```text
//! 0u64 BE ‖ 'd' ‖ "n" ‖ node_id: u64 BE  → protobuf Replica (node id, address)
//! 0u64 BE ‖ 'd' ‖ "r" ‖ group_id: u64 BE → protobuf Route (range, epoch, replicas)
//! ```
//! [`MetaState`] is the in-memory copy, rebuilt from the engine at start and after a
//! snapshot install. Liveness, stats and leaders are soft state of the meta leader
//! ([`LeaderView`]), not replicated: a new meta leader learns them from the next
//! heartbeats.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use phoenix_engine::{Db, ReadOptions, WriteBatch};
use phoenix_proto::{meta_command, MetaCommand, NodeStats, Replica, ReplicaStats, Route};
use prost::Message;

use crate::error::{Error, Result};
use crate::keys;

/// Group id of the meta group.
pub const META_GROUP: u64 = 0;

/// The replicated meta state.
#[derive(Debug, Default, Clone)]
pub struct MetaState {
    /// Registered nodes by id.
    pub nodes: BTreeMap<u64, Replica>,
    /// Data group routes by group id.
    pub routes: BTreeMap<u64, Route>,
}

fn node_key(id: u64) -> Vec<u8> {
    let mut k = b"n".to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    keys::data_key(META_GROUP, &k)
}

fn route_key(id: u64) -> Vec<u8> {
    let mut k = b"r".to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    keys::data_key(META_GROUP, &k)
}

impl MetaState {
    /// Loads the state from the engine.
    pub fn load(db: &Db) -> Result<MetaState> {
        let mut st = MetaState::default();
        let ro = ReadOptions {
            lower_bound: Some(keys::data_key(META_GROUP, b"")),
            upper_bound: Some(keys::data_end(META_GROUP)),
            ..ReadOptions::default()
        };
        let mut it = db.iter(&ro)?;
        it.seek_to_first();
        while it.valid() {
            let k = it.key();
            let rest = k.get(9..).unwrap_or_default();
            match rest.first() {
                Some(b'n') => {
                    let n = Replica::decode(it.value())
                        .map_err(|e| Error::Corruption(format!("meta node record {k:?}: {e}")))?;
                    st.nodes.insert(n.node_id, n);
                }
                Some(b'r') => {
                    let r = Route::decode(it.value())
                        .map_err(|e| Error::Corruption(format!("meta route record {k:?}: {e}")))?;
                    st.routes.insert(r.group_id, r);
                }
                _ => {
                    return Err(Error::Corruption(format!("unknown meta record key {k:?}")));
                }
            }
            it.next();
        }
        it.status()?;
        Ok(st)
    }

    /// Applies one committed command: adds its writes to `wb` and updates the copy.
    /// Returns an error text (not a failure of the node) for refused commands.
    pub fn apply(
        &mut self,
        cmd: MetaCommand,
        wb: &mut WriteBatch,
    ) -> std::result::Result<(), String> {
        match cmd.cmd {
            Some(meta_command::Cmd::RegisterNode(n)) => {
                if n.node_id == 0 {
                    return Err("node id 0 is reserved".into());
                }
                if let Some(other) = self
                    .nodes
                    .values()
                    .find(|o| o.addr == n.addr && o.node_id != n.node_id)
                {
                    return Err(format!(
                        "address {} already belongs to node {}",
                        n.addr, other.node_id
                    ));
                }
                wb.put(&node_key(n.node_id), &n.encode_to_vec());
                self.nodes.insert(n.node_id, n);
                Ok(())
            }
            Some(meta_command::Cmd::CreateGroups(cg)) => {
                if cg.routes.is_empty() {
                    return Err("no groups to create".into());
                }
                if let Some(r) = cg
                    .routes
                    .iter()
                    .find(|r| r.group_id == META_GROUP || self.routes.contains_key(&r.group_id))
                {
                    return Err(format!("group {} already exists", r.group_id));
                }
                if !self.routes.is_empty() {
                    return Err("the cluster is already bootstrapped".into());
                }
                for r in cg.routes {
                    wb.put(&route_key(r.group_id), &r.encode_to_vec());
                    self.routes.insert(r.group_id, r);
                }
                Ok(())
            }
            None => Err("empty meta command".into()),
        }
    }
}

/// What the meta leader knows from heartbeats (soft state).
#[derive(Debug, Default)]
pub struct LeaderView {
    /// Last heartbeat per node, with its stats.
    pub nodes: HashMap<u64, (Instant, NodeStats)>,
    /// Latest replica stats per (group, node).
    pub replicas: HashMap<(u64, u64), ReplicaStats>,
    /// Leader per group: (term, node).
    pub leaders: HashMap<u64, (u64, u64)>,
}

impl LeaderView {
    /// Records a heartbeat.
    pub fn record(&mut self, node: u64, stats: NodeStats, replicas: &[ReplicaStats]) {
        self.nodes.insert(node, (Instant::now(), stats));
        self.replicas.retain(|(_, n), _| *n != node);
        for r in replicas {
            self.replicas.insert((r.group_id, node), *r);
            if r.is_leader {
                let e = self.leaders.entry(r.group_id).or_insert((0, 0));
                if r.term >= e.0 {
                    *e = (r.term, node);
                }
            }
        }
    }
}

/// Chooses replicas for `groups` new groups among `nodes` (sorted ids): group i gets
/// `replication` consecutive nodes starting at i (round-robin), so leaders and data
/// spread when there are more nodes than replicas.
pub fn place(nodes: &[u64], groups: usize, replication: usize) -> Option<Vec<Vec<u64>>> {
    if nodes.len() < replication || replication == 0 {
        return None;
    }
    Some(
        (0..groups)
            .map(|g| {
                let mut r: Vec<u64> = (0..replication)
                    .map(|k| nodes[(g + k) % nodes.len()])
                    .collect();
                r.sort_unstable();
                r
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_round_robin() {
        assert_eq!(place(&[1, 2], 1, 3), None);
        assert_eq!(
            place(&[1, 2, 3], 2, 3),
            Some(vec![vec![1, 2, 3], vec![1, 2, 3]])
        );
        assert_eq!(
            place(&[1, 2, 3, 4], 2, 3),
            Some(vec![vec![1, 2, 3], vec![2, 3, 4]])
        );
    }

    #[test]
    fn create_groups_only_once() {
        let mut st = MetaState::default();
        let mut wb = WriteBatch::new();
        let r = Route {
            group_id: 1,
            epoch: 1,
            ..Default::default()
        };
        let cmd = |routes| MetaCommand {
            cmd: Some(meta_command::Cmd::CreateGroups(
                phoenix_proto::CreateGroups { routes },
            )),
        };
        st.apply(cmd(vec![r.clone()]), &mut wb).unwrap();
        assert!(st.apply(cmd(vec![r.clone()]), &mut wb).is_err());
        let mut r2 = r;
        r2.group_id = 2;
        assert!(st.apply(cmd(vec![r2]), &mut wb).is_err());
        assert_eq!(st.routes.len(), 1);
    }
}
