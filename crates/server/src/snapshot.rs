//! Snapshots of a group: built by the leader from an engine snapshot as SST files of
//! the group's whole key range (data and system keys, so the applied-index sentinel
//! and membership travel with the data), streamed in rate-limited chunks over
//! `RaftTransport.SendSnapshot`, written to `<data>/snap-recv/` by the receiver,
//! checked (sizes and crc32c as they arrive; then each file read whole as the engine's
//! ingest would, its keys inside the group, the group's sentinel naming the snapshot),
//! and handed to the
//! driver, which ingests them once raft accepts the snapshot (node.rs,
//! `install_snapshot`). A snapshot that fails a check is refused; the leader sends again.
//!
//! Chunk stream: first chunk = header (group, raft message, route, file list with
//! sizes and crc32c); then each file's bytes in order, in chunks of at most
//! `CHUNK_BYTES`, with (file_index, offset) checked to be contiguous.
//!
//! **By copy** (seed 004 §6.2): where the engine's tables live on a shared object store,
//! the leader sends the group's tables below L0 by name (they hold the group alone) and
//! streams only the rest of the group (memtables, L0 and the system keys: a small file,
//! `Db::write_group_rest`) over `SendSnapshotByCopy`; the receiver copies the tables on
//! the store into its own prefix (the store copies the bytes; they do not pass through
//! either node) and installs copies and rest in one manifest edit. A receiver that cannot
//! (on another store, an older binary) says so and the leader streams instead. The
//! leader's engine keeps the tables until the receiver answered.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use phoenix_engine::{ReadOptions, SstWriter};
use phoenix_proto as proto;
use phoenix_proto::convert;
use phoenix_raft::Message;
use tokio_stream::StreamExt;
use tonic::{Response, Status, Streaming};

use crate::keys;
use crate::node::Event;
use crate::shared::Shared;

/// Bytes per chunk.
const CHUNK_BYTES: usize = 256 << 10;
/// Target size of one snapshot SST file.
const FILE_BYTES_TARGET: u64 = 64 << 20;

/// Data-group snapshots a node holds received and not yet installed (or still
/// receiving), at most: a further one waits before its first file byte is taken. Without
/// the cap a node back from the dead takes every group's copy at once and keeps them all
/// on disk next to its old state until raft installs them (seed 000's repair: the space
/// that amplification measures). The meta group's snapshot never waits.
pub const STAGED_MAX: usize = 4;

/// Data-group snapshots a node builds and sends at once, at most. A further one is
/// reported failed at once, before anything is built (raft asks again later): a leader
/// of many groups whose follower came back would otherwise build every group's copy at
/// once and keep them on its disk while the follower's staging room lets them in a few
/// at a time.
pub const SENDING_MAX: usize = 4;

/// A received snapshot's directory, staged until installed or dropped: removed when
/// dropped, and counted against [`STAGED_MAX`] until then.
#[derive(Debug)]
pub struct Staged {
    dir: PathBuf,
    /// The tables copied in for a snapshot by copy, installed with the files (deleted
    /// if dropped).
    /// (Boxed: the staged snapshot travels in an event next to small ones.)
    copies: Option<Box<phoenix_engine::CopiedTables>>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Staged {
    /// The directory holding the snapshot's SST files.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The tables copied in (a snapshot by copy), for the install to take.
    pub fn take_copies(&mut self) -> Option<phoenix_engine::CopiedTables> {
        self.copies.take().map(|c| *c)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        remove_dir(&self.dir);
        if let Some(copies) = self.copies.take() {
            // Deleting copies not installed is a request per table to the store: not on
            // the driver thread, which drops the snapshots raft did not take.
            let spawned = std::thread::Builder::new()
                .name("phoenix-snap-drop".into())
                .spawn(move || drop(copies));
            if let Err(e) = spawned {
                // (The closure, and the copies with it, were dropped here.)
                tracing::warn!("no thread to delete a snapshot's copies: {e}");
            }
        }
    }
}

/// Removes a snapshot directory (best effort, logged).
pub fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), "removing snapshot directory: {e}");
        }
    }
}

