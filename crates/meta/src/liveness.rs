//! What the meta leader learns from heartbeats: liveness, node stats, replica states
//! and group leaders.
//!
//! This is soft state, not replicated: a new meta leader starts empty and learns it
//! from the next round of heartbeats (about one interval). Time is passed in by the
//! caller (`now`), so the bookkeeping is deterministic under test.
//!
//! The meta group is kept apart from the data groups: its route is not in the routing
//! table (it holds no keys) but is the meta leader's own replica's membership
//! ([`LeaderView::set_meta_route`]), and nodes report their meta replica in a field of
//! its own ([`LeaderView::record_meta_replica`]). So the balancers, route updates and
//! merges, which walk the table and the reported replicas, never see it; the operators
//! and repair reach it by group id ([`LeaderView::replica`], [`LeaderView::leader`],
//! [`LeaderView::hosts`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use phoenix_proto::{NodeStats, ReplicaStats, Route};

use crate::state::{MetaState, META_GROUP};

/// A node counts as alive if it sent a heartbeat within this.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// The meta leader's view from heartbeats.
#[derive(Debug, Default, Clone)]
pub struct LeaderView {
    /// Last heartbeat per node, with its stats.
    nodes: HashMap<u64, (Instant, NodeStats)>,
    /// Latest replica stats per node, by group: a full report replaces a node's map
    /// whole, a partial one changes only what it names.
    replicas: HashMap<u64, BTreeMap<u64, ReplicaStats>>,
    /// Per node, the sequence number of the last report recorded: a partial report
    /// builds on it and is taken whole only if it names it as its base.
    report_seq: HashMap<u64, u64>,
    /// Leader per group: (term, node).
    leaders: HashMap<u64, (u64, u64)>,
    /// The meta group's membership as the meta leader's replica applied it.
    meta_route: Option<Route>,
    /// Each node's last report of its meta replica (absent: it hosts none).
    meta_replicas: BTreeMap<u64, ReplicaStats>,
    /// Counts the changes to `replicas` (and so to `leaders`): the walks over every
    /// route read nothing else of the view, so while it stands still they would find
    /// what they found last time.
    changes: u64,
    /// The same, per node: the changes to that node's replicas.
    node_changes: HashMap<u64, u64>,
    /// Per node, the (table applied index, node changes) at which the placement walks
    /// last found nothing to do (`crate::schedule::placement_commands_memo`).
    pub(crate) quiet_placement: HashMap<u64, (u64, u64)>,
    /// The (table applied index, changes) at which the route updates' walk last found
    /// nothing to do (`crate::schedule::route_updates_memo`).
    pub(crate) quiet_routes: Option<(u64, u64)>,
}

impl LeaderView {
    /// Records a heartbeat of `node` received at `now`: its stats and the replicas it
    /// reports (which replace the ones it reported before). A reported leader is taken
    /// unless a leader of a higher term is already known.
    pub fn record(&mut self, now: Instant, node: u64, stats: NodeStats, replicas: &[ReplicaStats]) {
        self.record_report(now, node, stats, replicas, &Report::full(0));
    }

    /// Records a heartbeat that may be partial (`report`): a full one as [`record`]; a
    /// partial one changes the replicas it names, drops `removed`, and leaves the others
    /// as the report it builds on said. Returns whether the view now holds the node's
    /// whole state as of `report.seq` — false when a partial report builds on a report
    /// this view does not hold (another meta leader took it, or its answer was lost):
    /// then only the node's liveness and stats are taken, and it must send a full
    /// report next.
    ///
    /// [`record`]: LeaderView::record
    pub fn record_report(
        &mut self,
        now: Instant,
        node: u64,
        stats: NodeStats,
        replicas: &[ReplicaStats],
        report: &Report,
    ) -> bool {
        self.nodes.insert(node, (now, stats));
        let whole = match report.base {
            None => true,
            Some(base) => base != 0 && self.report_seq.get(&node) == Some(&base),
        };
        if !whole {
            // Changes against a state this view does not hold, perhaps older than what
            // it holds (an answer lost, the report delayed past a whole one): only the
            // liveness counts; the node sends a whole report next.
            self.report_seq.remove(&node);
            return false;
        }
        let held = self.replicas.entry(node).or_default();
        // (A whole report counts as a change: they are rare, and comparing it would
        // cost as much as the walks it saves.)
        let mut changed = report.base.is_none();
        if report.base.is_none() {
            held.clear();
        }
        for g in &report.removed {
            changed |= held.remove(g).is_some();
        }
        for r in replicas {
            // The reporting node is the authority on its own replicas.
            let r = ReplicaStats {
                node_id: node,
                ..r.clone()
            };
            let (group, is_leader, term) = (r.group_id, r.is_leader, r.term);
            changed |= held.get(&group).is_none_or(|h| !same_but_scrub_age(h, &r));
            held.insert(group, r);
            if is_leader {
                let e = self.leaders.entry(group).or_insert((0, 0));
                if term >= e.0 {
                    // (A tie in a term can move it too, with stats otherwise the same.)
                    changed |= *e != (term, node);
                    *e = (term, node);
                }
            }
        }
        self.report_seq.insert(node, report.seq);
        if changed {
            self.changes += 1;
            *self.node_changes.entry(node).or_default() += 1;
        }
        true
    }

