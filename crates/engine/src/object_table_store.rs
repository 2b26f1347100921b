//! A [`TableStore`] over an object store (the `object_store` crate: S3 and its kin, or
//! an in-memory store for tests): tables and manifests as objects under a prefix.
//!
//! Nothing appends, renames or syncs a directory there, so each call maps to whole-object
//! requests:
//! - a table's writer buffers its bytes and uploads them whole at `sync_all` (the table
//!   is durable, and present, once the upload returns); on an S3 server a table past
//!   one part (`multipart_part_mib`, 8 MiB) goes up in parts as it is written, and is
//!   present once the upload completes at `sync_all` (`multipart`);
//! - a manifest's writer uploads the whole manifest again at each sync (each edit is a
//!   replacement of the object; an edit that never reached the store is a lost append,
//!   as a torn tail is on a file system);
//! - the `CURRENT` object names the manifest and is replaced whole;
//! - an import reads the file from the local file system and uploads it, then deletes it;
//! - `sync` has nothing to do: a finished upload or delete is durable.
//!
//! **Fencing.** Two engines may open the same prefix (a node restarted elsewhere while
//! the old one still runs): the newer takes the store over and the older stops at its
//! next manifest write with [`Error::is_fenced`], writing nothing more that counts.
//! Every upload is conditional (seed 004 §4.3): an object is created only if absent
//! (`If-None-Match`), and a manifest or `CURRENT` is replaced only if it is still the
//! version this writer last wrote (`If-Match` its ETag). An engine opening the store
//! appends a record to the manifest it read (conditional on the version it read:
//! a writer that changed it meanwhile makes the open fail instead), so the older
//! writer's next append finds the manifest changed and fails; then it writes its fresh
//! manifest and replaces `CURRENT` conditionally (an older writer that rolled its
//! manifest meanwhile fails the open the same way). The newer writer's file numbers
//! start [`FENCE_FILE_GAP`] past the manifest's counter, so tables the older writer
//! still writes before it finds out never share a name with its own. An upload whose
//! condition fails is read back: finding its own bytes there (a request sent again after
//! its answer was lost) it counts as done, not as fenced.
//!
//! The engine's calls are synchronous; each request runs on the store's own runtime and
//! the caller waits for its answer (also from a thread of another tokio runtime, where
//! blocking on a runtime directly is refused).
//!
//! Errors are classified (`error`): what the store refused for good is an I/O error;
//! a store that did not answer (refused connections, timeouts, 5xx once the client's
//! own retries ran out) is `Unavailable`, which the engine's background work backs off
//! from and tries again, and a manifest write of unknown outcome is replaced by a fresh
//! manifest (`version_set`). A `CURRENT` upload of unknown outcome is remembered: finding
//! its manifest named there later is finding this writer's own write, not a fence. A
//! user's read waits at most the read deadline; background work waits as long as the
//! client tries (`io_class`).
//!
//! The manifest is rolled once it holds twice the state it started from (or 64 KiB):
//! an edit uploads a few times the live state, not the history since the last roll.
//! Not built: manifest edits as objects of their own (an edit would then upload itself
//! alone, not the live state).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use parking_lot::Mutex;
use phoenix_storage::{FileSystem, IoOp, ReadableFile, WritableFile};

use crate::error::{Error, Result};
use crate::filename;
use crate::flash_cache::{object_key, FlashCache, PAGE_BYTES};
use crate::table_store::{parse_current, Imported, StoredFile, TableStore};
use crate::version_edit::VersionEdit;

mod multipart;
use multipart::PartUpload;

/// File numbers an engine that takes a store over skips (see the module docs).
pub const FENCE_FILE_GAP: u64 = 1 << 20;

/// How long a user's read of a table (not a flush's or a compaction's, see
/// `io_class`) waits for the store by default before it fails as unavailable
/// ([`ObjectTableStore::set_read_deadline`], the URL's `read_deadline_ms`).
pub const DEFAULT_READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Tables and manifest as objects under a prefix of an object store.
pub struct ObjectTableStore {
    inner: Arc<Remote>,
    fence: Mutex<Fence>,
}

/// What this writer knows of the objects others could change under it.
#[derive(Debug, Default)]
struct Fence {
    /// `CURRENT` as read at open or last written: `None` before the open read it;
    /// `Some(None)` when there was none; else its ETag.
    current: Option<Option<String>>,
    /// The manifest read at open and not yet fenced: its object, bytes and ETag.
    opened: Option<(ObjectPath, Bytes, String)>,
    /// Whether this writer's open named its manifest in `CURRENT`: past it, manifest
    /// numbers are this writer's alone, so its manifest uploads may read back.
    open_done: bool,
    /// Manifests this writer named in a `CURRENT` upload whose outcome is unknown (the
    /// store was unavailable): finding one of them there is finding its own write.
    unsure: Vec<u64>,
}

/// What the store's files and writers share: the object store, the prefix and the
/// runtime that runs the requests.
struct Remote {
    store: Arc<dyn ObjectStore>,
    /// Names the store for [`TableStore::shared_id`]: engines whose stores say the same
    /// copy tables between them.
    shared_id: String,
    prefix: ObjectPath,
    /// Added before each request (`added_latency_ms`): a store on loopback made to
    /// answer as one across a network does, for measurements.
    added_latency: std::time::Duration,
    /// Pages of tables kept on local flash ([`ObjectTableStore::set_flash_cache`]).
    cache: std::sync::OnceLock<Arc<FlashCache>>,
    /// How long a user's read waits ([`DEFAULT_READ_DEADLINE`]), in microseconds.
    read_deadline_us: std::sync::atomic::AtomicU64,
    /// A table past this many bytes goes up in parts of this size; 0: tables go up
    /// whole (a store not known to complete uploads create-only, see `multipart`).
    part_bytes: usize,
    /// Whether the server was found to complete uploads create-only (`multipart::probe`).
    create_only_completions: std::sync::OnceLock<bool>,
    /// Taken only by `drop`.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Remote {
    fn drop(&mut self) {
        // Not the blocking shutdown: the last holder may be a thread of another runtime,
        // where blocking is refused. Every request was waited for but the abort of an
        // upload in parts left unfinished (cut short here: see `multipart`).
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for ObjectTableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectTableStore")
            .field("store", &self.inner.store.to_string())
            .field("prefix", &self.inner.prefix.as_ref())
            .finish()
    }
}

impl ObjectTableStore {
    /// A store of the objects under `prefix` in `store`. Starts the runtime that runs
    /// its requests (two threads).
    /// Stores made over the same `store` (one `Arc`) copy tables between them.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<ObjectTableStore> {
        let shared_id = format!("{store}@{:p}", Arc::as_ptr(&store).cast::<()>());
        ObjectTableStore::with_latency(store, shared_id, prefix, std::time::Duration::ZERO, 0)
    }

    fn with_latency(
        store: Arc<dyn ObjectStore>,
        shared_id: String,
        prefix: &str,
        added_latency: std::time::Duration,
        part_bytes: usize,
    ) -> Result<ObjectTableStore> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("phoenix-objects")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Storage(phoenix_storage::Error::io(
                    IoOp::Open,
                    PathBuf::from(prefix),
                    e,
                ))
            })?;
        Ok(ObjectTableStore {
            inner: Arc::new(Remote {
                store,
                shared_id,
                prefix: ObjectPath::from(prefix),
                added_latency,
                cache: std::sync::OnceLock::new(),
                read_deadline_us: std::sync::atomic::AtomicU64::new(
                    DEFAULT_READ_DEADLINE.as_micros() as u64,
                ),
                part_bytes,
                create_only_completions: std::sync::OnceLock::new(),
                runtime: Some(runtime),
            }),
            fence: Mutex::new(Fence::default()),
        })
    }
}

