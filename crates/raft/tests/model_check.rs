//! Exhaustive model check (stateright, breadth-first) of small configurations of the
//! same core: three `RawNode`s with in-memory storage, driven by the model's actions —
//! an election timeout at any node, a proposal at a leader, delivery or loss of any
//! message in flight (so any order and any loss), and a crash/restart from durable
//! state. Terms and proposals are bounded. Checked in every reachable state:
//! election safety, log matching, leader completeness and state-machine safety.
//!
//! States are deduplicated on a projection of each node (hard state, role, leader, log,
//! applied index, membership, votes, per-peer progress) so that ready counters and the
//! timeout jitter generator, which the model never uses, do not split equal states.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use phoenix_raft::{
    ConfState, Config, Error, MemStorage, Message, NodeId, ProgressState, RawNode, StateRole,
};
use stateright::{Checker, Model, Property};

const N: u64 = 3;

#[derive(Clone, Debug)]
struct MState {
    nodes: Vec<RawNode<MemStorage>>,
    /// Messages in flight (kept in a canonical order).
    net: Vec<Message>,
    /// Ghost: (term, leader) pairs ever seen.
    leaders: BTreeSet<(u64, NodeId)>,
    /// Ghost: (index, term) ever known committed by some node → the lowest term in
    /// which a node knew it committed (the commit happened in that term or before).
    committed: BTreeMap<(u64, u64), u64>,
    /// Ghost: what each node applied, in order.
    applied: Vec<Vec<(u64, u64, Bytes)>>,
    proposals: u8,
    restarts: u8,
}

fn msg_key(m: &Message) -> impl Ord + Hash {
    (
        (m.from, m.to, m.kind, m.term),
        (m.log_term, m.index, m.commit, m.reject, m.reject_hint),
        m.entries
            .iter()
            .map(|e| (e.index, e.term, e.data.clone()))
            .collect::<Vec<_>>(),
    )
}

type NodeKey = (
    (u64, u64, u64),
    (u8, NodeId, u64),
    Vec<(u64, u64, Bytes)>,
    Vec<NodeId>,
    Vec<(NodeId, bool)>,
    Vec<(NodeId, u64, u64, u8, bool)>,
);

