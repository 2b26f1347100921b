//! Deterministic simulation of whole groups (3 and 5 voters) under a seeded random
//! network (drop, delay, reorder, duplicate, partition and heal), crash/restart with
//! only persisted state, asynchronous persistence, random proposals, reads, snapshots,
//! leader transfers and membership changes. After every step it checks:
//!
//! - election safety: at most one leader per term;
//! - log matching: two durable entries with the same index and term carry the same
//!   command and follow entries of the same term (so, by induction, equal prefixes);
//! - leader completeness: a new leader's log holds every entry known committed;
//! - state machine safety: every node applies the same command at the same index, and
//!   snapshots carry the same state digest as applying the log did;
//! - linearizable reads: a ReadIndex answer is at least the commit index known anywhere
//!   when the read was asked;
//!
//! and at the end of each seed, after healing, that the group makes progress again.
//!
//! `PHOENIX_SIM_SEEDS` (default 10000) seeds starting at `PHOENIX_SIM_BASE_SEED`
//! (default 0); `PHOENIX_SIM_STEPS` steps each (default 3000). A failure prints the
//! command line that replays it exactly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use bytes::Bytes;
use phoenix_raft::{
    ConfChange, ConfState, Config, EntryKind, Error, MemStorage, Message, MessageType, NodeId,
    Raft, RawNode, Ready, SnapshotStatus, StateRole, Storage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type Check = Result<(), String>;

/// The application of one node: a digest of everything applied, in order.
struct App {
    index: u64,
    digest: u64,
    conf: ConfState,
}

struct SimNode {
    raw: RawNode<MemStorage>,
    alive: bool,
    /// Readies handed out, not yet durable (oldest first).
    pending: VecDeque<Ready>,
    app: App,
    /// (context id, commit index known anywhere when asked)
    reads: BTreeMap<u64, u64>,
    was_leader_term: u64,
}

fn digest_step(d: u64, index: u64, data: &[u8]) -> u64 {
    // FNV-1a over the index and payload, chained.
    let mut h = d ^ 0xcbf2_9ce4_8422_2325;
    for b in index.to_le_bytes().iter().chain(data) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn snap_data(index: u64, digest: u64) -> Bytes {
    let mut v = index.to_be_bytes().to_vec();
    v.extend_from_slice(&digest.to_be_bytes());
    Bytes::from(v)
}

fn parse_snap(data: &[u8]) -> (u64, u64) {
    if data.len() != 16 {
        return (0, 0);
    }
    let i = u64::from_be_bytes(data[..8].try_into().unwrap());
    let d = u64::from_be_bytes(data[8..].try_into().unwrap());
    (i, d)
}

/// What a run exercised, summed over seeds (printed so a weak run is visible).
#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    leader_terms: u64,
    commands_applied: u64,
    snapshots_installed: u64,
    conf_changes_applied: u64,
    crashes: u64,
    reads_checked: u64,
    messages_delivered: u64,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.leader_terms += o.leader_terms;
        self.commands_applied += o.commands_applied;
        self.snapshots_installed += o.snapshots_installed;
        self.conf_changes_applied += o.conf_changes_applied;
        self.crashes += o.crashes;
        self.reads_checked += o.reads_checked;
        self.messages_delivered += o.messages_delivered;
    }
}

#[derive(Default)]
struct Checker {
    stats: Stats,
    leaders: BTreeMap<u64, NodeId>,
    /// (index, term) → (command, term of the previous entry)
    entries: BTreeMap<(u64, u64), (Bytes, u64)>,
    /// index → (term, command, lowest term in which a node knew it committed)
    committed: BTreeMap<u64, (u64, Bytes, u64)>,
    /// index → (term, command) applied somewhere
    applied: BTreeMap<u64, (u64, Bytes)>,
    /// index → state digest after applying it
    digests: BTreeMap<u64, u64>,
    max_commit: u64,
}

struct Sim {
    rng: ChaCha8Rng,
    nodes: BTreeMap<NodeId, SimNode>,
    net: Vec<Message>,
    /// Side of each node in the current partition (all 0 = healed).
    side: BTreeMap<NodeId, u8>,
    check: Checker,
    next_cmd: u64,
    next_read: u64,
    spare_ids: Vec<NodeId>,
    step: u64,
    drop_pct: u32,
    dup_pct: u32,
}