impl ObjectTableStore {
    /// A store on an S3 server, from a URL: `s3://<bucket>/<prefix>?<key>=<value>&…`.
    ///
    /// The keys are `object_store`'s S3 settings (`endpoint`, `region`,
    /// `virtual_hosted_style_request`, `allow_http`, `timeout`, …); credentials come from
    /// the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, and the rest of
    /// `AWS_*`), so they never show in a command line. Plain HTTP is allowed when the
    /// endpoint says `http://`. A missing region is `us-east-1` (what MinIO expects).
    /// Some keys are ours: `added_latency_ms` delays every request by that much (to
    /// measure a store on loopback as if it were across a network); `read_deadline_ms`
    /// bounds a user's read ([`ObjectTableStore::set_read_deadline`]); `max_retries`
    /// (default 10) and `retry_timeout_ms` (default 180000) bound how often and how long
    /// the client sends a request again after a refused connection, a timeout or a 5xx.
    /// Past them a flush or compaction fails as unavailable and the engine tries it
    /// again later itself. `multipart_part_mib` (default 8; 5 to 5120, or 0 for whole
    /// uploads only) is the part size of tables uploaded in parts.
    pub fn from_url(url: &str) -> Result<ObjectTableStore> {
        let p = parse_s3_url(url)?;
        let store = ObjectTableStore::with_latency(
            Arc::new(p.s3),
            p.shared_id,
            &p.prefix,
            p.added_latency,
            p.part_bytes,
        )?;
        if let Some(d) = p.read_deadline {
            store.set_read_deadline(d);
        }
        Ok(store)
    }
}

/// A bucket prefix on an S3 server, from a URL as [`ObjectTableStore::from_url`] takes
/// it (the settings of our own are checked and not used): for tools that write objects
/// of their own next to engines' tables (backups). As the table store's, its client
/// completes multipart uploads only where no object exists.
pub struct S3Prefix {
    /// The bucket.
    pub store: Arc<dyn ObjectStore>,
    /// What [`TableStore::shared_id`] says of an engine's store in this bucket.
    pub shared_id: String,
    /// The prefix in the bucket (no leading or trailing `/`).
    pub prefix: String,
}

impl std::fmt::Debug for S3Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Prefix")
            .field("shared_id", &self.shared_id)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl S3Prefix {
    /// Parses `url` (`s3://<bucket>/<prefix>?<key>=<value>&…`).
    pub fn from_url(url: &str) -> Result<S3Prefix> {
        let p = parse_s3_url(url)?;
        Ok(S3Prefix {
            store: Arc::new(p.s3),
            shared_id: p.shared_id,
            prefix: p.prefix,
        })
    }
}

/// What an `s3://` URL says.
struct ParsedUrl {
    s3: object_store::aws::AmazonS3,
    shared_id: String,
    prefix: String,
    added_latency: std::time::Duration,
    read_deadline: Option<std::time::Duration>,
    part_bytes: usize,
}

fn parse_s3_url(url: &str) -> Result<ParsedUrl> {
    let bad = |why: &str| Error::InvalidArgument(format!("table store URL {url:?}: {why}"));
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("only s3://<bucket>/<prefix> is understood"))?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_region("us-east-1");
    let mut allow_http = None;
    let mut added_latency = std::time::Duration::ZERO;
    let mut read_deadline = None;
    let mut part_bytes = multipart::DEFAULT_PART_BYTES;
    let mut retry = object_store::RetryConfig::default();
    let ms = |pair: &str, value: &str, max: f64| {
        value
            .parse()
            .ok()
            .filter(|ms: &f64| ms.is_finite() && *ms >= 0.0 && *ms <= max)
            .map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0))
            .ok_or_else(|| bad(&format!("{pair:?}: milliseconds in 0..={max}")))
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| bad(&format!("{pair:?} is not key=value")))?;
        let value = percent_decode(value).ok_or_else(|| bad(&format!("{pair:?}: bad %-escape")))?;
        match key {
            "added_latency_ms" => {
                added_latency = ms(pair, &value, 60_000.0)?;
                continue;
            }
            "read_deadline_ms" => {
                read_deadline = Some(ms(pair, &value, 3_600_000.0)?);
                continue;
            }
            "retry_timeout_ms" => {
                retry.retry_timeout = ms(pair, &value, 3_600_000.0)?;
                continue;
            }
            "multipart_part_mib" => {
                part_bytes = value
                    .parse::<usize>()
                    .ok()
                    .map(|mib| mib << 20)
                    .filter(|b| {
                        *b == 0
                            || (multipart::MIN_PART_BYTES..=multipart::MAX_PART_BYTES).contains(b)
                    })
                    .ok_or_else(|| bad(&format!("{pair:?}: 0, or MiB in 5..=5120")))?;
                continue;
            }
            "max_retries" => {
                retry.max_retries = value
                    .parse()
                    .ok()
                    .filter(|n| *n <= 100)
                    .ok_or_else(|| bad(&format!("{pair:?}: a count in 0..=100")))?;
                continue;
            }
            _ => {}
        }
        if key == "allow_http" {
            allow_http = Some(value == "true");
        }
        if key == "endpoint" && allow_http.is_none() {
            allow_http = Some(value.starts_with("http://"));
        }
        let config: object_store::aws::AmazonS3ConfigKey = key
            .parse()
            .map_err(|_| bad(&format!("unknown setting {key:?}")))?;
        builder = builder.with_config(config, value);
    }
    if let Some(allow) = allow_http {
        builder = builder.with_allow_http(allow);
    }
    // (The bucket on the endpoint: nodes whose URLs differ in prefix or in settings
    // of their own still copy tables between them.)
    let endpoint = builder
        .get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint)
        .unwrap_or_default();
    let shared_id = format!("s3://{bucket}@{}", endpoint.trim_end_matches('/'));
    let s3 = builder
        .with_http_connector(multipart::CreateOnlyCompletions)
        .with_retry(retry)
        .build()
        .map_err(|e| bad(&e.to_string()))?;
    Ok(ParsedUrl {
        s3,
        shared_id,
        prefix: prefix.trim_matches('/').to_string(),
        added_latency,
        read_deadline,
        part_bytes,
    })
}

