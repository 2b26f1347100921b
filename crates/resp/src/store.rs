//! What the front end needs from the cluster ([`Store`]), and its implementation over
//! `phoenix-client` ([`ClusterStore`]): routing by key, the leader cache, retries within
//! the deadline and client sessions (a retried write applies once) all come from the
//! client.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use phoenix_client::{
    CasOutcome, Client, ClientError, ExpireAt, ExpireCondition, Expiry, IncrOutcome, KeyTtl,
    ScanPage, WriteOp,
};

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
    /// Sets `key` to `value` with `expiry` ([`StoreError::Unsupported`] where key expiry
    /// is not served yet).
    fn put_with(
        &self,
        key: &[u8],
        value: &[u8],
        expiry: Expiry,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// [`Store::cas`] whose write leaves the key with `expiry`.
    fn cas_with(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        expiry: Expiry,
    ) -> impl Future<Output = Result<CasOutcome, StoreError>> + Send;
    /// Changes `key`'s expiry if `condition` holds; whether it changed the key.
    fn expire(
        &self,
        key: &[u8],
        at: ExpireAt,
        condition: ExpireCondition,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// `key`'s expiry.
    fn ttl(&self, key: &[u8]) -> impl Future<Output = Result<KeyTtl, StoreError>> + Send;
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

    async fn put_with(&self, key: &[u8], value: &[u8], expiry: Expiry) -> Result<(), StoreError> {
        self.client
            .put_with(key, value, expiry)
            .await
            .map_err(from_client)
    }

    async fn cas_with(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        expiry: Expiry,
    ) -> Result<CasOutcome, StoreError> {
        self.client
            .cas_with(key, expected, new, expiry)
            .await
            .map_err(from_client)
    }

    async fn expire(
        &self,
        key: &[u8],
        at: ExpireAt,
        condition: ExpireCondition,
    ) -> Result<bool, StoreError> {
        self.client
            .expire(key, at, condition)
            .await
            .map_err(from_client)
    }

    async fn ttl(&self, key: &[u8]) -> Result<KeyTtl, StoreError> {
        self.client.ttl(key).await.map_err(from_client)
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
/// and a way to try the protocol without a cluster. Keys expire by this process's clock.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    mem: Arc<Mutex<Mem>>,
    split_keys: Vec<Vec<u8>>,
    /// Refuse `incr` as a cluster with an older node does.
    without_incr: bool,
}

/// The keys and the expiries of some of them (ms since the Unix epoch).
#[derive(Debug, Default)]
struct Mem {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    expiry: BTreeMap<Vec<u8>, u64>,
}

/// This process's clock: ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Mem {
    /// Forgets `key` if its expiry has passed (it lives through that millisecond).
    fn purge(&mut self, key: &[u8], now: u64) {
        if self.expiry.get(key).is_some_and(|&at| at < now) {
            self.expiry.remove(key);
            self.map.remove(key);
        }
    }

    /// Forgets every key whose expiry has passed.
    fn purge_all(&mut self, now: u64) {
        let gone: Vec<Vec<u8>> = self
            .expiry
            .iter()
            .filter(|(_, &at)| at < now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.purge(&k, now);
        }
    }

    fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.purge(key, now_ms());
        self.map.get(key).cloned()
    }

    fn put(&mut self, key: &[u8], value: &[u8], expiry: Expiry) -> Result<(), StoreError> {
        let now = now_ms();
        self.purge(key, now);
        match expiry {
            Expiry::Never => {
                self.expiry.remove(key);
            }
            Expiry::Keep => {}
            Expiry::After(d) => {
                let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                if ms == 0 {
                    return Err(StoreError::Invalid("an expiry after less than 1 ms".into()));
                }
                self.expiry.insert(key.to_vec(), now.saturating_add(ms));
            }
        }
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) {
        self.map.remove(key);
        self.expiry.remove(key);
    }
}

