//! The node's side of `phoenix backup`: the `Backup` service. The leader of a group,
//! after a read barrier (so every write acknowledged before the call is in it), takes
//! the group's state at one applied index and hands it out: where its tables are on an
//! object store the backup's bucket shares, the group's own tables are copied there by
//! the store (`phoenix_engine::GroupExport`), and only the rest streams; otherwise the
//! whole group streams as SST files. The files are built in a directory of their own
//! under the data directory and removed once sent (or when the call fails).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use phoenix_engine::ReadOptions;
use phoenix_proto as proto;
use prost::Message as _;
use tokio::sync::{mpsc, Semaphore};
use tonic::{Request, Response, Status};

use crate::keys;
use crate::service::{Services, Where};
use crate::shared::Shared;

/// The key layout of the files a backup holds (keys.rs).
pub const KEY_FORMAT: u32 = 1;

/// Bytes per streamed chunk.
const CHUNK_BYTES: usize = 1 << 20;

/// Backups one node serves at once: each reads a whole group.
const AT_ONCE: usize = 2;

/// The `Backup` service of a node.
#[derive(Clone)]
pub struct BackupService {
    kv: Services,
    permits: Arc<Semaphore>,
}

impl BackupService {
    /// The service over the node's request layer.
    pub fn new(kv: Services) -> BackupService {
        BackupService {
            kv,
            permits: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }
}

type Chunk = Result<proto::BackupGroupChunk, Status>;

fn refusal(e: proto::Error) -> proto::BackupGroupChunk {
    proto::BackupGroupChunk {
        error: Some(e),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl proto::backup_server::Backup for BackupService {
    type BackupGroupStream = tokio_stream::wrappers::ReceiverStream<Chunk>;

    async fn backup_group(
        &self,
        req: Request<proto::BackupGroupRequest>,
    ) -> Result<Response<Self::BackupGroupStream>, Status> {
        let r = req.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let answer = Response::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let refuse = |e: proto::Error| {
            // (The channel has room for it: nothing else was sent.)
            let _ = tx.try_send(Ok(refusal(e)));
        };
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            refuse(proto::Error::server_busy(format!(
                "{AT_ONCE} backups are under way on this node; retry"
            )));
            return Ok(answer);
        };
        let shared = &self.kv.shared;
        // Served by the leader alone (a stream is not forwarded): others redirect.
        let c = match self.kv.locate(r.header.as_ref()) {
            Ok(Where::Here(c)) => c,
            Ok(Where::Leader(t)) => {
                refuse(proto::Error::not_leader(
                    t.group,
                    shared.replica_of(t.leader),
                ));
                return Ok(answer);
            }
            Err(e) => {
                refuse(e);
                return Ok(answer);
            }
        };
        if let Err(e) = self.kv.read_index(&c).await {
            refuse(e);
            return Ok(answer);
        }
        // Frozen for a merge: refused before accepting, so the caller's client retries
        // (with backoff, within its deadline) as for any unavailable group.
        if let Some(e) = merging(shared, c.group) {
            refuse(e);
            return Ok(answer);
        }
        let accepted = proto::BackupGroupChunk {
            accepted: true,
            ..Default::default()
        };
        if tx.send(Ok(accepted)).await.is_err() {
            return Ok(answer);
        }
        let shared = Arc::clone(shared);
        let g = c.group;
        let route = c.route.clone();
        let dir = shared.cfg.data_dir.join("backup-send").join(format!(
            "{g}-r{}-{}",
            shared.run,
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        tokio::task::spawn_blocking(move || {
            let sent = send(&shared, g, &route, &r, &dir, &tx);
            crate::snapshot::remove_dir(&dir);
            drop(permit);
            if let Err(e) = sent {
                tracing::warn!(group = g, "backup of the group failed: {}", e.message);
                // Before the head: an answer; after it, the stream ends in an error.
                let _ = tx.blocking_send(Ok(refusal(e)));
            }
        });
        Ok(answer)
    }
}

/// How long a chunk waits for a caller that reads nothing before the backup gives up
/// (its files and its turn are then freed).
const SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a group cannot be backed up now: it is merging (frozen or merged away).
fn merging(shared: &Shared, g: u64) -> Option<proto::Error> {
    let v = shared
        .engine
        .get(&ReadOptions::default(), &keys::range_key(g))
        .ok()??;
    merge_refusal(g, &proto::GroupRange::decode(v.as_slice()).ok()?)
}

/// The refusal of a group whose applied range says it is merging (frozen or merged).
fn merge_refusal(g: u64, r: &proto::GroupRange) -> Option<proto::Error> {
    (r.merged_into != 0 || r.merging_into != 0).then(|| {
        proto::Error::group_unavailable(
            g,
            "it is merging into its neighbour; retry once the merge is done",
        )
    })
}

/// Sends one message from a blocking thread; `false` if the caller went away or read
/// nothing for [`SEND_WAIT`].
fn send_chunk(tx: &mpsc::Sender<Chunk>, chunk: proto::BackupGroupChunk) -> bool {
    tokio::runtime::Handle::current()
        .block_on(tokio::time::timeout(SEND_WAIT, tx.send(Ok(chunk))))
        .is_ok_and(|sent| sent.is_ok())
}

/// Numbers the directories of this process's backups.
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the group's state is taken from.
enum Source {
    Snapshot(phoenix_engine::Snapshot),
    Export(phoenix_engine::GroupExport),
}

/// Takes the group's state, builds its files, and sends the head and the files.
fn send(
    shared: &Arc<Shared>,
    g: u64,
    route: &proto::Route,
    req: &proto::BackupGroupRequest,
    dir: &Path,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), proto::Error> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        proto::Error::internal(format!("group {g}: {what}: {e}"))
    };
    let engine = &shared.engine;
    let copy = !req.copy_store.is_empty()
        && !req.copy_prefix.is_empty()
        && engine.shared_store_id().as_deref() == Some(req.copy_store.as_str());
    let mut source = match copy.then(|| engine.export_group(g)) {
        Some(Ok(e)) => Source::Export(e),
        Some(Err(e)) => {
            tracing::debug!(group = g, "backup streamed, not copied: {e}");
            Source::Snapshot(engine.snapshot())
        }
        None => Source::Snapshot(engine.snapshot()),
    };
    let mut tables = Vec::new();
    if let Source::Export(export) = &source {
        match export.copy_tables_to(&req.copy_prefix) {
            Ok(copied) => {
                for t in copied {
                    let name = t.object.rsplit('/').next().unwrap_or_default().to_string();
                    tables.push(proto::BackupTable {
                        name,
                        level: t.level,
                        size: t.size,
                    });
                }
            }
            Err(e) => {
                // (Copies made before the failure stay under a prefix no manifest
                // names.) A later snapshot still follows the read barrier.
                tracing::info!(group = g, "backup streamed, not copied: {e}");
                source = Source::Snapshot(engine.snapshot());
            }
        }
    }
    let snap = match &source {
        Source::Snapshot(s) => s,
        Source::Export(e) => e.snapshot(),
    };
    let ro = ReadOptions {
        snapshot: Some(snap),
        ..ReadOptions::default()
    };
    let read = |k: Vec<u8>| {
        engine
            .get(&ro, &k)
            .map_err(|e| failed("reading its state", &e))
    };
    let (applied_index, applied_term) = read(keys::applied_key(g))?
        .as_deref()
        .and_then(keys::decode_applied)
        .ok_or_else(|| {
            proto::Error::group_unavailable(g, "the replica has not applied anything yet")
        })?;
    // Its range as applied at that index (absent: as created).
    let (start_key, end_key, epoch) = match read(keys::range_key(g))? {
        Some(v) => {
            let r = proto::GroupRange::decode(v.as_slice())
                .map_err(|e| failed("decoding its range", &e))?;
            if let Some(e) = merge_refusal(g, &r) {
                return Err(e);
            }
            (r.start_key, r.end_key, r.epoch)
        }
        None => (route.start_key.clone(), route.end_key.clone(), route.epoch),
    };
    let gone = || proto::Error::internal(format!("group {g}: the caller went away"));
    if tx.is_closed() {
        return Err(gone());
    }
    let files = match &mut source {
        Source::Export(export) => crate::snapshot::build_rest(shared, g, export, dir),
        Source::Snapshot(s) => crate::snapshot::build_files(shared, g, s, dir),
    }
    .map_err(|e| failed("writing its files", &e))?;
    drop(source);
    let head = proto::BackupGroupHead {
        key_format: KEY_FORMAT,
        group_id: g,
        start_key,
        end_key,
        epoch,
        applied_index,
        applied_term,
        tables,
        files: files
            .iter()
            .map(|(p, size, crc)| proto::BackupFile {
                name: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                size: *size,
                crc32c: *crc,
            })
            .collect(),
        node_id: shared.cfg.node_id,
    };
    let sent = send_chunk(
        tx,
        proto::BackupGroupChunk {
            head: Some(head),
            ..Default::default()
        },
    );
    if !sent {
        return Err(gone());
    }
    for (i, (path, _, _)) in files.iter().enumerate() {
        stream_file(i as u32, path, tx)
            .map_err(|e| failed(&format!("sending {}", path.display()), &e))?
            .then_some(())
            .ok_or_else(gone)?;
    }
    Ok(())
}

/// Streams one file in chunks; `Ok(false)` when the caller went away.
fn stream_file(file: u32, path: &PathBuf, tx: &mpsc::Sender<Chunk>) -> std::io::Result<bool> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path)?;
    let mut offset = 0u64;
    loop {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        if n == 0 {
            return Ok(true);
        }
        buf.truncate(n);
        let chunk = proto::BackupGroupChunk {
            file: Some(proto::BackupFileChunk {
                file,
                offset,
                data: buf.into(),
            }),
            ..Default::default()
        };
        if !send_chunk(tx, chunk) {
            return Ok(false);
        }
        offset += n as u64;
    }
}
