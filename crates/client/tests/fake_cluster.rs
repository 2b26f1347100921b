//! The client's routing and retry behaviour against fake nodes: real tonic servers on
//! loopback whose Kv/Meta answers the test scripts (who leads, which epoch, failures),
//! over one shared in-memory map standing for the replicated data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use phoenix_client::{
    Client, ClientError, ClientOptions, ExpireAt, ExpireCondition, Expiry, WriteOp,
};
use phoenix_proto as pb;
use phoenix_proto::kv_server::{Kv, KvServer};
use phoenix_proto::meta_server::{Meta, MetaServer};
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

/// A scripted failure a node answers instead of serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// GroupUnavailable on every kv request.
    Unavailable,
    /// DeadlineExceeded on the next `n` kv requests.
    ServerTimeout(u64),
    /// OutcomeUnknown (proposed, then leadership lost) on the next kv request.
    LostLeadership,
    /// DiskFull on every kv request (the leader's disk is under its reserve).
    DiskFull,
}

struct State {
    /// (route, leader node id) per group; the route's leader field is what GetRoutes
    /// reports (may be stale or 0).
    routes: Mutex<Vec<pb::Route>>,
    leaders: Mutex<HashMap<u64, u64>>,
    /// Whether NotLeader answers carry the leader hint.
    hint: bool,
    data: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    fault: Mutex<Fault>,
    /// Kv requests received, per node id.
    hits: Mutex<HashMap<u64, u64>>,
    /// (client id, sequence) of every kv request received, in order.
    sessions: Mutex<Vec<(u64, u64)>>,
    /// Largest page a Scan answers.
    page: u32,
    addrs: Mutex<HashMap<u64, String>>,
    get_routes_calls: AtomicU64,
    /// Nodes that take kv reads and never answer (a paused process: the connection
    /// stays open, nothing comes back).
    silent: Mutex<std::collections::HashSet<u64>>,
    /// Whether the nodes serve `Kv.Batch` (false: a node from before it).
    batch: bool,
    /// `Kv.Batch` calls (streams opened, or refused when `batch` is off).
    batch_streams: AtomicU64,
    /// StaleEpoch answers carry the other groups' routes as related (a split's).
    related_in_stale: std::sync::atomic::AtomicBool,
    /// The next batch item is served, then its stream fails without answering it (the
    /// connection broke after the write applied).
    break_stream_after_serving: Mutex<bool>,
}

#[derive(Clone)]
struct Node {
    id: u64,
    st: Arc<State>,
}

fn contains(r: &pb::Route, key: &[u8]) -> bool {
    key >= r.start_key.as_ref() && (r.end_key.is_empty() || key < r.end_key.as_ref())
}

impl Node {
    /// Common checks of a kv request: fault, group, epoch, leadership, key range.
    fn admit(
        &self,
        header: Option<pb::RequestHeader>,
        keys: &[&[u8]],
    ) -> Result<pb::Route, pb::Error> {
        *self.st.hits.lock().unwrap().entry(self.id).or_default() += 1;
        let h = header.ok_or_else(|| pb::Error::invalid_argument("no header"))?;
        self.st.sessions.lock().unwrap().push((h.client_id, h.seq));
        assert!(h.timeout_ms > 0, "the client must send a deadline");
        {
            let mut f = self.st.fault.lock().unwrap();
            match *f {
                Fault::None => {}
                Fault::Unavailable => {
                    return Err(pb::Error::group_unavailable(h.group_id, "scripted"))
                }
                Fault::ServerTimeout(n) => {
                    *f = if n <= 1 {
                        Fault::None
                    } else {
                        Fault::ServerTimeout(n - 1)
                    };
                    return Err(pb::Error::deadline_exceeded(h.timeout_ms));
                }
                Fault::LostLeadership => {
                    *f = Fault::None;
                    return Err(pb::Error::outcome_unknown(h.group_id, "scripted"));
                }
                Fault::DiskFull => {
                    return Err(pb::Error::disk_full(
                        h.group_id,
                        self.id,
                        10,
                        100,
                        vec![self.id],
                    ))
                }
            }
        }
        let route = self
            .st
            .routes
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.group_id == h.group_id)
            .cloned()
            .ok_or_else(|| pb::Error::group_unavailable(h.group_id, "no such group"))?;
        if h.epoch < route.epoch {
            let mut err = pb::Error::stale_epoch(h.group_id, h.epoch, route);
            if self.st.related_in_stale.load(Ordering::Relaxed) {
                if let Some(pb::error::Kind::StaleEpoch(se)) = err.kind.as_mut() {
                    let routes = self.st.routes.lock().unwrap();
                    se.related = routes
                        .iter()
                        .filter(|r| r.group_id != h.group_id)
                        .cloned()
                        .collect();
                }
            }
            return Err(err);
        }
        let leader = self
            .st
            .leaders
            .lock()
            .unwrap()
            .get(&h.group_id)
            .copied()
            .unwrap_or(0);
        if leader != self.id {
            let hint = (self.st.hint && leader != 0).then(|| pb::Replica {
                protocol: 0,
                node_id: leader,
                addr: self
                    .st
                    .addrs
                    .lock()
                    .unwrap()
                    .get(&leader)
                    .cloned()
                    .unwrap_or_default(),
            });
            return Err(pb::Error::not_leader(h.group_id, hint));
        }
        for k in keys {
            if !contains(&route, k) {
                return Err(pb::Error::key_not_in_group(k, h.group_id, Some(route)));
            }
        }
        Ok(route)
    }
}

type R<T> = Result<Response<T>, Status>;

type BatchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::BatchResponse, Status>> + Send>>;