impl ObjectTableStore {
    /// How long a user's read of a table waits for the store before it fails as
    /// unavailable ([`DEFAULT_READ_DEADLINE`]); flushes and compactions are not cut
    /// short (they wait as long as the store's client tries).
    pub fn set_read_deadline(&self, deadline: std::time::Duration) {
        self.inner.read_deadline_us.store(
            deadline.as_micros().min(u128::from(u64::MAX)) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Keeps the pages of tables read (and uploaded) in `cache` from now on, and reads
    /// them from there (see `flash_cache`). Once: a second cache is refused.
    pub fn set_flash_cache(&self, cache: Arc<FlashCache>) -> Result<()> {
        self.inner.cache.set(cache).map_err(|_| {
            Error::InvalidArgument(format!(
                "{}: the store has a flash cache already",
                self.location().display()
            ))
        })
    }

    /// Removes the database the store holds: `CURRENT` first (the store reads as empty
    /// from then on, also if this stops part way), then every table, manifest and
    /// temporary under the prefix. Objects it does not own are left.
    pub fn destroy(&self) -> Result<()> {
        match self.inner.delete(&self.inner.object("CURRENT")) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        for f in self.list()? {
            self.remove(&f)?;
        }
        for (_, at) in self.lease_objects()? {
            match self.inner.delete(&at) {
                Err(e) if !e.is_not_found() => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The leases under `readers/` (direct children only): names and objects.
    fn lease_objects(&self) -> Result<Vec<(String, ObjectPath)>> {
        let dir = self.inner.prefix.child(READERS);
        let store = Arc::clone(&self.inner.store);
        let d = dir.clone();
        let metas = self
            .inner
            .wait(async move { store.list(Some(&d)).try_collect::<Vec<_>>().await })
            .map_err(|e| self.inner.error(IoOp::List, &dir, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = {
                    let mut parts = m.location.prefix_match(&dir)?;
                    match (parts.next(), parts.next()) {
                        (Some(name), None) => name.as_ref().to_string(),
                        _ => return None,
                    }
                };
                Some((name, m.location))
            })
            .collect())
    }

    /// The object of reader `reader`'s lease.
    fn lease_object(&self, reader: &str) -> Result<ObjectPath> {
        let plain = !reader.is_empty()
            && reader
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !plain {
            return Err(Error::InvalidArgument(format!(
                "reader id {reader:?}: letters, digits, '-' and '_' only"
            )));
        }
        Ok(self.inner.prefix.child(READERS).child(reader))
    }
}

/// The directory of readers' leases under a store's prefix ([`crate::reader_lease`]).
const READERS: &str = "readers";

/// `s` with its `%XX` escapes decoded; `None` when one is malformed or the result is
/// not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Remote {
    /// The part size of uploads in parts, or `None`: tables go up whole (parts are
    /// off, or the server does not complete them create-only). Probes the server once;
    /// a probe that fails (the store unavailable) leaves this table whole and asks
    /// again at the next.
    fn parts(self: &Arc<Remote>) -> Option<usize> {
        if self.part_bytes == 0 {
            return None;
        }
        let ok = match self.create_only_completions.get() {
            Some(ok) => *ok,
            None => match multipart::probe(self) {
                Ok(ok) => {
                    if !ok {
                        tracing::warn!(
                            store = %self.store,
                            "the object store completes multipart uploads over existing \
                             objects (If-None-Match ignored): tables go up whole"
                        );
                    }
                    *self.create_only_completions.get_or_init(|| ok)
                }
                Err(e) => {
                    tracing::info!(error = %e, "probe of multipart completions failed; this table goes up whole");
                    false
                }
            },
        };
        ok.then_some(self.part_bytes)
    }

    fn object(&self, name: &str) -> ObjectPath {
        self.prefix.child(name)
    }

    /// The object's location as messages name it: `<store>/<path>`.
    fn location(&self, object: &ObjectPath) -> PathBuf {
        PathBuf::from(format!("{}/{}", self.store, object))
    }

    /// Runs `f` on the store's runtime and waits for its answer.
    fn wait<T: Send + 'static>(
        &self,
        f: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> object_store::Result<T> {
        self.wait_within(f, None)
    }

    /// Runs the read `f` on the store's runtime and waits for its answer, within the
    /// read deadline when the caller is not background work (see `io_class`): past
    /// it, the request is dropped and the read fails as unavailable.
    fn read<T: Send + 'static>(
        &self,
        f: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> object_store::Result<T> {
        let deadline = (!crate::io_class::is_background()).then(|| {
            std::time::Duration::from_micros(
                self.read_deadline_us
                    .load(std::sync::atomic::Ordering::Relaxed),
            )
        });
        self.wait_within(f, deadline)
    }

    fn wait_within<T: Send + 'static>(
        &self,
        f: impl Future<Output = object_store::Result<T>> + Send + 'static,
        deadline: Option<std::time::Duration>,
    ) -> object_store::Result<T> {
        Remote::answer(self.start(f, deadline))
    }

    /// Starts `f` on the store's runtime; its answer comes on the receiver
    /// ([`Remote::answer`] waits for it).
    fn start<T: Send + 'static>(
        &self,
        f: impl Future<Output = object_store::Result<T>> + Send + 'static,
        deadline: Option<std::time::Duration>,
    ) -> std::sync::mpsc::Receiver<object_store::Result<T>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        match &self.runtime {
            Some(rt) => {
                let added = self.added_latency;
                rt.spawn(async move {
                    let request = async move {
                        if !added.is_zero() {
                            tokio::time::sleep(added).await;
                        }
                        f.await
                    };
                    let answer = match deadline {
                        None => request.await,
                        Some(d) => tokio::time::timeout(d, request).await.unwrap_or_else(|_| {
                            Err(object_store::Error::Generic {
                                store: "phoenix",
                                source: Box::new(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    format!("no answer within the read deadline of {d:?}"),
                                )),
                            })
                        }),
                    };
                    // The caller waits on the other end (it is gone only if it panicked,
                    // or did not mean to wait: an abort of an unfinished upload).
                    let _ = tx.send(answer);
                });
            }
            // (Only while dropping: the answer below says so.)
            None => drop(tx),
        }
        rx
    }

    /// Waits for the answer of a request [`Remote::start`] started.
    fn answer<T>(
        rx: std::sync::mpsc::Receiver<object_store::Result<T>>,
    ) -> object_store::Result<T> {
        rx.recv().unwrap_or_else(|_| {
            Err(object_store::Error::Generic {
                store: "phoenix",
                source: Box::new(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "the object store's runtime dropped the request",
                )),
            })
        })
    }

    /// Uploads `data` as `object`: created if absent (`expected` None), else replaced if
    /// its ETag is still `expected`. Returns the new ETag. Finding the object there, or
    /// changed, or gone, means another writer took the store over: [`Fenced`].
    ///
    /// With `read_back`, a failed condition is checked by reading the object: its bytes
    /// equal to `data` count as this upload done (see below). Only where no other
    /// writer can mean to upload the same bytes: not for the uploads of an open (a
    /// fresh manifest, the takeover record), which two engines opening the same store at
    /// once derive alike from what both read, and of which only one may succeed.
    ///
    /// [`Fenced`]: phoenix_storage::Error::Fenced
    fn put_if(
        &self,
        object: &ObjectPath,
        data: Bytes,
        expected: Option<String>,
        read_back: bool,
    ) -> phoenix_storage::Result<String> {
        let replacing = expected.is_some();
        let mode = match expected {
            None => PutMode::Create,
            Some(e_tag) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let store = Arc::clone(&self.store);
        let at = object.clone();
        let payload = PutPayload::from(data.clone());
        let done = self.wait(async move {
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            store.put_opts(&at, payload, opts).await
        });
        match done {
            Ok(r) => self.need_tag(IoOp::Write, object, r.e_tag),
            // The condition failed. Either another writer got there first, or this
            // upload did: a request whose answer was lost (a 5xx after it landed) and
            // that the client sent again finds its own bytes. Reading back tells them
            // apart: past an open, two writers' table and manifest numbers differ, and
            // a takeover's record is one the writer it fences never writes. A read
            // that fails because the store is unavailable tells nothing yet: so says
            // the error, and the write is tried again later (it did not land: its
            // condition failed). Any other failed read: fenced, the safe side
            // (reopening would take the store back from a newer writer).
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => match read_back.then(|| self.get(object)) {
                Some(Ok((there, tag))) if there == data => self.need_tag(IoOp::Write, object, tag),
                Some(Err(e)) if e.is_retryable() => Err(e),
                _ => Err(phoenix_storage::Error::Fenced {
                    path: self.location(object),
                }),
            },
            // (Gone, when replacing: the newer writer removed the manifest it took over.
            // When creating, a missing bucket is an error of its own.)
            Err(object_store::Error::NotFound { .. }) if replacing => {
                Err(phoenix_storage::Error::Fenced {
                    path: self.location(object),
                })
            }
            Err(e) => Err(self.error(IoOp::Write, object, e)),
        }
    }

    /// `tag`, or an error saying the store gives no ETags (fencing needs them).
    fn need_tag(
        &self,
        op: IoOp,
        object: &ObjectPath,
        tag: Option<String>,
    ) -> phoenix_storage::Result<String> {
        tag.ok_or_else(|| {
            phoenix_storage::Error::io(
                op,
                self.location(object),
                std::io::Error::other(
                    "the object store gave no ETag; conditional writes (fencing) need one",
                ),
            )
        })
    }

    /// The object's bytes and ETag.
    fn get(&self, object: &ObjectPath) -> phoenix_storage::Result<(Bytes, Option<String>)> {
        let store = Arc::clone(&self.store);
        let at = object.clone();
        self.wait(async move {
            let r = store.get(&at).await?;
            let e_tag = r.meta.e_tag.clone();
            Ok((r.bytes().await?, e_tag))
        })
        .map_err(|e| self.error(IoOp::Read, object, e))
    }

    fn delete(&self, object: &ObjectPath) -> phoenix_storage::Result<()> {
        let store = Arc::clone(&self.store);
        let at = object.clone();
        self.wait(async move { store.delete(&at).await })
            .map_err(|e| self.error(IoOp::Delete, object, e))
    }

    /// An object store's error as a storage error of the object's location, classified:
    /// a missing object is `NotFound` (what `is_not_found` recognises); what says the
    /// store is out of reach for now — a refused or reset connection, a timeout, a 5xx
    /// (but 501 and 505) or 408/429 once the client's own retries ran out ([`transient`])
    /// — is [`Unavailable`](phoenix_storage::Error::Unavailable): retried later; every
    /// other answer (a 4xx, a failed condition, an error the client does not explain) is
    /// an I/O error, which stops the work visibly rather than retrying it forever.
    fn error(
        &self,
        op: IoOp,
        object: &ObjectPath,
        e: object_store::Error,
    ) -> phoenix_storage::Error {
        use object_store::Error as E;
        use std::io::ErrorKind;
        let path = self.location(object);
        if transient(&e) {
            return phoenix_storage::Error::Unavailable {
                op,
                path,
                source: std::io::Error::other(e),
            };
        }
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => ErrorKind::PermissionDenied,
            E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::NotImplemented
            | E::UnknownConfigurationKey { .. } => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        phoenix_storage::Error::io(op, path, std::io::Error::new(kind, e))
    }
}