    /// How many times the recorded replicas (and so the leaders) have changed.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// How many times `node`'s recorded replicas have changed.
    pub fn node_changes(&self, node: u64) -> u64 {
        self.node_changes.get(&node).copied().unwrap_or(0)
    }

    /// Takes the meta group's membership from the meta leader's own replica: `route`
    /// (its voters and learners at its conf version), led by `route.leader_node_id` in
    /// `term`.
    pub fn set_meta_route(&mut self, route: Route, term: u64) {
        debug_assert_eq!(route.group_id, META_GROUP);
        let leader = route.leader_node_id;
        if leader != 0 {
            let e = self.leaders.entry(META_GROUP).or_insert((0, 0));
            if term >= e.0 {
                *e = (term, leader);
            }
        }
        self.meta_route = Some(route);
    }

    /// The meta group's membership, once the meta leader has set it.
    pub fn meta_route(&self) -> Option<&Route> {
        self.meta_route.as_ref()
    }

    /// Records `node`'s report of its meta replica (None: it hosts none). Every heartbeat
    /// carries it whole.
    pub fn record_meta_replica(&mut self, node: u64, rep: Option<ReplicaStats>) {
        match rep {
            Some(r) => {
                let r = ReplicaStats {
                    node_id: node,
                    group_id: META_GROUP,
                    ..r
                };
                self.meta_replicas.insert(node, r);
            }
            None => {
                self.meta_replicas.remove(&node);
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

    /// Nodes whose last heartbeat said their disk is under its reserve (they refuse
    /// client writes), by id: their leaders hand groups to the others.
    pub fn disk_full_nodes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, (_, s))| s.disk_full)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    /// Last reported leader of `group` (the one of the highest term).
    pub fn leader(&self, group: u64) -> Option<u64> {
        self.leaders.get(&group).map(|&(_, node)| node)
    }

    /// The latest stats `node` reported for its replica of `group`.
    pub fn replica(&self, node: u64, group: u64) -> Option<&ReplicaStats> {
        if group == META_GROUP {
            return self.meta_replicas.get(&node);
        }
        self.replicas.get(&node).and_then(|m| m.get(&group))
    }

    /// Whether `node`'s reports say it hosts a replica of `group`.
    pub fn hosts(&self, node: u64, group: u64) -> bool {
        if group == META_GROUP {
            return self.meta_replicas.contains_key(&node);
        }
        self.replicas
            .get(&node)
            .is_some_and(|m| m.contains_key(&group))
    }

    /// The latest stats of every replica `node` reported, by group id.
    pub fn hosted(&self, node: u64) -> impl Iterator<Item = &ReplicaStats> {
        self.replicas
            .get(&node)
            .into_iter()
            .flat_map(|m| m.values())
    }

    /// Every reported replica's latest stats.
    pub fn all_replicas(&self) -> impl Iterator<Item = &ReplicaStats> {
        self.replicas.values().flat_map(|m| m.values())
    }

    /// The latest stats of every reported replica of `group`, by node id.
    pub fn replicas_of(&self, group: u64) -> Vec<ReplicaStats> {
        if group == META_GROUP {
            return self.meta_replicas.values().cloned().collect();
        }
        let mut out: Vec<ReplicaStats> = self
            .replicas
            .values()
            .filter_map(|m| m.get(&group).cloned())
            .collect();
        out.sort_by_key(|s| s.node_id);
        out
    }
}

/// Whether `a` and `b` differ in nothing but the scrub's age. The age moves by itself
/// (nodes send it again every few minutes): it is kept, but no walk over the view reads
/// it, so it does not count as a change.
fn same_but_scrub_age(a: &ReplicaStats, b: &ReplicaStats) -> bool {
    if a.scrub_age_ms == b.scrub_age_ms {
        return a == b;
    }
    *a == ReplicaStats {
        scrub_age_ms: a.scrub_age_ms,
        ..b.clone()
    }
}

/// What a heartbeat's replica list is: the whole set, or the changes since a report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The sender's number for this report.
    pub seq: u64,
    /// `None`: the list is every replica of the node. `Some(b)`: only the replicas that
    /// changed since the node's report `b` (plus `removed`).
    pub base: Option<u64>,
    /// Groups the node no longer hosts (partial reports only).
    pub removed: Vec<u64>,
}

