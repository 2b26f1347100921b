//! A MinIO server that `phoenix playground --shared-storage` starts on loopback and
//! stops with its nodes: the S3 store they keep their tables in (their logs stay on
//! local disk). Its data is `<data-dir>/minio` (the bucket [`BUCKET`] a directory at
//! its top), its log `<data-dir>/minio.log`; its root secret, made on the first start,
//! `<data-dir>/minio.secret` (only the owner reads it). The nodes get the credentials
//! in their environment, not on their command lines.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::playground::{free_ports, Proc};
use super::BoxError;

/// The bucket the nodes' tables are in.
pub const BUCKET: &str = "phoenix";
/// MinIO's root user, which the nodes use.
const USER: &str = "phoenix";

/// A running MinIO server (stopped when dropped).
#[derive(Debug)]
pub struct Minio {
    proc: Proc,
    addr: SocketAddr,
    secret: String,
    data: PathBuf,
}

/// The MinIO binary: `given`, else `minio` on the PATH, else `~/go/bin/minio`.
fn binary(given: Option<PathBuf>) -> Result<PathBuf, BoxError> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "no MinIO binary at {} (--minio, PHOENIX_MINIO)",
                p.display()
            )
            .into())
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("minio"))
            .find(|p| p.is_file())
    });
    let in_go = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/minio"));
    on_path.or(in_go.filter(|p| p.is_file())).ok_or_else(|| {
        "--shared-storage needs MinIO: install it with `go install \
             github.com/minio/minio@latest` (or the version .ci/run pins), or name the \
             binary with --minio or PHOENIX_MINIO"
            .into()
    })
}

/// The secret kept in `path`, made (random, readable by the owner alone) if missing.
fn secret(path: &Path) -> Result<String, BoxError> {
    match std::fs::read_to_string(path) {
        Ok(s) if s.trim().len() >= 8 => return Ok(s.trim().to_string()),
        // Cut short before it was synced (a crash): MinIO never ran with it.
        Ok(s) if s.is_empty() => {
            std::fs::remove_file(path).map_err(|e| format!("remove {}: {e}", path.display()))?
        }
        Ok(_) => {
            return Err(
                format!("{} holds no secret of 8 characters or more", path.display()).into(),
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("read {}: {e}", path.display()).into()),
    }
    let s = format!("{:032x}", rand::random::<u128>());
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    f.write_all(format!("{s}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(s)
}

impl Minio {
    /// Starts MinIO (`binary`, or found as [`binary`] says) over `<dir>/minio` on free
    /// loopback ports and waits until it serves (60 s at most).
    pub fn start(dir: &Path, binary_path: Option<PathBuf>) -> Result<Minio, BoxError> {
        let program = binary(binary_path)?;
        let data = dir.join("minio");
        std::fs::create_dir_all(data.join(BUCKET))
            .map_err(|e| format!("create {}: {e}", data.join(BUCKET).display()))?;
        let secret = secret(&dir.join("minio.secret"))?;
        let ports = free_ports(2)?;
        let (addr, console) = (ports[0], ports[1]);
        let mut cmd = Command::new(&program);
        cmd.arg("server")
            .arg(&data)
            .arg("--address")
            .arg(addr.to_string())
            .arg("--console-address")
            .arg(console.to_string())
            .arg("--quiet")
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", &secret)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off");
        let mut proc = Proc::spawn("MinIO".into(), cmd, dir.join("minio.log"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !live(addr) {
            if let Some(status) = proc.exited() {
                return Err(format!(
                    "MinIO ({}) exited ({status}); see {}",
                    program.display(),
                    proc.log.display()
                )
                .into());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "MinIO did not serve on {addr} within 60 s; see {}",
                    proc.log.display()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Minio {
            proc,
            addr,
            secret,
            data,
        })
    }

    /// The S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where MinIO keeps its data.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// MinIO's log.
    pub fn log(&self) -> &Path {
        &self.proc.log
    }

    /// The table store URL (`--sst-store`) of `prefix` in the bucket.
    pub fn table_store_url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}?endpoint={}", self.endpoint())
    }

    /// The environment an S3 client of this server needs (its credentials).
    pub fn client_env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), USER.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), self.secret.clone()),
        ]
    }
}

/// Whether MinIO answers its liveness probe on `addr`.
fn live(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let asked =
        s.write_all(format!("GET /minio/health/live HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes());
    let mut head = [0u8; 12];
    asked.is_ok()
        && s.read_exact(&mut head).is_ok()
        && (head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
}