/// Whether an object store's error says the store could not be reached or answer for
/// now. The client reports transport failures and 5xx alike as `Generic`; its own
/// error types are private, so the cause is found down the error's chain: a transport
/// error of a kind that means no answer ([`HttpError`](object_store::client::HttpError)
/// connect / request / timeout / interrupted, or such an `io::Error`), or a status the
/// client gave up retrying.
fn transient(e: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind as H;
    use std::io::ErrorKind as K;
    let object_store::Error::Generic { source, .. } = e else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<object_store::client::HttpError>() {
            match h.kind() {
                H::Connect | H::Request | H::Timeout | H::Interrupted => return true,
                // Decode / unknown: look further down (an io::Error may say more).
                _ => {}
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::TimedOut
                    | K::Interrupted
                    | K::UnexpectedEof
            ) {
                return true;
            }
        }
        if let Some(status) = status_of(c) {
            return matches!(status, 500 | 502..=504 | 506..=599 | 408 | 429);
        }
        cause = c.source();
    }
    false
}

/// The HTTP status an error of the S3 client names, if it is one: the client's own
/// request error reads "Server returned non-2xx status code: <code> …" (its type is
/// private); an error *response* (a 200 carrying an S3 error document, which S3 sends
/// for internal errors met after the status went out) counts as a 500.
fn status_of(e: &dyn std::error::Error) -> Option<u16> {
    let text = e.to_string();
    if text.starts_with("Server returned error response") {
        return Some(500);
    }
    let rest = text.strip_prefix("Server returned non-2xx status code: ")?;
    rest.get(..3)?.parse().ok()
}

impl TableStore for ObjectTableStore {
    fn location(&self) -> PathBuf {
        self.inner.location(&self.inner.prefix)
    }

    fn table_location(&self, number: u64) -> PathBuf {
        let name = crate::table::table_file_name(number);
        self.inner.location(&self.inner.object(&name))
    }

    fn create_table(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        let name = crate::table::table_file_name(number);
        Ok(Box::new(ObjectWriter::new(&self.inner, &name, Kind::Table)))
    }

    fn open_table(&self, number: u64) -> Result<Arc<dyn ReadableFile>> {
        let object = self.inner.object(&crate::table::table_file_name(number));
        let store = Arc::clone(&self.inner.store);
        let at = object.clone();
        let meta = self
            .inner
            .read(async move { store.head(&at).await })
            .map_err(|e| self.inner.error(IoOp::Open, &object, e))?;
        let cached = match (self.inner.cache.get(), &meta.e_tag) {
            (Some(cache), Some(tag)) => Some((Arc::clone(cache), object_key(object.as_ref(), tag))),
            _ => None,
        };
        Ok(Arc::new(ObjectReader {
            location: self.inner.location(&object),
            remote: Arc::clone(&self.inner),
            object,
            size: meta.size,
            e_tag: meta.e_tag,
            cached,
        }))
    }

    fn delete_table(&self, number: u64) -> Result<()> {
        let object = self.inner.object(&crate::table::table_file_name(number));
        // Deleting a missing object succeeds on S3; the trait says "not found".
        let store = Arc::clone(&self.inner.store);
        let at = object.clone();
        self.inner
            .wait(async move { store.head(&at).await })
            .map_err(|e| self.inner.error(IoOp::Delete, &object, e))?;
        Ok(self.inner.delete(&object)?)
    }

    fn import_table(&self, from: &dyn FileSystem, src: &Path, number: u64) -> Result<Imported> {
        let data = Bytes::from(from.read_all(src)?);
        let object = self.inner.object(&crate::table::table_file_name(number));
        let parts = (data.len() > self.inner.part_bytes)
            .then(|| self.inner.parts())
            .flatten();
        if let Some(part) = parts {
            // (At most S3's 10,000 parts: larger parts for a larger file, in whole MiB.)
            let part = part.max(data.len().div_ceil(10_000).next_multiple_of(1 << 20));
            let mut parts = PartUpload::start(&self.inner, &object, false)?;
            for at in (0..data.len()).step_by(part) {
                parts.put(data.slice(at..data.len().min(at + part)))?;
            }
            parts.finish()?;
        } else {
            self.inner.put_if(&object, data, None, true)?;
        }
        Ok(Imported::Copied)
    }