impl Node {
    async fn serve_item(&self, item: pb::BatchRequestItem) -> pb::BatchResponseItem {
        use pb::batch_request_item::Request as Q;
        use pb::batch_response_item::Response as A;
        let response = match item
            .request
            .expect("the client sends a request in every item")
        {
            Q::Get(r) => A::Get(self.get(Request::new(r)).await.unwrap().into_inner()),
            Q::Put(r) => A::Put(self.put(Request::new(r)).await.unwrap().into_inner()),
            Q::Delete(r) => A::Delete(self.delete(Request::new(r)).await.unwrap().into_inner()),
            Q::Cas(r) => A::Cas(self.cas(Request::new(r)).await.unwrap().into_inner()),
            // These nodes predate `Incr` and key expiry: the item is not served, as an
            // older server answers an item whose kind it cannot decode.
            Q::Incr(_) | Q::Expire(_) | Q::Ttl(_) | Q::PutEx(_) | Q::CasEx(_) => {
                return pb::BatchResponseItem {
                    id: item.id,
                    error: Some(pb::Error::invalid_argument(
                        "batch item carries no request (or one this server does not know)",
                    )),
                    response: None,
                }
            }
        };
        pb::BatchResponseItem {
            id: item.id,
            error: None,
            response: Some(response),
        }
    }
}

#[tonic::async_trait]
impl Kv for Node {
    type BatchStream = BatchStream;

