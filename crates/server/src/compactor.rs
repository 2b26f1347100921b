//! Compactions on another machine (seed 004 §7.2): the worker `phoenix compactor`
//! serves ([`serve`]), and the node's side that hands jobs to it ([`RemoteCompactor`],
//! the engine's `CompactionService`).
//!
//! A node whose tables are on an object store (`--sst-store`) and that is given
//! `--compactor` sends each background compaction to the worker; the worker reads the
//! inputs from the bucket, writes the outputs there and answers with their numbers; the
//! node reads them back, checks them and installs them (`phoenix_engine::remote_compaction`
//! says what is checked and why a crash on either side loses nothing). A worker that
//! cannot be reached, fails, or answers wrongly costs the node the compaction's CPU, not
//! its data: the node compacts itself.
//!
//! The worker owns no state of its own beyond open stores: it is started with a bucket
//! prefix (`s3://bucket/base?endpoint=…`, credentials from the environment) and serves
//! jobs for tables under it only, each store reached with the worker's endpoint and
//! credentials. It runs at most `jobs` compactions at once; the others wait their turn.
//! Callers are let in as a node's peers are: by the nodes' token or a CA-signed
//! certificate.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use phoenix_engine::table::TableCache;
use phoenix_engine::{CompactionJob, CompactionService, JobOutput, ObjectTableStore};
use phoenix_proto as proto;
use phoenix_proto::security::{AuthChannel, Credentials};

use crate::config::Security;
use crate::error::{Error, Result};

/// Tables kept open per store by the worker (their footers and indexes).
const OPEN_TABLES_PER_STORE: usize = 256;

/// How the worker runs.
#[derive(Debug)]
pub struct WorkerConfig {
    /// The bucket prefix it serves, `s3://bucket/base?settings` (settings as
    /// `ObjectTableStore::from_url` reads them).
    pub sst_store: String,
    /// Compactions run at once.
    pub jobs: usize,
    /// Who may call.
    pub security: Security,
}

/// `bucket/prefix` of an `s3://bucket/prefix?…` URL (without a trailing `/`), and its
/// settings: what names a store to the worker, and how the worker reaches it.
pub fn store_location(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| Error::Config(format!("table store {url:?}: not s3://bucket/prefix")))?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let location = location.trim_end_matches('/');
    if location.is_empty() || location.starts_with('/') {
        return Err(Error::Config(format!("table store {url:?}: no bucket")));
    }
    Ok((location.to_string(), query.to_string()))
}

/// Serves compaction jobs on `listener` until `stop` resolves.
pub async fn serve(
    cfg: WorkerConfig,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (base, query) = store_location(&cfg.sst_store)?;
    let server = cfg.security.server("the compactor")?;
    let service = Worker {
        base,
        query,
        stores: Arc::new(Mutex::new(HashMap::new())),
        turns: Arc::new(tokio::sync::Semaphore::new(cfg.jobs.max(1))),
        jobs: cfg.jobs.max(1),
    };
    let max = proto::limits::MESSAGE_BYTES_MAX;
    server
        .layer(tonic::service::InterceptorLayer::new(
            cfg.security.gate().for_peers(),
        ))
        .add_service(
            proto::compactor_server::CompactorServer::new(service)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            stop,
        )
        .await
        .map_err(|e| Error::Config(format!("compactor serving: {e}")))
}

/// One store the worker writes, with its open tables.
struct Store {
    store: Arc<ObjectTableStore>,
    tables: Arc<TableCache>,
}

struct Worker {
    base: String,
    query: String,
    stores: Arc<Mutex<HashMap<String, Arc<Store>>>>,
    turns: Arc<tokio::sync::Semaphore>,
    jobs: usize,
}

