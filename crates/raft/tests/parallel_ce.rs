//! ParallelRaft-CE against the paper's rules: the ghost-entry trace of
//! docs/parallel-raft.md step by step, and a bounded model check (stateright) of three
//! `CeNode`s under any delivery order, loss, crashes and restarts.
//!
//! The replicas' state machine is a map of single-letter keys; a command `k=v` writes one
//! key and conflicts with commands on the same key. The cluster keeps each replica's
//! durable state (hard state, entries, applied watermark and set, and the map, applied
//! and persisted together), so a crash loses only what a ready had not made durable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use phoenix_raft::parallel::{
    CeConfig, CeEntry, CeHardState, CeMessage, CeNode, CeRole, ConflictItem, ConflictSet, Rules,
};
use stateright::{Checker, Model, Property};

const N: u64 = 3;

/// What a replica keeps across a crash.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Durable {
    hs: CeHardState,
    entries: BTreeMap<u64, CeEntry>,
    applied: u64,
    applied_above: BTreeSet<u64>,
    kv: BTreeMap<u8, u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cluster {
    rules: Rules,
    nodes: Vec<Option<CeNode>>,
    durable: Vec<Durable>,
    net: Vec<CeMessage>,
    /// Ghost: per replica, the (index, command) it applied, in order.
    history: Vec<Vec<(u64, Bytes)>>,
    /// Ghost: (term, leader) pairs ever seen.
    leaders: BTreeSet<(u64, u64)>,
    /// Ghost: a replica applied an entry after a later entry it conflicts with.
    out_of_order: Option<String>,
    /// Ghost: the command each index was first known committed with, anywhere.
    committed_seen: BTreeMap<u64, Bytes>,
    /// Ghost: an index known committed with another command, or applied twice.
    broken: Option<String>,
}

fn conflicts_of(cmd: &[u8]) -> ConflictSet {
    match cmd.first() {
        None => ConflictSet::none(),
        Some(&k) => ConflictSet::Items(vec![ConflictItem::Point {
            fp: u64::from(k),
            prefix: u64::from(k),
        }]),
    }
}

impl Cluster {
    fn new(rules: Rules) -> Cluster {
        let nodes = (1..=N)
            .map(|id| {
                let mut cfg = CeConfig::new(id, 1..=N);
                cfg.rules = rules;
                Some(CeNode::new(cfg).unwrap())
            })
            .collect();
        Cluster {
            rules,
            nodes,
            durable: vec![Durable::default(); N as usize],
            net: Vec::new(),
            history: vec![Vec::new(); N as usize],
            leaders: BTreeSet::new(),
            out_of_order: None,
            committed_seen: BTreeMap::new(),
            broken: None,
        }
    }

    fn node(&mut self, id: u64) -> &mut CeNode {
        self.nodes[(id - 1) as usize].as_mut().unwrap()
    }

    /// Persists, sends and applies what node `id` has ready.
    fn process(&mut self, id: u64) {
        let i = (id - 1) as usize;
        let Some(node) = self.nodes[i].as_mut() else {
            return;
        };
        let rd = node.ready();
        let (applied, applied_above) = {
            let (a, s) = node.applied();
            (a, s.clone())
        };
        if node.role() == CeRole::Leader {
            self.leaders.insert((node.hard_state().term, id));
        }
        for (&j, e) in node.log() {
            if node.is_committed(j) {
                let first = self
                    .committed_seen
                    .entry(j)
                    .or_insert_with(|| e.data.clone());
                if *first != e.data {
                    self.broken.get_or_insert(format!(
                        "node {id} holds {:?} at committed index {j}, first committed as {first:?}",
                        e.data
                    ));
                }
            }
        }
        let d = &mut self.durable[i];
        if let Some(hs) = rd.hard_state {
            d.hs = hs;
        }
        if let Some(end) = rd.erase_above {
            d.entries.split_off(&(end + 1));
        }
        for e in rd.entries {
            d.entries.insert(e.index, e);
        }
        self.net.extend(rd.messages);
        for e in rd.apply {
            // An entry must never run after a later entry it conflicts with.
            if let Some((j, _)) = self.history[i]
                .iter()
                .find(|(j, c)| *j > e.index && conflicts_of(c).conflicts(&e.conflicts))
            {
                self.out_of_order.get_or_insert(format!(
                    "node {id} applied index {} after index {j}, which it conflicts with",
                    e.index
                ));
            }
            if self.history[i].iter().any(|(j, _)| *j == e.index) {
                self.broken
                    .get_or_insert(format!("node {id} applied index {} twice", e.index));
            }
            if let [k, b'=', v] = e.data[..] {
                d.kv.insert(k, v);
            }
            self.history[i].push((e.index, e.data.clone()));
        }
        d.applied = applied;
        d.applied_above = applied_above;
    }

