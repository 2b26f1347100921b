//! An object store over another that fails on request, as a remote store does when it
//! is down or its answers are lost: every request of the kinds set down fails before it
//! reaches the store; an upload whose answer is set to be lost lands, then fails.
//! Failures are `object_store::Error::Generic`, what the S3 client reports for refused
//! connections, timeouts and 5xx.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Kinds of request, as bits of [`Flaky::down`].
pub const PUT: u32 = 1;
/// Reads: GET, ranged GET and HEAD.
pub const GET: u32 = 2;
/// Listing.
pub const LIST: u32 = 4;
/// Deletes.
pub const DELETE: u32 = 8;
/// Every kind.
pub const ALL: u32 = PUT | GET | LIST | DELETE;

/// See the module docs.
#[derive(Debug)]
pub struct Flaky {
    inner: Arc<dyn ObjectStore>,
    /// Kinds of request that fail (bits above).
    down: AtomicU32,
    /// Uploads whose name contains [`Flaky::only`] fail (when set); others pass.
    only: parking_lot::Mutex<Option<String>>,
    /// Uploads to objects whose name contains the first string: the next so many of
    /// them land, then fail.
    lose: parking_lot::Mutex<Vec<(String, u32)>>,
    /// Reads wait this long (milliseconds) before they go to the store.
    slow_reads_ms: AtomicU64,
    /// Uploads to objects whose name contains the string wait this long first.
    slow_uploads: parking_lot::Mutex<Option<(String, std::time::Duration)>>,
    /// Uploads waiting so (see [`Flaky::slow_uploads_to`]) now.
    pub uploads_waiting: AtomicU64,
    /// Requests failed so far.
    pub failed: AtomicU64,
    /// Reads (GET, ranged GET, HEAD) that reached the store so far.
    pub reads: AtomicU64,
    /// Bytes the ranged GETs that reached the store asked for so far.
    pub bytes_read: AtomicU64,
    /// Requests of every kind so far.
    requests: AtomicU64,
    /// The request (by [`Flaky::requests`]) at which the store crashes: it and every
    /// later one fail ([`Flaky::crash_after`]); `u64::MAX`: never.
    crash_at: AtomicU64,
    /// Whether the crashing request, an upload or a delete, is done before it fails.
    crash_lands: std::sync::atomic::AtomicBool,
    /// Run once when the crash comes.
    on_crash: parking_lot::Mutex<OnCrash>,
}

/// What [`Flaky::crash_after`] runs when the crash comes.
#[derive(Default)]
struct OnCrash(Option<Box<dyn FnOnce() + Send>>);

impl fmt::Debug for OnCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OnCrash({})", self.0.is_some())
    }
}

