//! What the meta leader learns from heartbeats: liveness, node stats, replica states
//! and group leaders.
//!
//! This is soft state, not replicated: a new meta leader starts empty and learns it
//! from the next round of heartbeats (about one interval). Time is passed in by the
//! caller (`now`), so the bookkeeping is deterministic under test.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use phoenix_proto::{NodeStats, ReplicaStats};

use crate::state::MetaState;

/// A node counts as alive if it sent a heartbeat within this.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// The meta leader's view from heartbeats.
#[derive(Debug, Default, Clone)]
pub struct LeaderView {
    /// Last heartbeat per node, with its stats.
    nodes: HashMap<u64, (Instant, NodeStats)>,
    /// Latest replica stats per (group, node).
    replicas: HashMap<(u64, u64), ReplicaStats>,
    /// Leader per group: (term, node).
    leaders: HashMap<u64, (u64, u64)>,
}

impl LeaderView {
    /// Records a heartbeat of `node` received at `now`: its stats and the replicas it
    /// reports (which replace the ones it reported before). A reported leader is taken
    /// unless a leader of a higher term is already known.
    pub fn record(&mut self, now: Instant, node: u64, stats: NodeStats, replicas: &[ReplicaStats]) {
        self.nodes.insert(node, (now, stats));
        self.replicas.retain(|(_, n), _| *n != node);
        for r in replicas {
            // The reporting node is the authority on its own replicas.
            let r = ReplicaStats {
                node_id: node,
                ..*r
            };
            self.replicas.insert((r.group_id, node), r);
            if r.is_leader {
                let e = self.leaders.entry(r.group_id).or_insert((0, 0));
                if r.term >= e.0 {
                    *e = (r.term, node);
                }
            }
        }
    }

    /// When `node` was last heard from, and its stats then.
    pub fn last_heartbeat(&self, node: u64) -> Option<(Instant, &NodeStats)> {
        self.nodes.get(&node).map(|(t, s)| (*t, s))
    }

    /// Whether `node` sent a heartbeat within [`ALIVE_WITHIN`] before `now`.
    pub fn is_alive(&self, node: u64, now: Instant) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) < ALIVE_WITHIN)
    }

    /// Registered nodes that are alive at `now`, by id.
    pub fn alive_nodes(&self, state: &MetaState, now: Instant) -> Vec<u64> {
        state
            .nodes()
            .keys()
            .copied()
            .filter(|id| self.is_alive(*id, now))
            .collect()
    }

    /// Last reported leader of `group` (the one of the highest term).
    pub fn leader(&self, group: u64) -> Option<u64> {
        self.leaders.get(&group).map(|&(_, node)| node)
    }

    /// The latest stats of every reported replica of `group`, by node id.
    pub fn replicas_of(&self, group: u64) -> Vec<ReplicaStats> {
        let mut out: Vec<ReplicaStats> = self
            .replicas
            .iter()
            .filter(|((g, _), _)| *g == group)
            .map(|(_, s)| *s)
            .collect();
        out.sort_by_key(|s| s.node_id);
        out
    }
}