/// The store a request names, if the worker serves it: `bucket/prefix` under the
/// worker's own, each part of plain characters (`A-Z a-z 0-9 . _ -`, not `.` or `..`),
/// so that nothing in it reaches the URL's settings or another place.
fn served(base: &str, requested: &str) -> std::result::Result<String, String> {
    let location = requested.trim_end_matches('/');
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    let under = location == base
        || location
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'));
    if !under || !location.split('/').all(plain) {
        return Err(format!(
            "table store {location:?} is not under {base:?}, the one this worker serves"
        ));
    }
    Ok(location.to_string())
}

impl Worker {
    /// The store at `location`, opened on first use (blocking: it starts the store's
    /// runtime).
    fn store(
        stores: &Mutex<HashMap<String, Arc<Store>>>,
        location: &str,
        query: &str,
    ) -> std::result::Result<Arc<Store>, String> {
        if let Some(s) = stores.lock().get(location) {
            return Ok(Arc::clone(s));
        }
        let url = if query.is_empty() {
            format!("s3://{location}")
        } else {
            format!("s3://{location}?{query}")
        };
        let store = Arc::new(ObjectTableStore::from_url(&url).map_err(|e| e.to_string())?);
        let s = Arc::new(Store {
            tables: Arc::new(TableCache::new(
                Arc::clone(&store) as phoenix_engine::SharedTableStore,
                OPEN_TABLES_PER_STORE,
                None,
            )),
            store,
        });
        Ok(Arc::clone(
            stores.lock().entry(location.to_string()).or_insert(s),
        ))
    }

    fn refuse(why: String) -> tonic::Response<proto::CompactResponse> {
        tonic::Response::new(proto::CompactResponse {
            output: Default::default(),
            error: why,
        })
    }
}

#[tonic::async_trait]
impl proto::compactor_server::Compactor for Worker {
    async fn compact(
        &self,
        req: tonic::Request<proto::CompactRequest>,
    ) -> std::result::Result<tonic::Response<proto::CompactResponse>, tonic::Status> {
        let req = req.into_inner();
        let location = match served(&self.base, &req.table_store) {
            Ok(l) => l,
            Err(why) => return Ok(Worker::refuse(why)),
        };
        let job = match CompactionJob::decode(&req.job) {
            Ok(j) => j,
            Err(e) => return Ok(Worker::refuse(e.to_string())),
        };
        // A job that would wait is refused: the node compacts itself at once rather
        // than hold its compaction (and what waits on it) in this queue.
        let Ok(turn) = Arc::clone(&self.turns).try_acquire_owned() else {
            return Ok(Worker::refuse(format!(
                "busy: {} compactions under way",
                self.jobs
            )));
        };
        let (stores, query) = (Arc::clone(&self.stores), self.query.clone());
        let started = std::time::Instant::now();
        let ran = tokio::task::spawn_blocking(move || {
            // (Held by the task, not the call: a caller that gave up does not free the
            // turn of a compaction still running.)
            let _turn = turn;
            let s = Worker::store(&stores, &location, &query)?;
            phoenix_engine::remote_compaction::execute(&*s.store, &s.tables, &job)
                .map_err(|e| e.to_string())
        })
        .await;
        Ok(match ran {
            Ok(Ok(out)) => {
                tracing::info!(
                    files = out.files.len(),
                    read = out.bytes_read,
                    written = out.bytes_written,
                    ms = started.elapsed().as_millis() as u64,
                    "compaction done"
                );
                tonic::Response::new(proto::CompactResponse {
                    output: out.encode().into(),
                    error: String::new(),
                })
            }
            Ok(Err(why)) => {
                tracing::warn!(error = %why, "compaction failed");
                Worker::refuse(why)
            }
            Err(e) => Worker::refuse(format!("compaction task: {e}")),
        })
    }
}

/// The node's side: hands the engine's compactions to the worker at `addr`.
pub struct RemoteCompactor {
    addr: String,
    location: String,
    credentials: Credentials,
    timeout: Duration,
    /// Always `Some` until dropped (taken out to shut it down without blocking: the
    /// engine holding this may be dropped on a runtime's thread).
    runtime: Option<tokio::runtime::Runtime>,
    client: Mutex<Option<proto::compactor_client::CompactorClient<AuthChannel>>>,
}