    fn campaign(&mut self, id: u64) {
        self.node(id).campaign();
        self.process(id);
    }

    fn heartbeat(&mut self, id: u64) {
        self.node(id).heartbeat();
        self.process(id);
    }

    fn propose(&mut self, id: u64, cmd: &'static [u8]) -> u64 {
        let i = self
            .node(id)
            .propose(Bytes::from_static(cmd), conflicts_of(cmd))
            .unwrap();
        self.process(id);
        i
    }

    /// Delivers the message at `k` (lost if its receiver is down).
    fn deliver(&mut self, k: usize) {
        let m = self.net.remove(k);
        let to = m.to;
        if self.nodes[(to - 1) as usize].is_none() {
            return;
        }
        if let Err(e) = self.node(to).step(m.clone()) {
            panic!("step of {m:?} failed: {e}");
        }
        self.process(to);
    }

    /// Delivers the first message matching `f`; panics if there is none.
    fn deliver_where(&mut self, f: impl Fn(&CeMessage) -> bool) {
        let k = self.net.iter().position(f).expect("a matching message");
        self.deliver(k);
    }

    /// Delivers messages (and the ones they cause) until none is left that `f` accepts;
    /// drops the rest.
    fn settle(&mut self, f: impl Fn(&CeMessage) -> bool) {
        let mut n = 0;
        while let Some(k) = self.net.iter().position(&f) {
            n += 1;
            assert!(
                n < 10_000,
                "messages keep causing messages: {:?}",
                &self.net[..3]
            );
            self.deliver(k);
        }
        self.net.clear();
    }

    fn crash(&mut self, id: u64) {
        self.nodes[(id - 1) as usize] = None;
        self.net.retain(|m| m.to != id && m.from != id);
    }

    fn restart(&mut self, id: u64) {
        let d = self.durable[(id - 1) as usize].clone();
        let mut cfg = CeConfig::new(id, 1..=N);
        cfg.rules = self.rules;
        self.nodes[(id - 1) as usize] = Some(
            CeNode::restart(
                cfg,
                d.hs,
                d.entries.into_values(),
                d.applied,
                d.applied_above,
            )
            .unwrap(),
        );
    }

    fn value(&self, id: u64, key: u8) -> Option<u8> {
        self.durable[(id - 1) as usize].kv.get(&key).copied()
    }

    fn applied(&self, id: u64, cmd: &[u8]) -> bool {
        self.history[(id - 1) as usize]
            .iter()
            .any(|(_, c)| &c[..] == cmd)
    }
}

/// At most one leader per term.
fn one_leader_per_term(c: &Cluster) -> bool {
    let mut by_term = BTreeMap::new();
    c.leaders
        .iter()
        .all(|(t, id)| *by_term.entry(*t).or_insert(*id) == *id)
}

/// One command per index among applied entries.
fn one_command_per_index(c: &Cluster) -> bool {
    let mut at = BTreeMap::new();
    c.history
        .iter()
        .flatten()
        .all(|(i, cmd)| at.entry(*i).or_insert(cmd) == &cmd)
}

/// Per key, one replica's sequence of applied writes is a prefix of another's.
fn keys_agree(c: &Cluster) -> bool {
    let per_key = |h: &Vec<(u64, Bytes)>, k: u8| -> Vec<u64> {
        h.iter()
            .filter(|(_, cmd)| cmd.first() == Some(&k))
            .map(|(i, _)| *i)
            .collect()
    };
    c.history.iter().all(|a| {
        c.history.iter().all(|b| {
            KEYS.iter().all(|&k| {
                let (x, y) = (per_key(a, k), per_key(b, k));
                let n = x.len().min(y.len());
                x[..n] == y[..n]
            })
        })
    })
}

