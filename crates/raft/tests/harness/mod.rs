//! A small synchronous cluster for scenario tests: nodes with `MemStorage`, a FIFO
//! network with partitions and message hooks, crash/restart from storage.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use phoenix_raft::{
    ConfChange, ConfState, Config, Entry, EntryKind, Error, HardState, MemStorage, Message,
    MessageType, NodeId, RawNode, ReadState, StateRole,
};

/// The application side of one node: what it applied.
pub struct Node {
    pub raw: RawNode<MemStorage>,
    /// (index, term, data) of applied normal entries.
    pub applied: Vec<(u64, u64, Bytes)>,
    pub conf: ConfState,
    pub read_states: Vec<ReadState>,
}

pub type Hook = Box<dyn FnMut(&mut Message) -> bool>;

pub struct Network {
    pub nodes: BTreeMap<NodeId, Node>,
    pub down: BTreeSet<NodeId>,
    pub queue: VecDeque<Message>,
    /// Directed links that drop everything.
    pub cut: BTreeSet<(NodeId, NodeId)>,
    /// Returns false to drop the message; may rewrite it.
    pub hook: Option<Hook>,
    pub cfg: Box<dyn Fn(NodeId) -> Config>,
    /// Every message delivered, for assertions.
    pub delivered: Vec<Message>,
}

pub fn cfg_default(id: NodeId) -> Config {
    let mut c = Config::new(id);
    c.seed = 7;
    c
}

pub fn cfg_plain(id: NodeId) -> Config {
    let mut c = cfg_default(id);
    c.pre_vote = false;
    c.check_quorum = false;
    c
}

/// Entries with the given terms at indexes 1.. (data = "t{term}i{index}").
pub fn ents_with_terms(terms: &[u64]) -> Vec<Entry> {
    terms
        .iter()
        .enumerate()
        .map(|(k, &t)| Entry {
            term: t,
            index: k as u64 + 1,
            kind: EntryKind::Normal,
            data: Bytes::from(format!("t{t}i{}", k + 1)),
            conflict_keys: None,
        })
        .collect()
}

impl Network {
    pub fn new(ids: &[NodeId], cfg: impl Fn(NodeId) -> Config + 'static) -> Network {
        let conf = ConfState::with_voters(ids.iter().copied());
        let stores = ids
            .iter()
            .map(|&id| (id, MemStorage::new_with_conf(conf.clone())))
            .collect();
        Network::with_stores(stores, cfg)
    }

    /// Nodes whose storage is preset (e.g. with logs of a paper figure).
    pub fn with_stores(
        stores: Vec<(NodeId, MemStorage)>,
        cfg: impl Fn(NodeId) -> Config + 'static,
    ) -> Network {
        let mut nodes = BTreeMap::new();
        for (id, store) in stores {
            let conf = phoenix_raft::Storage::initial_state(&store)
                .unwrap()
                .conf_state;
            let raw = RawNode::new(&cfg(id), store).unwrap();
            nodes.insert(
                id,
                Node {
                    raw,
                    applied: Vec::new(),
                    conf,
                    read_states: Vec::new(),
                },
            );
        }
        Network {
            nodes,
            down: BTreeSet::new(),
            queue: VecDeque::new(),
            cut: BTreeSet::new(),
            hook: None,
            cfg: Box::new(cfg),
            delivered: Vec::new(),
        }
    }

    /// Storage with `terms` as the log, hard state term `term`, membership `voters`.
    pub fn preset_store(voters: &[NodeId], terms: &[u64], term: u64) -> MemStorage {
        let mut s = MemStorage::new_with_conf(ConfState::with_voters(voters.iter().copied()));
        s.append(&ents_with_terms(terms)).unwrap();
        s.set_hard_state(HardState {
            term,
            vote: 0,
            commit: 0,
        });
        s
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[&id]
    }

    pub fn raw(&mut self, id: NodeId) -> &mut RawNode<MemStorage> {
        &mut self.nodes.get_mut(&id).unwrap().raw
    }

    /// Persists, sends and applies every ready of `id` (synchronous storage).
    pub fn process(&mut self, id: NodeId) {
        if self.down.contains(&id) {
            return;
        }
        loop {
            let node = self.nodes.get_mut(&id).unwrap();
            if !node.raw.has_ready() {
                break;
            }
            let mut rd = node.raw.ready().unwrap();
            self.queue.extend(rd.messages.drain(..));
            let node = self.nodes.get_mut(&id).unwrap();
            if let Some(s) = rd.snapshot.clone() {
                node.conf = s.meta.conf.clone();
                node.applied.retain(|(i, _, _)| *i <= s.meta.index);
                node.raw.store_mut().apply_snapshot(s).unwrap();
            }
            node.raw.store_mut().append(&rd.entries).unwrap();
            if let Some(hs) = rd.hard_state {
                node.raw.store_mut().set_hard_state(hs);
            }
            node.read_states.append(&mut rd.read_states);
            for e in &rd.committed_entries {
                match e.kind {
                    EntryKind::Normal => {
                        if !e.data.is_empty() {
                            node.applied.push((e.index, e.term, e.data.clone()));
                        }
                    }
                    EntryKind::ConfChange => {
                        let cc = ConfChange::decode(&e.data).unwrap();
                        let cs = node.raw.apply_conf_change(cc).unwrap();
                        node.raw.store_mut().set_conf_state(cs.clone());
                        node.conf = cs;
                    }
                }
            }
            let persisted: Vec<Message> = rd.persisted_messages.drain(..).collect();
            node.raw.advance(rd).unwrap();
            node.raw.check_invariants().unwrap();
            self.queue.extend(persisted);
        }
    }