impl MemoryStore {
    /// An empty store whose groups start at `split_keys` (sorted).
    pub fn with_split_keys(mut split_keys: Vec<Vec<u8>>) -> MemoryStore {
        split_keys.sort();
        MemoryStore {
            mem: Arc::default(),
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
        Ok(self.mem.lock().get(key))
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.mem.lock().put(key, value, Expiry::Never)
    }

    async fn put_with(&self, key: &[u8], value: &[u8], expiry: Expiry) -> Result<(), StoreError> {
        self.mem.lock().put(key, value, expiry)
    }

    async fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<CasOutcome, StoreError> {
        self.cas_with(key, expected, new, Expiry::Never).await
    }

    async fn cas_with(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        expiry: Expiry,
    ) -> Result<CasOutcome, StoreError> {
        let mut mem = self.mem.lock();
        let previous = mem.get(key);
        let succeeded = previous.as_deref() == expected;
        if succeeded {
            match new {
                Some(v) => mem.put(key, v, expiry)?,
                None => mem.delete(key),
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
        let mut mem = self.mem.lock();
        let r = phoenix_proto::counter::incremented(mem.get(key).as_deref(), by);
        if let Ok(n) = r {
            // An increment keeps the key's expiry.
            mem.put(key, n.to_string().as_bytes(), Expiry::Keep)?;
        }
        Ok(IncrOutcome::of(r))
    }

    async fn expire(
        &self,
        key: &[u8],
        at: ExpireAt,
        condition: ExpireCondition,
    ) -> Result<bool, StoreError> {
        let mut mem = self.mem.lock();
        let now = now_ms();
        if mem.get(key).is_none() {
            return Ok(false);
        }
        let current = mem.expiry.get(key).copied();
        let new = match at {
            ExpireAt::Never => {
                return Ok(mem.expiry.remove(key).is_some());
            }
            ExpireAt::After(d) => {
                now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
            ExpireAt::UnixMs(ms) => ms.max(1),
        };
        let holds = match condition {
            ExpireCondition::ExpireAlways => true,
            ExpireCondition::ExpireIfNone => current.is_none(),
            ExpireCondition::ExpireIfSet => current.is_some(),
            ExpireCondition::ExpireIfLater => current.is_some_and(|c| new > c),
            ExpireCondition::ExpireIfEarlier => current.is_none_or(|c| new < c),
        };
        if !holds {
            return Ok(false);
        }
        if new <= now {
            mem.delete(key);
        } else {
            mem.expiry.insert(key.to_vec(), new);
        }
        Ok(true)
    }

    async fn ttl(&self, key: &[u8]) -> Result<KeyTtl, StoreError> {
        let mut mem = self.mem.lock();
        let now = now_ms();
        if mem.get(key).is_none() {
            return Ok(KeyTtl::Absent);
        }
        Ok(match mem.expiry.get(key) {
            None => KeyTtl::Never,
            Some(&at) => KeyTtl::At {
                at_ms: at,
                left_ms: at.saturating_sub(now),
            },
        })
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut mem = self.mem.lock();
        Ok(keys.iter().map(|k| mem.get(k)).collect())
    }

    async fn write(&self, ops: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        let mut groups: Vec<usize> = ops.iter().map(|(k, _)| self.group_of(k)).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.len() > 1 {
            return Err(StoreError::CrossGroup(format!("groups {groups:?}")));
        }
        let mut mem = self.mem.lock();
        for (k, v) in ops {
            match v {
                Some(v) => mem.put(k, v, Expiry::Never)?,
                None => mem.delete(k),
            };
        }
        Ok(())
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: u32) -> Result<ScanPage, StoreError> {
        let mut mem = self.mem.lock();
        mem.purge_all(now_ms());
        let limit = limit.max(1) as usize;
        let mut pairs = Vec::new();
        let mut next = None;
        for (k, v) in mem.map.range(start.to_vec()..) {
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