impl Report {
    /// A full report numbered `seq`.
    pub fn full(seq: u64) -> Report {
        Report {
            seq,
            base: None,
            removed: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phoenix_proto::{meta_command, MetaCommand, Replica};

    fn rep(group: u64, leader: bool, term: u64) -> ReplicaStats {
        ReplicaStats {
            group_id: group,
            is_leader: leader,
            term,
            ..ReplicaStats::default()
        }
    }

    fn stats(groups: u64) -> NodeStats {
        NodeStats {
            groups,
            ..NodeStats::default()
        }
    }

    /// Changes are counted per node and in all: a report repeating what is held, or
    /// moving only a scrub's age (kept all the same), is none; a removal or another field
    /// is one; a partial report on a base the view does not hold changes nothing.
    #[test]
    fn changes_count_what_the_walks_read() {
        let t = Instant::now();
        let mut v = LeaderView::default();
        let scrubbed = |age: u64, applied: u64| ReplicaStats {
            scrub_index: 4,
            scrub_age_ms: age,
            applied_index: applied,
            ..rep(1, true, 2)
        };
        let partial = |seq: u64, removed: Vec<u64>| Report {
            seq,
            base: Some(seq - 1),
            removed,
        };
        v.record_report(
            t,
            1,
            stats(2),
            &[scrubbed(0, 5), rep(2, false, 2)],
            &Report::full(1),
        );
        v.record_report(t, 2, stats(0), &[], &Report::full(1));
        let counts = |v: &LeaderView| (v.node_changes(1), v.node_changes(2), v.changes());
        assert_eq!(counts(&v), (1, 1, 2));
        assert!(v.record_report(t, 1, stats(2), &[scrubbed(0, 5)], &partial(2, vec![])));
        assert_eq!(counts(&v), (1, 1, 2), "the same again");
        assert!(v.record_report(t, 1, stats(2), &[scrubbed(600_000, 5)], &partial(3, vec![])));
        assert_eq!(counts(&v), (1, 1, 2), "the age alone");
        assert_eq!(v.replica(1, 1).map(|r| r.scrub_age_ms), Some(600_000));
        assert!(v.record_report(t, 1, stats(2), &[scrubbed(600_000, 6)], &partial(4, vec![])));
        assert_eq!(counts(&v), (2, 1, 3), "an index");
        assert!(v.record_report(t, 1, stats(1), &[], &partial(5, vec![9])));
        assert_eq!(counts(&v), (2, 1, 3), "a group it never reported");
        assert!(v.record_report(t, 1, stats(1), &[], &partial(6, vec![2])));
        assert_eq!(counts(&v), (3, 1, 4), "a removal");
        assert!(!v.record_report(t, 1, stats(1), &[rep(3, true, 9)], &partial(9, vec![1])));
        assert_eq!(counts(&v), (3, 1, 4), "a report on a base not held");
        assert!(v.hosts(1, 1) && !v.hosts(1, 3));
    }

    #[test]
    fn full_disks_follow_the_last_heartbeat() {
        let t0 = Instant::now();
        let mut v = LeaderView::default();
        let full = |on| NodeStats {
            disk_full: on,
            ..NodeStats::default()
        };
        v.record(t0, 3, full(true), &[]);
        v.record(t0, 1, full(true), &[]);
        v.record(t0, 2, full(false), &[]);
        assert_eq!(v.disk_full_nodes(), vec![1, 3]);
        v.record(t0, 3, full(false), &[]);
        assert_eq!(v.disk_full_nodes(), vec![1]);
    }

    #[test]
    fn liveness_follows_the_last_heartbeat() {
        let t0 = Instant::now();
        let mut v = LeaderView::default();
        assert!(!v.is_alive(1, t0));
        assert!(v.last_heartbeat(1).is_none());
        v.record(t0, 1, stats(2), &[]);
        assert!(v.is_alive(1, t0));
        assert!(v.is_alive(1, t0 + ALIVE_WITHIN - Duration::from_millis(1)));
        assert!(!v.is_alive(1, t0 + ALIVE_WITHIN));
        // A clock that reads earlier than the heartbeat does not make it dead.
        v.record(t0 + Duration::from_secs(1), 1, stats(3), &[]);
        assert!(v.is_alive(1, t0));
        let (t, s) = v.last_heartbeat(1).unwrap();
        assert_eq!((t, s.groups), (t0 + Duration::from_secs(1), 3));
        assert!(v.is_alive(1, t0 + ALIVE_WITHIN));
    }

    #[test]
    fn alive_nodes_are_registered_and_recent() {
        let mut st = MetaState::default();
        for (i, id) in [1u64, 2, 3].iter().enumerate() {
            let cmd = MetaCommand {
                cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                    protocol: 0,
                    node_id: *id,
                    addr: format!("h:{id}"),
                })),
            };
            st.apply(i as u64 + 1, &cmd).unwrap();
        }
        let t0 = Instant::now();
        let mut v = LeaderView::default();
        v.record(t0, 1, stats(0), &[]);
        v.record(t0 + Duration::from_secs(4), 2, stats(0), &[]);
        v.record(t0 + Duration::from_secs(4), 9, stats(0), &[]); // not registered
        let now = t0 + Duration::from_secs(6);
        assert_eq!(v.alive_nodes(&st, now), vec![2]);
        assert_eq!(v.alive_nodes(&st, t0), vec![1, 2]);
    }

    #[test]
    fn leaders_by_highest_term_and_replicas_replaced() {
        let t = Instant::now();
        let mut v = LeaderView::default();
        v.record(t, 1, stats(2), &[rep(1, true, 3), rep(2, false, 1)]);
        v.record(t, 2, stats(2), &[rep(1, false, 3), rep(2, true, 1)]);
        assert_eq!(v.leader(1), Some(1));
        assert_eq!(v.leader(2), Some(2));
        assert_eq!(v.leader(3), None);
        // A stale report of an older term does not win.
        v.record(t, 3, stats(1), &[rep(1, true, 2)]);
        assert_eq!(v.leader(1), Some(1));
        // A newer term does.
        v.record(t, 2, stats(2), &[rep(1, true, 4), rep(2, true, 1)]);
        assert_eq!(v.leader(1), Some(2));
        let nodes: Vec<u64> = v.replicas_of(1).iter().map(|r| r.node_id).collect();
        assert_eq!(nodes, vec![1, 2, 3]);
        // Node 3 no longer reports group 1: its replica state goes.
        v.record(t, 3, stats(0), &[]);
        let nodes: Vec<u64> = v.replicas_of(1).iter().map(|r| r.node_id).collect();
        assert_eq!(nodes, vec![1, 2]);
        // Replica stats carry the reporting node's id whatever the report says.
        v.record(
            t,
            4,
            stats(1),
            &[ReplicaStats {
                node_id: 77,
                ..rep(5, false, 1)
            }],
        );
        assert_eq!(v.replicas_of(5)[0].node_id, 4);
    }

    #[test]
    fn partial_reports_build_on_the_recorded_one() {
        let t = Instant::now();
        let mut v = LeaderView::default();
        let full = Report::full(10);
        assert!(v.record_report(
            t,
            1,
            stats(3),
            &[rep(1, true, 1), rep(2, false, 1), rep(3, false, 1)],
            &full
        ));
        // Changes since 10: group 2 now led, group 3 gone.
        let part = Report {
            seq: 11,
            base: Some(10),
            removed: vec![3],
        };
        assert!(v.record_report(t, 1, stats(2), &[rep(2, true, 2)], &part));
        assert_eq!(v.leader(2), Some(1));
        assert!(v.hosts(1, 1) && v.hosts(1, 2) && !v.hosts(1, 3));
        assert_eq!(v.replicas_of(1).len(), 1, "unchanged replicas stay");
        // A partial report on a base this view never recorded (report 12 went to
        // another meta leader, or arrived late): its changes may be older than what
        // the view holds, so only liveness is taken; the node must resend all.
        let stale = Report {
            seq: 13,
            base: Some(12),
            removed: vec![1],
        };
        assert!(!v.record_report(
            t + Duration::from_secs(1),
            1,
            stats(2),
            &[rep(2, false, 3)],
            &stale
        ));
        assert!(v.hosts(1, 1), "a refused report removes nothing");
        assert!(
            v.replicas_of(2)[0].is_leader,
            "a refused report changes nothing"
        );
        assert_eq!(v.last_heartbeat(1).unwrap().0, t + Duration::from_secs(1));
        // Nothing builds on a refused one either.
        let next = Report {
            seq: 14,
            base: Some(13),
            removed: vec![],
        };
        assert!(!v.record_report(t, 1, stats(2), &[], &next));
        // A full report replaces everything and is a base again.
        assert!(v.record_report(t, 1, stats(1), &[rep(4, false, 1)], &Report::full(15)));
        assert!(!v.hosts(1, 1) && v.hosts(1, 4));
        let after = Report {
            seq: 16,
            base: Some(15),
            removed: vec![],
        };
        assert!(v.record_report(t, 1, stats(1), &[], &after));
        // Base 0 is never a report.
        let zero = Report {
            seq: 17,
            base: Some(0),
            removed: vec![],
        };
        let mut fresh = LeaderView::default();
        assert!(!fresh.record_report(t, 2, stats(0), &[], &zero));
    }
}