    fn unimport_table(
        &self,
        _from: &dyn FileSystem,
        _src: &Path,
        number: u64,
        how: Imported,
    ) -> Result<()> {
        debug_assert_eq!(how, Imported::Copied, "an object store only copies");
        self.delete_table(number)
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn list(&self) -> Result<Vec<StoredFile>> {
        let store = Arc::clone(&self.inner.store);
        let prefix = self.inner.prefix.clone();
        let metas = self
            .inner
            .wait(async move { store.list(Some(&prefix)).try_collect::<Vec<_>>().await })
            .map_err(|e| self.inner.error(IoOp::List, &self.inner.prefix, e))?;
        let mut out = Vec::new();
        for m in metas {
            // Only the objects right under the prefix are the store's.
            let Some(name) =
                m.location
                    .prefix_match(&self.inner.prefix)
                    .and_then(|mut parts| match (parts.next(), parts.next()) {
                        (Some(name), None) => Some(name.as_ref().to_string()),
                        _ => None,
                    })
            else {
                continue;
            };
            out.extend(StoredFile::from_name(&name));
        }
        Ok(out)
    }

    fn remove(&self, file: &StoredFile) -> Result<()> {
        Ok(self.inner.delete(&self.inner.object(&file.name()))?)
    }

    fn read_current_manifest(&self) -> Result<Option<(u64, PathBuf, Vec<u8>)>> {
        let current = self.inner.object("CURRENT");
        let (cur, current_tag) = match self.inner.get(&current) {
            Ok(got) => got,
            Err(e) if e.is_not_found() => {
                *self.fence.lock() = Fence {
                    current: Some(None),
                    ..Fence::default()
                };
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let current_tag = self.inner.need_tag(IoOp::Read, &current, current_tag)?;
        let number = parse_current(&cur, &self.inner.location(&current))?;
        let object = self.inner.object(&filename::manifest_name(number));
        let (data, tag) = self.inner.get(&object)?;
        let tag = self.inner.need_tag(IoOp::Read, &object, tag)?;
        *self.fence.lock() = Fence {
            current: Some(Some(current_tag)),
            opened: Some((object.clone(), data.clone(), tag)),
            ..Fence::default()
        };
        Ok(Some((number, self.inner.location(&object), data.to_vec())))
    }

    fn create_manifest(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        // At an open, two engines may upload the same bytes under the same number (see
        // `put_if`): its first upload is not read back.
        let kind = if self.fence.lock().open_done {
            Kind::Manifest
        } else {
            Kind::OpeningManifest
        };
        Ok(Box::new(ObjectWriter::new(
            &self.inner,
            &filename::manifest_name(number),
            kind,
        )))
    }

    fn set_current_manifest(&self, number: u64) -> Result<()> {
        let mut fence = self.fence.lock();
        if let Some((object, bytes, tag)) = fence.opened.take() {
            // The takeover: the writer before us finds its manifest changed at its next
            // append. (One that appended since we read it makes this fail: the open
            // fails, and nothing of ours is current.)
            // The record says the numbers up to the new manifest's are taken. The older
            // writer's numbers stay below it (they are [`FENCE_FILE_GAP`] short), so no
            // record of its can have these bytes: a retried upload of its own that
            // reads back (see `put_if`) never mistakes the fenced manifest for its own.
            let mut payload = Vec::new();
            VersionEdit {
                next_file_number: Some(number.saturating_add(1)),
                ..Default::default()
            }
            .encode(&mut payload);
            let mut fenced = bytes.to_vec();
            fenced.extend_from_slice(&crate::version_set::encode_record(&payload));
            self.inner
                .put_if(&object, Bytes::from(fenced), Some(tag), false)?;
        }
        let named = |n: u64| Bytes::from(format!("{}\n", filename::manifest_name(n)));
        let at = self.inner.object("CURRENT");
        let expected = fence.current.clone().flatten();
        // (Read back: two opens at once name different manifests, see `put_if`.)
        let put = match self.inner.put_if(&at, named(number), expected, true) {
            // An earlier upload of ours whose outcome was unknown may have landed: then
            // `CURRENT` names its manifest (no other writer names that number), and this
            // one replaces it.
            Err(e) if e.is_fenced() && !fence.unsure.is_empty() => match self.inner.get(&at) {
                Ok((there, Some(tag))) if fence.unsure.iter().any(|&n| named(n) == there) => {
                    self.inner.put_if(&at, named(number), Some(tag), true)
                }
                // (Tells nothing yet: tried again later.)
                Err(read) if read.is_retryable() => Err(read),
                _ => Err(e),
            },
            other => other,
        };
        match put {
            Ok(tag) => {
                fence.current = Some(Some(tag));
                fence.open_done = true;
                fence.unsure.clear();
                Ok(())
            }
            Err(e) => {
                if e.is_retryable() {
                    fence.unsure.push(number);
                }
                Err(e.into())
            }
        }
    }

    fn reads_at_once(&self) -> bool {
        true
    }

    fn shared_id(&self) -> Option<String> {
        Some(self.inner.shared_id.clone())
    }

    fn rewrites_manifest_whole(&self) -> bool {
        true
    }

    fn table_object(&self, number: u64) -> Option<String> {
        Some(
            self.inner
                .object(&crate::table::table_file_name(number))
                .to_string(),
        )
    }

    fn copy_table(&self, object: &str, number: u64) -> Result<()> {
        // Only a table may be copied in: a peer naming a manifest or `CURRENT` (or a
        // path that does not parse) is refused before any request.
        let from = ObjectPath::parse(object)
            .ok()
            .filter(|p| {
                p.filename()
                    .and_then(filename::parse)
                    .is_some_and(|k| matches!(k, filename::FileKind::Table(_)))
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{object:?} does not name a table to copy"))
            })?;
        let to = self.inner.object(&crate::table::table_file_name(number));
        let store = Arc::clone(&self.inner.store);
        let (f, t) = (from, to.clone());
        self.inner
            .wait(async move { store.copy(&f, &t).await })
            .map_err(|e| self.inner.error(IoOp::Write, &to, e))?;
        Ok(())
    }

    fn supports_reader_leases(&self) -> bool {
        true
    }

    fn put_reader_lease(&self, reader: &str, lease: &[u8]) -> Result<()> {
        let at = self.lease_object(reader)?;
        let store = Arc::clone(&self.inner.store);
        let (t, payload) = (at.clone(), PutPayload::from(lease.to_vec()));
        self.inner
            .wait(async move { store.put(&t, payload).await })
            .map_err(|e| self.inner.error(IoOp::Write, &at, e))?;
        Ok(())
    }

    fn delete_reader_lease(&self, reader: &str) -> Result<()> {
        let at = self.lease_object(reader)?;
        match self.inner.delete(&at) {
            Err(e) if !e.is_not_found() => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn reader_leases(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let listed = self.lease_objects()?;
        let store = Arc::clone(&self.inner.store);
        let ats: Vec<ObjectPath> = listed.iter().map(|(_, at)| at.clone()).collect();
        // (Read at once: the flush thread waits for them.)
        let got = self
            .inner
            .wait(async move {
                let reads = ats.into_iter().map(|at| {
                    let store = Arc::clone(&store);
                    async move {
                        match store.get(&at).await {
                            Ok(r) => r.bytes().await.map(Some),
                            // (Gone meanwhile: its reader left.)
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            Err(e) => Err(e),
                        }
                    }
                });
                futures_util::future::try_join_all(reads).await
            })
            .map_err(|e| {
                self.inner
                    .error(IoOp::Read, &self.inner.prefix.child(READERS), e)
            })?;
        Ok(listed
            .into_iter()
            .zip(got)
            .filter_map(|((name, _), b)| b.map(|b| (name, b.to_vec())))
            .collect())
    }

    fn copy_table_out(&self, number: u64, object: &str) -> Result<()> {
        // Only to `…/tables/<table name>` (an engine's tables sit right under its
        // prefix), never under this engine's own prefix, never over an object: a copy
        // lands on no engine's table.
        let to = ObjectPath::parse(object)
            .ok()
            .filter(|p| {
                let parts: Vec<_> = p.parts().collect();
                parts.len() >= 2
                    && parts[parts.len() - 2].as_ref() == "tables"
                    && filename::parse(parts[parts.len() - 1].as_ref())
                        .is_some_and(|k| matches!(k, filename::FileKind::Table(_)))
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{object:?} is not a table name under a `tables` directory"
                ))
            })?;
        let own = self.inner.prefix.as_ref();
        if own.is_empty() || to.as_ref().starts_with(&format!("{own}/")) {
            return Err(Error::InvalidArgument(format!(
                "{object:?} is inside this engine's own prefix {own:?}"
            )));
        }
        let store = Arc::clone(&self.inner.store);
        let t = to.clone();
        match self.inner.wait(async move { store.head(&t).await }) {
            Ok(_) => {
                return Err(Error::InvalidArgument(format!(
                    "{object:?} exists already: a copy is never written over an object"
                )))
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.inner.error(IoOp::Read, &to, e).into()),
        }
        let from = self.inner.object(&crate::table::table_file_name(number));
        let store = Arc::clone(&self.inner.store);
        let t = to.clone();
        self.inner
            .wait(async move { store.copy(&from, &t).await })
            .map_err(|e| self.inner.error(IoOp::Write, &to, e))?;
        Ok(())
    }

    fn file_number_gap(&self) -> u64 {
        FENCE_FILE_GAP
    }
}

/// A table or manifest being written: the bytes are kept here and uploaded whole at each
/// sync that has something new to upload; or, for a table past one part on a store
/// that takes them, sent in parts as they come and completed at the sync.
struct ObjectWriter {
    remote: Arc<Remote>,
    object: ObjectPath,
    location: PathBuf,
    kind: Kind,
    /// The bytes not yet sent (all of them, but for a table going up in parts).
    buf: Vec<u8>,
    /// Bytes the last upload held and its ETag (none yet: `None`).
    uploaded: Option<(u64, String)>,
    /// A table's upload in parts, once its bytes passed one part.
    parts: Option<PartUpload>,
    /// Bytes sent in parts (no longer in `buf`).
    sent: u64,
    /// The table goes up whole (the store was found not to take parts for it).
    uploaded_whole: bool,
    /// The upload in parts completed or failed: nothing more can be written.
    closed: Option<Closed>,
}

/// Why an [`ObjectWriter`] takes no more bytes.
#[derive(Debug)]
enum Closed {
    /// Its upload in parts completed: the table is whole.
    Completed,
    /// Its upload in parts failed (the parts are aborted): the table is to be written
    /// again, as a new one. Whether the failure was the store being unavailable, and
    /// what it said.
    Failed { retryable: bool, why: String },
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("object", &self.object.as_ref())
            .field("len", &self.buf.len())
            .finish()
    }
}

/// What an [`ObjectWriter`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Table,
    Manifest,
    /// The manifest of an open, before it is named in `CURRENT`.
    OpeningManifest,
}

impl ObjectWriter {
    fn new(remote: &Arc<Remote>, name: &str, kind: Kind) -> ObjectWriter {
        let object = remote.object(name);
        ObjectWriter {
            location: remote.location(&object),
            remote: Arc::clone(remote),
            object,
            kind,
            buf: Vec::new(),
            uploaded: None,
            parts: None,
            sent: 0,
            uploaded_whole: false,
            closed: None,
        }
    }

