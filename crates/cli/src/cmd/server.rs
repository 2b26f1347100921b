//! `phoenix server`: runs one node (see docs/cluster.md).

use std::path::PathBuf;
use std::time::Duration;

use super::BoxError;

/// Runs one PhoenixKV node until Ctrl-C or SIGTERM.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's id (unique in the cluster, not 0).
    #[arg(long)]
    pub id: u64,
    /// Address to listen on, e.g. 127.0.0.1:7001.
    #[arg(long)]
    pub listen: String,
    /// Address others use to reach this node (default: --listen).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Data directory (engine in db/, log store in log/).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Meta group members: id@host:port,... (a node listed here hosts a meta replica).
    #[arg(long)]
    pub meta: String,
    /// Keep the engine's own WAL on (baseline of the log-as-WAL comparison).
    #[arg(long)]
    pub engine_wal: bool,
    /// Replicas per data group.
    #[arg(long, default_value_t = 3)]
    pub replication: usize,
    /// Split keys of the initial data groups, comma separated (n keys → n + 1 groups).
    #[arg(long, value_delimiter = ',', conflicts_with = "initial_groups")]
    pub split_keys: Vec<String>,
    /// Bootstrap this many data groups, cutting the key space evenly over its first four
    /// bytes (for keys spread over the binary space, e.g. hashed).
    #[arg(long)]
    pub initial_groups: Option<usize>,
    /// Engine memtable size in MiB.
    #[arg(long, default_value_t = 64)]
    pub memtable_mb: usize,
    /// Keep the engine's tables and manifest on an S3 server instead of in db/:
    /// s3://bucket/prefix?endpoint=http://host:port (the log store stays local).
    /// Credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. The prefix is this
    /// node's alone: another node opening it takes it over, and this one stops
    /// (docs/engine.md, "The table store").
    #[arg(long)]
    pub sst_store: Option<String>,
    /// MiB of local flash (in the data directory, sst-cache/) that keep pages of the
    /// tables on --sst-store, read or written; 0: none.
    #[arg(long, default_value_t = 1024, requires = "sst_store")]
    pub sst_cache_mb: u64,
    /// Hand the engine's background compactions to a worker (`phoenix compactor`,
    /// host:port) that reaches the same bucket: it reads and writes the tables there,
    /// the node only installs what it wrote. A worker that fails or is unreachable
    /// leaves the compaction to the node. Calls carry the node's token and TLS.
    #[arg(long, requires = "sst_store")]
    pub compactor: Option<String>,
    /// How long to wait for the worker to finish one compaction before running it here.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration, requires = "compactor")]
    pub compactor_timeout: Duration,
    /// Log entries kept below the persisted applied index for lagging followers.
    #[arg(long, default_value_t = 10_000)]
    pub log_keep_entries: u64,
    /// How often logs are truncated, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub log_truncate_ms: u64,
    /// Largest value accepted, in bytes.
    #[arg(long, default_value_t = phoenix_proto::limits::VALUE_BYTES_MAX)]
    pub value_max_bytes: usize,
    /// Raft tick in milliseconds (election timeout = 50 ticks, randomized up to twice
    /// that; heartbeat = 5 ticks).
    #[arg(long, default_value_t = 10)]
    pub tick_ms: u64,
    /// Idle ticks after which a leader puts its group to sleep (no heartbeats, no timers
    /// until a request or message; 0: never).
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_HIBERNATE_TICKS)]
    pub hibernate_ticks: u32,
    /// Snapshot streaming rate limit in MiB/s.
    #[arg(long, default_value_t = 64)]
    pub snapshot_mb_per_sec: u64,
    /// Stream every snapshot whole, even where the tables are on --sst-store (there, by
    /// default, a new replica copies the group's tables on the store and only the rest
    /// passes through the nodes).
    #[arg(long)]
    pub snapshot_no_copy: bool,
    /// Address to serve metrics on (`GET /metrics`, Prometheus text; names in
    /// docs/metrics.md), e.g. 127.0.0.1:9101. Off unless given.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Address to serve the Redis protocol on (RESP2/RESP3: redis-cli, redis-benchmark,
    /// Redis client libraries), e.g. 127.0.0.1:6379. Requests go to each key's group
    /// leader wherever it is. Commands in docs/resp.md. Off unless given.
    #[arg(long)]
    pub resp_listen: Option<String>,
    /// File holding the password Redis clients must give (AUTH, or HELLO … AUTH; Redis'
    /// `requirepass`) before any other command on the --resp-listen port; one trailing
    /// newline is ignored. Without it the port asks for none: bind it to loopback or a
    /// private network then.
    #[arg(long, requires = "resp_listen")]
    pub resp_password_file: Option<std::path::PathBuf>,
    /// PEM certificate of this node (with --tls-key and --tls-ca): its client, peer and
    /// Redis ports then speak TLS only. It must name the host of --advertise (or
    /// --listen) and serve for both server and client authentication (nodes present it
    /// to each other).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the CA that signed every node's certificate: nodes check each
    /// other against it, and a client showing a certificate it signed is let in.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// File of tokens (one a line; `#` comments; each at least 16 visible ASCII
    /// characters): the first is the nodes' own (they present it to each other; it alone
    /// opens the services only peers call), the others are clients' (over gRPC as
    /// `authorization: Bearer <token>`, on the Redis port with AUTH). Calls without one
    /// (or a CA-signed certificate) are refused. Without TLS a token crosses the network
    /// in the clear.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Free disk space to keep, in MiB: under it the node refuses client writes with a
    /// DiskFull error (reads go on) and takes them again once space returns. 0: never.
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_RESERVE_SPACE >> 20)]
    pub reserve_space_mb: u64,
    /// Do not move leaderships to balance them (as the meta leader, this node would
    /// otherwise bring every node's count of led groups within 10% of the mean, or one,
    /// as far as the placement allows). Give it to every meta member.
    #[arg(long)]
    pub no_balance_leaders: bool,
    /// Do not move replicas to balance them (as the meta leader, this node would
    /// otherwise bring every node's count of replicas within 10% of the mean, or one,
    /// and trim groups with more voters than --replication, e.g. after `cluster
    /// add-replica`). Give it to every meta member.
    #[arg(long)]
    pub no_balance_replicas: bool,
    /// Replace the replicas of a node not heard from for this long (e.g. 30s, 5m; 0:
    /// never): as the meta leader, this node adds a replica of each of its groups on
    /// the live node hosting the fewest, then removes the down one. Give it to every
    /// meta member.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub down_after: Duration,
    /// Split a group this node leads once its data passes this many MiB (about: from
    /// the engine's tables), at its middle key (0: never by size).
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_GROUP_SPLIT_BYTES >> 20)]
    pub split_size_mb: u64,
    /// Split a group this node leads once it holds this many entries (0: never by
    /// count).
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_GROUP_SPLIT_KEYS)]
    pub split_size_keys: u64,
    /// Split a group this node leads once it serves more than this many requests a
    /// second over a split check interval, at the median of its requests' keys (0:
    /// never by load).
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_GROUP_SPLIT_QPS)]
    pub split_qps: u64,
    /// As the meta leader, merge two neighbouring groups with the same replicas whose
    /// data together is under this many MiB (0: never by size).
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_GROUP_MERGE_BYTES >> 20)]
    pub merge_size_mb: u64,
    /// ... and under this many entries together.
    #[arg(long, default_value_t = phoenix_server::Config::DEFAULT_GROUP_MERGE_KEYS)]
    pub merge_size_keys: u64,
    /// Merge by size only groups whose range has not changed for this long (a group just
    /// split is not merged back at once; e.g. 10m).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub merge_after: Duration,
    /// How often to measure the groups this node leads for splitting (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub split_check_interval: Duration,
    /// As the meta leader, scrub every group once per this long: its replicas checksum
    /// their data at the same log index and the meta leader compares them (0s: never).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub scrub_interval: Duration,
    /// Serve the fault-injection service (cut links to chosen peers on request), for
    /// fault runs (`bench cluster --nemesis partition`). Never in production.
    #[arg(long)]
    pub fault_injection: bool,
    /// Keep bytes not yet synced in memory instead of the OS page cache, so that killing
    /// the node loses them as a power loss would (`bench cluster --nemesis powerloss`).
    /// Slower; for fault runs only.
    #[arg(long)]
    pub unsynced_in_memory: bool,
    /// How a replica's old data leaves the engine when it is dropped or a snapshot
    /// replaces it: `files` (deleted at once) or `range-delete` (hidden by a range
    /// tombstone, removed by compaction later, as stock RocksDB users do: the baseline
    /// of `phoenix bench repair`).
    #[arg(long, value_enum, default_value = "files")]
    pub drop_mode: DropModeArg,
}