/// The SST files of a received snapshot, in name order.
pub fn files_in(dir: &Path) -> crate::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    let rd = std::fs::read_dir(dir)
        .map_err(|e| crate::Error::io(format!("listing {}", dir.display()), e))?;
    for ent in rd {
        let ent = ent.map_err(|e| crate::Error::io(format!("listing {}", dir.display()), e))?;
        let p = ent.path();
        if p.extension().is_some_and(|x| x == "sst") {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// Starts sending a snapshot for `msg` (a raft `Snapshot` message of group `g`). Called
/// on the driver thread right when the message leaves, so the engine snapshot taken
/// here holds exactly the state as of the applied index the message names.
pub fn start_send(shared: &Arc<Shared>, g: u64, route: &proto::Route, msg: Message) {
    let to = msg.to;
    let Some(meta) = msg.snapshot.as_ref().map(|s| s.meta.clone()) else {
        return;
    };
    let permit = if g == crate::meta::META_GROUP {
        None
    } else {
        match Arc::clone(&shared.snapshots_sending).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                tracing::debug!(group = g, to, "snapshot not sent now: others are under way");
                let _ = shared.events.send(Event::SnapshotSent {
                    group: g,
                    to,
                    ok: false,
                });
                return;
            }
        }
    };
    let source = Source::take(shared, g);
    let ro = ReadOptions {
        snapshot: Some(source.snapshot()),
        ..ReadOptions::default()
    };
    let sentinel = shared
        .engine
        .get(&ro, &keys::applied_key(g))
        .ok()
        .flatten()
        .and_then(|v| keys::decode_applied(&v));
    // A group merged into its neighbour here is about to be dropped: its data lives in
    // the neighbour now, and a replica that installed it would hold a merged group.
    let merged = shared
        .engine
        .get(&ro, &keys::range_key(g))
        .ok()
        .flatten()
        .and_then(|v| <proto::GroupRange as prost::Message>::decode(v.as_slice()).ok())
        .is_some_and(|r| r.merged_into != 0);
    if merged || sentinel != Some((meta.index, meta.term)) {
        tracing::error!(
            group = g,
            ?sentinel,
            index = meta.index,
            merged,
            "engine state does not match the snapshot index, or the group merged; not sending"
        );
        let _ = shared.events.send(Event::SnapshotSent {
            group: g,
            to,
            ok: false,
        });
        return;
    }
    let dir = shared
        .cfg
        .data_dir
        .join("snap-send")
        // (The run: a sender of an earlier run of this process, still finishing, must
        // not remove the files of the same snapshot sent again.)
        .join(format!("{g}-{}-{to}-r{}", meta.index, shared.run));
    let shared2 = Arc::clone(shared);
    let route = route.clone();
    // Build the files on a plain thread (blocking engine reads and file writes).
    let spawned = std::thread::Builder::new()
        .name(format!("phoenix-snap-{g}"))
        .spawn(move || {
            let ok = match build_and_send(&shared2, g, &route, &msg, source, &dir) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(group = g, to, "sending snapshot failed: {e}");
                    false
                }
            };
            remove_dir(&dir);
            drop(permit);
            let _ = shared2
                .events
                .send(Event::SnapshotSent { group: g, to, ok });
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start a snapshot thread: {e}");
        let _ = shared.events.send(Event::SnapshotSent {
            group: g,
            to,
            ok: false,
        });
    }
}

/// What a snapshot is built from: an engine snapshot, or a group export (a snapshot and
/// the tables to copy) where the engine's tables are on a shared store.
enum Source {
    Snapshot(phoenix_engine::Snapshot),
    Export(phoenix_engine::GroupExport),
}

impl Source {
    /// Takes the group's state as of now (on the driver thread: exactly the state at
    /// the applied index the snapshot message names).
    fn take(shared: &Shared, g: u64) -> Source {
        // (The meta group is small and read by every node: streamed.)
        if shared.cfg.snapshot_by_copy && g != crate::meta::META_GROUP {
            match shared.engine.export_group(g) {
                Ok(e) => return Source::Export(e),
                Err(e) => tracing::debug!(group = g, "snapshot streamed, not copied: {e}"),
            }
        }
        Source::Snapshot(shared.engine.snapshot())
    }

    fn snapshot(&self) -> &phoenix_engine::Snapshot {
        match self {
            Source::Snapshot(s) => s,
            Source::Export(e) => e.snapshot(),
        }
    }
}

/// Why a snapshot was not sent.
enum SendError {
    /// The receiver cannot copy the tables: stream the snapshot instead.
    CopyUnsupported(String),
    Failed(String),
}

impl From<String> for SendError {
    fn from(s: String) -> SendError {
        SendError::Failed(s)
    }
}

