//! A [`TableStore`] over an object store (the `object_store` crate: S3 and its kin, or
//! an in-memory store for tests): tables and manifests as objects under a prefix.
//!
//! Nothing appends, renames or syncs a directory there, so each call maps to whole-object
//! requests:
//! - a table's writer buffers its bytes and uploads them whole at `sync_all` (the table
//!   is durable, and present, once the upload returns);
//! - a manifest's writer uploads the whole manifest again at each sync (each edit is a
//!   replacement of the object; an edit that never reached the store is a lost append,
//!   as a torn tail is on a file system);
//! - the `CURRENT` object names the manifest and is replaced whole;
//! - an import reads the file from the local file system and uploads it, then deletes it;
//! - `sync` has nothing to do: a finished upload or delete is durable.
//!
//! The engine's calls are synchronous; each request runs on the store's own runtime and
//! the caller waits for its answer (also from a thread of another tokio runtime, where
//! blocking on a runtime directly is refused).
//!
//! Not yet built (the issue "Data on shared storage"): multipart uploads for large
//! tables, fencing of a second writer by conditional puts, a local cache of remote
//! blocks, and deadlines and retries by error class.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use phoenix_storage::{FileSystem, IoOp, ReadableFile, WritableFile};

use crate::error::{Error, Result};
use crate::filename::{self, FileKind};
use crate::table_store::{StoredFile, TableStore};

/// Tables and manifest as objects under a prefix of an object store.
pub struct ObjectTableStore {
    inner: Arc<Remote>,
}

/// What the store's files and writers share: the object store, the prefix and the
/// runtime that runs the requests.
struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// Taken only by `drop`.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Remote {
    fn drop(&mut self) {
        // Not the blocking shutdown: the last holder may be a thread of another runtime,
        // where blocking is refused. Nothing is left running: every request was waited for.
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
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<ObjectTableStore> {
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
                prefix: ObjectPath::from(prefix),
                runtime: Some(runtime),
            }),
        })
    }
}

