//! Replica scrubbing, the meta leader's half: when to ask a group's leader for a scrub
//! point, and what the replicas' checksums say (PolarCtrl's scrubbing, TiKV's
//! consistency check). The nodes' half (the scrub point in the log, the checksum at it)
//! is the server's `scrub.rs`.
//!
//! Soft state, as the operators: a new meta leader starts empty. A group whose replicas
//! report the age of their last scrub is next due one interval after it; one never
//! scrubbed (or whose nodes restarted since) is due at a point of the first interval
//! set by its id, so a leader change does not scrub everything at once. At most
//! [`SCRUB_INFLIGHT_MAX`] scheduled scrubs are under way (each reads a whole group on
//! every replica).
//!
//! A scrub is asked for only once every replica the routing table lists on a live node
//! has reported, and is *past* the highest applied index or scrub index any replica
//! reported then (`before`): an older result (yesterday's scrub, reported to a meta
//! leader new in office) is never taken for the new one. It is done when every replica
//! it waits for — listed in the table, on a live node, reported running — reports a
//! scrub past `before` (a dead or stopped replica cannot apply the scrub point), or
//! given up after [`SCRUB_TIMEOUT`]. A replica that applied past the point without a
//! checksum there (its node restarted, or it took a snapshot past the point) never
//! reports it: the scrub is asked again, past everything applied. The request goes to the group's leader until its
//! leader reports a scrub past `before`: once, and again after [`SCRUB_RESEND`] (a lost
//! answer, a new leader); a duplicate scrub point costs a second scan, nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use phoenix_proto::{
    placement_command, PlacementCommand, ReplicaStats, ScrubGroup, ScrubGroupResponse,
    ScrubMismatch, ScrubReport,
};

use crate::liveness::LeaderView;
use crate::state::MetaState;

/// Scrubs under way at most, over the cluster.
pub const SCRUB_INFLIGHT_MAX: usize = 2;

/// A scrub not done within this is given up (counted as done for its interval).
pub const SCRUB_TIMEOUT: Duration = Duration::from_secs(120);

/// A scrub request without a result is sent again after this.
pub const SCRUB_RESEND: Duration = Duration::from_secs(15);

/// Times one scrub is asked again because a replica missed its point, at most (each
/// costs every replica a scan; a replica that keeps missing points, catching up by
/// snapshots, is waited out to [`SCRUB_TIMEOUT`] after that).
pub const SCRUB_REASKS_MAX: u32 = 3;

#[derive(Debug, Clone)]
struct Asked {
    at: Instant,
    /// When the request last went to a leader (None: not yet).
    sent: Option<Instant>,
    /// The highest scrub index any replica of the group reported when asked.
    before: u64,
    /// Times asked again because a replica missed the point.
    reasked: u32,
}

/// The replicas of `group` a scrub waits for: those the routing table lists (voters
/// and learners), on nodes alive at `now`, reported and running. None when the group is
/// not in the table, or a replica listed on a live node has not reported it yet. A node
/// not heard from at all counts as alive (to be waited for) while `new_in_office`: a
/// meta leader new in office has not heard from every node yet.
fn waited(
    state: &MetaState,
    view: &LeaderView,
    group: u64,
    now: Instant,
    new_in_office: bool,
) -> Option<Vec<ReplicaStats>> {
    let route = state.routes().get(&group)?;
    let mut out = Vec::new();
    for r in &route.replicas {
        let unheard = view.last_heartbeat(r.node_id).is_none();
        let awaited = view.is_alive(r.node_id, now) || (unheard && new_in_office);
        if !awaited {
            continue;
        }
        let rep = view.replica(r.node_id, group)?;
        if rep.stopped.is_empty() {
            out.push(rep.clone());
        }
    }
    Some(out)
}

/// Whether every replica `waited` reports a scrub past `before` (and there is one).
fn done(waited: &[ReplicaStats], before: u64) -> bool {
    !waited.is_empty() && waited.iter().all(|r| r.scrub_index > before)
}