/// Builds the snapshot's files in `dir` and sends them (by copy where `source` is an
/// export and the receiver can copy; else streamed whole).
fn build_and_send(
    shared: &Shared,
    g: u64,
    route: &proto::Route,
    msg: &Message,
    source: Source,
    dir: &Path,
) -> Result<(), String> {
    let rt = shared.runtime.clone();
    let mut source = source;
    if let Source::Export(export) = &mut source {
        let files = build_rest(shared, g, export, dir)
            .map_err(|e| format!("building the snapshot's rest: {e}"))?;
        match rt.block_on(send_files(shared, g, route, msg, &files, Some(&*export))) {
            Ok(()) => {
                shared.metrics.snapshot_bytes("copied", export.bytes());
                return Ok(());
            }
            Err(SendError::Failed(e)) => return Err(e),
            Err(SendError::CopyUnsupported(why)) => {
                tracing::info!(
                    group = g,
                    to = msg.to,
                    "snapshot streamed, not copied: {why}"
                );
            }
        }
    }
    let files = build_files(shared, g, source.snapshot(), dir)
        .map_err(|e| format!("building the snapshot: {e}"))?;
    drop(source);
    match rt.block_on(send_files(shared, g, route, msg, &files, None)) {
        Ok(()) => Ok(()),
        Err(SendError::Failed(e) | SendError::CopyUnsupported(e)) => Err(e),
    }
}

/// Snapshot SST files being written to a directory, cut at [`FILE_BYTES_TARGET`].
struct FileSink<'d> {
    dir: &'d Path,
    fs: phoenix_storage::SharedFs,
    topts: phoenix_engine::table::TableOptions,
    paths: Vec<PathBuf>,
    writer: Option<(SstWriter, PathBuf)>,
    bytes: u64,
    /// Bytes after which a file is cut ([`FILE_BYTES_TARGET`]).
    target: u64,
    /// The range deletion the keys have reached and not passed, not yet written: it
    /// goes into the file that holds the keys it spans, cut where a file is cut (no two
    /// files overlap).
    range: Option<(Vec<u8>, Vec<u8>)>,
}

impl<'d> FileSink<'d> {
    fn new(dir: &'d Path) -> crate::Result<FileSink<'d>> {
        remove_dir(dir);
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::Error::io(format!("creating {}", dir.display()), e))?;
        Ok(FileSink {
            dir,
            fs: Arc::new(phoenix_storage::LocalFs::new()),
            topts: phoenix_engine::table::TableOptions::default(),
            paths: Vec::new(),
            writer: None,
            bytes: 0,
            target: FILE_BYTES_TARGET,
            range: None,
        })
    }

    fn writer(&mut self) -> phoenix_engine::Result<&mut SstWriter> {
        let w = match self.writer.take() {
            Some(w) => w,
            None => {
                let p = self.dir.join(format!("{:06}.sst", self.paths.len() + 1));
                self.bytes = 0;
                (SstWriter::create(&self.fs, &p, &self.topts)?, p)
            }
        };
        Ok(&mut self.writer.insert(w).0)
    }

    /// Adds one entry of a group's rest (in key order).
    fn entry(&mut self, e: phoenix_engine::RestEntry<'_>) -> phoenix_engine::Result<()> {
        match e {
            phoenix_engine::RestEntry::Put(k, v) => self.add(k, Some(v)),
            phoenix_engine::RestEntry::Delete(k) => self.add(k, None),
            phoenix_engine::RestEntry::DeleteRange(s, e) => {
                self.write_range()?;
                self.bytes += (s.len() + e.len()) as u64;
                self.range = Some((s.to_vec(), e.to_vec()));
                Ok(())
            }
        }
    }

    /// Writes the pending range deletion into the current file.
    fn write_range(&mut self) -> phoenix_engine::Result<()> {
        if let Some((s, e)) = self.range.take() {
            self.writer()?.delete_range(&s, &e)?;
        }
        Ok(())
    }

    /// Adds `key` (in order): its value, or a deletion (`None`).
    fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> phoenix_engine::Result<()> {
        if self
            .range
            .as_ref()
            .is_some_and(|(_, e)| key >= e.as_slice())
        {
            self.write_range()?;
        }
        if self.bytes >= self.target {
            // A pending range is cut at `key`: its part below goes in this file.
            if let Some((s, e)) = self.range.take() {
                if s.as_slice() < key {
                    self.writer()?.delete_range(&s, key)?;
                }
                self.range = Some((s.max(key.to_vec()), e));
            }
            if let Some((w, p)) = self.writer.take() {
                w.finish()?;
                self.paths.push(p);
            }
        }
        let w = self.writer()?;
        match value {
            Some(v) => w.put(key, v)?,
            None => w.delete(key)?,
        }
        self.bytes += (key.len() + value.map_or(0, <[u8]>::len)) as u64;
        Ok(())
    }