/// Every safety property at once: the first one broken, if any.
fn violation(c: &Cluster) -> Option<String> {
    if !one_leader_per_term(c) {
        return Some(format!("two leaders in one term: {:?}", c.leaders));
    }
    if let Some(w) = c.out_of_order.as_ref().or(c.broken.as_ref()) {
        return Some(w.clone());
    }
    if !one_command_per_index(c) {
        return Some("two commands applied at one index".into());
    }
    if !keys_agree(c) {
        return Some(format!("replicas disagree on a key: {:?}", c.history));
    }
    if !final_blocks_agree(c) {
        return Some("final blocks disagree".into());
    }
    None
}

/// The spec's syncCompleteness over the replicas' durable state: a block below a node's
/// sync is final, so any two nodes hold the same entries up to the lower of their final
/// ends, and the node further on holds no entry of a block the other has not finalized.
fn final_blocks_agree(c: &Cluster) -> bool {
    c.durable.iter().all(|a| {
        c.durable.iter().all(|b| {
            let (lo, hi) = if a.hs.final_end <= b.hs.final_end {
                (a, b)
            } else {
                (b, a)
            };
            let f = lo.hs.final_end;
            let same = (1..=f).all(|i| {
                let x = lo.entries.get(&i).map(|e| (e.term, &e.data));
                let y = hi.entries.get(&i).map(|e| (e.term, &e.data));
                x == y
            });
            let later = hi.hs.final_end <= f
                || hi
                    .entries
                    .range(f + 1..=hi.hs.final_end)
                    .all(|(_, e)| e.term >= lo.hs.sync);
            same && later
        })
    })
}

fn is_append_of(m: &CeMessage, index: u64) -> bool {
    matches!(&m.body, phoenix_raft::parallel::CeBody::Append { entries, .. }
        if entries.iter().any(|e| e.index == index))
}

/// The keys commands write.
const KEYS: [u8; 3] = [b'k', b'p', b'r'];

const G: &[u8] = b"k=g";
const P: &[u8] = b"p=1";
const Q: &[u8] = b"k=q";

/// The schedule of docs/parallel-raft.md, "The ghost entry, step by step"; returns the
/// cluster at its end.
fn ghost_trace(rules: Rules) -> Cluster {
    let mut c = Cluster::new(rules);
    // Term 1: S1 wins with S2's vote (and syncs both under -CE), appends G, and crashes
    // before sending it.
    c.campaign(1);
    c.settle(|m| m.to != 3 || !matches!(m.body, phoenix_raft::parallel::CeBody::Vote { .. }));
    assert_eq!(c.node(1).role(), CeRole::Leader);
    assert_eq!(c.propose(1, G), 1);
    c.crash(1);
    // Term 2: S2 wins with S3's vote, appends P at 1 and Q at 2; only Q reaches S3.
    c.campaign(2);
    c.settle(|m| m.to != 1);
    assert_eq!(c.node(2).role(), CeRole::Leader);
    assert_eq!(c.propose(2, P), 1);
    assert_eq!(c.propose(2, Q), 2);
    c.deliver_where(|m| m.to == 3 && is_append_of(m, 2));
    c.deliver_where(|m| m.to == 2); // S3's acknowledgement: Q committed, S2 applies it
    assert!(c.applied(2, Q));
    c.net.clear(); // P never leaves S2
    c.heartbeat(2);
    c.deliver_where(|m| m.to == 3 && !is_append_of(m, 1)); // the commit, without P
    assert!(
        c.applied(3, Q),
        "S3 applies Q past the hole at 1 (look-behind: p)"
    );
    c.crash(2);
    // S1 comes back holding G and campaigns: S3 refuses it.
    c.restart(1);
    for _ in 0..2 {
        c.campaign(1);
        c.settle(|_| true);
        assert_ne!(
            c.node(1).role(),
            CeRole::Leader,
            "S1 must not win against S3"
        );
    }
    // S3 wins with S1's vote and leads.
    c.campaign(3);
    c.settle(|_| true);
    assert_eq!(c.node(3).role(), CeRole::Leader);
    c.heartbeat(3);
    c.settle(|_| true);
    // S2 comes back and catches up.
    c.restart(2);
    c.heartbeat(3);
    c.settle(|_| true);
    c.heartbeat(3);
    c.settle(|_| true);
    c
}

#[test]
fn the_ghost_entry_diverges_under_the_paper_s_rules() {
    let c = ghost_trace(Rules::Paper);
    // S3 applied Q, then the ghost G it rediscovered at 1; S1 applied G, then Q.
    assert_eq!(c.value(1, b'k'), Some(b'q'));
    assert_eq!(c.value(3, b'k'), Some(b'g'));
    assert!(c.applied(3, G));
    let why = c.out_of_order.as_deref().unwrap_or("");
    assert!(
        why.contains("node 3 applied index 1 after index 2"),
        "{why}"
    );
}

