//! Replica balancing: the meta leader spreads replicas over the nodes by count and by
//! bytes, so a node added to the cluster takes its share and a lopsided bootstrap or a
//! few large groups on the same nodes even out (PD's balance-region scheduler).
//!
//! Decisions only, stateless like repair ([`crate::repair`]), on the groups repair leaves
//! alone (none of their replicas on a down or draining node), so a repair that cannot
//! finish (nowhere to put a replica) does not stop the balancing of the others. Each
//! pass:
//! - a group with more voters than `replication`, all on live nodes, loses the one on
//!   the node hosting the most replicas (ties: a follower, then the highest id), one
//!   with fewer gets one on the least loaded node that lacks it; a live learner left by
//!   an addition that gave up is removed, or promoted if the group lacks voters;
//! - then, while the eligible nodes (alive, not full, not stopping, not draining) are
//!   not all within
//!   `max(10% of the mean, 1)` of the mean, a group on the most loaded node that can
//!   give one to a node hosting at least two fewer (the least loaded such) moves its
//!   replica there (of the groups that can, the one leaving the two nodes' bytes
//!   closest);
//! - then, while the eligible nodes' bytes (the sum of the sizes of the groups they
//!   host, a group's size being the largest its replicas report) are not all within
//!   `max(10% of the mean, BYTES_BAND_MIN)` of the mean, a replica moves from a heavier
//!   node to a lighter one, at least one of them out of the band, choosing the group
//!   whose size is nearest half their difference (and under it: every move narrows the
//!   spread, so balancing ends; groups under `BYTES_MOVE_MIN` stay). A move by bytes keeps both nodes' counts within the
//!   count band; counts come first.
//!
//! A move is an addition on the new node; once it votes, the next pass trims the group
//! back to `replication` from the node the move meant ([`Operators::trim_hint`]), or,
//! without that hint (a meta leader change), from its most loaded node. Adding first
//! keeps every group at its number of voters throughout.
//!
//! The two groups the merge check is bringing onto the same voters
//! ([`crate::merge_alignment`]) are not moved for balance (their extra voter is still
//! trimmed): the balancer would undo the alignment, and the two would chase each other.
//!
//! A group under an operator, whose leader is not known to be live, or whose replica
//! addition or removal asked for by a user ended within
//! [`crate::operator::ASKED_GRACE`] (so the removal half of a `cluster move` comes
//! before any trim) is left alone.
//! Counts include the additions under way. Ties go to the lowest ids: the same view
//! gives the same moves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::liveness::LeaderView;
use crate::operator::{eligible_nodes, move_pairs, within_band, Operators};
use crate::repair::ReplicaMove;
use crate::state::MetaState;

/// Replica balancing operators under way at most (each may stream a snapshot).
pub const REPLICA_BALANCE_INFLIGHT_MAX: usize = 32;

/// Nodes whose bytes are within this of the mean are balanced by bytes whatever 10% of
/// the mean is: a move costs a snapshot, not worth a few MiB.
pub const BYTES_BAND_MIN: u64 = 16 << 20;

/// Groups smaller than this are not moved for bytes (an operator for a few MiB is not
/// worth it; many small groups on a node are the count balancing's).
pub const BYTES_MOVE_MIN: u64 = 4 << 20;