    /// The error of a write to a writer that takes no more bytes.
    fn closed_error(&self, closed: &Closed) -> phoenix_storage::Error {
        let source = std::io::Error::other(match closed {
            Closed::Completed => "the table's upload in parts completed: it takes no more \
                                  bytes"
                .to_string(),
            Closed::Failed { why, .. } => format!("the table's upload in parts failed: {why}"),
        });
        let path = self.location.clone();
        match closed {
            Closed::Failed {
                retryable: true, ..
            } => phoenix_storage::Error::Unavailable {
                op: IoOp::Write,
                path,
                source,
            },
            _ => phoenix_storage::Error::io(IoOp::Write, path, source),
        }
    }

    /// Records that the upload in parts failed with `e` (its parts are aborted as the
    /// upload is dropped), and returns `e`.
    fn fail(&mut self, e: phoenix_storage::Error) -> phoenix_storage::Error {
        self.parts = None;
        self.closed = Some(Closed::Failed {
            retryable: e.is_retryable(),
            why: e.to_string(),
        });
        e
    }

    /// A table never uploaded yet sends what fills whole parts (starting an upload in
    /// parts once it has one).
    fn send_parts(&mut self) -> phoenix_storage::Result<()> {
        if self.kind != Kind::Table
            || self.uploaded_whole
            || self.uploaded.is_some()
            || self.remote.part_bytes == 0
            || self.buf.len() < self.remote.part_bytes
        {
            return Ok(());
        }
        let part = match &self.parts {
            Some(_) => self.remote.part_bytes,
            None => match self.remote.parts() {
                Some(part) => part,
                None => {
                    // This table goes up whole: asked once, not at every append (a
                    // probe that failed is asked again for the next table only).
                    self.uploaded_whole = true;
                    return Ok(());
                }
            },
        };
        while self.buf.len() >= part {
            if self.parts.is_none() {
                self.parts = Some(PartUpload::start(&self.remote, &self.object, true)?);
            }
            let rest = self.buf.split_off(part);
            let full = std::mem::replace(&mut self.buf, rest);
            if let Some(parts) = self.parts.as_mut() {
                parts.put(Bytes::from(full))?;
                self.sent = parts.len();
            }
        }
        Ok(())
    }

    /// Uploads the bytes so far: the first time only if no such object exists, then only
    /// over the version this writer uploaded last (see the module docs, fencing).
    fn upload(&mut self) -> phoenix_storage::Result<()> {
        match &self.closed {
            // (Appends are refused past it: nothing new to upload.)
            Some(Closed::Completed) => return Ok(()),
            Some(closed) => return Err(self.closed_error(closed)),
            None => {}
        }
        if let Some(mut parts) = self.parts.take() {
            let rest = Bytes::from(std::mem::take(&mut self.buf));
            let finished = match rest.is_empty() {
                true => Ok(()),
                false => parts.put(rest),
            }
            .and_then(|()| {
                let len = parts.len();
                parts.finish().map(|tag| (len, tag))
            });
            let (len, tag) = finished.map_err(|e| self.fail(e))?;
            self.sent = len;
            self.uploaded = Some((len, tag));
            self.closed = Some(Closed::Completed);
            return Ok(());
        }
        if self
            .uploaded
            .as_ref()
            .is_some_and(|(len, _)| *len == self.buf.len() as u64)
        {
            return Ok(());
        }
        let expected = self.uploaded.as_ref().map(|(_, tag)| tag.clone());
        // An open's manifest's first upload is not read back: two engines opening at
        // once may upload the same bytes under the same number (see `put_if`).
        let read_back = !(self.kind == Kind::OpeningManifest && expected.is_none());
        // (A copy: the writer goes on appending to its buffer.)
        let tag = self.remote.put_if(
            &self.object,
            Bytes::copy_from_slice(&self.buf),
            expected,
            read_back,
        )?;
        // A table this node wrote is read here soon (by compactions, by reads): keep it
        // on flash as it goes up, as a local engine keeps what it writes.
        if let (Kind::Table, Some(cache)) = (self.kind, self.remote.cache.get()) {
            let key = object_key(self.object.as_ref(), &tag);
            for (i, chunk) in self.buf.chunks(PAGE_BYTES as usize).enumerate() {
                cache.insert(key, i as u64, chunk);
            }
        }
        self.uploaded = Some((self.buf.len() as u64, tag));
        Ok(())
    }
}

impl WritableFile for ObjectWriter {
    fn append(&mut self, data: &[u8]) -> phoenix_storage::Result<()> {
        if let Some(closed) = &self.closed {
            return Err(self.closed_error(closed));
        }
        self.buf.extend_from_slice(data);
        self.send_parts().map_err(|e| self.fail(e))
    }

    fn sync_data(&mut self) -> phoenix_storage::Result<()> {
        self.upload()
    }

    fn sync_all(&mut self) -> phoenix_storage::Result<()> {
        self.upload()
    }

    fn preallocate(&mut self, _len: u64) -> phoenix_storage::Result<()> {
        // Objects have no room to reserve.
        Ok(())
    }

    fn position(&self) -> u64 {
        self.sent + self.buf.len() as u64
    }

    fn path(&self) -> &Path {
        &self.location
    }
}

/// Reads of one batch at most this far apart go as one ranged request (the bytes
/// between are fetched and dropped: cheaper than a request of their own).
const COALESCE_GAP: u64 = 64 << 10;
/// The most one coalesced request spans.
const COALESCE_MAX: u64 = 4 << 20;

/// A read of [`ObjectReader::read_many`] left to fetch: its offset, its buffer, and
/// the pages flash did not hold (`None`: all of it).
type Pending<'a> = (u64, &'a mut [u8], Option<Vec<u64>>);

/// Page `p`'s part of a read of bytes `offset..end`: from and to as offsets in the page,
/// and where it goes in the read's buffer.
fn page_part(offset: u64, end: u64, p: u64) -> (usize, usize, usize) {
    let start = p * PAGE_BYTES;
    let from = offset.max(start);
    let to = end.min(start + PAGE_BYTES);
    (
        (from - start) as usize,
        (to - start) as usize,
        (from - offset) as usize,
    )
}

/// A table read by ranged requests.
struct ObjectReader {
    remote: Arc<Remote>,
    object: ObjectPath,
    location: PathBuf,
    size: u64,
    /// The version opened: reads ask for it (`If-Match`), so bytes of another version
    /// are never read, nor kept on flash under this one's name.
    e_tag: Option<String>,
    /// The flash cache and this version's key in it.
    cached: Option<(Arc<FlashCache>, u64)>,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("object", &self.object.as_ref())
            .field("size", &self.size)
            .finish()
    }
}

impl ObjectReader {
    /// Bytes `from..to` of the object, by one ranged request.
    fn fetch(&self, from: u64, to: u64) -> phoenix_storage::Result<Bytes> {
        let store = Arc::clone(&self.remote.store);
        let at = self.object.clone();
        let opts = object_store::GetOptions {
            if_match: self.e_tag.clone(),
            range: Some((from..to).into()),
            ..Default::default()
        };
        self.remote
            .read(async move { store.get_opts(&at, opts).await?.bytes().await })
            .map_err(|e| self.remote.error(IoOp::Read, &self.object, e))
    }

