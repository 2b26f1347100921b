//! Multipart uploads of large tables: a table's bytes go up in parts while the table is
//! still being written (a few parts in flight at once, so the upload overlaps the
//! build), and the upload completes only if no object of its name exists — as every
//! table upload is create-only (see the parent's docs, fencing).
//!
//! `object_store` 0.12 completes a multipart upload unconditionally through its public
//! API (its create-only completion is private to its copy-if-not-exists). S3 and MinIO
//! honour `If-None-Match: *` on CompleteMultipartUpload, so the S3 client built from a
//! URL sends its requests through [`CreateOnlyCompletions`], which adds that header to
//! every completion: an object this client completes is created, never replaced. A
//! server that ignores the header would let a large table replace another's, so before
//! its first upload in parts a store checks that its server refuses a completion over an
//! object that exists ([`probe`]); a server that does not, and stores handed over as they
//! are ([`ObjectTableStore::new`](super::ObjectTableStore::new)), upload tables whole.
//!
//! An upload that is not completed (the table failed or was dropped) is aborted once its
//! parts in flight are answered; one cut short by a crash (or by the store being dropped
//! meanwhile) stays as parts without an object, which S3's lifecycle rules and MinIO's
//! expiry of stale uploads remove: nothing reads them.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use bytes::Bytes;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, PutMultipartOptions, PutPayload};
use phoenix_storage::IoOp;

use super::Remote;
use crate::flash_cache::{object_key, PAGE_BYTES};

/// A table's part size unless the URL says otherwise (`multipart_part_mib`).
pub(super) const DEFAULT_PART_BYTES: usize = 8 << 20;
/// S3's least size of a part but the last.
pub(super) const MIN_PART_BYTES: usize = 5 << 20;
/// S3's greatest part size.
pub(super) const MAX_PART_BYTES: usize = 5 << 30;
/// S3's most parts in one upload.
const MAX_PARTS: usize = 10_000;
/// Parts of one table on their way at once: enough to keep a remote store's pipe full,
/// few enough that a writer holds at most this many parts' bytes.
const PARTS_IN_FLIGHT: usize = 4;

/// Sends the S3 client's requests, with `If-None-Match: *` on every
/// CompleteMultipartUpload (see the module docs).
#[derive(Debug, Default)]
pub(super) struct CreateOnlyCompletions;

impl HttpConnector for CreateOnlyCompletions {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CreateOnly(inner)))
    }
}

#[derive(Debug)]
struct CreateOnly(HttpClient);

#[async_trait::async_trait]
impl HttpService for CreateOnly {
    async fn call(&self, mut request: HttpRequest) -> Result<HttpResponse, HttpError> {
        if is_completion(request.method(), request.uri()) {
            // (Not among the signed headers: S3 and MinIO check only those it lists.)
            request.headers_mut().insert(
                http::header::IF_NONE_MATCH,
                http::HeaderValue::from_static("*"),
            );
        }
        self.0.execute(request).await
    }
}

/// Whether a request completes a multipart upload: a POST naming an `uploadId`
/// (creating an upload is a POST of `?uploads`, a part a PUT, an abort a DELETE).
fn is_completion(method: &http::Method, uri: &http::Uri) -> bool {
    method == http::Method::POST
        && uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p.starts_with("uploadId=")))
}

/// One object uploaded in parts.
pub(super) struct PartUpload {
    remote: Arc<Remote>,
    object: ObjectPath,
    /// Taken by `finish`; aborted on drop if still here.
    upload: Option<Box<dyn MultipartUpload>>,
    in_flight: VecDeque<Receiver<object_store::Result<()>>>,
    parts: usize,
    len: u64,
    /// crc32c of every byte sent: what a read-back compares (see `finish`).
    crc: u32,
    /// The parts sent, kept to fill the flash cache once the object's ETag is known.
    kept: Option<Vec<Bytes>>,
}