/// `--drop-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DropModeArg {
    /// Delete the replica's files at once.
    Files,
    /// Write a range tombstone; compaction drops the data later.
    RangeDelete,
}

/// Runs the node.
pub fn run(args: Args) -> Result<(), BoxError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let meta = phoenix_server::parse_meta_members(&args.meta)?;
    let mut cfg = phoenix_server::Config::new(args.id, &args.listen, args.data_dir, meta);
    if let Some(a) = args.advertise {
        cfg.advertise = a;
    }
    cfg.engine_wal = args.engine_wal;
    cfg.replication = args.replication;
    cfg.split_keys = match args.initial_groups {
        Some(n) => phoenix_server::even_split_keys(n).map_err(|_| {
            format!(
                "--initial-groups must be in 1..={}",
                phoenix_server::INITIAL_GROUPS_MAX
            )
        })?,
        None => args
            .split_keys
            .into_iter()
            .map(String::into_bytes)
            .collect(),
    };
    cfg.memtable_bytes = args.memtable_mb.max(1) << 20;
    cfg.sst_store = args.sst_store;
    cfg.sst_cache_bytes = args.sst_cache_mb.saturating_mul(1 << 20);
    cfg.compactor = args.compactor;
    cfg.compactor_timeout = args.compactor_timeout;
    cfg.log_keep_entries = args.log_keep_entries;
    cfg.log_truncate_interval = Duration::from_millis(args.log_truncate_ms.max(10));
    cfg.value_bytes_max = args.value_max_bytes;
    cfg.tick = Duration::from_millis(args.tick_ms.max(1));
    cfg.hibernate_ticks = args.hibernate_ticks;
    cfg.snapshot_bytes_per_sec = args.snapshot_mb_per_sec.max(1) << 20;
    cfg.snapshot_by_copy = !args.snapshot_no_copy;
    cfg.reserve_space = args.reserve_space_mb.saturating_mul(1 << 20);
    cfg.metrics_listen = args.metrics_listen;
    cfg.security = phoenix_server::Security {
        tls: phoenix_proto::security::TlsFiles::from_flags(
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
        )?,
        tokens: match &args.token_file {
            Some(f) => phoenix_proto::security::read_tokens(f)?,
            None => Vec::new(),
        },
    };
    let resp_listen = args.resp_listen;
    // The default user takes the password file's password and every token.
    let mut resp_secrets: Vec<Vec<u8>> = cfg
        .security
        .tokens
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .collect();
    if let Some(f) = &args.resp_password_file {
        resp_secrets.push(read_password(f)?);
    }
    let resp_password = phoenix_resp::Password::any_of(resp_secrets);
    let resp_tls = match &cfg.security.tls {
        Some(t) => Some(phoenix_resp::Tls::new(t)?),
        None => None,
    };
    let resp_credentials = cfg.security.credentials()?;
    let node_id = cfg.node_id;
    let advertise = cfg.advertise.clone();
    let requests = phoenix_server::Requests::default();
    // This node first, then the meta members: the client finds the rest.
    let mut resp_endpoints = vec![cfg.advertise.clone()];
    for m in &cfg.meta {
        if !resp_endpoints.contains(&m.addr) {
            resp_endpoints.push(m.addr.clone());
        }
    }
    cfg.balance_leaders = !args.no_balance_leaders;
    cfg.balance_replicas = !args.no_balance_replicas;
    cfg.down_after = args.down_after;
    cfg.scrub_interval = args.scrub_interval;
    cfg.group_split_bytes = args.split_size_mb.saturating_mul(1 << 20);
    cfg.group_split_keys = args.split_size_keys;
    cfg.group_split_qps = args.split_qps;
    cfg.group_merge_bytes = args.merge_size_mb.saturating_mul(1 << 20);
    cfg.group_merge_keys = args.merge_size_keys;
    cfg.merge_after = args.merge_after;
    cfg.split_check_interval = args.split_check_interval.max(Duration::from_millis(100));
    cfg.fault_injection = args.fault_injection;
    cfg.unsynced_in_memory = args.unsynced_in_memory;
    cfg.drop_mode = match args.drop_mode {
        DropModeArg::Files => phoenix_server::DropMode::Files,
        DropModeArg::RangeDelete => phoenix_server::DropMode::RangeDelete,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("phoenix-io")
        .build()?;
    rt.block_on(async move {
        // The Redis front end listens before the node starts, so a port taken fails the
        // start. It reaches the cluster as any client does (routing, retries, sessions),
        // but its calls to this node's groups are served in the process, not over a
        // connection. It stops taking connections when the node starts stopping.
        let (stopping, stop_seen) = tokio::sync::watch::channel(false);
        let resp = match &resp_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("--resp-listen {addr}: {e}"))?;
                tracing::info!(addr = %addr, "serving the Redis protocol");
                let client = phoenix_client::Client::new_lazy(
                    resp_endpoints,
                    phoenix_client::ClientOptions {
                        local_node: Some(std::sync::Arc::new(phoenix_resp::InNode::new(
                            advertise.clone(),
                            requests.clone(),
                        ))),
                        credentials: resp_credentials,
                        ..phoenix_client::ClientOptions::default()
                    },
                )?;
                let store = std::sync::Arc::new(phoenix_resp::ClusterStore::new(client));
                let info = phoenix_resp::ServerInfo {
                    node_id,
                    password: resp_password,
                    ..phoenix_resp::ServerInfo::default()
                };
                let mut stop_seen = stop_seen;
                Some(tokio::spawn(phoenix_resp::serve(
                    listener,
                    store,
                    info,
                    resp_tls,
                    async move {
                        let _ = stop_seen.wait_for(|s| *s).await;
                    },
                )))
            }
            None => None,
        };
        let shutdown = async move {
            stop_signal().await;
            let _ = stopping.send(true);
        };
        let ran = phoenix_server::run_with(cfg, shutdown, requests).await;
        if let Some(task) = resp {
            // The front end was told to stop with the node: its connections answer what
            // they have read, then close (within its own grace).
            let grace = phoenix_resp::CLOSE_GRACE + std::time::Duration::from_secs(1);
            let _ = tokio::time::timeout(grace, task).await;
        }
        ran.map_err(BoxError::from)
    })?;
    Ok(())
}

/// Resolves at Ctrl-C or SIGTERM.
pub async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
}

/// The Redis password in `file` (one trailing newline dropped; empty is refused).
fn read_password(file: &std::path::Path) -> Result<Vec<u8>, BoxError> {
    let mut bytes =
        std::fs::read(file).map_err(|e| format!("--resp-password-file {}: {e}", file.display()))?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    if bytes.is_empty() {
        return Err(format!("--resp-password-file {}: the file is empty", file.display()).into());
    }
    Ok(bytes)
}