    async fn batch(
        &self,
        req: Request<tonic::Streaming<pb::BatchRequest>>,
    ) -> R<Self::BatchStream> {
        self.st.batch_streams.fetch_add(1, Ordering::Relaxed);
        if !self.st.batch {
            return Err(Status::unimplemented("this node predates Kv.Batch"));
        }
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let node = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                for item in m.items {
                    let (node, tx) = (node.clone(), tx.clone());
                    tokio::spawn(async move {
                        let answer = node.serve_item(item).await;
                        let broken = std::mem::take(
                            &mut *node.st.break_stream_after_serving.lock().unwrap(),
                        );
                        let _ = tx.send(if broken {
                            Err(Status::unavailable("scripted: stream broken"))
                        } else {
                            Ok(pb::BatchResponse {
                                items: vec![answer],
                            })
                        });
                    });
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> R<pb::GetResponse> {
        let r = req.into_inner();
        if self.st.silent.lock().unwrap().contains(&self.id) {
            *self.st.hits.lock().unwrap().entry(self.id).or_default() += 1;
            std::future::pending::<()>().await;
        }
        Ok(Response::new(match self.admit(r.header, &[&r.key]) {
            Err(e) => pb::GetResponse {
                error: Some(e),
                ..Default::default()
            },
            Ok(_) => {
                let v = self.st.data.lock().unwrap().get(r.key.as_ref()).cloned();
                pb::GetResponse {
                    error: None,
                    found: v.is_some(),
                    value: v.unwrap_or_default().into(),
                }
            }
        }))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> R<pb::PutResponse> {
        let r = req.into_inner();
        let error = match self.admit(r.header, &[&r.key]) {
            Err(e) => Some(e),
            Ok(_) => {
                self.st
                    .data
                    .lock()
                    .unwrap()
                    .insert(r.key.to_vec(), r.value.to_vec());
                None
            }
        };
        Ok(Response::new(pb::PutResponse { error }))
    }

    async fn delete(&self, req: Request<pb::DeleteRequest>) -> R<pb::DeleteResponse> {
        let r = req.into_inner();
        let error = match self.admit(r.header, &[&r.key]) {
            Err(e) => Some(e),
            Ok(_) => {
                self.st.data.lock().unwrap().remove(r.key.as_ref());
                None
            }
        };
        Ok(Response::new(pb::DeleteResponse { error }))
    }

    async fn batch_get(&self, req: Request<pb::BatchGetRequest>) -> R<pb::BatchGetResponse> {
        let r = req.into_inner();
        let keys: Vec<&[u8]> = r.keys.iter().map(|k| k.as_ref()).collect();
        Ok(Response::new(match self.admit(r.header, &keys) {
            Err(e) => pb::BatchGetResponse {
                error: Some(e),
                results: vec![],
            },
            Ok(_) => {
                let data = self.st.data.lock().unwrap();
                let results = r
                    .keys
                    .iter()
                    .map(|k| {
                        let v = data.get(k.as_ref()).cloned();
                        pb::GetResult {
                            key: k.clone(),
                            found: v.is_some(),
                            value: v.unwrap_or_default().into(),
                        }
                    })
                    .collect();
                pb::BatchGetResponse {
                    error: None,
                    results,
                }
            }
        }))
    }

    async fn batch_write(&self, req: Request<pb::BatchWriteRequest>) -> R<pb::BatchWriteResponse> {
        let r = req.into_inner();
        let keys: Vec<&[u8]> = r.mutations.iter().map(|m| m.key.as_ref()).collect();
        let error = match self.admit(r.header, &keys) {
            Err(e) => Some(e),
            Ok(_) => {
                let mut data = self.st.data.lock().unwrap();
                for m in &r.mutations {
                    if m.op == pb::MutationOp::Delete as i32 {
                        data.remove(m.key.as_ref());
                    } else {
                        data.insert(m.key.to_vec(), m.value.to_vec());
                    }
                }
                None
            }
        };
        Ok(Response::new(pb::BatchWriteResponse { error }))
    }

    async fn scan(&self, req: Request<pb::ScanRequest>) -> R<pb::ScanResponse> {
        let r = req.into_inner();
        let route = match self.admit(r.header, &[&r.start]) {
            Err(e) => {
                return Ok(Response::new(pb::ScanResponse {
                    error: Some(e),
                    ..Default::default()
                }))
            }
            Ok(route) => route,
        };
        let limit = if r.limit == 0 {
            self.st.page
        } else {
            r.limit.min(self.st.page)
        } as usize;
        let data = self.st.data.lock().unwrap();
        let mut pairs = Vec::new();
        let mut more = false;
        let mut next_key = Bytes::new();
        for (k, v) in data.range(r.start.to_vec()..) {
            let past_end =
                (!r.end.is_empty() && k.as_slice() >= r.end.as_ref()) || !contains(&route, k);
            if past_end {
                break;
            }
            if pairs.len() == limit {
                more = true;
                next_key = k.clone().into();
                break;
            }
            pairs.push(pb::KvPair {
                key: k.clone().into(),
                value: v.clone().into(),
            });
        }
        Ok(Response::new(pb::ScanResponse {
            error: None,
            pairs,
            more,
            next_key,
            group_end: route.end_key,
        }))
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> R<pb::DeleteRangeResponse> {
        let r = req.into_inner();
        let route = match self.admit(r.header, &[&r.start]) {
            Err(e) => return Ok(Response::new(pb::DeleteRangeResponse { error: Some(e) })),
            Ok(route) => route,
        };
        let mut data = self.st.data.lock().unwrap();
        let doomed: Vec<Vec<u8>> = data
            .range(r.start.to_vec()..)
            .map(|(k, _)| k.clone())
            .take_while(|k| {
                contains(&route, k) && (r.end.is_empty() || k.as_slice() < r.end.as_ref())
            })
            .collect();
        for k in doomed {
            data.remove(&k);
        }
        Ok(Response::new(pb::DeleteRangeResponse { error: None }))
    }

    async fn cas(&self, req: Request<pb::CasRequest>) -> R<pb::CasResponse> {
        let r = req.into_inner();
        Ok(Response::new(match self.admit(r.header, &[&r.key]) {
            Err(e) => pb::CasResponse {
                error: Some(e),
                ..Default::default()
            },
            Ok(_) => {
                let mut data = self.st.data.lock().unwrap();
                let cur = data.get(r.key.as_ref()).cloned();
                let holds = match &cur {
                    Some(v) => r.expect_exists && v.as_slice() == r.expected.as_ref(),
                    None => !r.expect_exists,
                };
                if holds {
                    if r.delete {
                        data.remove(r.key.as_ref());
                    } else {
                        data.insert(r.key.to_vec(), r.new_value.to_vec());
                    }
                }
                pb::CasResponse {
                    error: None,
                    succeeded: holds,
                    current_found: cur.is_some(),
                    current_value: cur.unwrap_or_default().into(),
                }
            }
        }))
    }

    async fn incr(&self, _req: Request<pb::IncrRequest>) -> R<pb::IncrResponse> {
        Err(Status::unimplemented("this node predates Kv.Incr"))
    }

    async fn expire(&self, _req: Request<pb::ExpireRequest>) -> R<pb::ExpireResponse> {
        Err(Status::unimplemented("this node predates Kv.Expire"))
    }

    async fn ttl(&self, _req: Request<pb::TtlRequest>) -> R<pb::TtlResponse> {
        Err(Status::unimplemented("this node predates Kv.Ttl"))
    }

    async fn put_ex(&self, _req: Request<pb::PutRequest>) -> R<pb::PutResponse> {
        Err(Status::unimplemented("this node predates Kv.PutEx"))
    }

    async fn cas_ex(&self, _req: Request<pb::CasRequest>) -> R<pb::CasResponse> {
        Err(Status::unimplemented("this node predates Kv.CasEx"))
    }
}

#[tonic::async_trait]
impl Meta for Node {
    async fn get_routes(&self, _req: Request<pb::GetRoutesRequest>) -> R<pb::GetRoutesResponse> {
        self.st.get_routes_calls.fetch_add(1, Ordering::Relaxed);
        let routes = self.st.routes.lock().unwrap().clone();
        Ok(Response::new(pb::GetRoutesResponse {
            error: None,
            routes,
            version: 1,
        }))
    }

    async fn get_cluster(&self, _req: Request<pb::GetClusterRequest>) -> R<pb::GetClusterResponse> {
        let addrs = self.st.addrs.lock().unwrap().clone();
        let mut nodes: Vec<pb::NodeInfo> = addrs
            .iter()
            .map(|(&id, a)| pb::NodeInfo {
                node_id: id,
                addr: a.clone(),
                last_heartbeat_ms_ago: if id == 3 { u64::MAX } else { 100 },
                alive: id != 3,
                stats: Some(pb::NodeStats {
                    groups: 1,
                    leaders: u64::from(id == 1),
                    engine_bytes: 1000 * id,
                    log_bytes: 10,
                    uptime_ms: 5,
                    available_bytes: (id == 1).then_some(1 << 30),
                    disk_full: id == 2,
                    stopping: false,
                    protocol: 1,
                }),
                draining: false,
            })
            .collect();
        nodes.sort_by_key(|n| n.node_id);
        let groups = self
            .st
            .routes
            .lock()
            .unwrap()
            .iter()
            .map(|r| pb::GroupInfo {
                route: Some(r.clone()),
                replicas: vec![pb::ReplicaStats {
                    group_id: r.group_id,
                    node_id: 1,
                    is_leader: true,
                    term: 2,
                    commit_index: 9,
                    applied_index: 9,
                    log_first_index: 1,
                    approximate_bytes: 4096,
                    epoch: r.epoch,
                    stopped: String::new(),
                    hibernating: false,
                    ..Default::default()
                }],
            })
            .collect();
        Ok(Response::new(pb::GetClusterResponse {
            error: None,
            nodes,
            groups,
            meta_leader_node_id: 1,
            meta_group: None,
            scrub_mismatches: Vec::new(),
            operators: vec![pb::Operator {
                group_id: 2,
                kind: pb::OperatorKind::TransferLeader as i32,
                origin: pb::OperatorOrigin::Balance as i32,
                from_node: 1,
                to_node: 2,
                age_ms: 40,
                step: String::new(),
                into_group: 0,
            }],
        }))
    }

    /// Node 1 answers as a meta member that cannot reach the meta leader (retryable),
    /// the others as the meta leader: a node that hosts no replica is refused, any
    /// other target leads at once.
    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> R<pb::TransferLeaderResponse> {
        let r = req.into_inner();
        let error = if self.id == 1 {
            Some(pb::Error::group_unavailable(0, "no meta leader known"))
        } else if !self.st.addrs.lock().unwrap().contains_key(&r.to_node) {
            Some(pb::Error::invalid_argument(format!(
                "node {} holds no replica of group {}",
                r.to_node, r.group_id
            )))
        } else {
            None
        };
        Ok(Response::new(pb::TransferLeaderResponse {
            leader_node_id: if error.is_none() { r.to_node } else { 0 },
            error,
        }))
    }

    async fn add_replica(&self, _req: Request<pb::AddReplicaRequest>) -> R<pb::AddReplicaResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn remove_replica(
        &self,
        _req: Request<pb::RemoveReplicaRequest>,
    ) -> R<pb::RemoveReplicaResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn drain_node(&self, _req: Request<pb::DrainNodeRequest>) -> R<pb::DrainNodeResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn split_group(&self, _req: Request<pb::SplitGroupRequest>) -> R<pb::SplitGroupResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn scrub_group(&self, _req: Request<pb::ScrubGroupRequest>) -> R<pb::ScrubGroupResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn merge_group(&self, _req: Request<pb::MergeGroupRequest>) -> R<pb::MergeGroupResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn heartbeat(&self, _req: Request<pb::HeartbeatRequest>) -> R<pb::HeartbeatResponse> {
        Err(Status::unimplemented("fake"))
    }
}

struct Cluster {
    st: Arc<State>,
    servers: HashMap<u64, JoinHandle<()>>,
    addrs: Vec<String>,
}

fn route(group: u64, start: &str, end: &str, epoch: u64, addrs: &[String]) -> pb::Route {
    pb::Route {
        group_id: group,
        start_key: Bytes::copy_from_slice(start.as_bytes()),
        end_key: Bytes::copy_from_slice(end.as_bytes()),
        epoch,
        replicas: addrs
            .iter()
            .enumerate()
            .map(|(i, a)| pb::Replica {
                protocol: 0,
                node_id: i as u64 + 1,
                addr: a.clone(),
            })
            .collect(),
        leader_node_id: 0,
        leader_addr: String::new(),
        conf_version: 0,
        learners: Vec::new(),
    }
}

impl Cluster {
    /// Three fake nodes; `groups` = (start, end) of each group (ids 1..), all epoch 1.
    async fn start(groups: &[(&str, &str)], hint: bool, page: u32) -> Cluster {
        Self::start_with(groups, hint, page, true).await
    }

    /// As [`Cluster::start`]; `batch`: whether the nodes serve `Kv.Batch`.
    async fn start_with(groups: &[(&str, &str)], hint: bool, page: u32, batch: bool) -> Cluster {
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..3 {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(l.local_addr().unwrap().to_string());
            listeners.push(l);
        }
        let routes = groups
            .iter()
            .enumerate()
            .map(|(i, (s, e))| route(i as u64 + 1, s, e, 1, &addrs))
            .collect();
        let st = Arc::new(State {
            routes: Mutex::new(routes),
            leaders: Mutex::new((1..=groups.len() as u64).map(|g| (g, 1)).collect()),
            hint,
            data: Mutex::new(BTreeMap::new()),
            fault: Mutex::new(Fault::None),
            hits: Mutex::new(HashMap::new()),
            sessions: Mutex::new(Vec::new()),
            page,
            addrs: Mutex::new(
                addrs
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (i as u64 + 1, a.clone()))
                    .collect(),
            ),
            get_routes_calls: AtomicU64::new(0),
            silent: Mutex::new(std::collections::HashSet::new()),
            batch,
            batch_streams: AtomicU64::new(0),
            related_in_stale: std::sync::atomic::AtomicBool::new(false),
            break_stream_after_serving: Mutex::new(false),
        });
        let mut servers = HashMap::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let node = Node {
                id: i as u64 + 1,
                st: st.clone(),
            };
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
            let h = tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(KvServer::new(node.clone()))
                    .add_service(MetaServer::new(node))
                    .serve_with_incoming(incoming)
                    .await;
            });
            servers.insert(i as u64 + 1, h);
        }
        Cluster { st, servers, addrs }
    }