/// The replica balancer's next moves (at most `max`), as the module doc says. `down`
/// are the nodes down for `--down-after` (none of them may host a replica for the
/// balancer to act).
pub fn balance_replicas(
    state: &MetaState,
    view: &LeaderView,
    ops: &Operators,
    now: Instant,
    down: &[u64],
    replication: usize,
    max: usize,
) -> Vec<ReplicaMove> {
    let routes = state.routes();
    let draining = state.draining_nodes();
    let leaving = |n: u64| down.contains(&n) || draining.contains(&n);
    if max == 0 {
        return Vec::new();
    }
    let eligible: BTreeSet<u64> = eligible_nodes(state, view, now, leaving)
        .into_iter()
        .collect();
    // A group's size: the largest its listed replicas report (a node that left keeps
    // its last report in the view).
    let sizes: BTreeMap<u64, u64> = routes
        .iter()
        .map(|(&g, route)| {
            let b = route
                .replicas
                .iter()
                .filter_map(|r| view.replica(r.node_id, g))
                .map(|r| r.approximate_bytes)
                .max()
                .unwrap_or(0);
            (g, b)
        })
        .collect();
    let size = |g: u64| sizes.get(&g).copied().unwrap_or(0);
    let mut load = Load {
        count: eligible.iter().map(|&n| (n, 0)).collect(),
        bytes: eligible.iter().map(|&n| (n, 0)).collect(),
    };
    for (&g, route) in routes {
        for r in &route.replicas {
            load.add(r.node_id, size(g));
        }
        // An addition under way counts for its target, once: the table lists its
        // learner from the first step on.
        let pending = ops
            .add_target(g)
            .filter(|to| !route.replicas.iter().any(|r| r.node_id == *to));
        if let Some(to) = pending {
            load.add(to, size(g));
            // A move under way no longer counts for the node it leaves (else later
            // passes would move another group off it, and overshoot).
            if let Some(from) = ops.move_source(g) {
                load.remove(from, size(g));
            }
        }
    }
    // Groups the balancer may touch: no operator, a live leader, every member alive.
    // Groups the balancer may touch: no operator, a live leader, every member alive, and
    // none on a down or draining node (those are repair's).
    let movable = |g: u64| {
        let route = &routes[&g];
        !ops.busy(g)
            && !ops.asked_lately(g, now)
            && view.leader(g).is_some_and(|l| view.is_alive(l, now))
            && route
                .replicas
                .iter()
                .all(|r| view.is_alive(r.node_id, now) && !leaving(r.node_id))
    };
    let mut moves = Vec::new();
    let mut touched: BTreeSet<u64> = BTreeSet::new();
    for (&g, route) in routes {
        if moves.len() >= max {
            return moves;
        }
        if !movable(g) {
            continue;
        }
        let voters: Vec<u64> = crate::operator::voters_of(route);
        let m = if let Some(&learner) = route.learners.iter().min() {
            if voters.len() < replication && eligible.contains(&learner) {
                ReplicaMove::Add {
                    group: g,
                    to: learner,
                }
            } else {
                ReplicaMove::Remove {
                    group: g,
                    node: learner,
                }
            }
        } else if voters.len() < replication {
            // Short of voters (a replica removed by hand, say): one more on the least
            // loaded eligible node that lacks one.
            let Some(to) = load
                .count
                .iter()
                .filter(|(&n, _)| !route.replicas.iter().any(|r| r.node_id == n))
                .min_by_key(|(&n, &c)| (c, load.bytes[&n], n))
                .map(|(&n, _)| n)
            else {
                continue;
            };
            load.add(to, size(g));
            ReplicaMove::Add { group: g, to }
        } else if voters.len() > replication {
            // The node a move meant; else the most loaded, among those a follower (a
            // leader would hand its leadership over first), then the highest id.
            let leader = view.leader(g);
            let hinted = ops.trim_hint(g, now).filter(|n| voters.contains(n));
            let node = hinted
                .or_else(|| {
                    voters.iter().copied().max_by_key(|&n| {
                        let c = load.count.get(&n).copied().unwrap_or(0);
                        (c, leader != Some(n), n)
                    })
                })
                .unwrap_or(0);
            load.remove(node, size(g));
            ReplicaMove::Remove { group: g, node }
        } else {
            continue;
        };
        touched.insert(g);
        moves.push(m);
    }
    if load.count.len() < 2 {
        return moves;
    }
    let fits = |g: u64, from: u64, to: u64, touched: &BTreeSet<u64>| {
        let route = &routes[&g];
        let on = |n: u64| route.replicas.iter().any(|r| r.node_id == n);
        on(from)
            && !on(to)
            && route.learners.is_empty()
            && route.replicas.len() <= replication
            && !touched.contains(&g)
            && !ops.held_for_merge(g)
            && movable(g)
    };
    while moves.len() < max && !within_band(&load.count) {
        let found = move_pairs(&load.count).into_iter().find_map(|(from, to)| {
            // Of the groups that fit, the one leaving the two nodes' bytes closest.
            let (bf, bt) = (load.bytes[&from] as i128, load.bytes[&to] as i128);
            routes
                .keys()
                .filter(|&&g| fits(g, from, to, &touched))
                .min_by_key(|&&g| ((bf - bt - 2 * i128::from(size(g))).abs(), g))
                .map(|&g| (g, from, to))
        });
        let Some((group, from, to)) = found else {
            break;
        };
        touched.insert(group);
        moves.push(ReplicaMove::Move { group, from, to });
        load.shift(from, to, size(group));
    }
    // The groups each node could give by bytes, largest first (those that fit any move:
    // big enough, no learner, not over `replication`, movable).
    let mut giving: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    if !load.bytes_within_band() {
        for (&g, route) in routes {
            let s = size(g);
            let fit = s >= BYTES_MOVE_MIN
                && route.learners.is_empty()
                && route.replicas.len() <= replication
                && movable(g);
            if fit {
                for r in &route.replicas {
                    giving.entry(r.node_id).or_default().push((s, g));
                }
            }
        }
    }
    while moves.len() < max && !load.bytes_within_band() {
        let (lo, hi) = band(&load.bytes, BYTES_BAND_MIN as f64);
        let (count_lo, count_hi) = band(&load.count, 1.0);
        let mut heavy: Vec<(u64, u64)> = load.bytes.iter().map(|(&n, &b)| (b, n)).collect();
        heavy.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut light = heavy.clone();
        light.sort_unstable();
        let found = heavy.iter().find_map(|&(from_bytes, from)| {
            light.iter().find_map(|&(to_bytes, to)| {
                let out_of_band = from_bytes as f64 > hi || (to_bytes as f64) < lo;
                let counts_stay = load.count[&to] as f64 + 1.0 <= count_hi
                    && load.count[&from] as f64 - 1.0 >= count_lo;
                if to_bytes >= from_bytes || !out_of_band || !counts_stay {
                    return None;
                }
                // Under the difference, so the spread narrows; nearest half of it.
                let gap = from_bytes - to_bytes;
                giving
                    .get(&from)?
                    .iter()
                    .filter(|&&(s, g)| s < gap && fits(g, from, to, &touched))
                    .min_by_key(|&&(s, g)| (s.saturating_mul(2).abs_diff(gap), g))
                    .map(|&(_, g)| (g, from, to))
            })
        });
        let Some((group, from, to)) = found else {
            break;
        };
        touched.insert(group);
        moves.push(ReplicaMove::Move { group, from, to });
        load.shift(from, to, size(group));
    }
    moves
}

