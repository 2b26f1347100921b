//! What the front end needs from the cluster ([`Store`]), and its implementation over
//! `phoenix-client` ([`ClusterStore`]): routing by key, the leader cache, retries within
//! the deadline and client sessions (a retried write applies once) all come from the
//! client.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_client::{CasOutcome, Client, ClientError, IncrOutcome, ScanPage, WriteOp};

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An atomic write names keys of more than one group.
    #[error("keys in request lie in more than one group ({0})")]
    CrossGroup(String),
    /// A write whose outcome is unknown: it may or may not have been applied.
    #[error("outcome unknown, the write may or may not have been applied: {0}")]
    Unknown(String),
    /// The request is malformed (a key or value over its limit, say).
    #[error("{0}")]
    Invalid(String),
    /// The cluster could not serve it (no leader within the deadline, a node down…).
    #[error("{0}")]
    Unavailable(String),
    /// The cluster does not serve this call yet (a node runs an older binary): nothing
    /// was applied, and the caller does what older clusters serve instead.
    #[error("not served by this cluster yet: {0}")]
    Unsupported(String),
}

/// The key-value operations the Redis commands are built from. Every call is
/// linearizable; `write` is atomic and refused across groups.
pub trait Store: Send + Sync + 'static {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
    /// Sets `key` to `value`.
    fn put(&self, key: &[u8], value: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// If `key` holds `expected` (None: absent), sets it to `new` (None: deletes it).
    fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> impl Future<Output = Result<CasOutcome, StoreError>> + Send;
    /// Adds `by` to the decimal i64 `key` holds (absent: 0) in one atomic step
    /// (`phoenix_proto::counter`'s rules); [`StoreError::Unsupported`] where that step is
    /// not served yet.
    fn incr(
        &self,
        key: &[u8],
        by: i64,
    ) -> impl Future<Output = Result<IncrOutcome, StoreError>> + Send;
    /// The values of `keys`, in order.
    fn get_many(
        &self,
        keys: &[Vec<u8>],
    ) -> impl Future<Output = Result<Vec<Option<Vec<u8>>>, StoreError>> + Send;
    /// Sets each key to its value (None: deletes it), all or none.
    fn write(
        &self,
        ops: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Up to `limit` pairs of `[start, end)` (empty `end`: unbounded).
    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
    ) -> impl Future<Output = Result<ScanPage, StoreError>> + Send;
}

/// The cluster, through a [`Client`].
#[derive(Clone)]
pub struct ClusterStore {
    client: Client,
    /// When the cluster last refused `incr` as unsupported (a node runs an older
    /// binary): for [`INCR_REFUSAL_KEPT`] after it, increments take the fallback at once
    /// instead of paying a refused call each.
    incr_refused: Arc<Mutex<Option<std::time::Instant>>>,
}

/// How long a refusal of `incr` is taken as the cluster's answer. Each node opens its
/// gate at its next heartbeat answer after the last node upgraded, so a front end may
/// take the fallback for up to a heartbeat interval plus this after that.
pub const INCR_REFUSAL_KEPT: std::time::Duration = std::time::Duration::from_secs(5);

impl ClusterStore {
    /// A store over `client`.
    pub fn new(client: Client) -> ClusterStore {
        ClusterStore {
            client,
            incr_refused: Arc::default(),
        }
    }
}