#[test]
fn the_ghost_entry_is_erased_under_ce() {
    let c = ghost_trace(Rules::Ce);
    for id in 1..=N {
        assert_eq!(c.value(id, b'k'), Some(b'q'), "node {id}");
        assert!(!c.applied(id, G), "node {id} applied the ghost");
        assert!(
            !c.applied(id, P),
            "node {id} applied P, which was never committed"
        );
        assert_eq!(c.durable[(id - 1) as usize].applied, 2, "node {id}");
    }
    assert_eq!(c.out_of_order, None);
    // Index 1 holds the candidate's no-op of block 2 everywhere.
    for id in 1..=N {
        let e = &c.durable[(id - 1) as usize].entries[&1];
        assert!(e.data.is_empty() && e.term == 2, "node {id}: {e:?}");
    }
}

/// A voter that synced past a candidate's block refuses it. Without that rule the
/// candidate below wins with that voter, fixes block 1 from its own stale copy (G, which
/// the term-2 candidate left out: block 1 is final and empty on S3) and syncs S2 to it.
#[test]
fn a_voter_refuses_a_candidate_behind_its_sync() {
    let mut c = Cluster::new(Rules::Ce);
    c.campaign(1);
    c.settle(|_| true);
    assert_eq!(c.node(1).role(), CeRole::Leader);
    c.propose(1, G);
    c.net.clear(); // G never leaves S1
                   // Term 2: S2 wins with S3, fixes block 1 empty, and S3 takes it and moves to sync 2;
                   // S3's answer to the last step is lost, so S2 never leads.
    c.campaign(2);
    c.deliver_where(|m| m.to == 3);
    c.deliver_where(|m| m.to == 2);
    c.deliver_where(|m| m.to == 3); // block 1, empty
    c.deliver_where(|m| m.to == 2);
    c.deliver_where(|m| m.to == 3); // UpdateSync(2)
    assert_eq!(c.node(3).hard_state().sync, 2);
    assert_eq!(c.node(2).role(), CeRole::LeaderCandidate);
    c.net
        .retain(|m| m.to == 1 && matches!(m.body, phoenix_raft::parallel::CeBody::Vote { .. }));
    c.deliver_where(|m| m.to == 1); // S1 steps down to term 2
    c.net.clear();
    // Term 3: S1, still at sync 1 with G, asks S3 only.
    c.campaign(1);
    c.net.retain(|m| m.to == 3);
    c.deliver_where(|m| m.to == 3);
    c.deliver_where(|m| m.to == 1);
    assert_eq!(c.node(1).role(), CeRole::Candidate, "S3 must refuse S1");
    // Whatever follows, the final blocks stay in agreement.
    c.settle(|_| true);
    c.campaign(1);
    c.settle(|m| m.to != 3);
    assert!(final_blocks_agree(&c), "{:?}", c.durable);
    assert!(!c.applied(1, G) && !c.applied(2, G));
}

// ---- the model ------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Campaign(u64),
    Heartbeat(u64),
    Propose(u64),
    Deliver(usize),
    Drop(usize),
    Crash(u64),
    Restart(u64),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MState {
    c: Cluster,
    proposals: u8,
    heartbeats: u8,
    crashes: u8,
}

struct CeModel {
    rules: Rules,
    /// Start with node 1 leading term 1, every node synced to it (the election done).
    start_led: bool,
    max_term: u64,
    /// Proposed in this order by whoever leads.
    commands: Vec<&'static [u8]>,
    max_heartbeats: u8,
    max_crashes: u8,
    max_in_flight: usize,
    lossy: bool,
}

impl Model for CeModel {
    type State = MState;
    type Action = Action;

    fn init_states(&self) -> Vec<MState> {
        let mut c = Cluster::new(self.rules);
        if self.start_led {
            c.campaign(1);
            c.settle(|_| true);
            assert_eq!(c.node(1).role(), CeRole::Leader);
            c.leaders.clear();
            c.leaders.insert((1, 1));
        }
        vec![MState {
            c,
            proposals: 0,
            heartbeats: 0,
            crashes: 0,
        }]
    }