impl Remote {
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
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if let Some(rt) = &self.runtime {
            rt.spawn(async move {
                // The caller waits on the other end (it is gone only if it panicked).
                let _ = tx.send(f.await);
            });
        }
        rx.recv().unwrap_or_else(|_| {
            Err(object_store::Error::Generic {
                store: "phoenix",
                source: "the object store's runtime dropped the request".into(),
            })
        })
    }

    fn put(&self, object: &ObjectPath, data: Bytes) -> phoenix_storage::Result<()> {
        let store = Arc::clone(&self.store);
        let at = object.clone();
        self.wait(async move { store.put(&at, PutPayload::from(data)).await })
            .map(|_| ())
            .map_err(|e| self.error(IoOp::Write, object, e))
    }

    fn get(&self, object: &ObjectPath) -> phoenix_storage::Result<Bytes> {
        let store = Arc::clone(&self.store);
        let at = object.clone();
        self.wait(async move { store.get(&at).await?.bytes().await })
            .map_err(|e| self.error(IoOp::Read, object, e))
    }

    fn delete(&self, object: &ObjectPath) -> phoenix_storage::Result<()> {
        let store = Arc::clone(&self.store);
        let at = object.clone();
        self.wait(async move { store.delete(&at).await })
            .map_err(|e| self.error(IoOp::Delete, object, e))
    }

    /// An object store's error as a storage error of the object's location; a missing
    /// object is `NotFound` (what `is_not_found` recognises).
    fn error(
        &self,
        op: IoOp,
        object: &ObjectPath,
        e: object_store::Error,
    ) -> phoenix_storage::Error {
        let kind = match &e {
            object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. } => std::io::ErrorKind::AlreadyExists,
            _ => std::io::ErrorKind::Other,
        };
        phoenix_storage::Error::io(op, self.location(object), std::io::Error::new(kind, e))
    }
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
        Ok(Box::new(ObjectWriter::new(&self.inner, &name)))
    }

    fn open_table(&self, number: u64) -> Result<Arc<dyn ReadableFile>> {
        let object = self.inner.object(&crate::table::table_file_name(number));
        let store = Arc::clone(&self.inner.store);
        let at = object.clone();
        let meta = self
            .inner
            .wait(async move { store.head(&at).await })
            .map_err(|e| self.inner.error(IoOp::Open, &object, e))?;
        Ok(Arc::new(ObjectReader {
            location: self.inner.location(&object),
            remote: Arc::clone(&self.inner),
            object,
            size: meta.size,
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

    fn import_table(&self, from: &dyn FileSystem, src: &Path, number: u64) -> Result<()> {
        let data = from.read_all(src)?;
        let object = self.inner.object(&crate::table::table_file_name(number));
        self.inner.put(&object, Bytes::from(data))?;
        from.delete(src)?;
        Ok(())
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
            match filename::parse(&name) {
                Some(FileKind::Table(n)) => out.push(StoredFile::Table(n)),
                Some(FileKind::Manifest(n)) => out.push(StoredFile::Manifest(n)),
                Some(FileKind::Temp) => out.push(StoredFile::Temp(name)),
                Some(FileKind::Lock | FileKind::Current) | None => {}
            }
        }
        Ok(out)
    }

    fn remove(&self, file: &StoredFile) -> Result<()> {
        let name = match file {
            StoredFile::Table(n) => crate::table::table_file_name(*n),
            StoredFile::Manifest(n) => filename::manifest_name(*n),
            StoredFile::Temp(name) => name.clone(),
        };
        Ok(self.inner.delete(&self.inner.object(&name))?)
    }

    fn read_current_manifest(&self) -> Result<Option<(u64, PathBuf, Vec<u8>)>> {
        let current = self.inner.object("CURRENT");
        let cur = match self.inner.get(&current) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let number = std::str::from_utf8(&cur)
            .ok()
            .and_then(|s| s.strip_suffix('\n'))
            .and_then(filename::parse)
            .and_then(|k| match k {
                FileKind::Manifest(n) => Some(n),
                _ => None,
            })
            .ok_or_else(|| {
                Error::corruption(
                    self.inner.location(&current),
                    0,
                    "CURRENT does not name a manifest",
                )
            })?;
        let object = self.inner.object(&filename::manifest_name(number));
        let data = self.inner.get(&object)?;
        Ok(Some((number, self.inner.location(&object), data.to_vec())))
    }

    fn create_manifest(&self, number: u64) -> Result<Box<dyn WritableFile>> {
        Ok(Box::new(ObjectWriter::new(
            &self.inner,
            &filename::manifest_name(number),
        )))
    }

    fn set_current_manifest(&self, number: u64) -> Result<()> {
        let current = format!("{}\n", filename::manifest_name(number));
        Ok(self
            .inner
            .put(&self.inner.object("CURRENT"), Bytes::from(current))?)
    }
}

/// A table or manifest being written: the bytes are kept here and uploaded whole at each
/// sync that has something new to upload.
struct ObjectWriter {
    remote: Arc<Remote>,
    object: ObjectPath,
    location: PathBuf,
    buf: Vec<u8>,
    /// Bytes of `buf` the last upload held (none yet: `None`).
    uploaded: Option<usize>,
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("object", &self.object.as_ref())
            .field("len", &self.buf.len())
            .finish()
    }
}

impl ObjectWriter {
    fn new(remote: &Arc<Remote>, name: &str) -> ObjectWriter {
        let object = remote.object(name);
        ObjectWriter {
            location: remote.location(&object),
            remote: Arc::clone(remote),
            object,
            buf: Vec::new(),
            uploaded: None,
        }
    }

    fn upload(&mut self) -> phoenix_storage::Result<()> {
        if self.uploaded == Some(self.buf.len()) {
            return Ok(());
        }
        // (A copy: the writer goes on appending to its buffer.)
        self.remote
            .put(&self.object, Bytes::copy_from_slice(&self.buf))?;
        self.uploaded = Some(self.buf.len());
        Ok(())
    }
}

impl WritableFile for ObjectWriter {
    fn append(&mut self, data: &[u8]) -> phoenix_storage::Result<()> {
        self.buf.extend_from_slice(data);
        Ok(())
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
        self.buf.len() as u64
    }

    fn path(&self) -> &Path {
        &self.location
    }
}

/// A table read by ranged requests.
struct ObjectReader {
    remote: Arc<Remote>,
    object: ObjectPath,
    location: PathBuf,
    size: u64,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("object", &self.object.as_ref())
            .field("size", &self.size)
            .finish()
    }
}

impl ReadableFile for ObjectReader {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> phoenix_storage::Result<()> {
        let n = self.read_at(offset, buf)?;
        if n < buf.len() {
            return Err(phoenix_storage::Error::io(
                IoOp::Read,
                self.location.clone(),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes at {offset} past the end ({} bytes)",
                        buf.len(),
                        self.size
                    ),
                ),
            ));
        }
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> phoenix_storage::Result<usize> {
        let end = offset.saturating_add(buf.len() as u64).min(self.size);
        if offset >= end {
            return Ok(0);
        }
        let store = Arc::clone(&self.remote.store);
        let at = self.object.clone();
        let bytes = self
            .remote
            .wait(async move { store.get_range(&at, offset..end).await })
            .map_err(|e| self.remote.error(IoOp::Read, &self.object, e))?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn path(&self) -> &Path {
        &self.location
    }
}
