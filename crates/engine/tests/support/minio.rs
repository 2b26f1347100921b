//! A MinIO server for the tests that need a real S3 server (`#[ignore = "needs minio"]`):
//! started on loopback over a fresh data directory holding one bucket, stopped (and the
//! directory removed) on drop. It can be killed and started again on the same port and
//! data, for tests of an S3 server that goes away.
//!
//! The binary: `PHOENIX_MINIO`, else `minio` on the `PATH`, else `~/go/bin/minio` (where
//! `.ci/run` installs it with `go install`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;

const USER: &str = "phoenix";
const PASSWORD: &str = "phoenix-test-secret";
/// The bucket every server starts with.
pub const BUCKET: &str = "phoenix";

pub struct Minio {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("PHOENIX_MINIO") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("minio"))
            .find(|p| p.is_file())
    });
    if let Some(p) = on_path {
        return p;
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let p = home.join("go/bin/minio");
    assert!(
        p.is_file(),
        "MinIO not found (PHOENIX_MINIO, the PATH, ~/go/bin): .ci/run installs it with \
         `go install github.com/minio/minio@<version in .ci/run>`"
    );
    p
}

impl Minio {
    /// Starts a server with an empty bucket [`BUCKET`]; panics (the test needs it) when
    /// it cannot.
    pub fn start() -> Minio {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "phoenix-minio-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        // A directory at the top of the data directory is a bucket to MinIO.
        std::fs::create_dir_all(dir.join("data").join(BUCKET)).expect("MinIO's data dir");
        let mut m = Minio {
            child: None,
            dir,
            port: super::free_port(),
        };
        m.restart();
        m
    }

    /// The S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A table store URL for `prefix` of the bucket, credentials included.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://{BUCKET}/{prefix}?endpoint={}&access_key_id={USER}&secret_access_key={PASSWORD}",
            self.endpoint()
        )
    }

    /// A client of the server's bucket.
    pub fn bucket(&self) -> Arc<dyn ObjectStore> {
        self.client(BUCKET)
    }

    /// A client of bucket `name` (which need not exist).
    pub fn client(&self, name: &str) -> Arc<dyn ObjectStore> {
        Arc::new(
            object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(name)
                .with_endpoint(self.endpoint())
                .with_region("us-east-1")
                .with_access_key_id(USER)
                .with_secret_access_key(PASSWORD)
                .with_allow_http(true)
                .build()
                .expect("an S3 client of the test server"),
        )
    }

    /// Kills the server (SIGKILL): requests fail until [`Minio::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server (again) on its port and data, and waits until it serves.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::File::create(self.dir.join("minio.log")).expect("MinIO's log");
        let child = Command::new(binary())
            .arg("server")
            .arg(self.dir.join("data"))
            .arg("--address")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--console-address")
            .arg(format!("127.0.0.1:{}", super::free_port()))
            .arg("--quiet")
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", PASSWORD)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("MinIO's log"))
            .stderr(log)
            .spawn()
            .expect("starting MinIO");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !live(self.port) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "MinIO exited ({status}): {}",
                    read_log(&self.dir.join("minio.log"))
                );
            }
            assert!(
                Instant::now() < deadline,
                "MinIO did not start within 60 s: {}",
                read_log(&self.dir.join("minio.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl std::fmt::Debug for Minio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MinIO at {}", self.endpoint())
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_log(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Whether the server answers its liveness probe.
fn live(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!(
        "GET /minio/health/live HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