    /// The files written, with their sizes and crc32c.
    fn finish(mut self) -> crate::Result<Vec<(PathBuf, u64, u32)>> {
        self.write_range()?;
        if let Some((w, p)) = self.writer.take() {
            w.finish()?;
            self.paths.push(p);
        }
        let mut out = Vec::with_capacity(self.paths.len());
        for p in self.paths {
            let data = std::fs::read(&p)
                .map_err(|e| crate::Error::io(format!("reading {}", p.display()), e))?;
            out.push((p, data.len() as u64, crc32c::crc32c(&data)));
        }
        Ok(out)
    }
}

pub(crate) fn build_files(
    shared: &Shared,
    g: u64,
    snap: &phoenix_engine::Snapshot,
    dir: &Path,
) -> crate::Result<Vec<(PathBuf, u64, u32)>> {
    let mut sink = FileSink::new(dir)?;
    let ro = ReadOptions {
        snapshot: Some(snap),
        lower_bound: Some(keys::group_start(g)),
        upper_bound: keys::group_end(g),
        // A whole-group scan would evict the hot blocks of every other group.
        fill_cache: false,
        ..ReadOptions::default()
    };
    let mut it = shared.engine.iter(&ro)?;
    it.seek_to_first();
    while it.valid() {
        sink.add(it.key(), Some(it.value()))?;
        it.next();
    }
    it.status()?;
    sink.finish()
}

/// The rest of a snapshot by copy: what the export's tables alone do not hold, and
/// every system key of the group (the receiver checks the sentinel, and reads the range
/// and membership, in these files).
pub(crate) fn build_rest(
    shared: &Shared,
    g: u64,
    export: &mut phoenix_engine::GroupExport,
    dir: &Path,
) -> crate::Result<Vec<(PathBuf, u64, u32)>> {
    let mut sink = FileSink::new(dir)?;
    shared
        .engine
        .write_group_rest(export, &keys::sys_key(g, b""), |e| sink.entry(e))?;
    sink.finish()
}

