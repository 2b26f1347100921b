//! phoenix-server: one PhoenixKV node.
//!
//! A node hosts replicas of raft groups over ONE engine (WAL off by default: the raft
//! log is the WAL, seed 000) and ONE shared log store. Its parts:
//! - [`node`]: the raft driver thread (ticks, steps, ready rounds, truncation);
//! - [`apply`]: the apply stage (committed entries → one engine batch with the sentinel);
//! - [`storage`]: raft storage of a group over the log store;
//! - [`transport`]: batched raft messages per peer node over one gRPC stream;
//! - [`snapshot`]: building, streaming and receiving group snapshots (SST files);
//! - [`service`]: the client `Kv` service ([`batch`]: its many-calls stream); [`control`]: the `Meta` service, heartbeats
//!   and the scheduler's host; [`meta`]: the meta group's state machine (group 0,
//!   `phoenix_meta`) stored in the engine;
//! - [`registry`]: the node's list of hosted replicas and tombstones of removed ones;
//!   [`dropper`]: the thread that drops removed replicas' data; [`keys`]: the engine
//!   key layout;
//! - [`metrics`]: Prometheus text on `--metrics-listen`;
//! - [`faults`]: cut links for fault runs (`--fault-injection`); [`disk`]: free space,
//!   and client writes refused while it is under the reserve.
//!
//! Design and decisions: `docs/cluster.md`.

// Request errors are the protocol's `Error` message, returned by value into responses;
// they are built only on the error path, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod apply;
pub mod backup;
pub mod batch;
pub mod compactor;
pub mod config;
pub mod control;
pub mod disk;
pub mod dropper;
pub mod error;
mod expiry_sweep;
pub mod failpoint;
pub mod faults;
pub mod forward;
pub mod keys;
pub mod known_meta;
mod local;
pub mod meta;
pub mod metrics;
pub mod node;
pub mod registry;
pub mod scrub;
pub mod service;
pub mod shared;
pub mod small_file;
pub mod snapshot;
pub mod split_check;
pub mod status_page;
pub mod storage;
pub mod transport;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use phoenix_engine::{Db, Options as EngineOptions, WalMode};
use phoenix_log::{LogOptions, LogStore};
use phoenix_proto as proto;
use tonic::service::interceptor::InterceptedService;

pub use config::{parse_meta_members, Config, DropMode, MetaMember, Security};
pub use error::{Error, Result};
pub use local::Requests;
pub use phoenix_meta::{even_split_keys, INITIAL_GROUPS_MAX};

use crate::meta::{LeaderView, MetaState, META_GROUP};
use crate::shared::Shared;

/// Runs a node until `shutdown` completes, then stops it cleanly.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    run_with(cfg, shutdown, Requests::default()).await
}