impl Flaky {
    /// A store over `inner` that fails nothing yet.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner,
            down: AtomicU32::new(0),
            only: parking_lot::Mutex::new(None),
            lose: parking_lot::Mutex::new(Vec::new()),
            slow_reads_ms: AtomicU64::new(0),
            slow_uploads: parking_lot::Mutex::new(None),
            uploads_waiting: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            crash_at: AtomicU64::new(u64::MAX),
            crash_lands: std::sync::atomic::AtomicBool::new(false),
            on_crash: parking_lot::Mutex::new(OnCrash::default()),
        })
    }

    /// Fails every request of `kinds` (bits; 0 heals) from now on.
    pub fn set_down(&self, kinds: u32) {
        self.down.store(kinds, Ordering::SeqCst);
    }

    /// Limits the failures of uploads to objects whose name contains `part`.
    pub fn only_uploads_to(&self, part: Option<&str>) {
        *self.only.lock() = part.map(str::to_string);
    }

    /// Makes the next `n` uploads to objects whose name contains `part` land and then
    /// fail.
    pub fn lose_answers_to(&self, part: &str, n: u32) {
        self.lose.lock().push((part.to_string(), n));
    }

    /// Makes every read wait `d` before it goes to the store (zero: none).
    pub fn slow_reads(&self, d: std::time::Duration) {
        self.slow_reads_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Makes every upload to an object whose name contains `part` wait `d` before it
    /// goes to the store (`None`: none waits).
    pub fn slow_uploads_to(&self, slow: Option<(&str, std::time::Duration)>) {
        *self.slow_uploads.lock() = slow.map(|(part, d)| (part.to_string(), d));
    }

    async fn upload_delay(&self, location: &Path) {
        let wait = self
            .slow_uploads
            .lock()
            .as_ref()
            .filter(|(part, _)| location.as_ref().contains(part.as_str()))
            .map(|(_, d)| *d);
        if let Some(d) = wait {
            self.uploads_waiting.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(d).await;
            self.uploads_waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    async fn read_delay(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let ms = self.slow_reads_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }

    /// Requests of every kind the store was sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Lets the next `n` requests through, then crashes: `on_crash` runs, and that
    /// request and every later one fail, as for a process that died there. With
    /// `lands`, the crashing request, if an upload or a delete, is done before it
    /// fails (its answer lost).
    pub fn crash_after(&self, n: u64, lands: bool, on_crash: impl FnOnce() + Send + 'static) {
        *self.on_crash.lock() = OnCrash(Some(Box::new(on_crash)));
        self.crash_lands.store(lands, Ordering::SeqCst);
        self.crash_at
            .store(self.requests() + n + 1, Ordering::SeqCst);
    }

    /// Counts a request; fails it if the store crashed. `Ok(true)`: the crashing
    /// request, to be done and then failed.
    fn gate(&self) -> Result<bool> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        let at = self.crash_at.load(Ordering::SeqCst);
        if n < at {
            return Ok(false);
        }
        if n == at {
            let f = self.on_crash.lock().0.take();
            if let Some(f) = f {
                f();
            }
            if self.crash_lands.load(Ordering::SeqCst) {
                return Ok(true);
            }
        }
        Err(self.fail())
    }

    /// Fails nothing more: every request goes through, and no answer is lost.
    pub fn heal(&self) {
        self.set_down(0);
        self.lose.lock().clear();
    }

    /// Whether uploads are still to lose their answers.
    pub fn losses_pending(&self) -> bool {
        self.lose.lock().iter().any(|(_, n)| *n > 0)
    }

    fn fail(&self) -> object_store::Error {
        self.failed.fetch_add(1, Ordering::SeqCst);
        object_store::Error::Generic {
            store: "flaky",
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused (injected)",
            )),
        }
    }

    fn check(&self, kind: u32) -> Result<()> {
        if self.down.load(Ordering::SeqCst) & kind != 0 {
            return Err(self.fail());
        }
        Ok(())
    }

    fn check_put(&self, location: &Path) -> Result<bool> {
        let named = self
            .only
            .lock()
            .as_ref()
            .is_none_or(|part| location.as_ref().contains(part.as_str()));
        if named {
            self.check(PUT)?;
        }
        let mut lose = self.lose.lock();
        let lost = lose
            .iter_mut()
            .find(|(part, n)| *n > 0 && location.as_ref().contains(part.as_str()));
        Ok(lost.map(|(_, n)| *n -= 1).is_some())
    }
}

impl fmt::Display for Flaky {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.upload_delay(location).await;
        let crashing = self.gate()?;
        let lost = self.check_put(location)? || crashing;
        let r = self.inner.put_opts(location, payload, opts).await?;
        if lost {
            return Err(self.fail());
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check_put(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check(GET)?;
        self.read_delay().await;
        if let Some(object_store::GetRange::Bounded(r)) = &options.range {
            self.bytes_read.fetch_add(r.end - r.start, Ordering::SeqCst);
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check(GET)?;
        self.read_delay().await;
        self.inner.get_ranges(location, ranges).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let crashing = self.gate()?;
        self.check(DELETE)?;
        self.inner.delete(location).await?;
        if crashing {
            return Err(self.fail());
        }
        Ok(())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if let Err(e) = self
            .gate()
            .and_then(|crashing| if crashing { Err(self.fail()) } else { Ok(()) })
            .and_then(|()| self.check(LIST))
        {
            return futures_util::stream::once(async move { Err(e) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check(LIST)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check(PUT)?;
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        if self.gate()? {
            return Err(self.fail());
        }
        self.check(PUT)?;
        self.inner.copy_if_not_exists(from, to).await
    }
}
