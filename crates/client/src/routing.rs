//! The client's routing cache: which group serves a key, at which epoch, on which nodes,
//! and which replica was last known to lead it.
//!
//! Routes come from the meta group (`GetRoutes`) and are cached (seed 001's PolarSwitch
//! keeps "all of the metadata" in memory so no lookup sits on the I/O path). A route
//! covers the user-key range `[start, end)`; an empty `end` means "to the end of the key
//! space". The cache may be stale: a server answering StaleEpoch hands the client the
//! current route, which replaces every cached route it overlaps that has a lower epoch.
//! Pure data structure, no I/O.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

/// Node identifier, as the meta group assigns it.
pub type NodeId = u64;

/// One group's entry of the routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Raft group id.
    pub group_id: u64,
    /// First user key of the range (inclusive).
    pub start: Vec<u8>,
    /// End of the range (exclusive); empty = unbounded.
    pub end: Vec<u8>,
    /// Bumped by every split/merge/membership change of the group.
    pub epoch: u64,
    /// Nodes holding a replica.
    pub replicas: Vec<NodeId>,
    /// Last known leader, if any.
    pub leader: Option<NodeId>,
}

impl Route {
    /// Whether `key` falls in `[start, end)`.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && (self.end.is_empty() || key < self.end.as_slice())
    }

    /// Whether the two ranges share at least one key.
    pub fn overlaps(&self, other: &Route) -> bool {
        let a_before_b_end = other.end.is_empty() || self.start < other.end;
        let b_before_a_end = self.end.is_empty() || other.start < self.end;
        a_before_b_end && b_before_a_end
    }
}

/// Routes by start key, plus the addresses of the nodes they name.
#[derive(Debug, Default, Clone)]
pub struct RouteTable {
    routes: BTreeMap<Vec<u8>, Route>,
    /// Start key of each group's route (a table of 10,000 groups is looked up by group
    /// on every request's answer: no scan).
    starts: HashMap<u64, Vec<u8>>,
    nodes: HashMap<NodeId, String>,
}

