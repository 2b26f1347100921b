//! State shared between the raft driver thread and the async services.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock};
use phoenix_engine::Db;
use phoenix_log::LogStore;
use phoenix_proto as proto;

use crate::config::{Config, MetaMember};
use crate::meta::{LeaderView, MetaState, META_GROUP};
use crate::node::Event;
use crate::transport::Transport;

/// What the services see of a hosted group (published by the driver every round).
#[derive(Debug, Clone, Default)]
pub struct GroupView {
    /// The group's route (range, epoch, replicas).
    pub route: proto::Route,
    /// Known leader (0 = none).
    pub leader: u64,
    /// Whether this node leads the group.
    pub is_leader: bool,
    /// Current term.
    pub term: u64,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// First index still in the log.
    pub log_first: u64,
    /// Why the replica stopped, if it did (node.rs `fail_group`).
    pub failed: Option<String>,
    /// Whether the group sleeps (no ticks, no heartbeats) on this node.
    pub hibernating: bool,
    /// The route of the group the last split of this one made (StaleEpoch answers and
    /// heartbeats carry it).
    pub split_child: Option<proto::Route>,
    /// Frozen for a merge into this group (0: not), at this log index: requests are
    /// refused until the merge ends.
    pub merging_into: u64,
    pub merge_index: u64,
    /// Applying is held before a merge's commit until this node's replica of this group
    /// (the source) reaches the prepare (0: not held).
    pub merge_waiting_for: u64,
    /// Whether the group's state may hold key expiries: `Some(false)` only once the
    /// replica knows it holds none, so reads skip looking for them; set back to `None` or
    /// `Some(true)` before a write that may bring one (node.rs).
    pub expiries: Option<bool>,
}

/// The node's shared state.
pub struct Shared {
    /// Configuration.
    pub cfg: Config,
    /// The engine every replica writes to.
    pub engine: Arc<Db>,
    /// The log store every replica's log lives in.
    pub log: Arc<LogStore>,
    /// Hosted groups.
    pub groups: RwLock<HashMap<u64, GroupView>>,
    /// Node id → address, learned from routes and the meta registry.
    pub addrs: Arc<RwLock<HashMap<u64, String>>>,
    /// Applied meta state (meaningful on meta members).
    pub meta: RwLock<MetaState>,
    /// Soft state of the meta leader.
    pub leader_view: Mutex<LeaderView>,
    /// The meta leader's operators under way (leader transfers). Lock order:
    /// `meta`, then `leader_view`, then `operators`.
    pub operators: Mutex<phoenix_meta::Operators>,
    /// The meta leader's scrub schedule (phoenix_meta::Scrubs). Lock it after
    /// `operators`.
    pub scrub_schedule: Mutex<phoenix_meta::Scrubs>,
    /// The meta leader's clocks for merges: since when it has seen each planned merge
    /// in its prepare phase (given up past `MERGE_PREPARE_MAX`), and each group at its
    /// route's range epoch (merged by size only past `Config::merge_after`). Lock it
    /// after `operators`.
    pub merge_clocks: Mutex<MergeClocks>,
    /// Since when this node leads the meta group, as its scheduler last saw (None: it
    /// does not). Lock it before `leader_view` and `operators`.
    pub meta_leader_since: Mutex<Option<Instant>>,
    /// The node is stopping: its heartbeats say so, so no leadership is moved to it.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Input of the raft driver.
    pub events: Sender<Event>,
    /// Outgoing raft messages.
    pub transport: Transport,
    /// What this node presents to the nodes it calls (TLS, its token).
    pub creds: phoenix_proto::security::Credentials,
    /// Peer links cut by fault injection.
    pub links: Arc<crate::faults::Links>,
    /// The disk's fault switches (they act only with fault injection on: the file
    /// system is then a `FaultFs` over them).
    pub disk_faults: Arc<phoenix_storage::DiskFaults>,
    /// The file system under the engine and the log store.
    pub fs: phoenix_storage::SharedFs,
    /// The data disk's free space, and whether client writes are refused for lack of it.
    pub disk: crate::disk::DiskSpace,
    /// What the node counts as it happens (metrics.rs).
    pub metrics: crate::metrics::NodeMetrics,
    /// What the split check last measured (split_check.rs).
    pub split: crate::split_check::SplitCheck,
    /// The latest scrub of each hosted group (scrub.rs).
    pub scrubs: Arc<crate::scrub::Scrubs>,
    /// Room for data-group snapshots received and not installed yet
    /// (`snapshot::STAGED_MAX`).
    pub snapshots_staged: Arc<tokio::sync::Semaphore>,
    /// Room for data-group snapshots this node builds and sends (`snapshot::SENDING_MAX`).
    pub snapshots_sending: Arc<tokio::sync::Semaphore>,
    /// When the node started.
    pub started: Instant,
    /// Tokio runtime handle for background tasks started from the driver thread.
    pub runtime: tokio::runtime::Handle,
    /// Woken when a replica's membership or leadership changes, or a replica comes or
    /// goes: the heartbeat loop then reports soon instead of at its next interval, so
    /// the meta leader's operators (each step waits for a report) move on at once.
    pub report_soon: tokio::sync::Notify,
    /// The meta group's members as the meta leader last named them in a heartbeat
    /// answer (empty until one does); the heartbeat loop is its one writer.
    pub learned_meta: RwLock<Vec<MetaMember>>,
    /// The lowest protocol level of the registered nodes as the meta leader last named
    /// them in a heartbeat answer (0 until one does): commands a replica of an older
    /// binary would not apply (`Incr`) are proposed only at or above their level. The
    /// heartbeat loop is its one writer.
    pub cluster_protocol: std::sync::atomic::AtomicU32,
    /// Set (with the cause) when the node must restart its storage: its log store or
    /// engine failed and the disk takes writes again (disk.rs). The node then stops and
    /// runs again in the process (lib.rs).
    pub storage_restart: tokio::sync::watch::Sender<Option<String>>,
    /// Which run of the node in this process this is (1: the first; each storage
    /// restart starts another), and whether the storage may restart again (not after
    /// `STORAGE_RESTARTS_MAX` quick ones in a row: lib.rs).
    pub run: u32,
    pub may_restart_storage: bool,
}