/// [`run`], with `requests` serving the node's request layer to a front end in this
/// process while the node serves.
///
/// Should the node's storage fail (its log store or engine stops on a write or sync
/// error: a full or failing disk), the node restarts it by itself once the disk takes
/// writes again (disk.rs): it stops as on shutdown and runs again in this process,
/// reopening everything from what reached the disk, less what the log store wrote after
/// its last successful sync ([`LogStore::unsynced_tails`]). A start that fails then on
/// the disk or the network is tried again, backing off up to a minute, until `shutdown`;
/// one that finds corruption is returned.
pub async fn run_with(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    requests: Requests,
) -> Result<()> {
    // One shutdown for every run of the node in this process.
    let (down_tx, down_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = down_tx.send(true);
    });
    let down = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|d| *d).await;
    };
    // The fault switches outlive a run: a fault set while the node restarts is kept.
    let disk_faults = Arc::new(phoenix_storage::DiskFaults::default());
    // Kept from a failed run until a run reopens the log store with them.
    let log_unsynced = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut runs = 0u32;
    // Storage restarts in a row, each soon after its run's start.
    let mut quick = 0u32;
    let mut backoff = disk::STORAGE_RESTART_DELAY_MIN;
    loop {
        runs += 1;
        let started = Instant::now();
        let run = Run {
            number: runs,
            may_restart_storage: quick < disk::STORAGE_RESTARTS_MAX,
            disk_faults: Arc::clone(&disk_faults),
            log_unsynced: Arc::clone(&log_unsynced),
        };
        let exit = run_once(cfg.clone(), down(down_rx.clone()), requests.clone(), run).await;
        match exit {
            Ok(Exit::Shutdown) => return Ok(()),
            // The first start's failure is the caller's to see (a bad flag, a locked
            // directory); a restart's is waited out.
            Err(e) if runs == 1 => return Err(e),
            Err(e) if !e.is_transient() => {
                tracing::error!(
                    node = cfg.node_id,
                    "the node's restart failed for good: {e}"
                );
                return Err(e);
            }
            Ok(Exit::StorageRestart(why)) => {
                tracing::warn!(node = cfg.node_id, "restarting the node's storage: {why}")
            }
            Err(e) => tracing::error!(node = cfg.node_id, "restarting the node: {e}"),
        }
        if *down_rx.borrow() {
            return Ok(());
        }
        // A run that failed soon after its start is not tried again at once.
        if started.elapsed() > RESTART_BACKOFF_MAX {
            backoff = disk::STORAGE_RESTART_DELAY_MIN;
            quick = 0;
        }
        quick += 1;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = down(down_rx.clone()) => return Ok(()),
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// The longest wait between two restarts of a node whose storage keeps failing.
const RESTART_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// What one run of the node takes from [`run_with`].
struct Run {
    /// 1 for the first; each restart adds one.
    number: u32,
    /// Whether this run may restart the storage again (`disk::STORAGE_RESTARTS_MAX`).
    may_restart_storage: bool,
    /// The disk's fault switches (they act with `--fault-injection` only).
    disk_faults: Arc<phoenix_storage::DiskFaults>,
    /// Where a failed run's log store left bytes it never synced: this run's reopen cuts
    /// them (a failed `fsync` leaves them readable in the page cache, not on the disk).
    log_unsynced: Arc<parking_lot::Mutex<Vec<phoenix_log::UnsyncedTail>>>,
}

/// Hands the log store's unsynced tails to the next run however this one ends.
struct KeepUnsynced {
    log: Arc<LogStore>,
    into: Arc<parking_lot::Mutex<Vec<phoenix_log::UnsyncedTail>>>,
}

impl Drop for KeepUnsynced {
    fn drop(&mut self) {
        // Closed first: its last seal and sync may fail too (a second close is a no-op).
        let _ = self.log.close();
        self.into.lock().extend(self.log.unsynced_tails());
    }
}

/// How one run of the node ended.
enum Exit {
    /// Asked to (`shutdown`).
    Shutdown,
    /// Its storage failed and the disk takes writes again: run again.
    StorageRestart(String),
}

/// One run of the node: from opening its storage until `shutdown` or a storage restart.
async fn run_once(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    requests: Requests,
    run: Run,
) -> Result<Exit> {
    cfg.validate()?;
    let creds = cfg.security.credentials()?;
    // (Before anything starts: a TLS setup that fails must stop the start, not a node
    // half up.)
    let server = cfg.security.server(&cfg.listen)?;
    let data = cfg.data_dir.clone();
    std::fs::create_dir_all(&data)
        .map_err(|e| Error::io(format!("creating {}", data.display()), e))?;
    let disk_faults = run.disk_faults;
    let mut local: phoenix_storage::SharedFs = Arc::new(phoenix_storage::LocalFs::new());
    if cfg.unsynced_in_memory {
        tracing::warn!("unsynced bytes kept in memory: killing this node is a power loss");
        local = Arc::new(phoenix_storage::PowerLossFs::new(local));
    }
    let fs: phoenix_storage::SharedFs = if cfg.fault_injection {
        Arc::new(phoenix_storage::FaultFs::new(
            local,
            Arc::clone(&disk_faults),
        ))
    } else {
        local
    };
    let engine_opts = EngineOptions {
        wal: if cfg.engine_wal {
            WalMode::Log
        } else {
            WalMode::None
        },
        write_buffer_size: cfg.memtable_bytes,
        compaction_service: match (&cfg.compactor, &cfg.sst_store) {
            (Some(addr), Some(url)) => Some(Arc::new(compactor::RemoteCompactor::new(
                addr,
                url,
                creds.clone(),
                cfg.compactor_timeout,
            )?)),
            _ => None,
        },
        ..EngineOptions::default()
    };
    let engine = match &cfg.sst_store {
        None => Db::open(Arc::clone(&fs), &data.join("db"), engine_opts)?,
        // (The store's requests run on a runtime of its own; the open blocks this
        // thread as a local open does on its disk.)
        Some(url) => {
            let store = phoenix_engine::ObjectTableStore::from_url(url)?;
            if cfg.sst_cache_bytes > 0 {
                let cache = phoenix_engine::FlashCache::open(
                    Arc::clone(&fs),
                    &data.join("sst-cache"),
                    cfg.sst_cache_bytes,
                )?;
                store.set_flash_cache(cache)?;
            }
            Db::open_with_store(
                Arc::clone(&fs),
                &data.join("db"),
                Arc::new(store),
                engine_opts,
            )?
        }
    };
    let cut = run.log_unsynced.lock().clone();
    let log = LogStore::open_cutting(
        Arc::clone(&fs),
        &data.join("log"),
        LogOptions::default(),
        &cut,
    )?;
    // (The cuts are sealed and synced by the open.)
    run.log_unsynced.lock().clear();
    let _keep_unsynced = KeepUnsynced {
        log: Arc::clone(&log),
        into: run.log_unsynced,
    };
    // Snapshot files from before a restart serve nothing: a received one was never handed
    // to raft in this process (raft asks again), a built one's stream is gone (so is a
    // backup's).
    for d in ["snap-recv", "snap-send", "backup-send"] {
        snapshot::remove_dir(&data.join(d));
    }

    let (tx, rx) = crossbeam_channel::unbounded();
    let mut addrs = HashMap::new();
    for m in &cfg.meta {
        addrs.insert(m.id, m.addr.clone());
    }
    addrs.insert(cfg.node_id, cfg.advertise.clone());
    let addrs = Arc::new(RwLock::new(addrs));
    let runtime = tokio::runtime::Handle::current();
    let links = Arc::new(faults::Links::new(Arc::clone(&addrs), cfg.fault_injection));
    let transport = transport::Transport::new(
        cfg.node_id,
        Arc::clone(&addrs),
        Arc::clone(&links),
        tx.clone(),
        runtime.clone(),
        creds.clone(),
    );

    let mut registry = registry::Registry::open(&data)?;
    let learned_meta = known_meta::load(&data)?;
    // A member removed from the meta group keeps its tombstone: `--meta` naming it
    // again (the flags it was first started with) must not bring back a replica of the
    // first membership.
    let bootstrap_meta = cfg.is_meta_member()
        && !registry.contains(META_GROUP)
        && registry.tombstone(META_GROUP).is_none();
    let meta_elsewhere = if bootstrap_meta {
        control::meta_group_without_me(&cfg, &creds, &learned_meta).await
    } else {
        None
    };
    if let Some(why) = &meta_elsewhere {
        tracing::warn!(
            "not starting a meta replica of --meta's first membership: {why}; the meta \
             leader creates one here if the meta group takes this node in"
        );
    }
    if bootstrap_meta && meta_elsewhere.is_none() {
        registry.add(&[proto::Route {
            group_id: META_GROUP,
            start_key: Default::default(),
            end_key: Default::default(),
            epoch: 1,
            replicas: cfg
                .meta
                .iter()
                .map(|m| proto::Replica {
                    protocol: 0,
                    node_id: m.id,
                    addr: m.addr.clone(),
                })
                .collect(),
            leader_node_id: 0,
            conf_version: 0,
            learners: Vec::new(),
            leader_addr: String::new(),
        }])?;
    }
    let meta_state = if registry.contains(META_GROUP) {
        meta::load(&engine)?
    } else {
        MetaState::default()
    };
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| Error::io(format!("binding {}", cfg.listen), e))?;
    let metrics_listener = match &cfg.metrics_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| Error::io(format!("binding the metrics address {a}"), e))?,
        ),
        None => None,
    };
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        engine: Arc::clone(&engine),
        log: Arc::clone(&log),
        groups: RwLock::new(HashMap::new()),
        addrs,
        meta: RwLock::new(meta_state),
        leader_view: Mutex::new(LeaderView::default()),
        operators: Mutex::default(),
        scrub_schedule: Mutex::default(),
        merge_clocks: Mutex::default(),
        meta_leader_since: Mutex::new(None),
        stopping: std::sync::atomic::AtomicBool::new(false),
        events: tx.clone(),
        transport,
        creds,
        links,
        disk_faults,
        fs: Arc::clone(&fs),
        disk: disk::DiskSpace::new(cfg.reserve_space, cfg.heartbeat_interval * 3),
        metrics: metrics::NodeMetrics::default(),
        started: Instant::now(),
        runtime,
        report_soon: tokio::sync::Notify::new(),
        learned_meta: RwLock::new(learned_meta),
        cluster_protocol: std::sync::atomic::AtomicU32::new(0),
        storage_restart: tokio::sync::watch::channel(None).0,
        run: run.number,
        may_restart_storage: run.may_restart_storage,
        split: split_check::SplitCheck::default(),
        scrubs: Arc::default(),
        snapshots_staged: Arc::new(tokio::sync::Semaphore::new(snapshot::STAGED_MAX)),
        snapshots_sending: Arc::new(tokio::sync::Semaphore::new(snapshot::SENDING_MAX)),
    });
    // A node that starts on a full disk refuses writes from its first request on.
    match shared.fs.available_space(&data) {
        Ok(a) => {
            if shared.disk.observe(a) == Some(true) {
                tracing::error!(
                    available = a,
                    reserve = cfg.reserve_space,
                    "disk nearly full at start: client writes refused until space is freed"
                );
            }
        }
        Err(e) => tracing::warn!("cannot sample the data disk's free space: {e}"),
    }
    let driver = node::Driver::new(Arc::clone(&shared), rx, registry)?;
    let driver_thread = std::thread::Builder::new()
        .name("phoenix-raft".into())
        .spawn(move || driver.run())
        .map_err(|e| Error::io("starting the raft thread", e))?;

    let hb = tokio::spawn(control::heartbeat_loop(Arc::clone(&shared)));
    let disk_watch = tokio::spawn(disk::watch(Arc::clone(&shared)));
    let sched = tokio::spawn(control::scheduler_loop(Arc::clone(&shared)));
    let split_check = tokio::spawn(split_check::split_check_loop(Arc::clone(&shared)));
    let expiry_sweep = tokio::spawn(expiry_sweep::sweep_loop(Arc::clone(&shared)));
    // On shutdown the groups this node leads are handed to their followers first (so
    // clients see a leader transfer, not an election timeout), then the driver stops (so
    // this node stops acting as a replica), then the outgoing streams close and the
    // incoming ones are ended, so the server's graceful drain does not wait on
    // long-lived raft streams.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    {
        let tx = tx.clone();
        let transport = shared.transport.clone();
        let shared = Arc::clone(&shared);
        let mut restart = shared.storage_restart.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown => {}
                _ = restart.wait_for(Option::is_some) => {}
            }
            shared
                .stopping
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            if tx.send(node::Event::HandOff(done_tx)).is_ok() {
                let wait = node::HAND_OFF_MAX + std::time::Duration::from_millis(500);
                let _ = tokio::time::timeout(wait, done_rx).await;
            }
            let _ = tx.send(node::Event::Stop);
            transport.close();
            let _ = stop_tx.send(true);
        });
    }
    let mut server_stop = stop_rx.clone();
    let metrics_task = metrics_listener
        .map(|l| tokio::spawn(metrics::serve(Arc::clone(&shared), l, stop_rx.clone())));

    let kv = service::Services {
        shared: Arc::clone(&shared),
        inflight: Arc::new(tokio::sync::Semaphore::new(cfg.inflight_requests_max)),
        forward: Arc::new(forward::Forwarder::new(
            shared.creds.clone(),
            shared.metrics.forwards.clone(),
        )),
        stop: stop_rx.clone(),
    };
    let backups = backup::BackupService::new(kv.clone());
    requests.set(Some(kv.clone())).await;
    // Should this future be dropped or panic before the end, the handle stops serving
    // a node that is gone (the normal end clears it below, after the drain).
    let clear = requests.clear_on_drop();
    let max = proto::limits::MESSAGE_BYTES_MAX;
    tracing::info!(node = cfg.node_id, listen = %cfg.listen, data = %data.display(), engine_wal = cfg.engine_wal, "node serving");
    // Every service, the peers' included, is behind the gate: a caller without a
    // certificate the CA signed or a token gets nothing but `Unauthenticated`.
    let served = server
        .layer(tonic::service::InterceptorLayer::new(cfg.security.gate()))
        .tcp_nodelay(true)
        // A client that stops reading (paused, cut off) is dropped, so a long-lived
        // stream to it (`Kv.Batch`) cannot hold the node's shutdown drain.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)))
        .add_service(
            proto::kv_server::KvServer::new(kv)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            proto::backup_server::BackupServer::new(backups)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            proto::meta_server::MetaServer::new(control::MetaService {
                shared: Arc::clone(&shared),
            })
            .max_decoding_message_size(max),
        )
        // What only peers call takes only what peers present.
        .add_service(InterceptedService::new(
            proto::raft_transport_server::RaftTransportServer::new(transport::TransportService {
                shared: Arc::clone(&shared),
                stop: stop_rx,
            })
            .max_decoding_message_size(max),
            cfg.security.gate().for_peers(),
        ))
        .add_service(InterceptedService::new(
            proto::faults_server::FaultsServer::new(faults::FaultsService {
                shared: Arc::clone(&shared),
            }),
            cfg.security.gate().for_peers(),
        ))
        .serve_with_incoming_shutdown(
            // The builder's `tcp_nodelay` applies only to listeners it creates itself:
            // without this, replies wait on Nagle behind the peer's delayed ACK (~40 ms).
            tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                |conn| {
                    if let Ok(c) = &conn {
                        if let Err(e) = c.set_nodelay(true) {
                            tracing::debug!("TCP_NODELAY on an accepted connection: {e}");
                        }
                    }
                    conn
                },
            ),
            async move {
                let _ = server_stop.wait_for(|s| *s).await;
            },
        )
        .await;
    hb.abort();
    disk_watch.abort();
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    sched.abort();
    split_check.abort();
    expiry_sweep.abort();
    let _ = tx.send(node::Event::Stop);
    let joined = tokio::task::spawn_blocking(move || driver_thread.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        tracing::error!("the raft thread ended abnormally");
    }
    requests.set(None).await;
    clear.disarm();
    let restart = shared.storage_restart.borrow().clone();
    drop(shared);
    // (Closed before a serving error is returned: a run after it must find the
    // directories unlocked.)
    if let Err(e) = engine.close() {
        tracing::warn!("closing the engine: {e}");
    }
    if let Err(e) = log.close() {
        tracing::warn!("closing the log store: {e}");
    }
    served.map_err(|e| Error::Transport(format!("serving {}: {e}", cfg.listen)))?;
    tracing::info!(node = cfg.node_id, "node stopped");
    Ok(match restart {
        Some(why) => Exit::StorageRestart(why),
        None => Exit::Shutdown,
    })
}