    fn actions(&self, s: &MState, out: &mut Vec<Action>) {
        for id in 1..=N {
            let Some(n) = &s.c.nodes[(id - 1) as usize] else {
                out.push(Action::Restart(id));
                continue;
            };
            if n.role() == CeRole::Follower && n.hard_state().term < self.max_term {
                out.push(Action::Campaign(id));
            }
            if n.role() != CeRole::Follower && s.heartbeats < self.max_heartbeats {
                out.push(Action::Heartbeat(id));
            }
            if n.role() == CeRole::Leader && (s.proposals as usize) < self.commands.len() {
                out.push(Action::Propose(id));
            }
            if s.crashes < self.max_crashes {
                out.push(Action::Crash(id));
            }
        }
        for k in 0..s.c.net.len() {
            if k > 0 && s.c.net[k] == s.c.net[k - 1] {
                continue;
            }
            out.push(Action::Deliver(k));
            if self.lossy {
                out.push(Action::Drop(k));
            }
        }
    }

    fn next_state(&self, last: &MState, action: Action) -> Option<MState> {
        let mut s = last.clone();
        match action {
            Action::Campaign(id) => s.c.campaign(id),
            Action::Heartbeat(id) => {
                s.heartbeats += 1;
                s.c.heartbeat(id);
            }
            Action::Propose(id) => {
                let cmd = self.commands[s.proposals as usize];
                s.proposals += 1;
                s.c.propose(id, cmd);
            }
            Action::Deliver(k) => s.c.deliver(k),
            Action::Drop(k) => {
                s.c.net.remove(k);
            }
            Action::Crash(id) => {
                s.crashes += 1;
                s.c.nodes[(id - 1) as usize] = None;
                s.c.net.retain(|m| m.to != id);
            }
            Action::Restart(id) => s.c.restart(id),
        }
        // Messages in flight are a multiset: keep them in one order.
        s.c.net.sort_by_cached_key(|m| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            m.hash(&mut h);
            h.finish()
        });
        Some(s)
    }

    fn within_boundary(&self, s: &MState) -> bool {
        s.c.net.len() <= self.max_in_flight
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("election safety", |_: &CeModel, s: &MState| {
                one_leader_per_term(&s.c)
            }),
            Property::always(
                "conflicting entries applied in index order",
                |_: &CeModel, s: &MState| s.c.out_of_order.is_none(),
            ),
            Property::always(
                "one command per index among applied entries",
                |_: &CeModel, s: &MState| one_command_per_index(&s.c),
            ),
            Property::always(
                "replicas agree on the keys both applied",
                |_: &CeModel, s: &MState| keys_agree(&s.c),
            ),
            Property::always(
                "committed entries never change, none applied twice",
                |_: &CeModel, s: &MState| s.c.broken.is_none(),
            ),
            Property::always("final blocks agree", |_: &CeModel, s: &MState| {
                final_blocks_agree(&s.c)
            }),
            Property::sometimes(
                "a command is applied everywhere",
                |m: &CeModel, s: &MState| {
                    !m.commands.is_empty() && s.c.history.iter().all(|h| !h.is_empty())
                },
            ),
        ]
    }
}