impl RouteTable {
    /// An empty table (every lookup misses until routes are loaded).
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of routes cached.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether no route is cached.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Replaces the whole table with a fresh copy from meta. Of overlapping routes (meta
    /// answered in the middle of a split) the higher epoch wins. Leaders known in the
    /// cache survive when the fresh copy names none and the leader is still a replica.
    pub fn replace_all(&mut self, routes: Vec<Route>, nodes: HashMap<NodeId, String>) {
        let old = std::mem::take(&mut self.routes);
        let old_starts = std::mem::take(&mut self.starts);
        for mut route in routes {
            if route.leader.is_none() {
                let prev = old_starts
                    .get(&route.group_id)
                    .and_then(|start| old.get(start));
                if let Some(prev) = prev {
                    if prev.leader.is_some_and(|l| route.replicas.contains(&l)) {
                        route.leader = prev.leader;
                    }
                }
            }
            self.update(route);
        }
        self.nodes = nodes;
    }

    /// Inserts one route (e.g. from a StaleEpoch answer). Cached routes it overlaps are
    /// dropped if their epoch is lower; if a cached overlapping route has a higher or
    /// equal epoch (and is another group or another range) the new one is ignored.
    /// Returns whether the route was taken.
    pub fn update(&mut self, route: Route) -> bool {
        if !route.end.is_empty() && route.end <= route.start {
            // An empty or inverted range serves no key (and would break the table's
            // order): refused.
            return false;
        }
        let overlapping = self.overlapping_starts(&route);
        for start in &overlapping {
            if let Some(r) = self.routes.get(start) {
                let same =
                    r.group_id == route.group_id && r.start == route.start && r.end == route.end;
                if r.epoch > route.epoch || (r.epoch == route.epoch && !same) {
                    return false;
                }
            }
        }
        for start in overlapping {
            if let Some(r) = self.routes.remove(&start) {
                if self.starts.get(&r.group_id) == Some(&start) {
                    self.starts.remove(&r.group_id);
                }
            }
        }
        self.starts.insert(route.group_id, route.start.clone());
        self.routes.insert(route.start.clone(), route);
        true
    }

    /// Start keys of the cached routes that overlap `route`. Cached routes never overlap
    /// one another (`update` keeps it so): at most the one starting at or before
    /// `route.start` reaches into it, and every one starting inside it overlaps it.
    fn overlapping_starts(&self, route: &Route) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let at_or_before = (Bound::Unbounded, Bound::Included(route.start.as_slice()));
        if let Some((start, r)) = self.routes.range::<[u8], _>(at_or_before).next_back() {
            if r.overlaps(route) {
                out.push(start.clone());
            }
        }
        // `update` refuses empty and inverted ranges, so this range is well formed.
        let end = if route.end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(route.end.as_slice())
        };
        let inside = (Bound::Excluded(route.start.as_slice()), end);
        out.extend(self.routes.range::<[u8], _>(inside).map(|(s, _)| s.clone()));
        debug_assert_eq!(
            out.len(),
            self.routes.values().filter(|r| r.overlaps(route)).count(),
            "cached routes overlap one another"
        );
        out
    }

    /// Adds or changes a node's address.
    pub fn set_node(&mut self, id: NodeId, addr: String) {
        self.nodes.insert(id, addr);
    }

    /// The address of a node, if known.
    pub fn node_addr(&self, id: NodeId) -> Option<&str> {
        self.nodes.get(&id).map(String::as_str)
    }

    /// All known node addresses.
    pub fn node_addrs(&self) -> impl Iterator<Item = (&NodeId, &String)> {
        self.nodes.iter()
    }

    /// The route serving `key`, if cached.
    pub fn locate(&self, key: &[u8]) -> Option<&Route> {
        self.routes
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.contains(key))
    }

    /// The route of a group, if cached.
    pub fn by_group(&self, group_id: u64) -> Option<&Route> {
        self.starts
            .get(&group_id)
            .and_then(|start| self.routes.get(start))
    }

    /// All cached routes in key order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.values()
    }

    /// Records `leader` as the leader of `group_id` (a NotLeader hint or a success). A
    /// leader that is not a replica of the cached route is recorded too (the route may be
    /// older than the hint), and made a replica so the client can reach it.
    pub fn set_leader(&mut self, group_id: u64, leader: Option<NodeId>) {
        let route = match self.starts.get(&group_id) {
            Some(start) => self.routes.get_mut(start),
            None => None,
        };
        if let Some(r) = route {
            if let Some(l) = leader {
                if !r.replicas.contains(&l) {
                    r.replicas.push(l);
                }
            }
            r.leader = leader;
        }
    }

    /// The order in which to try the replicas of `route`: the known leader first, then the
    /// others starting after `rotate` (so successive attempts without a leader hint visit
    /// different replicas).
    pub fn candidates(route: &Route, rotate: usize) -> Vec<NodeId> {
        let mut out = Vec::with_capacity(route.replicas.len());
        if let Some(l) = route.leader {
            out.push(l);
        }
        let n = route.replicas.len();
        for i in 0..n {
            let id = route.replicas[(rotate + i) % n];
            if Some(id) != route.leader {
                out.push(id);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(g: u64, start: &str, end: &str, epoch: u64) -> Route {
        Route {
            group_id: g,
            start: start.as_bytes().to_vec(),
            end: end.as_bytes().to_vec(),
            epoch,
            replicas: vec![1, 2, 3],
            leader: None,
        }
    }

    #[test]
    fn locate_by_range() {
        let mut t = RouteTable::new();
        t.replace_all(
            vec![
                route(1, "", "g", 1),
                route(2, "g", "p", 1),
                route(3, "p", "", 1),
            ],
            HashMap::new(),
        );
        assert_eq!(t.locate(b"").map(|r| r.group_id), Some(1));
        assert_eq!(t.locate(b"a").map(|r| r.group_id), Some(1));
        assert_eq!(t.locate(b"g").map(|r| r.group_id), Some(2));
        assert_eq!(t.locate(b"ozzz").map(|r| r.group_id), Some(2));
        assert_eq!(t.locate(b"p").map(|r| r.group_id), Some(3));
        assert_eq!(t.locate(b"\xff\xff").map(|r| r.group_id), Some(3));
    }

    #[test]
    fn hole_in_table_misses() {
        let mut t = RouteTable::new();
        t.replace_all(
            vec![route(1, "", "g", 1), route(3, "p", "", 1)],
            HashMap::new(),
        );
        assert!(t.locate(b"h").is_none());
        assert_eq!(t.locate(b"f").map(|r| r.group_id), Some(1));
    }

    #[test]
    fn newer_epoch_replaces_overlapping_routes_older_is_ignored() {
        let mut t = RouteTable::new();
        t.replace_all(vec![route(1, "", "", 1)], HashMap::new());
        // Group 1 split at "m": the server tells us group 1 now ends at "m" (epoch 2).
        assert!(t.update(route(1, "", "m", 2)));
        assert!(
            t.locate(b"z").is_none(),
            "the old full-range route must be gone"
        );
        assert!(t.update(route(2, "m", "", 2)));
        assert_eq!(t.locate(b"z").map(|r| r.group_id), Some(2));
        // A stale answer (epoch 1) must not bring back the old range.
        assert!(!t.update(route(1, "", "", 1)));
        assert_eq!(t.locate(b"z").map(|r| r.group_id), Some(2));
        assert_eq!(t.len(), 2);
    }

    /// The group index follows every change of the table: a split, a stale answer
    /// refused, a whole new table; empty and inverted ranges are refused.
    #[test]
    fn routes_are_found_by_group_through_changes() {
        let mut t = RouteTable::new();
        let routes: Vec<Route> = (0..1000u32)
            .map(|i| {
                let start = if i == 0 {
                    Vec::new()
                } else {
                    i.to_be_bytes().to_vec()
                };
                let end = if i == 999 {
                    Vec::new()
                } else {
                    (i + 1).to_be_bytes().to_vec()
                };
                Route {
                    group_id: u64::from(i) + 1,
                    start,
                    end,
                    epoch: 1,
                    replicas: vec![1, 2, 3],
                    leader: None,
                }
            })
            .collect();
        t.replace_all(routes, HashMap::new());
        assert_eq!(t.len(), 1000);
        for g in [1u64, 500, 1000] {
            assert_eq!(t.by_group(g).map(|r| r.group_id), Some(g));
        }
        t.set_leader(500, Some(2));
        assert_eq!(t.by_group(500).and_then(|r| r.leader), Some(2));
        // Group 500 = [499, 500) as 4-byte keys; it grows over group 501 (epoch 2).
        let mut merged = t.by_group(500).unwrap().clone();
        merged.end = 501u32.to_be_bytes().to_vec();
        merged.epoch = 2;
        assert!(t.update(merged));
        assert!(t.by_group(501).is_none(), "the overlapped route is gone");
        assert_eq!(
            t.locate(&500u32.to_be_bytes()).map(|r| r.group_id),
            Some(500)
        );
        assert_eq!(t.len(), 999);
        // Empty and inverted ranges serve no key: refused, nothing changes.
        assert!(!t.update(route(7, "b", "b", 9)));
        assert!(!t.update(route(7, "c", "b", 9)));
        assert_eq!(
            t.by_group(7).map(|r| r.start.clone()),
            Some(6u32.to_be_bytes().to_vec())
        );
        // A new table keeps a known leader that is still a replica.
        let again: Vec<Route> = t
            .routes()
            .cloned()
            .map(|mut r| {
                r.leader = None;
                r
            })
            .collect();
        t.replace_all(again, HashMap::new());
        assert_eq!(t.by_group(500).and_then(|r| r.leader), Some(2));
    }

    #[test]
    fn leader_hint_and_candidates() {
        let mut t = RouteTable::new();
        t.replace_all(vec![route(1, "", "", 1)], HashMap::new());
        let r = t.locate(b"k").unwrap().clone();
        assert_eq!(RouteTable::candidates(&r, 0), vec![1, 2, 3]);
        assert_eq!(RouteTable::candidates(&r, 1), vec![2, 3, 1]);
        t.set_leader(1, Some(3));
        let r = t.locate(b"k").unwrap().clone();
        assert_eq!(RouteTable::candidates(&r, 0), vec![3, 1, 2]);
        // A hint naming a node the route does not know yet is followed too.
        t.set_leader(1, Some(9));
        let r = t.locate(b"k").unwrap().clone();
        assert_eq!(RouteTable::candidates(&r, 0)[0], 9);
        // A refresh that names no leader keeps the cached one while it is a replica.
        t.replace_all(vec![route(1, "", "", 1)], HashMap::new());
        t.set_leader(1, Some(2));
        t.replace_all(vec![route(1, "", "", 1)], HashMap::new());
        assert_eq!(t.locate(b"k").unwrap().leader, Some(2));
    }
}