impl Shared {
    /// The replica description of node `id` (with its address if known).
    pub fn replica_of(&self, id: u64) -> Option<proto::Replica> {
        if id == 0 {
            return None;
        }
        Some(proto::Replica {
            protocol: 0,
            node_id: id,
            addr: self.addrs.read().get(&id).cloned().unwrap_or_default(),
        })
    }

    /// Records the addresses of a route's replicas.
    pub fn learn_addrs(&self, route: &proto::Route) {
        let mut a = self.addrs.write();
        for r in &route.replicas {
            if r.node_id != 0 && !r.addr.is_empty() {
                a.insert(r.node_id, r.addr.clone());
            }
        }
    }

    /// Address of node `id`.
    pub fn addr_of(&self, id: u64) -> Option<String> {
        self.addrs.read().get(&id).cloned()
    }

    /// The meta group's members (voters and learners) as this node knows them: its own
    /// meta replica's membership if it hosts a running one (exact on the meta leader),
    /// else the members the meta leader last named, else `--meta`. The meta group's
    /// membership changes (a dead member is replaced), so `--meta` is only where a node
    /// starts looking.
    pub fn meta_members(&self) -> Vec<MetaMember> {
        if let Some(v) = self.groups.read().get(&META_GROUP) {
            if v.failed.is_none() && !v.route.replicas.is_empty() {
                return v
                    .route
                    .replicas
                    .iter()
                    .map(|r| MetaMember {
                        id: r.node_id,
                        addr: if r.addr.is_empty() {
                            self.addr_of(r.node_id).unwrap_or_default()
                        } else {
                            r.addr.clone()
                        },
                    })
                    .collect();
            }
        }
        let learned = self.learned_meta.read();
        if !learned.is_empty() {
            return learned.clone();
        }
        self.cfg.meta.clone()
    }

    /// See [`Shared::cluster_protocol`].
    pub fn cluster_protocol(&self) -> u32 {
        self.cluster_protocol
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The ids of [`meta_members`](Self::meta_members).
    pub fn meta_member_ids(&self) -> Vec<u64> {
        self.meta_members().into_iter().map(|m| m.id).collect()
    }

    /// Where to look for the meta leader: the [`meta_members`](Self::meta_members),
    /// then the members last named and the `--meta` members not among them (a list may
    /// be stale: a removed member's own replica until it is dropped, a list learned
    /// before a restart; another may still hold a member).
    pub fn meta_addrs(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let learned = self.learned_meta.read().clone();
        let all = self
            .meta_members()
            .into_iter()
            .chain(learned)
            .chain(self.cfg.meta.clone());
        for m in all {
            if !m.addr.is_empty() && !out.contains(&m.addr) {
                out.push(m.addr);
            }
        }
        out
    }
}

/// Shared state handle.
pub type SharedRef = Arc<Shared>;

/// See [`Shared::merge_clocks`].
#[derive(Debug, Default)]
pub struct MergeClocks {
    /// Source group → when its plan was first seen in the prepare phase.
    pub preparing: HashMap<u64, Instant>,
    /// Group → (range epoch, since when).
    pub epochs: HashMap<u64, (u64, Instant)>,
}