/// The eligible nodes' replica counts and bytes, as the moves decided so far leave them.
struct Load {
    count: BTreeMap<u64, usize>,
    bytes: BTreeMap<u64, u64>,
}

impl Load {
    /// A replica of a group of `bytes` on `node` (nothing if it is not eligible).
    fn add(&mut self, node: u64, bytes: u64) {
        if let (Some(c), Some(b)) = (self.count.get_mut(&node), self.bytes.get_mut(&node)) {
            *c += 1;
            *b = b.saturating_add(bytes);
        }
    }

    /// One fewer on `node`.
    fn remove(&mut self, node: u64, bytes: u64) {
        if let (Some(c), Some(b)) = (self.count.get_mut(&node), self.bytes.get_mut(&node)) {
            *c = c.saturating_sub(1);
            *b = b.saturating_sub(bytes);
        }
    }

    /// A replica of a group of `bytes` moved from `from` to `to`.
    fn shift(&mut self, from: u64, to: u64, bytes: u64) {
        self.remove(from, bytes);
        self.add(to, bytes);
    }

    /// Whether every node's bytes are within `max(10% of the mean, BYTES_BAND_MIN)` of
    /// the mean.
    fn bytes_within_band(&self) -> bool {
        let (lo, hi) = band(&self.bytes, BYTES_BAND_MIN as f64);
        self.bytes
            .values()
            .all(|&b| (lo..=hi).contains(&(b as f64)))
    }
}