    fn set_leader(&self, group: u64, node: u64) {
        self.st.leaders.lock().unwrap().insert(group, node);
    }

    fn hits(&self) -> HashMap<u64, u64> {
        self.st.hits.lock().unwrap().clone()
    }

    fn total_hits(&self) -> u64 {
        self.hits().values().sum()
    }

    /// Stops node `id`'s server (its port then refuses connections).
    async fn kill(&mut self, id: u64) {
        if let Some(h) = self.servers.remove(&id) {
            h.abort();
            let _ = h.await;
        }
    }

    async fn client(&self, timeout: Duration) -> Client {
        let opts = ClientOptions {
            timeout,
            seed: 42,
            ..ClientOptions::default()
        };
        Client::connect(vec![self.addrs[0].clone()], opts)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_leader_hint_then_goes_straight_to_the_leader() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    c.set_leader(1, 3);
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"a", b"1").await.unwrap();
    // Node 1 (first replica) redirected to node 3, which served.
    assert_eq!(c.hits(), HashMap::from([(1, 1), (3, 1)]));
    assert_eq!(client.stats().redirects.load(Ordering::Relaxed), 1);
    // The leader is cached: the next requests go to node 3 only.
    for i in 0..10 {
        assert_eq!(
            client.get(b"a").await.unwrap(),
            Some(b"1".to_vec()),
            "read {i}"
        );
    }
    assert_eq!(c.hits(), HashMap::from([(1, 1), (3, 11)]));
    assert_eq!(
        client.stats().backoffs.load(Ordering::Relaxed),
        0,
        "a hinted redirect must not back off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_hints_it_tries_replicas_in_turn() {
    let c = Cluster::start(&[("", "")], false, 100).await;
    c.set_leader(1, 2);
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"k", b"v").await.unwrap();
    assert_eq!(c.hits().get(&2), Some(&1));
    let before = c.total_hits();
    client.get(b"k").await.unwrap();
    assert_eq!(c.total_hits() - before, 1, "the found leader is cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_fails_over_within_the_deadline() {
    let mut c = Cluster::start(&[("", "")], true, 100).await;
    c.set_leader(1, 3);
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"x", b"1").await.unwrap();
    // Node 3 dies; node 2 takes over; node 1 still names the old leader for a while,
    // then learns the new one.
    c.kill(3).await;
    c.set_leader(1, 0);
    let st = c.st.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        st.leaders.lock().unwrap().insert(1, 2);
    });
    let started = Instant::now();
    client.put(b"x", b"2").await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    assert_eq!(client.get(b"x").await.unwrap(), Some(b"2".to_vec()));
    assert!(client.stats().backoffs.load(Ordering::Relaxed) >= 2);
    // Served by node 2 from now on.
    let before = c.hits().get(&2).copied().unwrap_or(0);
    client.get(b"x").await.unwrap();
    assert_eq!(c.hits().get(&2).copied().unwrap_or(0), before + 1);
}