impl PartUpload {
    /// Starts an upload of `object`; with `for_cache`, its bytes go to the flash cache
    /// (if the store has one) once it completes.
    pub(super) fn start(
        remote: &Arc<Remote>,
        object: &ObjectPath,
        for_cache: bool,
    ) -> phoenix_storage::Result<PartUpload> {
        let store = Arc::clone(&remote.store);
        let at = object.clone();
        let upload = remote
            .wait(async move {
                store
                    .put_multipart_opts(&at, PutMultipartOptions::default())
                    .await
            })
            .map_err(|e| remote.error(IoOp::Write, object, e))?;
        Ok(PartUpload {
            remote: Arc::clone(remote),
            object: object.clone(),
            upload: Some(upload),
            in_flight: VecDeque::new(),
            parts: 0,
            len: 0,
            crc: 0,
            kept: (for_cache && remote.cache.get().is_some()).then(Vec::new),
        })
    }

    /// Bytes sent so far.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Sends the next part (at least [`MIN_PART_BYTES`] unless it is the last), once
    /// fewer than [`PARTS_IN_FLIGHT`] are on their way.
    pub(super) fn put(&mut self, part: Bytes) -> phoenix_storage::Result<()> {
        while self.in_flight.len() >= PARTS_IN_FLIGHT {
            self.wait_oldest()?;
        }
        if self.parts == MAX_PARTS {
            return Err(self.misuse(&format!(
                "more than {MAX_PARTS} parts (S3's limit): a larger multipart_part_mib is needed"
            )));
        }
        let Some(upload) = self.upload.as_mut() else {
            return Err(self.misuse("a part after the upload finished"));
        };
        let sending = upload.put_part(PutPayload::from(part.clone()));
        self.in_flight.push_back(self.remote.start(sending, None));
        self.parts += 1;
        self.len += part.len() as u64;
        self.crc = crc32c::crc32c_append(self.crc, &part);
        if let Some(kept) = &mut self.kept {
            kept.push(part);
        }
        Ok(())
    }

    fn wait_oldest(&mut self) -> phoenix_storage::Result<()> {
        if let Some(answer) = self.in_flight.pop_front() {
            Remote::answer(answer).map_err(|e| self.remote.error(IoOp::Write, &self.object, e))?;
        }
        Ok(())
    }

    /// Waits for every part, then completes the upload if no object of its name exists.
    /// Returns the object's ETag. An object there already is another writer's
    /// ([`Fenced`](phoenix_storage::Error::Fenced)) unless it holds exactly these
    /// bytes: this upload's own completion, sent again after its answer was lost.
    pub(super) fn finish(mut self) -> phoenix_storage::Result<String> {
        while !self.in_flight.is_empty() {
            self.wait_oldest()?;
        }
        let Some(mut upload) = self.upload.take() else {
            return Err(self.misuse("the upload finished twice"));
        };
        let (done, upload) = self
            .remote
            .wait(async move {
                let done = upload.complete().await;
                Ok((done, upload))
            })
            .map_err(|e| self.remote.error(IoOp::Write, &self.object, e))?;
        let tag = match done {
            Ok(r) => Ok(r.e_tag),
            // A completion sent again (the client retries one whose answer was lost)
            // finds the name taken (412) by its own first try, or that try still at
            // work (409), or the upload gone into the object (404): read back.
            Err(
                e @ (object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::NotFound { .. }),
            ) => self.read_back(e),
            Err(e) => Err(self.remote.error(IoOp::Write, &self.object, e)),
        };
        match tag {
            Ok(tag) => {
                drop(upload);
                let tag = self.remote.need_tag(IoOp::Write, &self.object, tag)?;
                self.fill_cache(&tag);
                Ok(tag)
            }
            Err(e) => {
                // Its parts are of no use now (best effort).
                self.upload = Some(upload);
                Err(e)
            }
        }
    }

    /// After a refused completion: the object's ETag if it holds this upload's bytes
    /// (same length and crc32c); `Fenced` if it holds others; unavailable if it is not
    /// there (a completion of unknown outcome: the table is written again later).
    fn read_back(&self, refused: object_store::Error) -> phoenix_storage::Result<Option<String>> {
        let taken = matches!(refused, object_store::Error::Precondition { .. });
        match self.remote.get(&self.object) {
            Ok((there, tag))
                if there.len() as u64 == self.len && crc32c::crc32c(&there) == self.crc =>
            {
                Ok(tag)
            }
            Err(e) if e.is_retryable() => Err(e),
            Err(e) if e.is_not_found() && !taken => Err(phoenix_storage::Error::Unavailable {
                op: IoOp::Write,
                path: self.remote.location(&self.object),
                source: std::io::Error::other(format!(
                    "the upload's completion was refused ({refused}) and no object is there"
                )),
            }),
            _ => Err(phoenix_storage::Error::Fenced {
                path: self.remote.location(&self.object),
            }),
        }
    }