    /// An error unless `len` bytes at `offset` lie within the object.
    fn check_within(&self, offset: u64, len: usize) -> phoenix_storage::Result<()> {
        if offset.saturating_add(len as u64) <= self.size {
            return Ok(());
        }
        Err(phoenix_storage::Error::io(
            IoOp::Read,
            self.location.clone(),
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset} past the end ({} bytes)", self.size),
            ),
        ))
    }

    /// Copies into `buf` (bytes `offset..offset + buf.len()` of the object) what the
    /// flash cache holds of them; returns the pages left to fetch, or `None` (all of
    /// it) without a cache.
    fn copy_from_flash(&self, offset: u64, buf: &mut [u8]) -> Option<Vec<u64>> {
        let (cache, key) = self.cached.as_ref()?;
        let end = offset + buf.len() as u64;
        let mut missing: Vec<u64> = Vec::new();
        if buf.is_empty() {
            return Some(missing);
        }
        for p in offset / PAGE_BYTES..=(end - 1) / PAGE_BYTES {
            let (from, to, at) = page_part(offset, end, p);
            let want = to - from;
            if cache.read(*key, p, from, &mut buf[at..at + want]) != Some(want) {
                missing.push(p);
            }
        }
        Some(missing)
    }

    /// Fetches what [`ObjectReader::copy_from_flash`] left of `buf`: all of it by one ranged
    /// request (`None`), or each run of missing pages by one request, the pages kept on
    /// flash.
    fn fetch_rest(
        &self,
        offset: u64,
        buf: &mut [u8],
        missing: Option<Vec<u64>>,
    ) -> phoenix_storage::Result<()> {
        let end = offset + buf.len() as u64;
        let (Some(missing), Some((cache, key))) = (missing, &self.cached) else {
            if buf.is_empty() {
                return Ok(());
            }
            let bytes = self.fetch(offset, end)?;
            if bytes.len() != buf.len() {
                return Err(self.short(offset, end, bytes.len()));
            }
            buf.copy_from_slice(&bytes);
            return Ok(());
        };
        let mut i = 0;
        while i < missing.len() {
            let mut j = i + 1;
            while j < missing.len() && missing[j] == missing[j - 1] + 1 {
                j += 1;
            }
            let from = missing[i] * PAGE_BYTES;
            let to = ((missing[j - 1] + 1) * PAGE_BYTES).min(self.size);
            let bytes = self.fetch(from, to)?;
            if bytes.len() as u64 != to - from {
                return Err(self.short(from, to, bytes.len()));
            }
            for (k, page) in bytes.chunks(PAGE_BYTES as usize).enumerate() {
                let p = missing[i] + k as u64;
                cache.insert(*key, p, page);
                let (pfrom, pto, at) = page_part(offset, end, p);
                buf[at..at + (pto - pfrom)].copy_from_slice(&page[pfrom..pto]);
            }
            i = j;
        }
        Ok(())
    }

    /// Runs `f` on every job side by side ([`crate::io_class::side_by_side`]); the first
    /// error is returned, once every job is done.
    fn at_once<T: Send>(
        &self,
        jobs: Vec<T>,
        f: impl Fn(T) -> phoenix_storage::Result<()> + Sync,
    ) -> phoenix_storage::Result<()> {
        crate::io_class::side_by_side(jobs, f)
            .into_iter()
            .try_for_each(|r| {
                r.unwrap_or_else(|_| {
                    Err(phoenix_storage::Error::io(
                        IoOp::Read,
                        self.location.clone(),
                        std::io::Error::other("a parallel read panicked"),
                    ))
                })
            })
    }

    fn short(&self, from: u64, to: u64, got: usize) -> phoenix_storage::Error {
        phoenix_storage::Error::io(
            IoOp::Read,
            self.location.clone(),
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("asked for bytes {from}..{to}, the store answered {got}"),
            ),
        )
    }
}

impl ReadableFile for ObjectReader {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> phoenix_storage::Result<()> {
        self.check_within(offset, buf.len())?;
        let missing = self.copy_from_flash(offset, buf);
        self.fetch_rest(offset, buf, missing)
    }

    fn reads_at_once(&self) -> bool {
        true
    }

    fn read_waits(&self, offset: u64, len: usize) -> bool {
        let Some((cache, key)) = &self.cached else {
            return true;
        };
        let end = offset.saturating_add(len as u64).min(self.size);
        end > offset
            && (offset / PAGE_BYTES..=(end - 1) / PAGE_BYTES).any(|p| !cache.holds(*key, p))
    }