/// A write refused for a full disk was not applied: it is resent while the group may
/// move to a node with room, and succeeds once it does; with no room anywhere the
/// refusal comes back typed after `DISK_FULL_PATIENCE`, well before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_waited_out_briefly_then_returned() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_secs(10)).await;
    *c.st.fault.lock().unwrap() = Fault::DiskFull;
    let st = c.st.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        *st.fault.lock().unwrap() = Fault::None;
    });
    let started = Instant::now();
    client.put(b"x", b"1").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(350));
    assert_eq!(client.get(b"x").await.unwrap(), Some(b"1".to_vec()));

    *c.st.fault.lock().unwrap() = Fault::DiskFull;
    let started = Instant::now();
    let err = client.put(b"x", b"2").await.unwrap_err();
    let took = started.elapsed();
    match &err {
        ClientError::Refused { op, error, .. } => {
            assert_eq!(*op, "put");
            assert!(
                matches!(error.kind, Some(pb::error::Kind::DiskFull(_))),
                "{error:?}"
            );
        }
        other => panic!("expected the DiskFull refusal, got {other:?}"),
    }
    assert!(
        took >= phoenix_client::DISK_FULL_PATIENCE && took < Duration::from_secs(5),
        "took {took:?}"
    );
    // A deadline shorter than the patience ends in the typed refusal too, on time.
    let short = c.client(Duration::from_millis(600)).await;
    let started = Instant::now();
    let err = short.put(b"x", b"3").await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, ClientError::Refused { error, .. }
            if matches!(error.kind, Some(pb::error::Kind::DiskFull(_)))),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
    *c.st.fault.lock().unwrap() = Fault::None;
    assert_eq!(client.get(b"x").await.unwrap(), Some(b"1".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_group_ends_in_deadline_exceeded_on_time() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_millis(400)).await;
    *c.st.fault.lock().unwrap() = Fault::Unavailable;
    let started = Instant::now();
    let err = client.get(b"k").await.unwrap_err();
    let took = started.elapsed();
    match &err {
        ClientError::DeadlineExceeded {
            op, attempts, last, ..
        } => {
            assert_eq!(*op, "get");
            assert!(*attempts >= 3, "attempts {attempts}");
            assert!(last.contains("unavailable"), "{last}");
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_millis(2_000),
        "took {took:?}"
    );
    // Backoff grows: far fewer attempts than a busy loop would make.
    assert!(c.total_hits() < 40, "{} attempts in 400 ms", c.total_hits());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_epoch_after_split_reroutes() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"a", b"1").await.unwrap();
    // Group 1 splits at "m": group 2 takes ["m", ∞), both at epoch 2.
    {
        let mut routes = c.st.routes.lock().unwrap();
        routes[0] = route(1, "", "m", 2, &c.addrs);
        routes.push(route(2, "m", "", 2, &c.addrs));
    }
    c.set_leader(2, 2);
    client.put(b"x", b"2").await.unwrap();
    assert_eq!(client.get(b"x").await.unwrap(), Some(b"2".to_vec()));
    let routes = client.cached_routes();
    assert_eq!(routes.len(), 2, "{routes:?}");
    assert_eq!((routes[1].group_id, routes[1].epoch), (2, 2));
    // An atomic batch across the new boundary is refused before sending.
    let before = c.total_hits();
    let err = client
        .batch_write(&[
            WriteOp::Put(b"b".to_vec(), b"1".to_vec()),
            WriteOp::Put(b"y".to_vec(), b"1".to_vec()),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::CrossGroup { ref groups } if groups == &[1, 2]),
        "{err:?}"
    );
    assert_eq!(c.total_hits(), before);
    // A multi-group batch get is split per group.
    client
        .batch_write(&[
            WriteOp::Put(b"b".to_vec(), b"B".to_vec()),
            WriteOp::Delete(b"a".to_vec()),
        ])
        .await
        .unwrap();
    let got = client
        .batch_get(&[b"x".to_vec(), b"a".to_vec(), b"b".to_vec(), b"zz".to_vec()])
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![Some(b"2".to_vec()), None, Some(b"B".to_vec()), None]
    );
}