/// Whether a replica `waited` missed the scrub point past `before` that another one
/// reported: it applied past the point, has no checksum there and none under way (its
/// node restarted after applying the point, or it took a snapshot past it). It would
/// never report that point.
fn missed(waited: &[ReplicaStats], before: u64) -> bool {
    let Some(point) = waited
        .iter()
        .map(|r| r.scrub_index)
        .filter(|&i| i > before)
        .min()
    else {
        return false;
    };
    waited
        .iter()
        .any(|r| r.applied_index >= point && r.scrub_index < point && r.scrub_running_index < point)
}

/// The highest applied or scrub index any replica of `group` reported: a scrub asked
/// now is past it.
fn high_water(view: &LeaderView, group: u64) -> u64 {
    view.replicas_of(group)
        .iter()
        .map(|r| r.applied_index.max(r.scrub_index))
        .max()
        .unwrap_or(0)
}

/// The meta leader's scrub schedule.
#[derive(Debug, Default)]
pub struct Scrubs {
    /// Scrubs under way, by group.
    asked: BTreeMap<u64, Asked>,
    /// When each group seen was last scrubbed (asked), or its first scrub's origin.
    last: HashMap<u64, Instant>,
    /// Mismatches already returned by `new_mismatches`: (group, index).
    logged: BTreeSet<(u64, u64)>,
    /// When this schedule was first used: this meta leader's time in office, near
    /// enough (it is made anew when the leadership changes).
    since: Option<Instant>,
}

impl Scrubs {
    /// Whether a node not heard from may still report (this meta leader is new, see
    /// [`waited`]); counts the time in office from the first call.
    fn new_in_office(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        now.saturating_duration_since(since) < crate::liveness::ALIVE_WITHIN
    }

    /// Asks for a scrub of `group` now (a user's request, or the schedule's). Returns
    /// `before`: the scrub asked for is the first every waited replica reports past it
    /// (see the module doc). None (nothing asked) while a replica listed on a live node
    /// has not reported the group: ask again after the next heartbeats. Asking again
    /// while one is under way joins it; once it is done (even if not settled yet), asks
    /// for another.
    pub fn ask(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        group: u64,
        now: Instant,
    ) -> Option<u64> {
        let new = self.new_in_office(now);
        let waited = waited(state, view, group, now, new)?;
        if let Some(a) = self.asked.get(&group) {
            if !done(&waited, a.before) {
                return Some(a.before);
            }
        }
        let before = high_water(view, group);
        self.asked.insert(
            group,
            Asked {
                at: now,
                sent: None,
                before,
                reasked: 0,
            },
        );
        Some(before)
    }

    /// The outcome of the scrub of `group` asked past `before`, once every waited
    /// replica reported the same scrub point past it (None: not yet).
    pub fn outcome(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        group: u64,
        before: u64,
        now: Instant,
    ) -> Option<ScrubGroupResponse> {
        let new = self.new_in_office(now);
        let waited = waited(state, view, group, now, new)?;
        let index = waited.first()?.scrub_index;
        if index <= before || waited.iter().any(|r| r.scrub_index != index) {
            return None;
        }
        let route = state.routes().get(&group)?;
        let replicas: Vec<ScrubReport> = waited.iter().map(scrub_report).collect();
        // Consistent: every voter of the table reported it, all alike.
        let voters_all = route
            .replicas
            .iter()
            .filter(|r| !route.learners.contains(&r.node_id))
            .all(|r| replicas.iter().any(|x| x.node_id == r.node_id));
        let consistent = voters_all && alike(&replicas);
        Some(ScrubGroupResponse {
            error: None,
            index,
            replicas,
            consistent,
        })
    }