fn cfg(id: NodeId, seed: u64) -> Config {
    let mut c = Config::new(id);
    c.election_tick = 10;
    c.heartbeat_tick = 2;
    // Tiny messages split batches so that acknowledgements often
    // cover only part of a term's entries (what the figure-8 commit rule is about).
    c.max_size_per_msg = 32 + seed % 128;
    c.max_inflight_msgs = 8;
    c.seed = seed;
    // Half the seeds run the server's setting: commit indexes ride on later messages,
    // periodic heartbeats skip followers just sent an append.
    c.coalesce_messages = seed & 2 != 0;
    c
}

fn step_ok(r: Result<(), Error>) -> Check {
    match r {
        Ok(()) | Err(Error::UnknownPeer { .. }) | Err(Error::ProposalDropped { .. }) => Ok(()),
        Err(e) => Err(format!("unexpected error: {e}")),
    }
}

impl Sim {
    fn new(seed: u64, voters: usize) -> Sim {
        let ids: Vec<NodeId> = (1..=voters as u64).collect();
        let conf = ConfState::with_voters(ids.iter().copied());
        let mut nodes = BTreeMap::new();
        for &id in &ids {
            let store = MemStorage::new_with_conf(conf.clone());
            let raw = RawNode::new(&cfg(id, seed), store).unwrap();
            nodes.insert(
                id,
                SimNode {
                    raw,
                    alive: true,
                    pending: VecDeque::new(),
                    app: App {
                        index: 0,
                        digest: 0,
                        conf: conf.clone(),
                    },
                    reads: BTreeMap::new(),
                    was_leader_term: 0,
                },
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let drop_pct = rng.gen_range(0..15);
        let dup_pct = rng.gen_range(0..5);
        Sim {
            rng,
            nodes,
            net: Vec::new(),
            side: BTreeMap::new(),
            check: Checker::default(),
            next_cmd: 1,
            next_read: 1,
            spare_ids: (voters as u64 + 1..=voters as u64 + 2).collect(),
            step: 0,
            drop_pct,
            dup_pct,
        }
    }

    fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    fn alive_ids(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.gen_range(0..v.len())])
        }
    }

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            if self.rng.gen_range(0..100) < self.drop_pct {
                self.report_lost(&m);
                continue;
            }
            self.net.push(m);
        }
    }

    /// What a transport tells the leader when a message is lost.
    fn report_lost(&mut self, m: &Message) {
        if let Some(n) = self.nodes.get_mut(&m.from) {
            if !n.alive {
                return;
            }
            if m.kind == MessageType::Snapshot {
                n.raw.report_snapshot(m.to, SnapshotStatus::Failure);
            } else if m.kind == MessageType::Append {
                n.raw.report_unreachable(m.to);
            }
        }
    }

    /// Takes every ready of `id`: messages leave at once, the rest waits for `persist`.
    fn drain(&mut self, id: NodeId) -> Check {
        loop {
            let n = self.nodes.get_mut(&id).unwrap();
            if !n.alive || !n.raw.has_ready() {
                break;
            }
            let mut rd = n.raw.ready().map_err(|e| e.to_string())?;
            let msgs = std::mem::take(&mut rd.messages);
            let n = self.nodes.get_mut(&id).unwrap();
            for rs in rd.read_states.drain(..) {
                let ctx = u64::from_be_bytes(rs.context[..].try_into().unwrap());
                if let Some(floor) = n.reads.remove(&ctx) {
                    self.check.stats.reads_checked += 1;
                    if rs.index < floor {
                        return Err(format!(
                            "read {ctx} on node {id} answered at index {} below commit {floor} known when asked",
                            rs.index
                        ));
                    }
                }
            }
            n.pending.push_back(rd);
            self.send(msgs);
        }
        let n = &self.nodes[&id];
        if n.alive {
            n.raw
                .check_invariants()
                .map_err(|e| format!("node {id}: {e}"))?;
        }
        Ok(())
    }

    /// Makes the oldest pending ready of `id` durable, applies it, releases its messages.
    fn persist_one(&mut self, id: NodeId) -> Check {
        let n = self.nodes.get_mut(&id).unwrap();
        let Some(mut rd) = n.pending.pop_front() else {
            return Ok(());
        };
        if let Some(s) = rd.snapshot.take() {
            let (si, sd) = parse_snap(&s.data);
            if si != s.meta.index {
                return Err(format!(
                    "snapshot data index {si} != meta index {}",
                    s.meta.index
                ));
            }
            if let Some(&d) = self.check.digests.get(&si) {
                if d != sd {
                    return Err(format!(
                        "node {id} installs snapshot {si} with a different state digest"
                    ));
                }
            }
            self.check.digests.insert(si, sd);
            self.check.stats.snapshots_installed += 1;
            let n = self.nodes.get_mut(&id).unwrap();
            n.app = App {
                index: si,
                digest: sd,
                conf: s.meta.conf.clone(),
            };
            n.raw
                .store_mut()
                .apply_snapshot(s)
                .map_err(|e| e.to_string())?;
        }
        let n = self.nodes.get_mut(&id).unwrap();
        n.raw
            .store_mut()
            .append(&rd.entries)
            .map_err(|e| format!("node {id} append: {e}"))?;
        if let Some(hs) = rd.hard_state {
            n.raw.store_mut().set_hard_state(hs);
        }
        // Log matching, on what became durable.
        for e in &rd.entries {
            let prev = n.raw.store().term(e.index - 1).unwrap_or(0);
            match self.check.entries.get(&(e.index, e.term)) {
                Some((data, p)) if *data != e.data || *p != prev => {
                    return Err(format!(
                        "log matching: node {id} has ({}, {}) with data {:?} prev term {prev}; seen before: data {:?} prev term {p}\n{}",
                        e.index, e.term, e.data, data, self.dump()
                    ));
                }
                Some(_) => {}
                None => {
                    self.check
                        .entries
                        .insert((e.index, e.term), (e.data.clone(), prev));
                }
            }
        }
        if let Some(hs) = rd.hard_state {
            self.note_commit(id, hs.commit, hs.term)?;
        }
        let committed = std::mem::take(&mut rd.committed_entries);
        for e in &committed {
            self.apply(id, e.index, e.term, e.kind, &e.data)?;
        }
        let msgs = std::mem::take(&mut rd.persisted_messages);
        let n = self.nodes.get_mut(&id).unwrap();
        n.raw
            .on_persist_ready(rd.number())
            .map_err(|e| format!("node {id}: {e}"))?;
        if let Some(last) = committed.last() {
            n.raw
                .advance_apply_to(last.index)
                .map_err(|e| e.to_string())?;
        }
        self.send(msgs);
        self.drain(id)
    }

    fn note_commit(&mut self, id: NodeId, commit: u64, term: u64) -> Check {
        let store = self.nodes[&id].raw.store();
        let first = store.first_index().unwrap();
        let from = first.max(self.check.max_commit.saturating_sub(64) + 1);
        for i in from..=commit {
            let Ok(t) = store.term(i) else { continue };
            let ents = store
                .entries(i, i + 1, u64::MAX)
                .map_err(|e| e.to_string())?;
            let data = ents[0].data.clone();
            match self.check.committed.get_mut(&i) {
                Some((ct, cd, _)) if *ct != t || *cd != data => {
                    return Err(format!(
                        "node {id} committed ({i}, {t}) but ({i}, {ct}) was committed before"
                    ));
                }
                Some((_, _, commit_term)) => *commit_term = (*commit_term).min(term),
                None => {
                    self.check.committed.insert(i, (t, data, term));
                }
            }
        }
        self.check.max_commit = self.check.max_commit.max(commit);
        Ok(())
    }

    fn apply(&mut self, id: NodeId, index: u64, term: u64, kind: EntryKind, data: &Bytes) -> Check {
        let n = self.nodes.get_mut(&id).unwrap();
        if index != n.app.index + 1 {
            return Err(format!("node {id} applies {index} after {}", n.app.index));
        }
        match self.check.applied.get(&index) {
            Some((t, d)) if *t != term || d != data => {
                return Err(format!("state machine safety: node {id} applies ({index}, {term}), others ({index}, {t})"));
            }
            Some(_) => {}
            None => {
                self.check.applied.insert(index, (term, data.clone()));
                self.check.stats.commands_applied += 1;
            }
        }
        if let Some((ct, _, _)) = self.check.committed.get(&index) {
            if *ct != term {
                return Err(format!(
                    "node {id} applies ({index}, {term}) but ({index}, {ct}) is committed"
                ));
            }
        }
        n.app.index = index;
        n.app.digest = digest_step(n.app.digest, index, data);
        match self.check.digests.get(&index) {
            Some(&d) if d != n.app.digest => {
                return Err(format!("node {id}: state digest differs at {index}"))
            }
            Some(_) => {}
            None => {
                self.check.digests.insert(index, n.app.digest);
            }
        }
        if kind == EntryKind::ConfChange {
            let cc = ConfChange::decode(data).map_err(|e| e.to_string())?;
            let cs = n
                .raw
                .apply_conf_change(cc)
                .map_err(|e| format!("node {id} conf change: {e}"))?;
            n.raw.store_mut().set_conf_state(cs.clone());
            n.app.conf = cs;
            self.check.stats.conf_changes_applied += 1;
        }
        Ok(())
    }

    fn check_leaders(&mut self) -> Check {
        let ids = self.alive_ids();
        for id in ids {
            let (role, term) = {
                let r = self.nodes[&id].raw.raft();
                (r.role(), r.term())
            };
            if role != StateRole::Leader {
                continue;
            }
            match self.check.leaders.get(&term) {
                Some(&l) if l != id => {
                    return Err(format!(
                        "election safety: {l} and {id} both lead term {term}"
                    ))
                }
                Some(_) => {}
                None => {
                    self.check.leaders.insert(term, id);
                    self.check.stats.leader_terms += 1;
                }
            }
            if self.nodes[&id].was_leader_term != term {
                self.nodes.get_mut(&id).unwrap().was_leader_term = term;
                // Leader completeness: a leader holds every entry committed in an
                // earlier term (a stale leader elected by delayed votes may lack
                // entries committed in later terms; it cannot commit anything).
                let log = self.nodes[&id].raw.raft().raft_log();
                for (&i, (t, _, ct)) in &self.check.committed {
                    if *ct >= term {
                        continue;
                    }
                    match log.entry_term(i).map_err(|e| e.to_string())? {
                        Some(lt) if lt != *t => {
                            return Err(format!("leader completeness: leader {id} of term {term} has ({i}, {lt}), committed ({i}, {t})"));
                        }
                        Some(_) => {}
                        None => {
                            let last = log.last_log_index().map_err(|e| e.to_string())?;
                            if i > last {
                                return Err(format!("leader completeness: leader {id} of term {term} lacks committed index {i}"));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn crash(&mut self, id: NodeId) {
        self.check.stats.crashes += 1;
        let n = self.nodes.get_mut(&id).unwrap();
        n.alive = false;
        n.pending.clear();
        n.reads.clear();
        n.was_leader_term = 0;
    }

    fn restart(&mut self, id: NodeId, seed: u64) -> Check {
        let n = self.nodes.get_mut(&id).unwrap();
        let mut store = n.raw.store().clone();
        // Only what was persisted survives; the state machine restarts from the snapshot.
        let snap = store.snapshot_ref().clone();
        let (si, sd) = if snap.meta.index == 0 {
            (0, 0)
        } else {
            parse_snap(&snap.data)
        };
        store.set_conf_state(snap.meta.conf.clone());
        n.app = App {
            index: si,
            digest: sd,
            conf: snap.meta.conf.clone(),
        };
        n.raw = RawNode::new(&cfg(id, seed ^ self.step), store)
            .map_err(|e| format!("restart {id}: {e}"))?;
        n.alive = true;
        self.drain(id)
    }

    fn deliver(&mut self) -> Check {
        if self.net.is_empty() {
            return Ok(());
        }
        let k = self.rng.gen_range(0..self.net.len());
        let m = if self.rng.gen_range(0..100) < self.dup_pct {
            self.net[k].clone()
        } else {
            self.net.swap_remove(k)
        };
        let to = m.to;
        let blocked = self.side.get(&m.from).copied().unwrap_or(0)
            != self.side.get(&to).copied().unwrap_or(0);
        let Some(n) = self.nodes.get_mut(&to) else {
            return Ok(());
        };
        if !n.alive || blocked {
            self.report_lost(&m);
            return Ok(());
        }
        self.check.stats.messages_delivered += 1;
        let (kind, from) = (m.kind, m.from);
        if kind == MessageType::Snapshot {
            // The transport reports a completed snapshot stream to the sender.
            if let Some(sender) = self.nodes.get_mut(&from).filter(|s| s.alive) {
                sender.raw.report_snapshot(to, SnapshotStatus::Finish);
            }
        }
        let Some(n) = self.nodes.get_mut(&to) else {
            return Ok(());
        };
        step_ok(n.raw.step(m)).map_err(|e| format!("node {to} stepping {kind:?}: {e}"))?;
        self.drain(to)
    }

    fn leader(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.alive && n.raw.raft().role() == StateRole::Leader)
            .max_by_key(|(_, n)| n.raw.raft().term())
            .map(|(id, _)| *id)
    }

    fn propose(&mut self) -> Check {
        let Some(l) = self.leader() else {
            return Ok(());
        };
        let n = 1 + self.rng.gen_range(0..3);
        let mut batch = Vec::new();
        for _ in 0..n {
            batch.push(Bytes::copy_from_slice(&self.next_cmd.to_be_bytes()));
            self.next_cmd += 1;
        }
        let r = self
            .nodes
            .get_mut(&l)
            .unwrap()
            .raw
            .propose_batch(batch)
            .map(|_| ());
        step_ok(r)?;
        self.drain(l)
    }

    fn conf_change(&mut self, seed: u64) -> Check {
        let Some(l) = self.leader() else {
            return Ok(());
        };
        let conf = self.nodes[&l].app.conf.clone();
        let cc = match self.rng.gen_range(0..3) {
            0 => {
                // Add a learner: new replicas always join as learners first.
                let candidates: Vec<NodeId> = self
                    .spare_ids
                    .iter()
                    .copied()
                    .chain(self.ids())
                    .filter(|&i| !conf.contains(i))
                    .collect();
                let Some(x) = self.pick(&candidates) else {
                    return Ok(());
                };
                ConfChange::AddLearner(x)
            }
            1 => {
                let Some(x) = self.pick(&conf.learners.clone()) else {
                    return Ok(());
                };
                ConfChange::AddVoter(x)
            }
            _ => {
                let all: Vec<NodeId> = conf.voters.iter().chain(&conf.learners).copied().collect();
                if conf.voters.len() <= 2 {
                    return Ok(()); // keep groups big enough to be interesting
                }
                let Some(x) = self.pick(&all) else {
                    return Ok(());
                };
                ConfChange::RemoveNode(x)
            }
        };
        let r = self
            .nodes
            .get_mut(&l)
            .unwrap()
            .raw
            .propose_conf_change(cc)
            .map(|_| ());
        let accepted = r.is_ok();
        step_ok(r)?;
        if accepted {
            if let ConfChange::AddLearner(x) = cc {
                if let std::collections::btree_map::Entry::Vacant(slot) = self.nodes.entry(x) {
                    // The server creates the replica with the membership its addition
                    // produces (from the control plane), and an empty log.
                    let c = Raft::<MemStorage>::changed_conf(&conf, cc);
                    let store = MemStorage::new_with_conf(c.clone());
                    let raw = RawNode::new(&cfg(x, seed), store).map_err(|e| e.to_string())?;
                    slot.insert(SimNode {
                        raw,
                        alive: true,
                        pending: VecDeque::new(),
                        app: App {
                            index: 0,
                            digest: 0,
                            conf: c,
                        },
                        reads: BTreeMap::new(),
                        was_leader_term: 0,
                    });
                    self.spare_ids.retain(|&s| s != x);
                }
            }
        }
        self.drain(l)
    }

    fn compact(&mut self, id: NodeId) -> Check {
        let n = self.nodes.get_mut(&id).unwrap();
        let applied = n.raw.raft().raft_log().applied_index();
        if n.app.index != applied || applied <= n.raw.store().snapshot_ref().meta.index {
            return Ok(());
        }
        let data = snap_data(n.app.index, n.app.digest);
        let conf = n.app.conf.clone();
        n.raw
            .store_mut()
            .compact_to_snapshot(applied, conf, data)
            .map_err(|e| e.to_string())
    }

    fn read(&mut self) -> Check {
        let ids = self.alive_ids();
        let Some(id) = self.pick(&ids) else {
            return Ok(());
        };
        let ctx = self.next_read;
        self.next_read += 1;
        let floor = self.check.max_commit;
        let n = self.nodes.get_mut(&id).unwrap();
        let r = n.raw.read_index(Bytes::copy_from_slice(&ctx.to_be_bytes()));
        if r.is_ok() {
            n.reads.insert(ctx, floor);
        }
        step_ok(r)?;
        self.drain(id)
    }

    fn random_step(&mut self, seed: u64) -> Check {
        self.step += 1;
        let ids = self.ids();
        let alive = self.alive_ids();
        let roll = self.rng.gen_range(0..1000);
        match roll {
            0..=479 => self.deliver()?,
            480..=609 => {
                if let Some(id) = self.pick(&alive) {
                    self.persist_one(id)?;
                }
            }
            610..=769 => {
                if let Some(id) = self.pick(&alive) {
                    step_ok(self.nodes.get_mut(&id).unwrap().raw.tick())?;
                    self.drain(id)?;
                }
            }
            770..=879 => self.propose()?,
            880..=891 => self.conf_change(seed)?,
            892..=894 => {
                // Crash, at most a minority of the original size at once.
                let down = ids.len() - alive.len();
                if down < 2 {
                    if let Some(id) = self.pick(&alive) {
                        self.crash(id);
                    }
                }
            }
            895..=914 => {
                let dead: Vec<NodeId> =
                    ids.iter().copied().filter(|i| !alive.contains(i)).collect();
                if let Some(id) = self.pick(&dead) {
                    self.restart(id, seed)?;
                }
            }
            915..=919 => {
                for &id in &ids {
                    let s = self.rng.gen_range(0..2u8);
                    self.side.insert(id, s);
                }
            }
            920..=944 => self.side.clear(),
            945..=959 => {
                if let Some(id) = self.pick(&alive) {
                    self.compact(id)?;
                }
            }
            960..=979 => self.read()?,
            980..=987 => {
                if let Some(l) = self.leader() {
                    let voters = self.nodes[&l].app.conf.voters.clone();
                    if let Some(t) = self.pick(&voters) {
                        step_ok(self.nodes.get_mut(&l).unwrap().raw.transfer_leader(t))?;
                        self.drain(l)?;
                    }
                }
            }
            988..=993 => {
                if let Some(l) = self.leader() {
                    let r = self.nodes.get_mut(&l).unwrap().raw.hibernate().map(|_| ());
                    step_ok(r)?;
                    self.drain(l)?;
                }
            }
            _ => {
                // The failure detector of the server wakes sleeping replicas.
                for id in alive {
                    self.nodes.get_mut(&id).unwrap().raw.wake();
                }
            }
        }
        self.check_leaders()
    }

    /// Heals everything and runs fault-free rounds: the group must elect a leader and
    /// commit a new command on every member of the leader's configuration.
    fn check_progress(&mut self, seed: u64) -> Check {
        self.side.clear();
        self.drop_pct = 0;
        self.dup_pct = 0;
        for id in self.ids() {
            if !self.nodes[&id].alive {
                self.restart(id, seed)?;
            }
            self.nodes.get_mut(&id).unwrap().raw.wake();
        }
        let mut target: Option<(NodeId, u64)> = None;
        for _round in 0..400 {
            for id in self.ids() {
                step_ok(self.nodes.get_mut(&id).unwrap().raw.tick())?;
                self.drain(id)?;
            }
            while !self.net.is_empty() || self.nodes.values().any(|n| !n.pending.is_empty()) {
                for id in self.ids() {
                    while !self.nodes[&id].pending.is_empty() {
                        self.persist_one(id)?;
                    }
                }
                while !self.net.is_empty() {
                    self.deliver()?;
                }
            }
            self.check_leaders()?;
            if target.is_none() {
                if let Some(l) = self.leader() {
                    let cmd = Bytes::copy_from_slice(&u64::MAX.to_be_bytes());
                    if let Ok(idx) = self.nodes.get_mut(&l).unwrap().raw.propose(cmd) {
                        target = Some((l, idx));
                    }
                    self.drain(l)?;
                }
            }
            if let Some((l, _)) = target {
                if self.leader() != Some(l) {
                    // Leadership moved before the command committed: propose again.
                    target = None;
                    continue;
                }
            }
            if let Some((l, idx)) = target {
                let conf = self.nodes[&l].app.conf.clone();
                let done = conf
                    .voters
                    .iter()
                    .chain(&conf.learners)
                    .all(|m| self.nodes.get(m).is_some_and(|n| n.app.index >= idx));
                if done {
                    if self.check.applied.get(&idx).map(|(_, d)| &d[..])
                        != Some(&u64::MAX.to_be_bytes()[..])
                    {
                        // Leadership changed and the proposal was replaced: try again.
                        target = None;
                        continue;
                    }
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no progress after healing (leader {:?}, target {target:?})\n{}",
            self.leader(),
            self.dump()
        ))
    }

    /// Per-node state for failure reports.
    fn dump(&self) -> String {
        let mut out = String::new();
        for (id, n) in &self.nodes {
            let r = n.raw.raft();
            let log = r.raft_log();
            out.push_str(&format!(
                "node {id}: alive {} role {:?} term {} lead {} commit {} applied {} app {} last {:?} conf {:?} hib {}\n",
                n.alive,
                r.role(),
                r.term(),
                r.leader(),
                log.commit_index(),
                log.applied_index(),
                n.app.index,
                log.last_log_index(),
                r.conf_state(),
                r.is_hibernating(),
            ));
            if r.role() == StateRole::Leader {
                for &p in self.nodes.keys() {
                    if let Some(pr) = r.progress(p) {
                        out.push_str(&format!("    progress {p}: {pr:?}\n"));
                    }
                }
            }
        }
        out
    }
}

fn run_seed(seed: u64, steps: u64) -> Result<(u64, Stats), String> {
    let voters = if seed & 1 == 0 { 3 } else { 5 };
    let mut sim = Sim::new(seed, voters);
    for _ in 0..steps {
        sim.random_step(seed)
            .map_err(|e| format!("step {}: {e}", sim.step))?;
    }
    sim.check_progress(seed)
        .map_err(|e| format!("after {} steps: {e}", sim.step))?;
    Ok((sim.step, sim.check.stats))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn simulation_preserves_raft_safety_properties() {
    let seeds = env_u64("PHOENIX_SIM_SEEDS", 10_000);
    let base = env_u64("PHOENIX_SIM_BASE_SEED", 0);
    let steps = env_u64("PHOENIX_SIM_STEPS", 3000);
    let start = Instant::now();
    let mut total_steps = 0u64;
    let mut stats = Stats::default();
    for seed in base..base + seeds {
        let r = catch_unwind(AssertUnwindSafe(|| run_seed(seed, steps)));
        match r {
            Ok(Ok((n, st))) => {
                total_steps += n;
                stats.add(st);
            }
            Ok(Err(e)) => panic!(
                "simulation failed: {e}\nreplay: PHOENIX_SIM_BASE_SEED={seed} PHOENIX_SIM_SEEDS=1 PHOENIX_SIM_STEPS={steps} cargo test -p phoenix-raft --test sim"
            ),
            Err(_) => panic!(
                "simulation panicked (see above)\nreplay: PHOENIX_SIM_BASE_SEED={seed} PHOENIX_SIM_SEEDS=1 PHOENIX_SIM_STEPS={steps} cargo test -p phoenix-raft --test sim"
            ),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "simulated {seeds} seeds, {total_steps} steps in {secs:.1} s: {:.0} steps/s",
        total_steps as f64 / secs.max(1e-9)
    );
    println!("exercised: {stats:?}");
    if seeds >= 100 {
        // A simulation that stopped electing or committing would check nothing.
        assert!(
            stats.leader_terms >= seeds && stats.commands_applied >= 10 * seeds,
            "{stats:?}"
        );
        assert!(
            stats.snapshots_installed > 0
                && stats.conf_changes_applied > 0
                && stats.reads_checked > 0
        );
    }
}