/// The band `mean ± max(10% of the mean, min_slack)` of the nodes' `values`.
fn band<V: Copy + TryInto<u64>>(values: &BTreeMap<u64, V>, min_slack: f64) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let sum: f64 = values
        .values()
        .map(|&v| v.try_into().unwrap_or(u64::MAX) as f64)
        .sum();
    let mean = sum / values.len() as f64;
    let slack = (mean / 10.0).max(min_slack);
    (mean - slack, mean + slack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::tests::{cluster, report, set_route, view};
    use crate::operator::{Origin, Outcome};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn counts(st: &MetaState) -> BTreeMap<u64, usize> {
        let mut c: BTreeMap<u64, usize> = st.nodes().keys().map(|&n| (n, 0)).collect();
        for r in st.routes().values() {
            for x in &r.replicas {
                *c.entry(x.node_id).or_default() += 1;
            }
        }
        c
    }

    /// Applies moves to the table as the operators would carry them out (a move's trim
    /// at once).
    fn apply(st: &mut MetaState, moves: &[ReplicaMove]) {
        for m in moves {
            let (g, route) = (m.group(), st.routes()[&m.group()].clone());
            let mut voters: Vec<u64> = route
                .replicas
                .iter()
                .map(|r| r.node_id)
                .filter(|n| !route.learners.contains(n))
                .collect();
            let mut learners = route.learners.clone();
            match *m {
                ReplicaMove::Add { to, .. } => {
                    learners.retain(|&n| n != to);
                    voters.push(to);
                }
                ReplicaMove::Remove { node, .. } => {
                    voters.retain(|&n| n != node);
                    learners.retain(|&n| n != node);
                }
                ReplicaMove::Move { from, to, .. } => {
                    assert!(voters.contains(&from) && !voters.contains(&to), "{m:?}");
                    voters.retain(|&n| n != from);
                    voters.push(to);
                }
            }
            set_route(st, g, &voters, &learners);
        }
    }

    const MIB: u64 = 1 << 20;

    /// A view as `view`'s, with group `g`'s replicas reporting `size(g)` bytes.
    fn sized_view(
        st: &MetaState,
        now: Instant,
        leader_of: impl Fn(u64) -> u64,
        size: impl Fn(u64) -> u64,
    ) -> LeaderView {
        let mut v = LeaderView::default();
        for &id in st.nodes().keys() {
            let mut reps = report(st, id, &leader_of);
            for r in &mut reps {
                r.approximate_bytes = size(r.group_id);
            }
            v.record(now, id, phoenix_proto::NodeStats::default(), &reps);
        }
        v
    }

    /// Each eligible node's bytes as the table places the groups.
    fn bytes(st: &MetaState, size: impl Fn(u64) -> u64) -> BTreeMap<u64, u64> {
        let mut b: BTreeMap<u64, u64> = st.nodes().keys().map(|&n| (n, 0)).collect();
        for (&g, r) in st.routes() {
            for x in &r.replicas {
                *b.entry(x.node_id).or_default() += size(g);
            }
        }
        b
    }

    /// Eight groups over four nodes, six replicas each: groups 1 and 2 on nodes 1-3,
    /// the others with node 4 in each.
    fn two_big_on_three(g: u64) -> Vec<u64> {
        match g {
            1 | 2 => vec![1, 2, 3],
            3 | 4 => vec![1, 2, 4],
            5 | 6 => vec![1, 3, 4],
            _ => vec![2, 3, 4],
        }
    }

    /// Groups 1 and 2 are 100 MiB, the others 1 MiB.
    fn two_big_size(g: u64) -> u64 {
        if g <= 2 {
            100 * MIB
        } else {
            MIB
        }
    }

    /// Counts balanced, bytes not: two 100 MiB groups on nodes 1-3 and six 1 MiB ones
    /// with node 4 in each. The big group moves to node 4 (its size nearest half the
    /// gap), the counts stay in their band, and balancing stops where no placement does
    /// better (six 100 MiB replicas over four nodes cannot be within 10%).
    #[test]
    fn bytes_even_out_while_counts_stay_in_band() {
        let now = Instant::now();
        let (place, size) = (two_big_on_three, two_big_size);
        let mut st = cluster(4, 8, place);
        assert_eq!(
            counts(&st).into_values().collect::<Vec<_>>(),
            vec![6, 6, 6, 6]
        );
        let v = sized_view(&st, now, |_| 1, size);
        let moves = balance_replicas(&st, &v, &Operators::default(), now, &[], 3, 1);
        assert_eq!(
            moves,
            vec![ReplicaMove::Move {
                group: 1,
                from: 1,
                to: 4
            }]
        );
        // Group 1 held for a merge's alignment: the other big one goes instead; both
        // held, nothing big moves.
        let mut held = Operators::default();
        held.set_merge_pair(Some([1, 3]));
        let moves = balance_replicas(&st, &v, &held, now, &[], 3, 1);
        assert_eq!(moves[0].group(), 2, "{moves:?}");
        held.set_merge_pair(Some([1, 2]));
        let moves = balance_replicas(&st, &v, &held, now, &[], 3, 1);
        assert!(moves.iter().all(|m| m.group() > 2), "{moves:?}");
        // Without sizes nothing moves: the counts are balanced.
        let flat = view(&st, now, |_| 1);
        assert_eq!(
            balance_replicas(&st, &flat, &Operators::default(), now, &[], 3, 10),
            vec![]
        );
        for step in 0..20 {
            let v = sized_view(&st, now, |g| st.routes()[&g].replicas[0].node_id, size);
            let moves = balance_replicas(&st, &v, &Operators::default(), now, &[], 3, 10);
            if moves.is_empty() {
                break;
            }
            assert!(step < 19, "balancing by bytes does not end");
            apply(&mut st, &moves);
        }
        let c = counts(&st);
        assert!(within_band(&c), "{c:?}");
        // The 100 MiB replicas are two, two, one, one (in MiB: 202-ish twice, 10x twice).
        let mut b: Vec<u64> = bytes(&st, size).into_values().map(|b| b / MIB).collect();
        b.sort_unstable();
        assert!(b[1] < 200 && b[2] >= 200, "{b:?}");
    }

    /// A move's trim removes the replica the move meant: with the counts balanced, the
    /// node that took the group counts the most after the addition and would be trimmed
    /// (undoing the move) were the operators not to name the node it left.
    #[test]
    fn a_move_is_trimmed_from_the_node_it_left() {
        let now = Instant::now();
        let (place, size) = (two_big_on_three, two_big_size);
        let mut st = cluster(4, 8, place);
        let members: [u64; 0] = [];
        let v = sized_view(&st, now, |_| 2, size);
        let mut ops = Operators::default();
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 1);
        let [ReplicaMove::Move { group, from, to }] = moves[..] else {
            panic!("{moves:?}");
        };
        assert_eq!((group, from, to), (1, 1, 4));
        assert_eq!(
            ops.move_replica(&st, &v, &members, group, from, to, now, Origin::Balance),
            Ok(true)
        );
        let listed = ops.list(now);
        assert_eq!((listed[0].from_node, listed[0].to_node), (1, 4));
        // The new replica votes: four voters, node 4 now hosting 7.
        set_route(&mut st, 1, &[1, 2, 3, 4], &[]);
        let v = sized_view(&st, now, |_| 2, size);
        assert_eq!(ops.settle(&st, &v, now), vec![(1, Outcome::Done)]);
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 1);
        assert_eq!(moves, vec![ReplicaMove::Remove { group: 1, node: 1 }]);
        // Without the hint (a new meta leader) the most loaded goes: node 4.
        let fresh = Operators::default();
        assert_eq!(
            balance_replicas(&st, &v, &fresh, now, &[], 3, 1),
            vec![ReplicaMove::Remove { group: 1, node: 4 }]
        );
        // The hint lasts until the trim is done (one given up leaves it), or
        // TRIM_HINT_FOR.
        assert_eq!(ops.trim_hint(1, now), Some(1));
        let later = now + crate::operator::TRIM_HINT_FOR;
        assert_eq!(ops.trim_hint(1, later), None);
        assert_eq!(
            ops.remove_replica(&st, &v, &members, 1, 1, now, Origin::Balance),
            Ok(true)
        );
        assert_eq!(ops.trim_hint(1, now), Some(1));
        set_route(&mut st, 1, &[2, 3, 4], &[]);
        let v = sized_view(&st, now, |_| 2, size);
        assert_eq!(ops.settle(&st, &v, now), vec![(1, Outcome::Done)]);
        assert_eq!(ops.trim_hint(1, now), None);
    }

    /// Two empty nodes join three that host 10 groups: replicas move to them, each by an
    /// addition then a trim from the most loaded node, until every node is in the band.
    #[test]
    fn new_nodes_take_their_share() {
        let now = Instant::now();
        let mut st = cluster(5, 10, |_| vec![1, 2, 3]);
        let ops = Operators::default();
        let v = view(&st, now, |_| 1);
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 100);
        // 30 replicas over 5 nodes: 6 each; 4 and 5 take 5 groups each... within 1.
        assert!(
            moves
                .iter()
                .all(|m| matches!(m, ReplicaMove::Move { to: 4 | 5, .. })),
            "{moves:?}"
        );
        assert_eq!(balance_replicas(&st, &v, &ops, now, &[], 3, 3), moves[..3]);
        for _ in 0..10 {
            let v = view(&st, now, |g| st.routes()[&g].replicas[0].node_id);
            let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 100);
            if moves.is_empty() {
                break;
            }
            apply(&mut st, &moves);
        }
        let c = counts(&st);
        assert!(c.values().all(|&n| (5..=7).contains(&n)), "{c:?}");
        assert!(st.routes().values().all(|r| r.replicas.len() == 3));
    }

    /// Nothing moves while a node down hosts a replica (repair first), for groups under
    /// an operator, or in a balanced cluster; extra voters and leftover learners go.
    #[test]
    fn balancing_waits_for_repair_and_trims_extras() {
        let now = Instant::now();
        let mut st = cluster(4, 4, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        // Every group has a replica on node 3, down: all of them are repair's.
        assert_eq!(balance_replicas(&st, &v, &ops, now, &[3], 3, 10), vec![]);
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Balance),
            Ok(true)
        );
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 10);
        assert!(moves
            .iter()
            .all(|m| !matches!(m, ReplicaMove::Add { group: 1, .. })));
        // Group 2 has a fourth voter, group 3 a learner on node 4, group 4 a learner
        // while it lacks a voter.
        set_route(&mut st, 2, &[1, 2, 3, 4], &[]);
        set_route(&mut st, 3, &[1, 2, 3], &[4]);
        set_route(&mut st, 4, &[1, 2], &[4]);
        let v = view(&st, now, |_| 1);
        let moves = balance_replicas(&st, &v, &Operators::default(), now, &[], 3, 10);
        assert_eq!(
            moves[..3],
            [
                // Nodes 1 and 2 host 4 each: node 2, a follower.
                ReplicaMove::Remove { group: 2, node: 2 },
                ReplicaMove::Remove { group: 3, node: 4 },
                ReplicaMove::Add { group: 4, to: 4 },
            ]
        );
        // Balanced: 4 groups of 3 over 4 nodes, 3 each.
        let st = cluster(4, 4, |g| (1..=4).filter(|&n| n != g).collect());
        let v = view(&st, now, |g| if g == 1 { 2 } else { 1 });
        assert_eq!(
            balance_replicas(&st, &v, &Operators::default(), now, &[], 3, 10),
            vec![]
        );
    }

    /// A user's addition that made a fourth voter is not trimmed while the removal half
    /// of a `cluster move` may still come, and is after; a group short of a voter gets
    /// one on the least loaded node; an addition under way counts once for its target.
    #[test]
    fn a_users_move_is_not_cut_in_between() {
        let now = Instant::now();
        let mut st = cluster(4, 2, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(true)
        );
        // Its learner in the table and the addition under way: node 4 counts 1, not 2
        // (else a 4-node cluster with 6 replicas would look balanced from node 4's side).
        set_route(&mut st, 1, &[1, 2, 3], &[4]);
        let v = view(&st, now, |_| 1);
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 10);
        assert!(
            moves
                .iter()
                .all(|m| !matches!(m, ReplicaMove::Remove { node: 4, .. })),
            "{moves:?}"
        );
        set_route(&mut st, 1, &[1, 2, 3, 4], &[]);
        let v = view(&st, now, |_| 1);
        assert_eq!(ops.settle(&st, &v, now).len(), 1);
        assert!(ops.asked_lately(1, now));
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 10);
        assert!(
            moves
                .iter()
                .all(|m| !matches!(m, ReplicaMove::Remove { group: 1, .. })),
            "{moves:?}"
        );
        let later = now + crate::operator::ASKED_GRACE;
        let v = view(&st, later, |_| 1);
        let moves = balance_replicas(&st, &v, &ops, later, &[], 3, 10);
        // (From the most loaded of its nodes: node 4 hosts the fewest.)
        assert!(
            moves.contains(&ReplicaMove::Remove { group: 1, node: 3 }),
            "{moves:?}"
        );
        // Group 2 loses a voter by hand: it gets one back, on node 4 (the least loaded).
        set_route(&mut st, 1, &[1, 2, 3], &[]);
        set_route(&mut st, 2, &[1, 2], &[]);
        let v = view(&st, later, |_| 1);
        assert_eq!(
            balance_replicas(&st, &v, &Operators::default(), later, &[], 3, 10),
            vec![ReplicaMove::Add { group: 2, to: 4 }]
        );
    }

    /// A group repair cannot mend (its down node's replica has nowhere to go) does not
    /// stop the balancing of the others; a draining node's groups are left to repair.
    #[test]
    fn balancing_goes_on_beside_a_repair_that_cannot_finish() {
        let now = Instant::now();
        // Group 1 on 1, 2, 3 with node 3 down; groups 2-7 on 1, 2, 4; node 5 empty.
        let st = cluster(5, 7, |g| if g == 1 { vec![1, 2, 3] } else { vec![1, 2, 4] });
        let v = view(&st, now, |_| 1);
        let moves = balance_replicas(&st, &v, &Operators::default(), now, &[3], 3, 10);
        assert!(!moves.is_empty(), "nothing balanced while node 3 is down");
        assert!(moves.iter().all(|m| m.group() != 1), "{moves:?}");
        assert!(
            moves
                .iter()
                .all(|m| matches!(m, ReplicaMove::Move { to: 5, .. })),
            "{moves:?}"
        );
    }

    /// Additions under way count once for their target: with three of them on their
    /// way to an empty node (learners in the table), the node counts 3, not 6, and gets
    /// more.
    #[test]
    fn additions_under_way_count_once() {
        let now = Instant::now();
        let mut st = cluster(4, 6, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        for g in 1..=3 {
            assert_eq!(
                ops.add_replica(&st, &v, &[], g, 4, now, Origin::Balance),
                Ok(true)
            );
            set_route(&mut st, g, &[1, 2, 3], &[4]);
        }
        let v = view(&st, now, |_| 1);
        let moves = balance_replicas(&st, &v, &ops, now, &[], 3, 10);
        assert!(
            moves.iter().any(|m| matches!(
                m,
                ReplicaMove::Move {
                    group: 4..=6,
                    to: 4,
                    ..
                }
            )),
            "{moves:?}"
        );
    }

    /// Random placements over random node counts, balanced step by step: the moves end,
    /// every group keeps `replication` replicas on distinct nodes, and every node ends
    /// within the band (or the layout allows no better). `PHOENIX_SEED` replays a run.
    #[test]
    fn random_placements_end_balanced() {
        let seed = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        eprintln!("PHOENIX_SEED={seed}");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let now = Instant::now();
        for round in 0..100 {
            let n = rng.gen_range(3..=8u64);
            let groups = rng.gen_range(1..=40u64);
            // Placed on the first nodes mostly: lopsided.
            let placements: Vec<Vec<u64>> = (0..groups)
                .map(|_| {
                    let mut nodes: Vec<u64> = (1..=n).collect();
                    for i in (1..nodes.len()).rev() {
                        nodes.swap(i, rng.gen_range(0..=i));
                    }
                    nodes.truncate(3);
                    if rng.gen_bool(0.6) {
                        vec![1, 2, 3]
                    } else {
                        nodes
                    }
                })
                .collect();
            let mut st = cluster(n, groups, |g| placements[g as usize - 1].clone());
            // Sizes: empty, small, or up to 200 MiB.
            let sizes: Vec<u64> = (0..groups)
                .map(|_| match rng.gen_range(0..3) {
                    0 => 0,
                    1 => rng.gen_range(0..8 * MIB),
                    _ => rng.gen_range(0..200 * MIB),
                })
                .collect();
            let size = |g: u64| sizes[g as usize - 1];
            for step in 0.. {
                assert!(
                    step < 500,
                    "seed {seed} round {round}: balancing does not end"
                );
                let v = sized_view(&st, now, |g| st.routes()[&g].replicas[0].node_id, size);
                let moves =
                    balance_replicas(&st, &v, &Operators::default(), now, &[], 3, 1 + step % 5);
                if moves.is_empty() {
                    break;
                }
                apply(&mut st, &moves);
            }
            for (g, r) in st.routes() {
                let mut on: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
                on.sort_unstable();
                on.dedup();
                assert_eq!(on.len(), 3, "seed {seed} round {round} group {g}: {r:?}");
            }
            let c = counts(&st);
            let mean = c.values().sum::<usize>() as f64 / c.len() as f64;
            let slack = (mean / 10.0).max(1.0);
            let (lo, hi) = (*c.values().min().unwrap(), *c.values().max().unwrap());
            let within = hi as f64 <= mean + slack && lo as f64 >= mean - slack;
            // Out of the band only when no group can go from a node to one hosting at
            // least two fewer.
            let stuck = c.iter().all(|(&a, &ca)| {
                c.iter().all(|(&b, &cb)| {
                    ca < cb + 2
                        || st.routes().values().all(|r| {
                            let on = |n: u64| r.replicas.iter().any(|x| x.node_id == n);
                            !on(a) || on(b)
                        })
                })
            });
            assert!(within || stuck, "seed {seed} round {round}: counts {c:?}");
            // By bytes: within the band, or no group of at least BYTES_MOVE_MIN can go
            // from a heavier node to a lighter one (one of them out of the band) under
            // their difference with both counts staying in their band.
            let b = bytes(&st, size);
            let (lo, hi) = band(&b, BYTES_BAND_MIN as f64);
            let (clo, chi) = band(&c, 1.0);
            let bytes_stuck = b.iter().all(|(&x, &bx)| {
                b.iter().all(|(&y, &by)| {
                    let gap = bx.saturating_sub(by);
                    let pair = by < bx
                        && (bx as f64 > hi || (by as f64) < lo)
                        && c[&y] as f64 + 1.0 <= chi
                        && c[&x] as f64 - 1.0 >= clo;
                    !pair
                        || st.routes().iter().all(|(&g, r)| {
                            let on = |n: u64| r.replicas.iter().any(|z| z.node_id == n);
                            !on(x) || on(y) || !(BYTES_MOVE_MIN..gap).contains(&size(g))
                        })
                })
            });
            let bytes_within = b.values().all(|&v| (lo..=hi).contains(&(v as f64)));
            assert!(
                bytes_within || bytes_stuck,
                "seed {seed} round {round}: bytes {b:?}"
            );
        }
    }
}