    /// Writes the kept parts to the flash cache under the object's ETag.
    fn fill_cache(&mut self, tag: &str) {
        if let (Some(kept), Some(cache)) = (self.kept.take(), self.remote.cache.get()) {
            let key = object_key(self.object.as_ref(), tag);
            let mut offset = 0u64;
            for part in kept {
                debug_assert_eq!(offset % PAGE_BYTES, 0, "parts but the last fill pages");
                for (i, page) in part.chunks(PAGE_BYTES as usize).enumerate() {
                    cache.insert(key, offset / PAGE_BYTES + i as u64, page);
                }
                offset += part.len() as u64;
            }
        }
    }

    fn misuse(&self, what: &str) -> phoenix_storage::Error {
        phoenix_storage::Error::io(
            IoOp::Write,
            self.remote.location(&self.object),
            std::io::Error::other(what.to_string()),
        )
    }
}

impl Drop for PartUpload {
    fn drop(&mut self) {
        if let Some(mut upload) = self.upload.take() {
            // Not completed: its parts are of no use (best effort; see the module docs).
            // The abort waits for the parts still on their way: one landing after it
            // would stay.
            let in_flight = std::mem::take(&mut self.in_flight);
            drop(self.remote.start(
                async move {
                    for part in in_flight {
                        let _ = tokio::task::spawn_blocking(move || part.recv()).await;
                    }
                    upload.abort().await
                },
                None,
            ));
        }
    }
}

/// Whether the store's server refuses to complete an upload over an object that exists
/// (see the module docs): completes a one-part upload over a probe object of its own
/// under `probes/` and looks at the answer. An error is the store's (not cached: asked
/// again at the next upload).
pub(super) fn probe(remote: &Arc<Remote>) -> phoenix_storage::Result<bool> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let object = remote.object(&format!("probes/multipart-{}-{nanos}", std::process::id()));
    let store = Arc::clone(&remote.store);
    let at = object.clone();
    let refused = remote.wait(async move {
        store.put(&at, PutPayload::from_static(b"there")).await?;
        let mut upload = store
            .put_multipart_opts(&at, PutMultipartOptions::default())
            .await?;
        let answer = async {
            upload.put_part(PutPayload::from_static(b"over it")).await?;
            upload.complete().await
        }
        .await;
        let refused = match answer {
            Ok(_) => Ok(false),
            Err(object_store::Error::Precondition { .. }) => {
                let _ = upload.abort().await;
                Ok(true)
            }
            Err(e) => {
                let _ = upload.abort().await;
                Err(e)
            }
        };
        let _ = store.delete(&at).await;
        refused
    });
    refused.map_err(|e| remote.error(IoOp::Write, &object, e))
}

#[cfg(test)]
mod tests {
    use super::is_completion;
    use http::{Method, Uri};

    #[test]
    fn only_a_completion_is_made_create_only() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_completion(
            &Method::POST,
            &uri("http://h/b/t/000007.sst?uploadId=abc")
        ));
        // Creating an upload, sending a part, aborting, a plain upload.
        assert!(!is_completion(
            &Method::POST,
            &uri("http://h/b/t/7.sst?uploads")
        ));
        assert!(!is_completion(
            &Method::PUT,
            &uri("http://h/b/t/7.sst?partNumber=1&uploadId=abc")
        ));
        assert!(!is_completion(
            &Method::DELETE,
            &uri("http://h/b/t/7.sst?uploadId=abc")
        ));
        assert!(!is_completion(&Method::PUT, &uri("http://h/b/t/7.sst")));
        assert!(!is_completion(&Method::POST, &uri("http://h/b?delete")));
    }
}
