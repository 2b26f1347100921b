//! Fault injection for fault runs: links to chosen peer nodes cut, as a network
//! partition looks from this node, and a failing disk. [`Links`] owns the cut set; the
//! transport (raft messages both ways), snapshot sending and the node's meta calls
//! consult it. The disk's switches are a [`phoenix_storage::DiskFaults`] under the
//! engine's and the log store's file system (a `FaultFs`, only with fault injection on).
//! The `Faults` gRPC service sets both, and only on a node started with
//! `--fault-injection` (`Config::fault_injection`); elsewhere every call is refused.
//!
//! Clients are not cut: a partitioned node still answers them (as a leader cut off from
//! its followers does, until check-quorum deposes it).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use phoenix_proto as proto;
use tonic::{Request, Response, Status};

/// Most peers named in one `SetLinks` call (a cluster's node ids, not user data).
const CUT_NODES_MAX: usize = 1024;

/// The peer nodes whose links to this node are cut.
pub struct Links {
    /// Fast path: false while nothing is cut (every raft message asks).
    any: AtomicBool,
    cut: RwLock<BTreeSet<u64>>,
    /// Node id → address (the node's shared map): meta calls go by address.
    addrs: Arc<RwLock<HashMap<u64, String>>>,
    /// Fault injection is on (`--fault-injection`): links can be cut at all.
    enabled: bool,
}

impl Links {
    /// No link cut; `addrs` resolves addresses for [`Links::is_cut_addr`]; `enabled`:
    /// whether links can be cut at all (`--fault-injection`).
    pub fn new(addrs: Arc<RwLock<HashMap<u64, String>>>, enabled: bool) -> Links {
        Links {
            any: AtomicBool::new(false),
            cut: RwLock::new(BTreeSet::new()),
            addrs,
            enabled,
        }
    }

    /// Whether links can be cut (fault injection on): streams then watch for cuts.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the link to node `node` is cut.
    pub fn is_cut(&self, node: u64) -> bool {
        self.any.load(Ordering::Acquire) && self.cut.read().contains(&node)
    }

    /// Whether the node at `addr` is one whose link is cut.
    pub fn is_cut_addr(&self, addr: &str) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let cut = self.cut.read();
        self.addrs
            .read()
            .iter()
            .any(|(id, a)| a == addr && cut.contains(id))
    }

    /// Replaces the cut set (empty: every link healed).
    pub fn set(&self, nodes: BTreeSet<u64>) {
        let mut cut = self.cut.write();
        self.any.store(!nodes.is_empty(), Ordering::Release);
        *cut = nodes;
    }

    /// The cut set now.
    pub fn cut(&self) -> Vec<u64> {
        self.cut.read().iter().copied().collect()
    }
}

/// The `Faults` gRPC service.
pub struct FaultsService {
    /// Shared node state.
    pub shared: Arc<crate::shared::Shared>,
}

impl FaultsService {
    fn refusal(&self) -> Option<proto::Error> {
        let me = self.shared.cfg.node_id;
        (!self.shared.cfg.fault_injection).then(|| {
            proto::Error::invalid_argument(format!(
                "fault injection is off on node {me} (start it with --fault-injection)"
            ))
        })
    }
}

#[tonic::async_trait]
impl proto::faults_server::Faults for FaultsService {
    async fn set_disk(
        &self,
        request: Request<proto::SetDiskRequest>,
    ) -> Result<Response<proto::SetDiskResponse>, Status> {
        let r = request.into_inner();
        let disk = &self.shared.disk_faults;
        let error = self.refusal();
        if error.is_none() {
            tracing::warn!(
                node = self.shared.cfg.node_id,
                fail_writes = r.fail_writes,
                fail_syncs = r.fail_syncs,
                space_cap = r.space_cap,
                "fault injection: disk"
            );
            disk.set(r.fail_writes, r.fail_syncs);
            disk.set_space(r.space_cap);
        }
        let (fail_writes, fail_syncs) = disk.get();
        Ok(Response::new(proto::SetDiskResponse {
            error,
            fail_writes,
            fail_syncs,
            space_cap: disk.space(),
        }))
    }

    async fn set_links(
        &self,
        request: Request<proto::SetLinksRequest>,
    ) -> Result<Response<proto::SetLinksResponse>, Status> {
        let r = request.into_inner();
        let links = &self.shared.links;
        let refuse = |why: String| proto::SetLinksResponse {
            error: Some(proto::Error::invalid_argument(why)),
            cut_nodes: links.cut(),
        };
        let me = self.shared.cfg.node_id;
        let resp = if let Some(e) = self.refusal() {
            proto::SetLinksResponse {
                error: Some(e),
                cut_nodes: links.cut(),
            }
        } else if r.cut_nodes.len() > CUT_NODES_MAX {
            refuse(format!(
                "{} nodes to cut, at most {CUT_NODES_MAX}",
                r.cut_nodes.len()
            ))
        } else if r.cut_nodes.iter().any(|&n| n == 0 || n == me) {
            refuse(format!(
                "cannot cut node 0 or this node ({me}): {:?}",
                r.cut_nodes
            ))
        } else {
            let nodes: BTreeSet<u64> = r.cut_nodes.into_iter().collect();
            tracing::warn!(node = me, cut = ?nodes, "fault injection: links cut");
            links.set(nodes);
            proto::SetLinksResponse {
                error: None,
                cut_nodes: links.cut(),
            }
        };
        Ok(Response::new(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_links_by_id_and_address() {
        let addrs = Arc::new(RwLock::new(HashMap::from([
            (1, "a:1".to_string()),
            (2, "a:2".to_string()),
            (3, "a:3".to_string()),
        ])));
        let l = Links::new(addrs, true);
        assert!(!l.is_cut(2) && !l.is_cut_addr("a:2"));
        l.set(BTreeSet::from([2, 3]));
        assert!(l.is_cut(2) && l.is_cut(3) && !l.is_cut(1));
        assert!(l.is_cut_addr("a:3") && !l.is_cut_addr("a:1") && !l.is_cut_addr("b:9"));
        assert_eq!(l.cut(), vec![2, 3]);
        l.set(BTreeSet::new());
        assert!(!l.is_cut(2) && !l.is_cut_addr("a:3"));
    }
}