fn from_client(e: ClientError) -> StoreError {
    match e {
        ClientError::CrossGroup { groups } => StoreError::CrossGroup(format!("groups {groups:?}")),
        ClientError::Unsupported { .. } => StoreError::Unsupported(e.to_string()),
        ClientError::Ambiguous { .. } => StoreError::Unknown(e.to_string()),
        ClientError::KeyTooLarge { .. }
        | ClientError::ValueTooLarge { .. }
        | ClientError::InvalidArgument(_) => StoreError::Invalid(e.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

impl Store for ClusterStore {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.client.get(key).await.map_err(from_client)
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.client.put(key, value).await.map_err(from_client)
    }

    async fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<CasOutcome, StoreError> {
        self.client
            .cas(key, expected, new)
            .await
            .map_err(from_client)
    }

    async fn incr(&self, key: &[u8], by: i64) -> Result<IncrOutcome, StoreError> {
        let recent = self
            .incr_refused
            .lock()
            .is_some_and(|t| t.elapsed() < INCR_REFUSAL_KEPT);
        if recent {
            return Err(StoreError::Unsupported(
                "incr (refused by the cluster moments ago)".into(),
            ));
        }
        let r = self.client.incr(key, by).await.map_err(from_client);
        match &r {
            Err(StoreError::Unsupported(_)) => {
                *self.incr_refused.lock() = Some(std::time::Instant::now());
            }
            // Served: the gate is open (a refusal of a call sent before it opened must
            // not shut it again for the others).
            Ok(_) => *self.incr_refused.lock() = None,
            Err(_) => {}
        }
        r
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.client.batch_get(keys).await.map_err(from_client)
    }

    async fn write(&self, ops: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        let ops: Vec<WriteOp> = ops
            .iter()
            .map(|(k, v)| match v {
                Some(v) => WriteOp::Put(k.clone(), v.clone()),
                None => WriteOp::Delete(k.clone()),
            })
            .collect();
        self.client.batch_write(&ops).await.map_err(from_client)
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: u32) -> Result<ScanPage, StoreError> {
        self.client
            .scan_page(start, end, limit)
            .await
            .map_err(from_client)
    }
}

/// The request layer of the node the front end runs in, for its [`Client`]
/// ([`phoenix_client::ClientOptions::local_node`]): the client's calls to this node's
/// groups are served in the process, not over a connection to itself.
#[derive(Debug)]
pub struct InNode {
    addr: String,
    requests: phoenix_server::Requests,
}

impl InNode {
    /// The node advertised at `addr`, serving through `requests`.
    pub fn new(addr: String, requests: phoenix_server::Requests) -> InNode {
        InNode { addr, requests }
    }
}

impl phoenix_client::LocalNode for InNode {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn ready(&self) -> bool {
        self.requests.ready()
    }

    fn call(&self, request: phoenix_client::LocalRequest) -> phoenix_client::LocalCall {
        let requests = self.requests.clone();
        Box::pin(async move { requests.serve(request).await })
    }
}

/// A store in memory, cut into "groups" at `split_keys` so atomic writes across them are
/// refused as the cluster refuses them: the model the front end's tests compare it with,
/// and a way to try the protocol without a cluster.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    map: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
    split_keys: Vec<Vec<u8>>,
    /// Refuse `incr` as a cluster with an older node does.
    without_incr: bool,
}

impl MemoryStore {
    /// An empty store whose groups start at `split_keys` (sorted).
    pub fn with_split_keys(mut split_keys: Vec<Vec<u8>>) -> MemoryStore {
        split_keys.sort();
        MemoryStore {
            map: Arc::default(),
            split_keys,
            without_incr: false,
        }
    }

    /// This store, refusing `incr` as [`StoreError::Unsupported`] (as a cluster with a
    /// node that predates it does), so callers fall back to what older clusters serve.
    pub fn without_incr(mut self) -> MemoryStore {
        self.without_incr = true;
        self
    }

    fn group_of(&self, key: &[u8]) -> usize {
        self.split_keys.partition_point(|s| s.as_slice() <= key)
    }
}

impl Store for MemoryStore {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map.lock().get(key).cloned())
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.map.lock().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    async fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<CasOutcome, StoreError> {
        let mut map = self.map.lock();
        let previous = map.get(key).cloned();
        let succeeded = previous.as_deref() == expected;
        if succeeded {
            match new {
                Some(v) => map.insert(key.to_vec(), v.to_vec()),
                None => map.remove(key),
            };
        }
        Ok(CasOutcome {
            succeeded,
            previous,
        })
    }

    async fn incr(&self, key: &[u8], by: i64) -> Result<IncrOutcome, StoreError> {
        if self.without_incr {
            return Err(StoreError::Unsupported("incr (a store without it)".into()));
        }
        let mut map = self.map.lock();
        let r = phoenix_proto::counter::incremented(map.get(key).map(Vec::as_slice), by);
        if let Ok(n) = r {
            map.insert(key.to_vec(), n.to_string().into_bytes());
        }
        Ok(IncrOutcome::of(r))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let map = self.map.lock();
        Ok(keys.iter().map(|k| map.get(k).cloned()).collect())
    }

    async fn write(&self, ops: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        let mut groups: Vec<usize> = ops.iter().map(|(k, _)| self.group_of(k)).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.len() > 1 {
            return Err(StoreError::CrossGroup(format!("groups {groups:?}")));
        }
        let mut map = self.map.lock();
        for (k, v) in ops {
            match v {
                Some(v) => map.insert(k.clone(), v.clone()),
                None => map.remove(k),
            };
        }
        Ok(())
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: u32) -> Result<ScanPage, StoreError> {
        let map = self.map.lock();
        let limit = limit.max(1) as usize;
        let mut pairs = Vec::new();
        let mut next = None;
        for (k, v) in map.range(start.to_vec()..) {
            if !end.is_empty() && k.as_slice() >= end {
                break;
            }
            if pairs.len() == limit {
                next = Some(k.clone());
                break;
            }
            pairs.push((k.clone(), v.clone()));
        }
        Ok(ScanPage { pairs, next })
    }
}