    /// What the flash cache holds of each read is copied at once; the rest go out
    /// together, each request on a thread of its own (the first on the caller's), so
    /// a batch of block reads waits about one round trip, not one per block. Without a
    /// flash cache, reads close to each other (within [`COALESCE_GAP`]) go as one
    /// ranged request: fewer requests for the store to serve.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> phoenix_storage::Result<()> {
        let mut pending: Vec<Pending<'_>> = Vec::new();
        for (offset, buf) in reads.iter_mut() {
            self.check_within(*offset, buf.len())?;
            let missing = self.copy_from_flash(*offset, buf);
            if missing.as_ref().is_some_and(Vec::is_empty) {
                continue;
            }
            pending.push((*offset, &mut **buf, missing));
        }
        if self.cached.is_some() {
            return self.at_once(pending, |(offset, buf, missing)| {
                self.fetch_rest(offset, buf, missing)
            });
        }
        // Runs of reads close to each other, by offset.
        pending.sort_by_key(|p| p.0);
        let mut runs: Vec<Vec<(u64, &mut [u8])>> = Vec::new();
        for (offset, buf, _) in pending {
            let end = offset + buf.len() as u64;
            let joins = runs.last().is_some_and(|run| {
                let start = run[0].0;
                let run_end = run
                    .iter()
                    .map(|(o, b)| o + b.len() as u64)
                    .max()
                    .unwrap_or(start);
                offset <= run_end + COALESCE_GAP && end - start <= COALESCE_MAX
            });
            match runs.last_mut() {
                Some(run) if joins => run.push((offset, buf)),
                _ => runs.push(vec![(offset, buf)]),
            }
        }
        self.at_once(runs, |mut run| {
            let from = run[0].0;
            let to = run
                .iter()
                .map(|(o, b)| o + b.len() as u64)
                .max()
                .unwrap_or(from);
            let bytes = self.fetch(from, to)?;
            if bytes.len() as u64 != to - from {
                return Err(self.short(from, to, bytes.len()));
            }
            for (offset, buf) in run.iter_mut() {
                let at = (*offset - from) as usize;
                buf.copy_from_slice(&bytes[at..at + buf.len()]);
            }
            Ok(())
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> phoenix_storage::Result<usize> {
        let end = offset.saturating_add(buf.len() as u64).min(self.size);
        if offset >= end {
            return Ok(0);
        }
        let buf = &mut buf[..(end - offset) as usize];
        let missing = self.copy_from_flash(offset, buf);
        self.fetch_rest(offset, buf, missing)?;
        Ok(buf.len())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn path(&self) -> &Path {
        &self.location
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A table copied out (a backup) goes only to a table name under a `tables`
    /// directory outside the engine's own prefix, and never over an object.
    #[test]
    fn a_table_is_copied_out_only_to_a_fresh_table_name_elsewhere() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let a = ObjectTableStore::new(Arc::clone(&bucket), "cluster/node-1").unwrap();
        let mut t = a.create_table(7).unwrap();
        t.append(b"table bytes").unwrap();
        t.sync_all().unwrap();
        drop(t);
        let refused = |to: &str| a.copy_table_out(7, to).unwrap_err().to_string();
        assert!(refused("cluster/node-1/tables/000001.sst").contains("own prefix"));
        assert!(refused("backup/g1/000001.sst").contains("under a `tables` directory"));
        assert!(refused("backup/g1/tables/MANIFEST-000001").contains("under a `tables`"));
        a.copy_table_out(7, "backup/g1/tables/000001.sst").unwrap();
        assert!(refused("backup/g1/tables/000001.sst").contains("exists already"));
        let copied = a
            .inner
            .wait({
                let b = Arc::clone(&bucket);
                async move {
                    b.get(&ObjectPath::from("backup/g1/tables/000001.sst"))
                        .await?
                        .bytes()
                        .await
                }
            })
            .unwrap();
        assert_eq!(&copied[..], b"table bytes");
    }

    fn record(edit: &VersionEdit) -> Vec<u8> {
        let mut p = Vec::new();
        edit.encode(&mut p);
        crate::version_set::encode_record(&p)
    }

    /// The takeover itself, call by call: B's open appends to the manifest A writes, so
    /// A's next append (conditional on its own last upload) is refused as fenced, and so
    /// is its pointer; B's pointer is taken conditionally too.
    #[test]
    fn a_takeover_fences_the_writer_before() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let a = ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
        assert!(a.read_current_manifest().unwrap().is_none());
        let mut a_manifest = a.create_manifest(1).unwrap();
        a_manifest.append(&record(&VersionEdit::default())).unwrap();
        a_manifest.sync_all().unwrap();
        a.set_current_manifest(1).unwrap();
        a_manifest.append(&record(&VersionEdit::default())).unwrap();
        a_manifest.sync_data().unwrap();

        let b = ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
        let (number, _, bytes) = b.read_current_manifest().unwrap().unwrap();
        assert_eq!(number, 1);
        assert_eq!(bytes.len() as u64, a_manifest.position());
        let mut b_manifest = b.create_manifest(2).unwrap();
        b_manifest.append(&record(&VersionEdit::default())).unwrap();
        b_manifest.sync_all().unwrap();
        b.set_current_manifest(2).unwrap();

        // A still holds manifest 1 (B has not removed it): its append meets B's fence.
        a_manifest.append(&record(&VersionEdit::default())).unwrap();
        let err = a_manifest.sync_data().unwrap_err();
        assert!(err.is_fenced(), "{err}");
        // A rolling its manifest: the new one's name is free, the pointer is not.
        let mut a_roll = a.create_manifest(3).unwrap();
        a_roll.append(&record(&VersionEdit::default())).unwrap();
        a_roll.sync_all().unwrap();
        let err = a.set_current_manifest(3).unwrap_err();
        assert!(err.is_fenced(), "{err}");
        // A table of a number B wrote is refused too (A's own numbers never meet B's).
        let mut t = b.create_table(7).unwrap();
        t.append(b"b's").unwrap();
        t.sync_all().unwrap();
        let mut t = a.create_table(7).unwrap();
        t.append(b"a's").unwrap();
        let err = t.sync_all().unwrap_err();
        assert!(err.is_fenced(), "{err}");
        let got = b.open_table(7).unwrap();
        let mut buf = vec![0; 3];
        got.read_exact_at(0, &mut buf).unwrap();
        assert_eq!(buf, b"b's");
        // The pointer names B's manifest.
        let c = ObjectTableStore::new(bucket, "s").unwrap();
        assert_eq!(c.read_current_manifest().unwrap().unwrap().0, 2);
    }

    /// Reads through the flash cache return the object's bytes at any offset and length
    /// (pages assembled across their bounds); a table uploaded through the store is on
    /// flash at once, and one read through a fresh cache is fetched once, then served
    /// from flash.
    #[test]
    fn reads_through_the_flash_cache_are_exact() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let data: Vec<u8> = (0..(PAGE_BYTES * 5 + 1234))
            .map(|i| (i % 253) as u8)
            .collect();
        let check = |s: &ObjectTableStore| {
            let t = s.open_table(3).unwrap();
            let mut seed = 7u64;
            for _ in 0..200 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let off = (seed >> 33) % data.len() as u64;
                let len = ((seed >> 13) % (3 * PAGE_BYTES)) as usize;
                let mut buf = vec![0u8; len];
                let n = t.read_at(off, &mut buf).unwrap();
                let want = &data[off as usize..(off as usize + len).min(data.len())];
                assert_eq!(&buf[..n], want, "{off}+{len}");
            }
        };
        let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::MemFs::new());
        let writer = ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
        let cache = FlashCache::open(Arc::clone(&fs), Path::new("/c1"), 64 << 20).unwrap();
        writer.set_flash_cache(Arc::clone(&cache)).unwrap();
        assert!(writer.set_flash_cache(Arc::clone(&cache)).is_err());
        let mut t = writer.create_table(3).unwrap();
        t.append(&data).unwrap();
        t.sync_all().unwrap();
        check(&writer);
        let s = cache.stats();
        assert_eq!((s.misses, s.inserts), (0, 6), "{s:?}");
        assert!(s.hits > 0);

        let reader = ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
        let cache = FlashCache::open(fs, Path::new("/c2"), 64 << 20).unwrap();
        reader.set_flash_cache(Arc::clone(&cache)).unwrap();
        check(&reader);
        let s = cache.stats();
        assert_eq!(s.inserts, 6, "each page fetched once: {s:?}");
        assert!(s.hits > s.misses, "{s:?}");
    }

    /// The URL names the bucket and prefix and carries settings; anything else is
    /// refused with the reason.
    #[test]
    fn a_store_url_is_read_or_refused_clearly() {
        let s = ObjectTableStore::from_url(
            "s3://b/cluster/node-1/?endpoint=http%3A%2F%2F127.0.0.1:9000&region=eu",
        )
        .unwrap();
        assert_eq!(s.inner.prefix.as_ref(), "cluster/node-1");
        assert!(s.location().to_string_lossy().contains("cluster/node-1"));
        for (url, says) in [
            ("file:///x", "only s3://"),
            ("s3:///p", "no bucket"),
            ("s3://b/p?endpoint", "not key=value"),
            ("s3://b/p?colour=red", "unknown setting"),
            ("s3://b/p?region=%zz", "bad %-escape"),
            ("s3://b/p?multipart_part_mib=4", "0, or MiB in 5..=5120"),
            ("s3://b/p?multipart_part_mib=x", "0, or MiB in 5..=5120"),
        ] {
            let err = ObjectTableStore::from_url(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    /// A server that completes an upload in parts over an object that exists (the
    /// in-memory store does) is found out by the probe, which leaves nothing behind; a
    /// store given as it is never uploads in parts.
    #[test]
    fn a_server_that_completes_over_an_object_is_found_out() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let s = ObjectTableStore::new(Arc::clone(&bucket), "p").unwrap();
        assert!(!multipart::probe(&s.inner).unwrap());
        let left: Vec<_> = s
            .inner
            .wait({
                let bucket = Arc::clone(&bucket);
                async move { bucket.list(None).try_collect::<Vec<_>>().await }
            })
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(s.inner.parts(), None);
    }

    /// A replacement conditional on a version someone else changed is refused, and so is
    /// a create of a name taken, unless what is there is the upload's own bytes (sent
    /// again after its answer was lost).
    #[test]
    fn only_a_lost_race_reads_as_fenced() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let s = ObjectTableStore::new(Arc::clone(&bucket), "s").unwrap();
        let object = s.inner.object("x");
        let tag = s
            .inner
            .put_if(&object, Bytes::from_static(b"1"), None, true)
            .unwrap();
        let newer = s
            .inner
            .put_if(&object, Bytes::from_static(b"2"), Some(tag.clone()), true)
            .unwrap();
        assert_ne!(tag, newer);
        let err = s
            .inner
            .put_if(&object, Bytes::from_static(b"3"), Some(tag.clone()), true)
            .unwrap_err();
        assert!(err.is_fenced(), "{err}");
        let err = s
            .inner
            .put_if(&object, Bytes::from_static(b"4"), None, true)
            .unwrap_err();
        assert!(err.is_fenced(), "{err}");
        // Without reading back (an open's uploads), even its own bytes are a lost race.
        let err = s
            .inner
            .put_if(&object, Bytes::from_static(b"2"), Some(tag.clone()), false)
            .unwrap_err();
        assert!(err.is_fenced(), "{err}");
        // An upload sent again after its answer was lost finds its own bytes: done.
        let again = s
            .inner
            .put_if(&object, Bytes::from_static(b"2"), Some(tag), true)
            .unwrap();
        assert_eq!(again, newer);
        let again = s
            .inner
            .put_if(&object, Bytes::from_static(b"2"), None, true)
            .unwrap();
        assert_eq!(again, newer);
    }
}
