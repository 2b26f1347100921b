//! Multipart uploads of large tables: a table's bytes go up in parts while the table is
//! still being written (a few parts in flight at once, so the upload overlaps the
//! build), and the upload completes only if no object of its name exists — as every
//! table upload is create-only (see the parent's docs, fencing).
//!
//! `object_store` 0.12 completes a multipart upload unconditionally through its public
//! API (its create-only completion is private to its copy-if-not-exists). S3 and MinIO
//! honour `If-None-Match: *` on CompleteMultipartUpload, so the S3 client built from a
//! URL sends its requests through [`CreateOnlyCompletions`], which adds that header to
//! every completion: an object this client completes is created, never replaced.
//! Stores handed over as they are ([`ObjectTableStore::new`](super::ObjectTableStore::new))
//! are not known to do so and upload tables whole.
//!
//! An upload that is not completed (the table failed or was dropped) is aborted; one cut
//! short by a crash stays as parts without an object, which S3's lifecycle rules and
//! MinIO's expiry of stale uploads remove: nothing reads them.

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
        let Some(upload) = self.upload.as_mut() else {
            return Err(self.misuse("a part after the upload finished"));
        };
        let sending = upload.put_part(PutPayload::from(part.clone()));
        self.in_flight.push_back(self.remote.start(sending, None));
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
        let done = self.remote.wait(async move {
            let done = upload.complete().await;
            if done.is_err() {
                // (Its parts are of no use now; an abort of an upload that did complete
                // fails, harmlessly.)
                let _ = upload.abort().await;
            }
            done
        });
        let tag = match done {
            Ok(r) => self.remote.need_tag(IoOp::Write, &self.object, r.e_tag)?,
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => match self.remote.get(&self.object) {
                Ok((there, tag))
                    if there.len() as u64 == self.len && crc32c::crc32c(&there) == self.crc =>
                {
                    self.remote.need_tag(IoOp::Write, &self.object, tag)?
                }
                Err(e) if e.is_retryable() => return Err(e),
                _ => {
                    return Err(phoenix_storage::Error::Fenced {
                        path: self.remote.location(&self.object),
                    })
                }
            },
            Err(e) => return Err(self.remote.error(IoOp::Write, &self.object, e)),
        };
        if let (Some(kept), Some(cache)) = (self.kept.take(), self.remote.cache.get()) {
            let key = object_key(self.object.as_ref(), &tag);
            let mut offset = 0u64;
            for part in kept {
                debug_assert_eq!(offset % PAGE_BYTES, 0, "parts but the last fill pages");
                for (i, page) in part.chunks(PAGE_BYTES as usize).enumerate() {
                    cache.insert(key, offset / PAGE_BYTES + i as u64, page);
                }
                offset += part.len() as u64;
            }
        }
        Ok(tag)
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
            drop(self.remote.start(
                async move {
                    upload.abort().await?;
                    Ok(())
                },
                None,
            ));
        }
    }
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