impl std::fmt::Debug for RemoteCompactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCompactor")
            .field("addr", &self.addr)
            .field("location", &self.location)
            .finish()
    }
}

impl RemoteCompactor {
    /// A client of the worker at `addr` (host:port) for the tables at `sst_store` (the
    /// engine's own URL), calling with `credentials`; a job not answered within
    /// `timeout` is compacted by the node.
    pub fn new(
        addr: &str,
        sst_store: &str,
        credentials: Credentials,
        timeout: Duration,
    ) -> Result<RemoteCompactor> {
        let (location, _) = store_location(sst_store)?;
        credentials.endpoint(addr).map_err(Error::Config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("phoenix-compactor-client")
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the compactor client's runtime", e))?;
        Ok(RemoteCompactor {
            addr: addr.to_string(),
            location,
            credentials,
            timeout,
            runtime: Some(runtime),
            client: Mutex::new(None),
        })
    }

    async fn call(&self, job: Vec<u8>) -> std::result::Result<JobOutput, String> {
        let cached = self.client.lock().clone();
        let mut client = match cached {
            Some(c) => c,
            None => {
                let ep = self.credentials.endpoint(&self.addr)?;
                let channel = ep
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await
                    .map_err(|e| format!("connecting to the compactor at {}: {e}", self.addr))?;
                let c = proto::compactor_client::CompactorClient::new(
                    self.credentials.authorize(channel),
                )
                .max_decoding_message_size(proto::limits::MESSAGE_BYTES_MAX)
                .max_encoding_message_size(proto::limits::MESSAGE_BYTES_MAX);
                *self.client.lock() = Some(c.clone());
                c
            }
        };
        let mut req = tonic::Request::new(proto::CompactRequest {
            table_store: self.location.clone(),
            job: job.into(),
        });
        req.set_timeout(self.timeout);
        let resp = match client.compact(req).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                // A broken connection is made again at the next job.
                *self.client.lock() = None;
                return Err(format!("compactor at {}: {status}", self.addr));
            }
        };
        if !resp.error.is_empty() {
            return Err(format!("compactor at {}: {}", self.addr, resp.error));
        }
        JobOutput::decode(&resp.output).map_err(|e| format!("compactor at {}: {e}", self.addr))
    }
}

impl CompactionService for RemoteCompactor {
    fn compact(&self, job: &CompactionJob) -> std::result::Result<JobOutput, String> {
        // Called from the engine's compaction threads (not a runtime's).
        match &self.runtime {
            Some(rt) => rt.block_on(self.call(job.encode())),
            None => Err("the compactor client is closed".into()),
        }
    }
}

impl Drop for RemoteCompactor {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_is_named_by_bucket_and_prefix() {
        assert_eq!(
            store_location("s3://b/p/q/?endpoint=http://x:1&a=b").unwrap(),
            ("b/p/q".to_string(), "endpoint=http://x:1&a=b".to_string())
        );
        assert_eq!(store_location("s3://b").unwrap().0, "b");
        assert!(store_location("file:///x").is_err());
        assert!(store_location("s3:///x").is_err());
    }

    #[test]
    fn a_worker_serves_plain_prefixes_under_its_own_only() {
        let base = "bucket/cluster";
        for ok in [
            "bucket/cluster",
            "bucket/cluster/node-1",
            "bucket/cluster/a.b_c/",
        ] {
            assert!(served(base, ok).is_ok(), "{ok}");
        }
        for bad in [
            "bucket/clusterx",
            "bucket",
            "other/cluster",
            "bucket/cluster/../x",
            "bucket/cluster/./x",
            "bucket/cluster//x",
            "bucket/cluster/x?aws_bucket=other",
            "bucket/cluster/x&endpoint=http://elsewhere",
            "bucket/cluster/x%3F",
            "bucket/cluster/x y",
        ] {
            assert!(served(base, bad).is_err(), "{bad}");
        }
    }
}