fn node_key(n: &RawNode<MemStorage>) -> NodeKey {
    let r = n.raft();
    let hs = r.hard_state();
    let role = match r.role() {
        StateRole::Follower => 0,
        StateRole::PreCandidate => 1,
        StateRole::Candidate => 2,
        StateRole::Leader => 3,
    };
    let ents = n
        .store()
        .all_entries()
        .iter()
        .map(|e| (e.index, e.term, e.data.clone()))
        .collect();
    let prs = if r.role() == StateRole::Leader {
        (1..=N)
            .filter_map(|p| {
                r.progress(p).map(|pr| {
                    let st = match pr.state {
                        ProgressState::Probe => 0,
                        ProgressState::Replicate => 1,
                        ProgressState::Snapshot => 2,
                    };
                    (p, pr.matched, pr.next_idx, st, pr.probe_sent)
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    (
        (hs.term, hs.vote, hs.commit),
        (role, r.leader(), r.raft_log().applied_index()),
        ents,
        r.conf_state().voters.clone(),
        r.votes().iter().map(|(k, v)| (*k, *v)).collect(),
        prs,
    )
}

impl MState {
    fn key(&self) -> impl Hash + Eq + '_ {
        (
            self.nodes.iter().map(node_key).collect::<Vec<_>>(),
            self.net.iter().map(msg_key).collect::<Vec<_>>(),
            &self.leaders,
            &self.committed,
            &self.applied,
            self.proposals,
            self.restarts,
        )
    }
}

impl Hash for MState {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

impl PartialEq for MState {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}

impl Eq for MState {}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Timeout(usize),
    Propose(usize),
    Deliver(usize),
    Drop(usize),
    Restart(usize),
}

struct RaftModel {
    max_term: u64,
    max_proposals: u8,
    max_restarts: u8,
    max_in_flight: usize,
    pre_vote: bool,
    /// Offer message loss as an action (a message never delivered is already
    /// explored; loss only frees room under `max_in_flight`).
    lossy: bool,
}

impl RaftModel {
    fn cfg(&self, id: NodeId) -> Config {
        let mut c = Config::new(id);
        c.pre_vote = self.pre_vote;
        c.check_quorum = false;
        c
    }

    /// Persists, sends and applies every ready of node `i` (synchronous storage).
    fn process(&self, s: &mut MState, i: usize) -> Result<(), Error> {
        while s.nodes[i].has_ready() {
            let n = &mut s.nodes[i];
            let mut rd = n.ready()?;
            if let Some(snap) = rd.snapshot.take() {
                n.store_mut().apply_snapshot(snap)?;
            }
            n.store_mut().append(&rd.entries)?;
            if let Some(hs) = rd.hard_state {
                n.store_mut().set_hard_state(hs);
            }
            for e in &rd.committed_entries {
                if !e.data.is_empty() {
                    s.applied[i].push((e.index, e.term, e.data.clone()));
                }
            }
            s.net.append(&mut rd.messages);
            s.net.append(&mut rd.persisted_messages);
            let n = &mut s.nodes[i];
            n.advance(rd)?;
        }
        let n = &s.nodes[i];
        let (commit, term) = (n.raft().committed(), n.raft().term());
        for e in n.store().all_entries().iter().filter(|e| e.index <= commit) {
            let ct = s.committed.entry((e.index, e.term)).or_insert(term);
            *ct = (*ct).min(term);
        }
        if n.raft().role() == StateRole::Leader {
            s.leaders.insert((n.raft().term(), n.raft().id()));
        }
        Ok(())
    }

    fn canonical(s: &mut MState) {
        s.net.sort_by_key(msg_key);
    }
}

fn new_node(model: &RaftModel, id: NodeId, store: MemStorage) -> RawNode<MemStorage> {
    RawNode::new(&model.cfg(id), store).unwrap()
}

impl Model for RaftModel {
    type State = MState;
    type Action = Action;

    fn init_states(&self) -> Vec<MState> {
        let conf = ConfState::with_voters(1..=N);
        let nodes = (1..=N)
            .map(|id| new_node(self, id, MemStorage::new_with_conf(conf.clone())))
            .collect();
        vec![MState {
            nodes,
            net: Vec::new(),
            leaders: BTreeSet::new(),
            committed: BTreeMap::new(),
            applied: vec![Vec::new(); N as usize],
            proposals: 0,
            restarts: 0,
        }]
    }

    fn actions(&self, s: &MState, out: &mut Vec<Action>) {
        for (i, n) in s.nodes.iter().enumerate() {
            let r = n.raft();
            if r.role() != StateRole::Leader && r.term() < self.max_term {
                out.push(Action::Timeout(i));
            }
            if r.role() == StateRole::Leader && s.proposals < self.max_proposals {
                out.push(Action::Propose(i));
            }
            if s.restarts < self.max_restarts {
                out.push(Action::Restart(i));
            }
        }
        for k in 0..s.net.len() {
            // Identical messages are interchangeable: offer the first only.
            if k > 0 && s.net[k] == s.net[k - 1] {
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
            Action::Timeout(i) => {
                s.nodes[i].campaign().unwrap();
                self.process(&mut s, i).unwrap();
            }
            Action::Propose(i) => {
                s.proposals += 1;
                let data = Bytes::from(vec![b'a' + s.proposals]);
                s.nodes[i].propose(data).unwrap();
                self.process(&mut s, i).unwrap();
            }
            Action::Deliver(k) => {
                let m = s.net.remove(k);
                let to = (m.to - 1) as usize;
                match s.nodes[to].step(m) {
                    Ok(()) => {}
                    Err(e) => panic!("step failed: {e}"),
                }
                self.process(&mut s, to).unwrap();
            }
            Action::Drop(k) => {
                s.net.remove(k);
            }
            Action::Restart(i) => {
                s.restarts += 1;
                let store = s.nodes[i].store().clone();
                s.nodes[i] = new_node(self, i as u64 + 1, store);
                // The state machine restarts empty and re-applies the committed log.
                s.applied[i].clear();
                self.process(&mut s, i).unwrap();
            }
        }
        Self::canonical(&mut s);
        Some(s)
    }

    fn within_boundary(&self, s: &MState) -> bool {
        s.net.len() <= self.max_in_flight
            && s.nodes.iter().all(|n| n.raft().term() <= self.max_term)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("election safety", |_: &RaftModel, s: &MState| {
                let mut by_term = BTreeMap::new();
                s.leaders
                    .iter()
                    .all(|(t, id)| *by_term.entry(*t).or_insert(*id) == *id)
            }),
            Property::always("log matching", |_: &RaftModel, s: &MState| {
                let logs: Vec<&[phoenix_raft::Entry]> =
                    s.nodes.iter().map(|n| n.store().all_entries()).collect();
                logs.iter().all(|a| {
                    logs.iter().all(|b| {
                        // Find the highest index where both have the same term; all
                        // before it must be identical.
                        let n = a.len().min(b.len());
                        match (0..n).rev().find(|&k| a[k].term == b[k].term) {
                            Some(k) => a[..=k] == b[..=k],
                            None => true,
                        }
                    })
                })
            }),
            Property::always(
                "committed entries never conflict",
                |_: &RaftModel, s: &MState| {
                    let mut by_index = BTreeMap::new();
                    s.committed
                        .keys()
                        .all(|(i, t)| *by_index.entry(*i).or_insert(*t) == *t)
                },
            ),
            // Every leader of a term after an entry's commit holds that entry.
            Property::always("leader completeness", |_: &RaftModel, s: &MState| {
                s.nodes
                    .iter()
                    .filter(|n| n.raft().role() == StateRole::Leader)
                    .all(|n| {
                        let (log, lt) = (n.raft().raft_log(), n.raft().term());
                        s.committed
                            .iter()
                            .filter(|(_, &ct)| ct < lt)
                            .all(|(&(i, t), _)| log.entry_term(i).ok().flatten() == Some(t))
                    })
            }),
            Property::always("state machine safety", |_: &RaftModel, s: &MState| {
                s.applied.iter().all(|a| {
                    s.applied.iter().all(|b| {
                        let n = a.len().min(b.len());
                        a[..n] == b[..n]
                    })
                })
            }),
            Property::sometimes(
                "every proposal is applied somewhere",
                |m: &RaftModel, s: &MState| {
                    m.max_proposals > 0
                        && s.applied
                            .iter()
                            .any(|a| a.len() == m.max_proposals as usize)
                },
            ),
        ]
    }
}

fn check(model: RaftModel, default_depth: usize) {
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
}

#[test]
fn three_nodes_one_proposal_terms_up_to_3() {
    check(
        RaftModel {
            max_term: 3,
            max_proposals: 1,
            max_restarts: 1,
            max_in_flight: 4,
            pre_vote: false,
            lossy: false,
        },
        14,
    );
}

#[test]
fn three_nodes_two_proposals_terms_up_to_2() {
    check(
        RaftModel {
            max_term: 2,
            max_proposals: 2,
            max_restarts: 0,
            max_in_flight: 4,
            pre_vote: false,
            lossy: false,
        },
        16,
    );
}

#[test]
fn three_nodes_with_pre_vote() {
    check(
        RaftModel {
            max_term: 2,
            max_proposals: 1,
            max_restarts: 0,
            max_in_flight: 4,
            pre_vote: true,
            lossy: false,
        },
        18,
    );
}

#[test]
fn three_nodes_with_pre_vote_and_message_loss() {
    check(
        RaftModel {
            max_term: 2,
            max_proposals: 1,
            max_restarts: 0,
            max_in_flight: 4,
            pre_vote: true,
            lossy: true,
        },
        13,
    );
}