    /// Starts the scheduled scrubs due at `now`: every group of the table is scrubbed
    /// once per `interval` (zero: never), at most [`SCRUB_INFLIGHT_MAX`] under way. A
    /// group first seen is due one interval after its last scrub as its replicas report
    /// its age, else at a point of the interval set by its id. Returns the groups
    /// asked.
    pub fn schedule(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        now: Instant,
        interval: Duration,
    ) -> Vec<u64> {
        if interval.is_zero() {
            return Vec::new();
        }
        let mut started = Vec::new();
        for &g in state.routes().keys() {
            let last = *self.last.entry(g).or_insert_with(|| {
                // The youngest scrub its replicas report (the age counts from when they
                // computed it)...
                let reported = view
                    .replicas_of(g)
                    .iter()
                    .filter(|r| r.scrub_index > 0)
                    .map(|r| Duration::from_millis(r.scrub_age_ms))
                    .min();
                match reported {
                    Some(age) => now.checked_sub(age).unwrap_or(now),
                    // ...else spread over the interval: due after (g * golden ratio mod
                    // 1) of it.
                    None => {
                        let frac = (g.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64
                            / (1u64 << 53) as f64;
                        now.checked_sub(interval.mul_f64(1.0 - frac)).unwrap_or(now)
                    }
                }
            });
            if self.asked.len() >= SCRUB_INFLIGHT_MAX {
                continue;
            }
            let due = now.saturating_duration_since(last) >= interval;
            if due
                && !self.asked.contains_key(&g)
                && view.leader(g).is_some()
                && self.ask(state, view, g, now).is_some()
            {
                self.last.insert(g, now);
                started.push(g);
            }
        }
        self.last.retain(|g, _| state.routes().contains_key(g));
        started
    }

    /// Ends the scrubs that are done (every waited replica of the group reported a scrub
    /// past `before`) or out of time; returns the groups ended, with whether done. One
    /// a waited replica [`missed`] is asked again at once, past what every replica
    /// applied (an answer waited for past the old `before` is the new point's).
    pub fn settle(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        now: Instant,
    ) -> Vec<(u64, bool)> {
        let mut ended = Vec::new();
        let new = self.new_in_office(now);
        self.asked.retain(|&g, a| {
            let waited = waited(state, view, g, now, new);
            let finished = waited.as_ref().is_some_and(|w| done(w, a.before));
            if finished || now.saturating_duration_since(a.at) >= SCRUB_TIMEOUT {
                ended.push((g, finished));
                return false;
            }
            if a.reasked < SCRUB_REASKS_MAX && waited.is_some_and(|w| missed(&w, a.before)) {
                a.before = high_water(view, g);
                a.sent = None;
                a.reasked += 1;
            }
            true
        });
        ended
    }

    /// The mismatches ([`scrub_mismatches`]) not returned before: the host logs each
    /// once.
    pub fn new_mismatches(&mut self, view: &LeaderView) -> Vec<ScrubMismatch> {
        let mut out = scrub_mismatches(view);
        let current: BTreeSet<(u64, u64)> = out.iter().map(|m| (m.group_id, m.index)).collect();
        out.retain(|m| self.logged.insert((m.group_id, m.index)));
        // (Those no longer reported are forgotten: the set stays small.)
        self.logged.retain(|k| current.contains(k));
        out
    }

    /// The scrub requests for `node`'s heartbeat answer: the scrubs under way of the
    /// groups the view says it leads, not sent lately, whose leader has not reported the
    /// scrub yet. Marks them sent.
    pub fn take_commands(
        &mut self,
        view: &LeaderView,
        node: u64,
        now: Instant,
    ) -> Vec<PlacementCommand> {
        let mut out = Vec::new();
        for (&g, a) in self.asked.iter_mut() {
            let due = a
                .sent
                .is_none_or(|s| now.saturating_duration_since(s) >= SCRUB_RESEND);
            let reported = view
                .replica(node, g)
                .is_some_and(|r| r.scrub_index > a.before);
            if due && !reported && view.leader(g) == Some(node) {
                a.sent = Some(now);
                out.push(PlacementCommand {
                    cmd: Some(placement_command::Cmd::ScrubGroup(ScrubGroup {
                        group_id: g,
                    })),
                });
            }
        }
        out
    }

    /// Whether a scrub of `group` is under way.
    pub fn under_way(&self, group: u64) -> bool {
        self.asked.contains_key(&group)
    }
}

/// A replica's scrub as reported.
pub fn scrub_report(r: &ReplicaStats) -> ScrubReport {
    ScrubReport {
        node_id: r.node_id,
        index: r.scrub_index,
        crc: r.scrub_crc,
        keys: r.scrub_keys,
        bytes: r.scrub_bytes,
        error: r.scrub_error.clone(),
    }
}

/// Whether the reports of one scrub point show the same data: every replica computed a
/// checksum (none failed) and they are equal.
fn alike(reps: &[ScrubReport]) -> bool {
    let Some(first) = reps.first() else {
        return true;
    };
    reps.iter().all(|r| {
        r.error.is_empty() && (r.crc, r.keys, r.bytes) == (first.crc, first.keys, first.bytes)
    })
}

/// The groups whose replicas reported different checksums at the same scrub point, or
/// a failed scrub (each replica reports its latest scrub only: replicas at different
/// points are not compared), by group id.
pub fn scrub_mismatches(view: &LeaderView) -> Vec<ScrubMismatch> {
    let mut by_group: BTreeMap<u64, BTreeMap<u64, Vec<ScrubReport>>> = BTreeMap::new();
    for r in view.all_replicas() {
        if r.scrub_index > 0 {
            by_group
                .entry(r.group_id)
                .or_default()
                .entry(r.scrub_index)
                .or_default()
                .push(scrub_report(r));
        }
    }
    let mut out = Vec::new();
    for (g, points) in by_group {
        for (index, mut reps) in points {
            if !alike(&reps) {
                reps.sort_by_key(|r| r.node_id);
                out.push(ScrubMismatch {
                    group_id: g,
                    index,
                    replicas: reps,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::tests::{cluster, report};
    use phoenix_proto::NodeStats;

    /// A view where node `id`'s replica of group `g` reports scrub `scrub(id, g)`:
    /// (index, crc).
    fn scrub_view(
        st: &MetaState,
        now: Instant,
        scrub: impl Fn(u64, u64) -> (u64, u32),
    ) -> LeaderView {
        let mut v = LeaderView::default();
        for &id in st.nodes().keys() {
            let mut reps = report(st, id, &|_| 1);
            for r in &mut reps {
                (r.scrub_index, r.scrub_crc) = scrub(id, r.group_id);
                r.scrub_keys = 10;
            }
            v.record(now, id, NodeStats::default(), &reps);
        }
        v
    }

    /// Replicas at the same point with different checksums are a mismatch; replicas at
    /// different points are not compared; agreeing ones are not reported.
    #[test]
    fn mismatches_compare_replicas_at_the_same_point() {
        let now = Instant::now();
        let st = cluster(3, 3, |_| vec![1, 2, 3]);
        let v = scrub_view(&st, now, |node, g| match (g, node) {
            // Group 1: all agree at 7.
            (1, _) => (7, 0xaa),
            // Group 2: node 3 differs at 9.
            (2, 3) => (9, 0xbb),
            (2, _) => (9, 0xaa),
            // Group 3: node 3 is at an older point with another checksum: not compared.
            (3, 3) => (5, 0xcc),
            _ => (8, 0xaa),
        });
        let m = scrub_mismatches(&v);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].group_id, m[0].index), (2, 9));
        assert_eq!(
            m[0].replicas
                .iter()
                .map(|r| (r.node_id, r.crc))
                .collect::<Vec<_>>(),
            vec![(1, 0xaa), (2, 0xaa), (3, 0xbb)]
        );
        // Said once.
        let mut s = Scrubs::default();
        assert_eq!(s.new_mismatches(&v), m);
        assert_eq!(s.new_mismatches(&v), vec![]);
    }

    /// A replica whose scrub failed (e.g. a block checksum did not match) is listed as a
    /// mismatch, even where the others agree, and a scrub asked for is not consistent.
    #[test]
    fn a_failed_scrub_is_a_mismatch() {
        let now = Instant::now();
        let st = cluster(3, 1, |_| vec![1, 2, 3]);
        let mut v = LeaderView::default();
        for &id in st.nodes().keys() {
            let mut reps = report(&st, id, &|_| 1);
            for r in &mut reps {
                (r.scrub_index, r.scrub_crc, r.scrub_keys) = (12, 0xaa, 10);
                if id == 2 {
                    (r.scrub_crc, r.scrub_keys) = (0, 0);
                    r.scrub_error = "corruption: block checksum mismatch".into();
                }
            }
            v.record(now, id, NodeStats::default(), &reps);
        }
        let m = scrub_mismatches(&v);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(
            m[0].replicas[1].error,
            "corruption: block checksum mismatch"
        );
        let mut s = Scrubs::default();
        assert_eq!(s.ask(&st, &v, 1, now), Some(12));
        // (Every report is past what was asked for: taken as this scrub's.)
        let out = s.outcome(&st, &v, 1, 11, now).unwrap();
        assert!(!out.consistent, "{out:?}");
    }

    /// A scrub asked for goes to the group's leader once, again after SCRUB_RESEND
    /// while the leader has not reported it, and is done when every replica reports a
    /// scrub past `before` (the highest applied or scrub index reported when asked).
    #[test]
    fn a_scrub_is_sent_to_the_leader_and_done_when_all_report() {
        let now = Instant::now();
        let st = cluster(3, 2, |_| vec![1, 2, 3]);
        // Replicas applied up to 10 (report's default); an old scrub at 4.
        let v = scrub_view(&st, now, |_, _| (4, 1));
        let mut s = Scrubs::default();
        assert_eq!(s.ask(&st, &v, 1, now), Some(10));
        assert!(
            s.take_commands(&v, 2, now).is_empty(),
            "node 2 leads nothing"
        );
        assert_eq!(s.take_commands(&v, 1, now).len(), 1);
        assert!(s.take_commands(&v, 1, now).is_empty(), "sent once");
        assert_eq!(s.take_commands(&v, 1, now + SCRUB_RESEND).len(), 1);
        // The leader and node 2 past 10, node 3 not: not done, and not sent again.
        let v = scrub_view(&st, now, |n, _| if n == 3 { (4, 1) } else { (12, 1) });
        assert_eq!(s.settle(&st, &v, now), vec![]);
        assert!(s.under_way(1));
        assert!(s.take_commands(&v, 1, now + SCRUB_RESEND * 2).is_empty());
        assert_eq!(s.outcome(&st, &v, 1, 10, now), None);
        let v = scrub_view(&st, now, |_, _| (12, 1));
        let out = s.outcome(&st, &v, 1, 10, now).unwrap();
        assert!(out.consistent && out.index == 12 && out.replicas.len() == 3);
        // Asked again before the schedule settled it: a new scrub, after this one.
        assert_eq!(s.ask(&st, &v, 1, now), Some(12));
        assert_eq!(s.take_commands(&v, 1, now).len(), 1);
        let v = scrub_view(&st, now, |_, _| (15, 1));
        assert_eq!(s.settle(&st, &v, now), vec![(1, true)]);
        assert!(!s.under_way(1));
        // One that never completes is given up.
        s.ask(&st, &v, 2, now);
        assert_eq!(s.settle(&st, &v, now + SCRUB_TIMEOUT), vec![(2, false)]);
    }

    /// A replica past the scrub point the others reported, with neither its checksum nor
    /// one under way (its node restarted after applying the point, or it took a snapshot
    /// past it), never reports it: the scrub is asked again past what every replica
    /// applied, at once, and an answer waited for under the first `before` is the new
    /// point's.
    #[test]
    fn a_scrub_a_replica_missed_is_asked_again() {
        let now = Instant::now();
        let st = cluster(3, 1, |_| vec![1, 2, 3]);
        let v = scrub_view(&st, now, |_, _| (0, 0));
        let mut s = Scrubs::default();
        assert_eq!(s.ask(&st, &v, 1, now), Some(10));
        assert_eq!(s.take_commands(&v, 1, now).len(), 1);
        // Nodes 1 and 2 computed the point (12); node 3 applied past it (20)...
        let view = |three: (u64, u64, u64), others: u64| {
            let mut v = LeaderView::default();
            for id in [1, 2, 3] {
                let mut reps = report(&st, id, &|_| 1);
                for r in &mut reps {
                    if id == 3 {
                        (r.applied_index, r.scrub_index, r.scrub_running_index) = three;
                    } else {
                        (r.applied_index, r.scrub_index) = (20, others);
                    }
                    r.scrub_crc = 1;
                }
                v.record(now, id, NodeStats::default(), &reps);
            }
            v
        };
        // ...still computing it: waited for, nothing sent again.
        let computing = view((20, 0, 12), 12);
        assert_eq!(s.settle(&st, &computing, now), vec![]);
        assert!(s.take_commands(&computing, 1, now).is_empty());
        // Not yet applied it: the same.
        let behind = view((11, 0, 0), 12);
        assert_eq!(s.settle(&st, &behind, now), vec![]);
        assert!(s.take_commands(&behind, 1, now).is_empty());
        // Missed it (no checksum, none under way): asked again past 20, sent at once.
        let missed = view((20, 0, 0), 12);
        assert_eq!(s.settle(&st, &missed, now), vec![]);
        assert!(s.under_way(1));
        assert_eq!(s.ask(&st, &missed, 1, now), Some(20));
        assert_eq!(s.take_commands(&missed, 1, now).len(), 1);
        assert_eq!(s.outcome(&st, &missed, 1, 10, now), None);
        // Missing every new point too: asked again SCRUB_REASKS_MAX times in all, then
        // waited out.
        let mut point = 20;
        for _ in 1..SCRUB_REASKS_MAX {
            point += 10;
            let missed_again = view((point + 5, 0, 0), point);
            assert_eq!(s.settle(&st, &missed_again, now), vec![]);
            assert_eq!(s.ask(&st, &missed_again, 1, now), Some(point + 5));
        }
        let last = view((point + 15, 0, 0), point + 10);
        assert_eq!(s.settle(&st, &last, now), vec![]);
        assert_eq!(
            s.ask(&st, &last, 1, now),
            Some(point + 5),
            "not asked again"
        );
        // Every replica at the new point: done, and the first asker's answer too.
        let again = view((point + 20, point + 12, 0), point + 12);
        let out = s.outcome(&st, &again, 1, 10, now).unwrap();
        assert!(out.consistent && out.index == point + 12, "{out:?}");
        assert_eq!(s.settle(&st, &again, now), vec![(1, true)]);
    }

    /// A scrub waits for no dead or stopped replica, and is not asked while a listed
    /// replica on a live node has not reported (a meta leader new in office: an older
    /// scrub reported later must not pass for the new one).
    #[test]
    fn a_scrub_waits_for_live_running_replicas_only() {
        let now = Instant::now();
        let st = cluster(3, 1, |_| vec![1, 2, 3]);
        // Node 3 not heard from. A meta leader new in office waits for it (it may
        // just not have reported yet, and its report could carry an older scrub)...
        let mut v = LeaderView::default();
        for id in [1, 2] {
            v.record(now, id, NodeStats::default(), &report(&st, id, &|_| 1));
        }
        let mut fresh = Scrubs::default();
        assert_eq!(fresh.ask(&st, &v, 1, now), None);
        // ...one in office for ALIVE_WITHIN counts it dead.
        let mut s = Scrubs::default();
        let earlier = now - crate::liveness::ALIVE_WITHIN;
        assert!(s.settle(&st, &v, earlier).is_empty());
        assert_eq!(s.ask(&st, &v, 1, now), Some(10));
        let past = |stopped: &str| {
            let mut v = LeaderView::default();
            for id in [1, 2, 3] {
                let mut reps = report(&st, id, &|_| 1);
                for r in &mut reps {
                    r.scrub_index = if id == 3 { 0 } else { 11 };
                    if id == 3 {
                        r.stopped = stopped.to_string();
                    }
                }
                // Node 3's heartbeat is old: it counts as dead unless `stopped`.
                let at = if id == 3 && stopped.is_empty() {
                    now - crate::liveness::ALIVE_WITHIN
                } else {
                    now
                };
                v.record(at, id, NodeStats::default(), &reps);
            }
            v
        };
        // Dead node 3: done without it.
        let dead = past("");
        assert_eq!(s.outcome(&st, &dead, 1, 10, now).map(|o| o.index), Some(11));
        assert!(!s.outcome(&st, &dead, 1, 10, now).unwrap().consistent);
        assert_eq!(s.settle(&st, &dead, now), vec![(1, true)]);
        // Alive but stopped: done without it too.
        s.ask(&st, &dead, 1, now);
        let stopped = past("disk failed");
        assert_eq!(
            s.outcome(&st, &stopped, 1, 10, now).map(|o| o.index),
            Some(11)
        );
        // A view that lacks a live replica's report asks nothing.
        let mut partial = LeaderView::default();
        partial.record(now, 1, NodeStats::default(), &report(&st, 1, &|_| 1));
        partial.record(now, 2, NodeStats::default(), &[]);
        let mut fresh = Scrubs::default();
        assert_eq!(fresh.ask(&st, &partial, 1, now), None);
        assert!(!fresh.under_way(1));
    }

    /// A group whose replicas report a scrub is next due one interval after it.
    #[test]
    fn the_schedule_counts_from_the_reported_scrub() {
        let now = Instant::now();
        let st = cluster(3, 1, |_| vec![1, 2, 3]);
        let interval = Duration::from_secs(100);
        let mut v = LeaderView::default();
        for id in 1..=3 {
            let mut reps = report(&st, id, &|_| 1);
            reps[0].scrub_index = 5;
            reps[0].scrub_age_ms = 90_000;
            v.record(now, id, NodeStats::default(), &reps);
        }
        let mut s = Scrubs::default();
        assert!(s.schedule(&st, &v, now, interval).is_empty());
        assert!(s
            .schedule(&st, &v, now + Duration::from_secs(9), interval)
            .is_empty());
        assert_eq!(
            s.schedule(&st, &v, now + Duration::from_secs(10), interval),
            vec![1]
        );
    }

    /// The schedule scrubs every group once per interval, spread over it, never more
    /// than SCRUB_INFLIGHT_MAX at once; zero turns it off.
    #[test]
    fn the_schedule_spreads_scrubs_and_caps_them() {
        let start = Instant::now();
        let st = cluster(3, 20, |_| vec![1, 2, 3]);
        let v = scrub_view(&st, start, |_, _| (0, 0));
        let mut s = Scrubs::default();
        let interval = Duration::from_secs(100);
        assert!(s.schedule(&st, &v, start, Duration::ZERO).is_empty());
        let mut asked: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for sec in 0..=200u64 {
            let now = start + Duration::from_secs(sec);
            for g in s.schedule(&st, &v, now, interval) {
                asked.entry(g).or_default().push(sec);
            }
            assert!(s.asked.len() <= SCRUB_INFLIGHT_MAX);
            // Each scrub ends at once (every replica reports a later point).
            let ended: Vec<u64> = s.asked.keys().copied().collect();
            for g in ended {
                s.asked.remove(&g);
            }
        }
        // Every group twice or three times in 200 s at one per 100 s, not all at first.
        assert_eq!(asked.len(), 20, "{asked:?}");
        assert!(
            asked.values().all(|t| (2..=3).contains(&t.len())),
            "{asked:?}"
        );
        let first: BTreeSet<u64> = asked.values().map(|t| t[0]).collect();
        assert!(first.len() > 10, "first scrubs bunched: {first:?}");
        for t in asked.values() {
            assert!(t.windows(2).all(|w| w[1] - w[0] >= 100), "{t:?}");
        }
    }
}