fn check(model: CeModel, default_depth: usize) -> usize {
    let depth = std::env::var("PHOENIX_MODEL_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_depth);
    let checker = model.checker().target_max_depth(depth).spawn_bfs().join();
    println!(
        "model check: {} states ({} unique), max depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
    checker.unique_state_count()
}

#[test]
fn ce_model_three_nodes_two_conflicting_commands() {
    check(
        CeModel {
            rules: Rules::Ce,
            start_led: false,
            max_term: 2,
            commands: vec![G, Q],
            max_heartbeats: 1,
            max_crashes: 0,
            max_in_flight: 4,
            lossy: false,
        },
        20,
    );
}

#[test]
fn ce_model_after_a_first_leader_three_commands_terms_up_to_3() {
    check(
        CeModel {
            rules: Rules::Ce,
            start_led: true,
            max_term: 3,
            commands: vec![G, P, Q],
            max_heartbeats: 1,
            max_crashes: 1,
            max_in_flight: 4,
            lossy: false,
        },
        12,
    );
}

// ---- seeded random runs ---------------------------------------------------------------

/// Commands of the random runs: writes to three keys, several values each.
const COMMANDS: [&[u8]; 8] = [
    b"k=a", b"k=b", b"p=1", b"k=c", b"r=x", b"p=2", b"r=y", b"k=d",
];

/// One random run: `steps` actions drawn from the seed (deliveries in any order,
/// duplicates, losses, campaigns, heartbeats, proposals, crashes and restarts), every
/// safety property checked after each. Returns what broke, with the step.
#[derive(Debug)]
enum Failure {
    /// A node refused a message or a proposal it should have taken.
    Step(String),
    /// A safety property broke.
    Broken(String),
}

fn random_run(rules: Rules, seed: u64, steps: usize) -> Result<(), Failure> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut c = Cluster::new(rules);
    let mut proposed = 0usize;
    for step in 0..steps {
        let roll = rng.gen_range(0..100);
        let id = rng.gen_range(1..=N);
        let i = (id - 1) as usize;
        let role = c.nodes[i].as_ref().map(|n| n.role());
        let alive = role.is_some();
        match roll {
            0..=54 if !c.net.is_empty() => {
                let k = rng.gen_range(0..c.net.len());
                let m = c.net.remove(k);
                if rng.gen_range(0..100) < 3 {
                    c.net.push(m.clone()); // delivered twice
                }
                let to = m.to;
                if let Some(n) = c.nodes[(to - 1) as usize].as_mut() {
                    n.step(m.clone())
                        .map_err(|e| Failure::Step(format!("step {step}: {m:?} refused: {e}")))?;
                    c.process(to);
                }
            }
            55..=59 if !c.net.is_empty() => {
                let k = rng.gen_range(0..c.net.len());
                c.net.remove(k);
            }
            60..=64 if alive && role != Some(CeRole::Leader) => c.campaign(id),
            65..=79 if alive && role != Some(CeRole::Follower) => c.heartbeat(id),
            80..=93 if role == Some(CeRole::Leader) => {
                let cmd = COMMANDS[proposed % COMMANDS.len()];
                proposed += 1;
                c.node(id)
                    .propose(Bytes::from_static(cmd), conflicts_of(cmd))
                    .map_err(|e| Failure::Step(format!("step {step}: proposal refused: {e}")))?;
                c.process(id);
            }
            94..=95 if alive => {
                c.nodes[i] = None;
                c.net.retain(|m| m.to != id); // what it sent stays in flight
            }
            96..=99 if !alive => c.restart(id),
            _ => {}
        }
        if let Some(v) = violation(&c) {
            return Err(Failure::Broken(format!("step {step}: {v}")));
        }
    }
    Ok(())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// -CE over many seeds: no property ever breaks. `PHOENIX_SEED=N` replays one seed;
/// `PHOENIX_SIM_SEEDS` sets how many (default 2,000), `PHOENIX_SIM_STEPS` their length.
#[test]
fn ce_random_runs_keep_every_property() {
    let steps = env_u64("PHOENIX_SIM_STEPS", 300) as usize;
    let seeds: Vec<u64> = match std::env::var("PHOENIX_SEED") {
        Ok(v) => vec![v.parse().expect("PHOENIX_SEED is a number")],
        // Seed 14444 found a replica applying past a candidate's no-op filler that a
        // later candidate replaced by the command (fixed); 453, a leader candidate
        // sending its block as appends (fixed). Both stay in the run.
        Err(_) => (0..env_u64("PHOENIX_SIM_SEEDS", 2_000))
            .chain([453, 14_444])
            .collect(),
    };
    for seed in seeds {
        if let Err(e) = random_run(Rules::Ce, seed, steps) {
            panic!("seed {seed} (replay: PHOENIX_SEED={seed}): {e:?}");
        }
    }
}

/// The paper's rules over the same kind of runs: some seed breaks a property by itself.
#[test]
fn paper_random_runs_find_a_divergence() {
    let steps = env_u64("PHOENIX_SIM_STEPS", 300) as usize;
    let mut found = None;
    for seed in 0..env_u64("PHOENIX_SIM_SEEDS", 2_000) {
        match random_run(Rules::Paper, seed, steps) {
            Ok(()) => {}
            Err(Failure::Broken(e)) => {
                found = Some((seed, e));
                break;
            }
            // The paper's nodes refusing a message would be a bug of ours, not theirs.
            Err(Failure::Step(e)) => panic!("seed {seed}: {e}"),
        }
    }
    let (seed, e) = found.expect("the paper's rules break a property within the seeds");
    println!("paper's rules: seed {seed}: {e}");
}