    pub fn process_all(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.process(id);
        }
    }

    fn passes(&mut self, m: &mut Message) -> bool {
        if self.down.contains(&m.to)
            || self.down.contains(&m.from)
            || self.cut.contains(&(m.from, m.to))
        {
            return false;
        }
        if !self.nodes.contains_key(&m.to) {
            return false;
        }
        match self.hook.as_mut() {
            Some(h) => h(m),
            None => true,
        }
    }

    /// Delivers messages until the network is quiet.
    pub fn settle(&mut self) {
        self.process_all();
        let mut budget = 100_000;
        while let Some(mut m) = self.queue.pop_front() {
            budget -= 1;
            assert!(budget > 0, "network did not settle");
            if !self.passes(&mut m) {
                continue;
            }
            let to = m.to;
            self.delivered.push(m.clone());
            match self.raw(to).step(m) {
                Ok(()) | Err(Error::UnknownPeer { .. }) => {}
                Err(e) => panic!("step on node {to} failed: {e}"),
            }
            self.process(to);
        }
    }

    pub fn tick(&mut self, id: NodeId) {
        if !self.down.contains(&id) {
            self.raw(id).tick().unwrap();
        }
    }

    /// Ticks every live node `n` times, settling the network after each round.
    pub fn tick_all(&mut self, n: usize) {
        for _ in 0..n {
            let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
            for id in ids {
                self.tick(id);
            }
            self.settle();
        }
    }

    pub fn campaign(&mut self, id: NodeId) {
        self.raw(id).campaign().unwrap();
        self.settle();
    }

    pub fn propose(&mut self, id: NodeId, data: &str) -> Result<u64, Error> {
        let r = self
            .raw(id)
            .propose(Bytes::copy_from_slice(data.as_bytes()));
        self.settle();
        r
    }

    pub fn isolate(&mut self, id: NodeId) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for o in ids {
            if o != id {
                self.cut.insert((id, o));
                self.cut.insert((o, id));
            }
        }
    }

    pub fn partition(&mut self, a: &[NodeId], b: &[NodeId]) {
        for &x in a {
            for &y in b {
                self.cut.insert((x, y));
                self.cut.insert((y, x));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Stops a node: unsent output is lost, storage survives.
    pub fn crash(&mut self, id: NodeId) {
        self.down.insert(id);
    }

    /// Restarts a node from its storage (the application re-applies from the snapshot).
    pub fn restart(&mut self, id: NodeId) {
        self.down.remove(&id);
        let node = self.nodes.get_mut(&id).unwrap();
        let store = node.raw.store().clone();
        let snap_index = store.snapshot_ref().meta.index;
        node.applied.retain(|(i, _, _)| *i <= snap_index);
        node.conf = phoenix_raft::Storage::initial_state(&store)
            .unwrap()
            .conf_state;
        node.raw = RawNode::new(&(self.cfg)(id), store).unwrap();
    }

    /// Adds a fresh node with an empty log, created (as the server does) with the
    /// membership that its addition produces: `conf` of the leader changed by `cc`.
    pub fn add_empty_node(&mut self, id: NodeId, cc: ConfChange) {
        let leader = self.leaders()[0];
        let conf = phoenix_raft::Raft::<MemStorage>::changed_conf(&self.nodes[&leader].conf, cc);
        let store = MemStorage::new_with_conf(conf.clone());
        let raw = RawNode::new(&(self.cfg)(id), store).unwrap();
        self.nodes.insert(
            id,
            Node {
                raw,
                applied: Vec::new(),
                conf,
                read_states: Vec::new(),
            },
        );
    }

    pub fn role(&self, id: NodeId) -> StateRole {
        self.nodes[&id].raw.raft().role()
    }

    pub fn term(&self, id: NodeId) -> u64 {
        self.nodes[&id].raw.raft().term()
    }

    pub fn committed(&self, id: NodeId) -> u64 {
        self.nodes[&id].raw.raft().committed()
    }

    /// The live leaders.
    pub fn leaders(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(id, n)| !self.down.contains(id) && n.raw.raft().role() == StateRole::Leader)
            .map(|(id, _)| *id)
            .collect()
    }

    /// (index, term) of every entry in `id`'s durable log.
    pub fn log_terms(&self, id: NodeId) -> Vec<(u64, u64)> {
        self.nodes[&id]
            .raw
            .store()
            .all_entries()
            .iter()
            .map(|e| (e.index, e.term))
            .collect()
    }

    pub fn applied_data(&self, id: NodeId) -> Vec<String> {
        self.nodes[&id]
            .applied
            .iter()
            .map(|(_, _, d)| String::from_utf8_lossy(d).into_owned())
            .collect()
    }

    /// Counts delivered messages of a kind.
    pub fn count_delivered(&self, kind: MessageType, pred: impl Fn(&Message) -> bool) -> usize {
        self.delivered
            .iter()
            .filter(|m| m.kind == kind && pred(m))
            .count()
    }
}