/// A StaleEpoch answer that names the group split off carries the client to it with no
/// routing table fetch (the meta service may not know the split yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_epoch_with_the_new_route_needs_no_route_fetch() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    c.st.related_in_stale.store(true, Ordering::Relaxed);
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"a", b"1").await.unwrap();
    {
        let mut routes = c.st.routes.lock().unwrap();
        routes[0] = route(1, "", "m", 2, &c.addrs);
        routes.push(route(2, "m", "", 2, &c.addrs));
    }
    c.set_leader(2, 2);
    let fetches = c.st.get_routes_calls.load(Ordering::Relaxed);
    client.put(b"x", b"2").await.unwrap();
    assert_eq!(client.get(b"x").await.unwrap(), Some(b"2".to_vec()));
    assert_eq!(c.st.get_routes_calls.load(Ordering::Relaxed), fetches);
    let routes = client.cached_routes();
    assert_eq!(routes.len(), 2, "{routes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_resent_in_their_session_and_not_without_one() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_secs(5)).await;
    let out = client.cas(b"c", None, Some(b"1")).await.unwrap();
    assert!(out.succeeded && out.previous.is_none());
    let out = client.cas(b"c", None, Some(b"2")).await.unwrap();
    assert!(!out.succeeded);
    assert_eq!(out.previous, Some(b"1".to_vec()));

    // With a session (the default) an ambiguous write is resent under the same
    // (client id, sequence): the group applies it at most once.
    for fault in [Fault::ServerTimeout(1), Fault::LostLeadership] {
        *c.st.fault.lock().unwrap() = fault;
        c.st.sessions.lock().unwrap().clear();
        let out = client.cas(b"c", Some(b"1"), Some(b"3")).await.unwrap();
        assert!(out.succeeded, "{fault:?}");
        let seen = c.st.sessions.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{fault:?}: sent, then resent: {seen:?}");
        assert!(seen[0].0 != 0 && seen[0].1 != 0, "{seen:?}");
        assert_eq!(seen[0], seen[1], "a resend keeps its sequence");
        client.put(b"c", b"1").await.unwrap();
    }
    // Each write has its own sequence; reads carry none.
    c.st.sessions.lock().unwrap().clear();
    client.put(b"c", b"4").await.unwrap();
    client.put(b"c", b"4").await.unwrap();
    assert_eq!(client.get(b"c").await.unwrap(), Some(b"4".to_vec()));
    let seen = c.st.sessions.lock().unwrap().clone();
    assert!(seen[1].1 > seen[0].1 && seen[2] == (0, 0), "{seen:?}");

    // Without a session nothing ambiguous is resent by default: a resent put could apply
    // again after another client's acknowledged write (a reader would see 1, 2, 1).
    let plain = Client::connect(
        vec![c.addrs[0].clone()],
        ClientOptions {
            timeout: Duration::from_secs(5),
            seed: 42,
            sessions: false,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    for op in ["cas", "put"] {
        *c.st.fault.lock().unwrap() = Fault::ServerTimeout(1);
        let before = c.total_hits();
        let err = if op == "cas" {
            plain.cas(b"c", Some(b"4"), Some(b"5")).await.unwrap_err()
        } else {
            plain.put(b"c", b"5").await.unwrap_err()
        };
        assert!(
            matches!(&err, ClientError::Ambiguous { op: o, .. } if *o == op),
            "{err:?}"
        );
        assert_eq!(
            c.total_hits() - before,
            1,
            "an ambiguous {op} must not be resent"
        );
    }
    // At-least-once, when asked for.
    let retrying = Client::connect(
        vec![c.addrs[0].clone()],
        ClientOptions {
            timeout: Duration::from_secs(5),
            seed: 42,
            sessions: false,
            retry_ambiguous_writes: true,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    *c.st.fault.lock().unwrap() = Fault::ServerTimeout(2);
    retrying.put(b"c", b"4").await.unwrap();
    // CAS with deletion.
    let out = client.cas(b"c", Some(b"4"), None).await.unwrap();
    assert!(out.succeeded);
    assert_eq!(client.get(b"c").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cas_retries_on_a_refused_connection() {
    let mut c = Cluster::start(&[("", "")], true, 100).await;
    c.set_leader(1, 2);
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"k", b"0").await.unwrap();
    // The cached leader (2) dies and 3 leads: connect errors are safe to retry.
    c.kill(2).await;
    c.set_leader(1, 3);
    let out = client.cas(b"k", Some(b"0"), Some(b"1")).await.unwrap();
    assert!(out.succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incr_on_nodes_that_predate_it_is_unsupported_at_once() {
    // Over the batch stream (the item is not served, then the unary method is not
    // known) and without it: a typed refusal, at once, not a retry until the deadline.
    for batch in [true, false] {
        let mut c = Cluster::start_with(&[("", "")], true, 100, batch).await;
        c.set_leader(1, 2);
        let client = c.client(Duration::from_secs(5)).await;
        client.put(b"n", b"1").await.unwrap();
        let started = Instant::now();
        let e = client.incr(b"n", 1).await.unwrap_err();
        assert!(
            matches!(&e, ClientError::Unsupported { op: "incr", .. }),
            "batch {batch}: {e}"
        );
        assert!(started.elapsed() < Duration::from_secs(2), "batch {batch}");
        // Key expiry likewise: a write with an expiry is refused, not written without
        // it (an older server would skip the fields it cannot decode).
        let ttl = Expiry::After(Duration::from_secs(60));
        for (op, e) in [
            (
                "put_ex",
                client.put_with(b"n", b"2", ttl).await.unwrap_err(),
            ),
            (
                "cas_ex",
                client
                    .cas_with(b"n", Some(b"1"), Some(b"2"), Expiry::Keep)
                    .await
                    .unwrap_err(),
            ),
            (
                "expire",
                client
                    .expire(b"n", ExpireAt::Never, ExpireCondition::ExpireAlways)
                    .await
                    .unwrap_err(),
            ),
            ("ttl", client.ttl(b"n").await.unwrap_err()),
        ] {
            assert!(
                matches!(&e, ClientError::Unsupported { op: o, .. } if *o == op),
                "batch {batch}, {op}: {e}"
            );
        }
        assert_eq!(client.get(b"n").await.unwrap(), Some(b"1".to_vec()));
        c.kill(2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_pages_across_groups() {
    let c = Cluster::start(&[("", "g"), ("g", "p"), ("p", "")], true, 3).await;
    c.set_leader(2, 2);
    c.set_leader(3, 3);
    let client = c.client(Duration::from_secs(5)).await;
    let keys: Vec<Vec<u8>> = (b'a'..=b'z').map(|b| vec![b, b'1']).collect();
    for k in &keys {
        client.put(k, k).await.unwrap();
    }
    let all = client.scan(b"", b"", 0).await.unwrap();
    assert_eq!(all.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), keys);
    let some = client.scan(b"e", b"t", 0).await.unwrap();
    assert_eq!(some.len(), (b'e'..b't').count());
    let limited = client.scan(b"c", b"", 7).await.unwrap();
    assert_eq!(limited.first().unwrap().0, b"c1".to_vec());
    assert_eq!(limited.len(), 7);
    let one = client.scan_prefix(b"q", 0).await.unwrap();
    assert_eq!(one, vec![(b"q1".to_vec(), b"q1".to_vec())]);
    // Manual paging with scan_page.
    let mut start = b"a".to_vec();
    let mut seen = 0;
    loop {
        let page = client.scan_page(&start, b"", 2).await.unwrap();
        seen += page.pairs.len();
        match page.next {
            Some(n) => start = n,
            None => break,
        }
    }
    assert_eq!(seen, 26);
    client.delete_range(b"f", b"r").await.unwrap();
    let left = client.scan(b"", b"", 0).await.unwrap();
    assert_eq!(left.len(), 26 - (b'f'..b'r').count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_checked_before_sending() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_secs(5)).await;
    let before = c.total_hits();
    let big_key = vec![b'k'; 4097];
    assert!(matches!(
        client.put(&big_key, b"v").await,
        Err(ClientError::KeyTooLarge {
            size: 4097,
            limit: 4096
        })
    ));
    let big_val = vec![0u8; (1 << 20) + 1];
    assert!(matches!(
        client.put(b"k", &big_val).await,
        Err(ClientError::ValueTooLarge { .. })
    ));
    assert!(matches!(
        client.get(b"").await,
        Err(ClientError::InvalidArgument(_))
    ));
    assert_eq!(c.total_hits(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_and_unreachable_seeds() {
    let c = Cluster::start(&[("", "m"), ("m", "")], true, 100).await;
    let client = c.client(Duration::from_secs(5)).await;
    let s = client.cluster_status().await.unwrap();
    assert_eq!(s.meta_leader, Some(1));
    assert_eq!(s.nodes.len(), 3);
    assert_eq!(s.nodes[2].last_heartbeat_ms_ago, None);
    assert!(!s.nodes[2].alive);
    let disk = |i: usize| (s.nodes[i].disk_free_bytes, s.nodes[i].disk_full);
    assert_eq!((disk(0), disk(1)), ((Some(1 << 30), false), (None, true)));
    assert_eq!(s.groups.len(), 2);
    assert_eq!(s.groups[1].start, b"m".to_vec());
    assert_eq!(s.groups[0].replica_status[0].approximate_bytes, 4096);
    assert_eq!(s.operators.len(), 1);
    assert_eq!(
        (s.operators[0].kind.as_str(), s.operators[0].origin.as_str()),
        ("transfer-leader", "balance")
    );
    assert_eq!((s.operators[0].from, s.operators[0].to), (1, 2));

    // A transfer goes past a node that cannot answer (retryable) to one that can; a
    // refusal comes back typed, at once.
    assert_eq!(client.transfer_leader(2, 3).await.unwrap(), 3);
    let t = Instant::now();
    match client.transfer_leader(2, 9).await {
        Err(ClientError::Refused { error, .. }) => {
            assert!(error.message.contains("holds no replica"), "{error}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // A node that predates a request kind answers Unimplemented: a refusal, at once.
    let t = Instant::now();
    match client.add_replica(1, 2).await {
        Err(ClientError::Refused { error, .. }) => {
            assert!(error.message.contains("older version"), "{error}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // A dead seed listed first is skipped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = Client::connect(vec![dead.clone(), c.addrs[1].clone()], opts.clone())
        .await
        .unwrap();
    client.put(b"q", b"1").await.unwrap();
    // No reachable seed: connect fails with the reason.
    let opts = ClientOptions {
        timeout: Duration::from_millis(300),
        ..opts
    };
    let err = Client::connect(vec![dead], opts).await.unwrap_err();
    assert!(
        matches!(err, ClientError::DeadlineExceeded { op: "connect", .. }),
        "{err:?}"
    );
    assert!(matches!(
        Client::new_lazy(vec!["nope".into()], ClientOptions::default()),
        Err(ClientError::BadEndpoint { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_requests_share_one_route_refresh() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = Client::new_lazy(vec![c.addrs[0].clone()], opts).unwrap();
    let mut tasks = Vec::new();
    for i in 0..32u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.put(format!("k{i}").as_bytes(), b"v").await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(c.st.get_routes_calls.load(Ordering::Relaxed), 1);
    assert_eq!(c.st.data.lock().unwrap().len(), 32);
}

/// A leader that stops answering (paused) while the other replicas still name it: the
/// read leaves it after one attempt timeout and does not go back to it on their hints,
/// so the failover costs one attempt timeout, not one per hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leader_costs_one_attempt_timeout() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    c.set_leader(1, 3);
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        attempt_timeout: Duration::from_millis(400),
        seed: 42,
        ..ClientOptions::default()
    };
    let client = Client::connect(vec![c.addrs[0].clone()], opts)
        .await
        .unwrap();
    client.put(b"k", b"v").await.unwrap();
    c.st.silent.lock().unwrap().insert(3);
    // The others name node 3 for 600 ms more (no election yet), then node 2.
    let st = c.st.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        st.leaders.lock().unwrap().insert(1, 2);
    });
    let before = c.hits().get(&3).copied().unwrap_or(0);
    let started = Instant::now();
    assert_eq!(client.get(b"k").await.unwrap(), Some(b"v".to_vec()));
    let took = started.elapsed();
    let at_3 = c.hits().get(&3).copied().unwrap_or(0) - before;
    assert_eq!(at_3, 1, "attempts at the silent node (took {took:?})");
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_calls_share_one_stream_per_node() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let client = c.client(Duration::from_secs(5)).await;
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let k = format!("k{i}");
                client.put(k.as_bytes(), b"v").await.unwrap();
                assert_eq!(client.get(k.as_bytes()).await.unwrap(), Some(b"v".to_vec()));
                client.delete(k.as_bytes()).await.unwrap();
                let out = client.cas(k.as_bytes(), None, Some(b"w")).await.unwrap();
                assert!(out.succeeded);
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(c.total_hits(), 256);
    assert_eq!(
        c.st.batch_streams.load(Ordering::Relaxed),
        1,
        "256 calls to the one leader ride one stream"
    );
    assert_eq!(c.st.data.lock().unwrap().len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_stream_is_called_unary() {
    let c = Cluster::start_with(&[("", "")], true, 100, false).await;
    let client = c.client(Duration::from_secs(5)).await;
    for i in 0..10u8 {
        client.put(&[i], b"v").await.unwrap();
        assert_eq!(client.get(&[i]).await.unwrap(), Some(b"v".to_vec()));
    }
    assert_eq!(c.total_hits(), 20, "every call served once, unary");
    assert_eq!(
        c.st.batch_streams.load(Ordering::Relaxed),
        1,
        "the stream is tried once, then the node is called unary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_cannot_connect_was_never_sent() {
    // Node 1, the first replica the client tries, is down before anyone connects; node
    // 2 leads. Without a session a write is resent only if it was never sent: the
    // refused connection of the stream's opening must say so.
    let mut c = Cluster::start(&[("", "")], false, 100).await;
    c.set_leader(1, 2);
    c.kill(1).await;
    let plain = Client::connect(
        vec![c.addrs[1].clone()],
        ClientOptions {
            timeout: Duration::from_secs(5),
            seed: 42,
            sessions: false,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    plain.put(b"k", b"v").await.unwrap();
    let out = plain.cas(b"k", Some(b"v"), Some(b"w")).await.unwrap();
    assert!(out.succeeded);
    assert_eq!(c.hits().get(&1), None, "node 1 is down");
    assert_eq!(
        c.st.data.lock().unwrap().get(&b"k"[..]),
        Some(&b"w".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_broken_after_a_write_makes_it_ambiguous() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    // In a session the write is resent with its sequence, on a new stream.
    let client = c.client(Duration::from_secs(5)).await;
    client.put(b"k", b"0").await.unwrap();
    *c.st.break_stream_after_serving.lock().unwrap() = true;
    c.st.sessions.lock().unwrap().clear();
    client.put(b"k", b"1").await.unwrap();
    let seen = c.st.sessions.lock().unwrap().clone();
    // Served, stream broken, resent (maybe via a replica that redirects to the leader).
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(
        seen.iter().all(|s| *s == seen[0]),
        "every resend keeps its sequence: {seen:?}"
    );
    assert!(
        c.st.batch_streams.load(Ordering::Relaxed) >= 2,
        "the broken stream is replaced"
    );

    // Without a session the write is not resent: its outcome is unknown.
    let plain = Client::connect(
        vec![c.addrs[0].clone()],
        ClientOptions {
            timeout: Duration::from_secs(5),
            seed: 42,
            sessions: false,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    plain.put(b"k", b"2").await.unwrap();
    *c.st.break_stream_after_serving.lock().unwrap() = true;
    let before = c.total_hits();
    let err = plain.put(b"k", b"3").await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Ambiguous { op: "put", .. }),
        "{err:?}"
    );
    assert_eq!(c.total_hits() - before, 1, "an ambiguous put is not resent");
    // The next call opens a new stream and is served.
    plain.put(b"k", b"4").await.unwrap();
    assert_eq!(client.get(b"k").await.unwrap(), Some(b"4".to_vec()));
}

/// A node of a fake cluster as if it ran in the client's process.
struct InProcess {
    addr: String,
    node: Node,
    ready: std::sync::atomic::AtomicBool,
    calls: Arc<AtomicU64>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} in the process", self.node.id)
    }
}

impl phoenix_client::LocalNode for InProcess {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn call(&self, request: phoenix_client::LocalRequest) -> phoenix_client::LocalCall {
        use phoenix_client::{LocalRequest as Req, LocalResponse as Resp};
        self.calls.fetch_add(1, Ordering::Relaxed);
        let node = self.node.clone();
        Box::pin(async move {
            match request {
                Req::Get(r) => Resp::Get(node.get(Request::new(r)).await.unwrap().into_inner()),
                Req::Put(r) => Resp::Put(node.put(Request::new(r)).await.unwrap().into_inner()),
                Req::Delete(r) => {
                    Resp::Delete(node.delete(Request::new(r)).await.unwrap().into_inner())
                }
                Req::Cas(r) => Resp::Cas(node.cas(Request::new(r)).await.unwrap().into_inner()),
                // A node of today whose cluster has an older node: the version gate.
                Req::Incr(_) => Resp::Incr(pb::IncrResponse {
                    error: Some(pb::Error::unsupported("incr", 6, 5)),
                    ..Default::default()
                }),
                Req::Expire(_) => Resp::Expire(pb::ExpireResponse {
                    error: Some(pb::Error::unsupported("key expiry", 7, 6)),
                    ..Default::default()
                }),
                Req::Ttl(_) => Resp::Ttl(pb::TtlResponse {
                    error: Some(pb::Error::unsupported("key expiry", 7, 6)),
                    ..Default::default()
                }),
                Req::PutEx(_) => Resp::PutEx(pb::PutResponse {
                    error: Some(pb::Error::unsupported("key expiry", 7, 6)),
                }),
                Req::CasEx(_) => Resp::CasEx(pb::CasResponse {
                    error: Some(pb::Error::unsupported("key expiry", 7, 6)),
                    ..Default::default()
                }),
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_node_in_the_process_stay_in_the_process() {
    let c = Cluster::start(&[("", "")], true, 100).await;
    let local = Arc::new(InProcess {
        addr: c.addrs[0].clone(),
        node: Node {
            id: 1,
            st: c.st.clone(),
        },
        ready: std::sync::atomic::AtomicBool::new(false),
        calls: Arc::default(),
    });
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        seed: 42,
        local_node: Some(local.clone()),
        ..ClientOptions::default()
    };
    let client = Client::connect(vec![c.addrs[0].clone()], opts)
        .await
        .unwrap();
    // Not serving yet: over the network.
    client.put(b"a", b"1").await.unwrap();
    assert_eq!(local.calls.load(Ordering::Relaxed), 0);
    assert_eq!(c.st.batch_streams.load(Ordering::Relaxed), 1);
    // Serving: node 1 (the leader) is called in the process, every kind of call.
    local.ready.store(true, Ordering::Relaxed);
    for i in 0..5u8 {
        client.put(&[i], b"v").await.unwrap();
        assert_eq!(client.get(&[i]).await.unwrap(), Some(b"v".to_vec()));
        assert!(
            client
                .cas(&[i], Some(b"v"), Some(b"w"))
                .await
                .unwrap()
                .succeeded
        );
        client.delete(&[i]).await.unwrap();
    }
    assert_eq!(local.calls.load(Ordering::Relaxed), 20);
    assert_eq!(c.hits(), HashMap::from([(1, 21)]));
    // The version gate's refusal is typed, and not retried.
    let e = client.incr(b"a", 1).await.unwrap_err();
    assert!(matches!(&e, ClientError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("protocol level 6"), "{e}");
    assert_eq!(local.calls.load(Ordering::Relaxed), 21);
    let local_calls_after_incr = 21;
    // Another node leads: the node in the process refuses with the hint, and the call
    // goes over the network to the leader, as it would from any client.
    c.set_leader(1, 3);
    client.put(b"b", b"2").await.unwrap();
    assert_eq!(
        local.calls.load(Ordering::Relaxed),
        local_calls_after_incr + 1
    );
    assert_eq!(c.hits(), HashMap::from([(1, 22), (3, 1)]));
    assert_eq!(
        c.st.data.lock().unwrap().get(&b"b"[..]),
        Some(&b"2".to_vec())
    );
}