async fn send_files(
    shared: &Shared,
    g: u64,
    route: &proto::Route,
    msg: &Message,
    files: &[(PathBuf, u64, u32)],
    copies: Option<&phoenix_engine::GroupExport>,
) -> Result<(), SendError> {
    if shared.links.is_cut(msg.to) {
        return Err(format!("link to node {} cut (fault injection)", msg.to).into());
    }
    let addr = shared
        .addr_of(msg.to)
        .ok_or_else(|| format!("no address for node {}", msg.to))?;
    let ep = shared
        .creds
        .endpoint(&addr)?
        .connect_timeout(Duration::from_secs(2));
    let ch = ep.connect().await.map_err(|e| format!("{addr}: {e}"))?;
    let mut client =
        proto::raft_transport_client::RaftTransportClient::new(shared.creds.authorize(ch))
            .max_encoding_message_size(proto::limits::MESSAGE_BYTES_MAX);
    let header = proto::SnapshotHeader {
        format: if copies.is_some() {
            FORMAT_BY_COPY
        } else {
            FORMAT_FILES
        },
        store_id: copies.map(|e| e.store_id().to_string()).unwrap_or_default(),
        copies: copies
            .map(|e| {
                e.tables()
                    .iter()
                    .map(|t| proto::SharedTable {
                        level: t.level,
                        object: t.object.clone(),
                        size: t.size,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        group_id: g,
        from_node: shared.cfg.node_id,
        to_node: msg.to,
        message: Some(convert::message_to_wire(msg)),
        start_key: route.start_key.clone(),
        end_key: route.end_key.clone(),
        epoch: route.epoch,
        files: files
            .iter()
            .map(|(p, size, crc)| proto::SnapshotFile {
                name: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                size: *size,
                crc32c: *crc,
            })
            .collect(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<proto::SnapshotChunk>(4);
    let by_copy = copies.is_some();
    let call = tokio::spawn(async move {
        let chunks = tokio_stream::wrappers::ReceiverStream::new(rx);
        if by_copy {
            client.send_snapshot_by_copy(chunks).await
        } else {
            client.send_snapshot(chunks).await
        }
    });
    let rate = shared.cfg.snapshot_bytes_per_sec.max(1);
    let send_all = async {
        tx.send(proto::SnapshotChunk {
            header: Some(header),
            ..Default::default()
        })
        .await
        .map_err(|_| "receiver closed".to_string())?;
        let mut started = Instant::now();
        let mut sent = 0u64;
        let mut waited = false;
        for (i, (p, _, _)) in files.iter().enumerate() {
            let data = tokio::fs::read(p)
                .await
                .map_err(|e| format!("reading {}: {e}", p.display()))?;
            for (k, chunk) in data.chunks(CHUNK_BYTES).enumerate() {
                // A link cut mid-stream (fault injection) breaks it, as a partition would.
                if shared.links.is_cut(msg.to) {
                    return Err(format!("link to node {} cut (fault injection)", msg.to));
                }
                let t = Instant::now();
                tx.send(proto::SnapshotChunk {
                    header: None,
                    file_index: i as u32,
                    offset: (k * CHUNK_BYTES) as u64,
                    data: bytes::Bytes::copy_from_slice(chunk),
                })
                .await
                .map_err(|_| "receiver closed".to_string())?;
                if !waited && t.elapsed() > Duration::from_millis(100) {
                    // The receiver held the stream before its first bytes (its staged
                    // snapshots at the cap): the rate counts from now, not in a burst
                    // making up for the wait. (Once: later stalls are the receiver's
                    // writes, which the rate must not make up for either.)
                    waited = true;
                    (started, sent) = (Instant::now(), 0);
                }
                sent += chunk.len() as u64;
                // Rate limit: never get ahead of `rate` bytes per second.
                let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                let el = started.elapsed();
                if due > el {
                    tokio::time::sleep(due - el).await;
                }
            }
        }
        Ok::<(), String>(())
    };
    let sent = send_all.await;
    drop(tx);
    let done = match call.await.map_err(|e| e.to_string())? {
        Ok(done) => done.into_inner(),
        // (An older receiver, without the method.)
        Err(s) if by_copy && s.code() == tonic::Code::Unimplemented => {
            return Err(SendError::CopyUnsupported(s.message().to_string()))
        }
        Err(s) => return Err(s.to_string().into()),
    };
    if done.accepted {
        sent?;
        shared
            .metrics
            .snapshot_bytes("streamed", files.iter().map(|(_, size, _)| size).sum());
        Ok(())
    } else if by_copy && done.copy_unsupported {
        Err(SendError::CopyUnsupported(done.reason))
    } else {
        sent?;
        Err(format!("refused: {}", done.reason).into())
    }
}

struct Receiving {
    dir: PathBuf,
    header: proto::SnapshotHeader,
    file: Option<std::fs::File>,
    file_index: usize,
    offset: u64,
    crc: u32,
}

fn refuse(why: String) -> Result<Response<proto::SnapshotDone>, Status> {
    tracing::warn!("snapshot refused: {why}");
    Ok(Response::new(proto::SnapshotDone {
        accepted: false,
        reason: why,
        copy_unsupported: false,
    }))
}

/// Refuses a snapshot by copy this node cannot copy in: the sender streams it instead.
fn refuse_copy(why: String) -> Result<Response<proto::SnapshotDone>, Status> {
    tracing::info!("snapshot by copy refused, to be streamed: {why}");
    Ok(Response::new(proto::SnapshotDone {
        accepted: false,
        reason: why,
        copy_unsupported: true,
    }))
}

/// Header format of a snapshot whose files hold the whole group.
const FORMAT_FILES: u32 = 1;
/// Header format of a snapshot by copy.
const FORMAT_BY_COPY: u32 = 2;

/// Why a snapshot of group `g` is refused for want of disk room, if it is: a disk under
/// its reserve takes no snapshot of a data group (a whole copy of the group's data); the
/// leader is told it failed and tries again later (disk.rs).
fn disk_full(shared: &Shared, g: u64) -> Option<String> {
    (shared.disk.is_full() && g != crate::meta::META_GROUP).then(|| {
        format!(
            "node {}'s disk is full ({} bytes free, under its reserve of {})",
            shared.cfg.node_id,
            shared.disk.available(),
            shared.cfg.reserve_space
        )
    })
}

/// Receives one snapshot stream (the `SendSnapshot` service method, or with `by_copy`
/// `SendSnapshotByCopy`).
pub async fn receive(
    shared: Arc<Shared>,
    mut s: Streaming<proto::SnapshotChunk>,
    by_copy: bool,
) -> Result<Response<proto::SnapshotDone>, Status> {
    let first = match s.next().await {
        Some(c) => c?,
        None => return refuse("empty snapshot stream".into()),
    };
    let Some(header) = first.header else {
        return refuse("first snapshot chunk carries no header".into());
    };
    let format = header.format.max(FORMAT_FILES);
    if format > FORMAT_BY_COPY {
        return refuse(format!(
            "snapshot format {format} is newer than this binary's {FORMAT_BY_COPY}; \
             upgrade the binary"
        ));
    }
    if by_copy != (format == FORMAT_BY_COPY) {
        return refuse(format!(
            "snapshot format {format} arrived on {}",
            if by_copy {
                "SendSnapshotByCopy"
            } else {
                "SendSnapshot"
            }
        ));
    }
    if !by_copy && !header.copies.is_empty() {
        return refuse("a streamed snapshot names tables to copy".into());
    }
    if by_copy {
        if let Some(why) = cannot_copy(&shared, &header) {
            return refuse_copy(why);
        }
    }
    if header.to_node != shared.cfg.node_id {
        return refuse(format!(
            "snapshot for node {} reached node {}",
            header.to_node, shared.cfg.node_id
        ));
    }
    if shared.links.is_cut(header.from_node) {
        return refuse(format!(
            "link to node {} cut (fault injection)",
            header.from_node
        ));
    }
    if let Some(why) = disk_full(&shared, header.group_id) {
        return refuse(why);
    }
    let Some(wire) = header.message.clone() else {
        return refuse("snapshot header without raft message".into());
    };
    let msg = match convert::message_from_wire(wire, bytes::Bytes::new()) {
        Ok(m) if m.kind == phoenix_raft::MessageType::Snapshot && m.to == shared.cfg.node_id => m,
        Ok(_) => return refuse("snapshot header carries a wrong raft message".into()),
        Err(e) => return refuse(format!("snapshot header: {e}")),
    };
    for f in &header.files {
        if f.name.contains('/') || f.name.contains("..") || !f.name.ends_with(".sst") {
            return refuse(format!("bad snapshot file name {:?}", f.name));
        }
    }
    let g = header.group_id;
    let index = msg.snapshot.as_ref().map_or(0, |s| s.meta.index);
    let permit = if g == crate::meta::META_GROUP {
        None
    } else {
        match Arc::clone(&shared.snapshots_staged).acquire_owned().await {
            Ok(p) => Some(p),
            Err(_) => return Err(Status::unavailable("node shutting down")),
        }
    };
    // (Checked again: snapshots installed during the wait may have used the room.)
    if let Some(why) = disk_full(&shared, g) {
        return refuse(why);
    }
    let dir = shared
        .cfg
        .data_dir
        .join("snap-recv")
        .join(format!("{g}-{index}-{}", rand::random::<u32>()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return refuse(format!("creating {}: {e}", dir.display()));
    }
    let mut staged = Staged {
        dir: dir.clone(),
        copies: None,
        _permit: permit,
    };
    let mut r = Receiving {
        dir,
        header,
        file: None,
        file_index: 0,
        offset: 0,
        crc: 0,
    };
    let result = receive_chunks(&mut r, &mut s).await;
    if let Err(why) = result {
        drop(staged);
        return refuse(why);
    }
    // Every file is read whole before raft hears of the snapshot: one that is no table,
    // holds keys of another group or lacks the snapshot's sentinel is refused here (the
    // leader sends again later), where installing it would fail and stop the replica.
    let term = msg.snapshot.as_ref().map_or(0, |s| s.meta.term);
    let dir = r.dir.clone();
    let checked = tokio::task::spawn_blocking(move || check_files(&dir, g, index, term)).await;
    let why = match checked {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(why),
        Err(e) => Some(format!("checking the snapshot files: {e}")),
    };
    if let Some(why) = why {
        drop(staged);
        return refuse(why);
    }
    if by_copy {
        // The tables are copied now, on the store, before raft hears of the snapshot.
        // The sender's engine keeps them until this answer.
        let engine = Arc::clone(&shared.engine);
        let store_id = r.header.store_id.clone();
        let tables: Vec<phoenix_engine::SharedTable> = r
            .header
            .copies
            .iter()
            .map(|t| phoenix_engine::SharedTable {
                level: t.level,
                object: t.object.clone(),
                size: t.size,
            })
            .collect();
        let node = shared.cfg.node_id;
        let copied = tokio::task::spawn_blocking(move || {
            crate::failpoint::check_group(crate::failpoint::names::SNAPSHOT_COPY_IN, node, g)
                .map_err(|e| (e.to_string(), false))?;
            engine.copy_in_group(g, &store_id, &tables).map_err(|e| {
                (
                    e.to_string(),
                    e.is_retryable() || matches!(e, phoenix_engine::Error::Closed),
                )
            })
        })
        .await;
        // A copy that fails for good (the store refuses it to this node, a table would
        // not fit here) is answered as one this node cannot take: the leader streams the
        // snapshot instead, where asking for the copy again would fail again. A passing
        // failure (the store unavailable for now, the node closing) is refused plainly:
        // the leader asks for the copy again later.
        match copied {
            Ok(Ok(c)) => staged.copies = Some(Box::new(c)),
            Ok(Err((e, true))) => return refuse(format!("copying the snapshot's tables: {e}")),
            Ok(Err((e, false))) => {
                return refuse_copy(format!("copying the snapshot's tables: {e}"))
            }
            Err(e) => return refuse(format!("copying the snapshot's tables: {e}")),
        }
    }
    let route = proto::Route {
        group_id: g,
        start_key: r.header.start_key.clone(),
        end_key: r.header.end_key.clone(),
        epoch: r.header.epoch,
        replicas: msg
            .snapshot
            .as_ref()
            .map(|s| {
                let c = &s.meta.conf;
                c.voters
                    .iter()
                    .chain(&c.learners)
                    .map(|&id| shared.replica_of(id).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default(),
        leader_node_id: msg.from,
        leader_addr: shared.addr_of(msg.from).unwrap_or_default(),
        // (The install takes the version the snapshot's files carry.)
        conf_version: 0,
        learners: msg
            .snapshot
            .as_ref()
            .map(|s| s.meta.conf.learners.clone())
            .unwrap_or_default(),
    };
    tracing::info!(
        group = g,
        index,
        files = r.header.files.len(),
        "snapshot received"
    );
    if shared
        .events
        .send(Event::SnapshotReceived {
            group: g,
            msg,
            dir: staged,
            route,
        })
        .is_err()
    {
        // (The event, and the staged files with it, are dropped.)
        return Err(Status::unavailable("node shutting down"));
    }
    Ok(Response::new(proto::SnapshotDone {
        accepted: true,
        reason: String::new(),
        copy_unsupported: false,
    }))
}

/// Why this node cannot take the snapshot `header` names by copy, if it cannot: its
/// tables are not on the sender's store, or it replaces groups by range tombstones.
fn cannot_copy(shared: &Shared, header: &proto::SnapshotHeader) -> Option<String> {
    if shared.cfg.drop_mode != crate::config::DropMode::Files {
        return Some(format!(
            "node {} replaces groups by range tombstones",
            shared.cfg.node_id
        ));
    }
    match shared.engine.shared_store_id() {
        Some(id) if id == header.store_id => None,
        mine => Some(format!(
            "node {}'s tables are on {}, the snapshot's on {:?}",
            shared.cfg.node_id,
            mine.as_deref().unwrap_or("its local disk"),
            header.store_id
        )),
    }
}

/// The value of `key` in the first of a snapshot's `files` that holds it.
pub fn value_in(files: &[PathBuf], key: &[u8]) -> crate::Result<Option<Vec<u8>>> {
    let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    for f in files {
        if let Some(v) = phoenix_engine::sst_get(&fs, f, key)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// The applied sentinel (index, term) a snapshot's `files` of group `g` carry.
pub fn sentinel_in(files: &[PathBuf], g: u64) -> crate::Result<Option<(u64, u64)>> {
    Ok(value_in(files, &keys::applied_key(g))?.and_then(|v| keys::decode_applied(&v)))
}

/// Checks the received files of group `g`'s snapshot at (`index`, `term`) as the install
/// will: tables the engine would ingest into the group (`check_group_files`: every
/// block's checksum, keys in order and in the group, no overlap), and the group's
/// applied sentinel, in the first file that holds it, naming the snapshot.
fn check_files(dir: &Path, g: u64, index: u64, term: u64) -> Result<(), String> {
    let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    let files = files_in(dir).map_err(|e| e.to_string())?;
    phoenix_engine::check_group_files(&fs, g, &files).map_err(|e| e.to_string())?;
    let sentinel = sentinel_in(&files, g).map_err(|e| e.to_string())?;
    if sentinel != Some((index, term)) {
        return Err(format!(
            "snapshot files of group {g} say applied {sentinel:?}, the message says ({index}, {term})"
        ));
    }
    Ok(())
}

fn finish_file(r: &mut Receiving) -> Result<(), String> {
    let Some(f) = r.file.take() else {
        return Ok(());
    };
    let want = &r.header.files[r.file_index];
    if r.offset != want.size || r.crc != want.crc32c {
        return Err(format!(
            "snapshot file {} ended at offset {} with crc {:#x}, expected size {} crc {:#x}",
            want.name, r.offset, r.crc, want.size, want.crc32c
        ));
    }
    f.sync_all()
        .map_err(|e| format!("syncing {}: {e}", want.name))?;
    r.file_index += 1;
    r.offset = 0;
    r.crc = 0;
    Ok(())
}

async fn receive_chunks(
    r: &mut Receiving,
    s: &mut Streaming<proto::SnapshotChunk>,
) -> Result<(), String> {
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| format!("snapshot stream: {e}"))?;
        let fi = chunk.file_index as usize;
        if fi != r.file_index {
            if fi == r.file_index + 1 && r.file.is_some() {
                finish_file(r)?;
            } else {
                return Err(format!(
                    "snapshot chunk for file {fi} while at file {}",
                    r.file_index
                ));
            }
        }
        let Some(meta) = r.header.files.get(fi) else {
            return Err(format!(
                "snapshot chunk for file {fi}, header lists {}",
                r.header.files.len()
            ));
        };
        if chunk.offset != r.offset || r.offset + chunk.data.len() as u64 > meta.size {
            return Err(format!(
                "snapshot file {} chunk at offset {} (expected {}), {} bytes past size {}",
                meta.name,
                chunk.offset,
                r.offset,
                chunk.data.len(),
                meta.size
            ));
        }
        if r.file.is_none() {
            let p = r.dir.join(&meta.name);
            r.file = Some(
                std::fs::File::create(&p).map_err(|e| format!("creating {}: {e}", p.display()))?,
            );
        }
        if let Some(f) = r.file.as_mut() {
            f.write_all(&chunk.data)
                .map_err(|e| format!("writing {}: {e}", meta.name))?;
        }
        r.crc = crc32c::crc32c_append(r.crc, &chunk.data);
        r.offset += chunk.data.len() as u64;
    }
    finish_file(r)?;
    if r.file_index != r.header.files.len() {
        return Err(format!(
            "snapshot stream ended after {} of {} files",
            r.file_index,
            r.header.files.len()
        ));
    }
    std::fs::File::open(&r.dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("syncing {}: {e}", r.dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use phoenix_engine::RestEntry;

    fn key(i: u32) -> Vec<u8> {
        keys::data_key(5, format!("k{i:05}").as_bytes())
    }

    /// A range deletion spanning many files of a rest is cut with them: the files do
    /// not overlap, and ingested over older data they delete every older key in the
    /// range and keep their own.
    #[test]
    fn a_range_deletion_is_cut_with_the_files_it_spans() {
        let tmp = tempfile::tempdir().unwrap();
        let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
        let db = phoenix_engine::Db::open(
            Arc::clone(&fs),
            &tmp.path().join("db"),
            phoenix_engine::Options::default(),
        )
        .unwrap();
        let wo = phoenix_engine::WriteOptions::default();
        for i in 0..1000 {
            db.put(&wo, &key(i), b"old").unwrap();
        }
        let dir = tmp.path().join("rest");
        let mut sink = FileSink::new(&dir).unwrap();
        sink.target = 2 << 10;
        let value = vec![b'n'; 100];
        sink.entry(RestEntry::Put(&key(1), &value)).unwrap();
        sink.entry(RestEntry::DeleteRange(&key(10), &key(900)))
            .unwrap();
        for i in (10..900).step_by(3) {
            sink.entry(RestEntry::Put(&key(i), &value)).unwrap();
        }
        sink.entry(RestEntry::DeleteRange(&key(950), &key(960)))
            .unwrap();
        sink.entry(RestEntry::Delete(&key(990))).unwrap();
        let files = sink.finish().unwrap();
        assert!(files.len() > 10, "{} files", files.len());
        let paths: Vec<PathBuf> = files.into_iter().map(|(p, _, _)| p).collect();
        phoenix_engine::check_group_files(&fs, 5, &paths).unwrap();
        db.ingest(&paths).unwrap();
        let ro = ReadOptions::default();
        for i in 0..1000 {
            let got = db.get(&ro, &key(i)).unwrap();
            let want: Option<&[u8]> = if i == 1 || ((10..900).contains(&i) && (i - 10) % 3 == 0) {
                Some(&value)
            } else if (10..900).contains(&i) || (950..960).contains(&i) || i == 990 {
                None
            } else {
                Some(b"old")
            };
            assert_eq!(got.as_deref(), want, "key {i}");
        }
        db.close().unwrap();
    }
}
