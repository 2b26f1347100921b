//! `phoenix playground`: a whole cluster on loopback in one command.
//!
//! Starts three `phoenix server` processes (children running this same binary), each
//! hosting a replica of the meta group (raft group 0, see docs/cluster.md) and, once the
//! meta leader has seen all three register, of data group 1. Data lives under
//! `./phoenix-data/node-N` (logs in `node-N/server.log`); the node addresses are kept in
//! `./phoenix-data/playground.conf` so a second run starts the same nodes on the same
//! ports over the same data. Ctrl-C (or SIGTERM) stops every node.
//!
//! [`LocalCluster`] is also what `phoenix bench cluster --spawn` uses.

use std::fmt::Write as _;
use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use phoenix_client::routing::Route;
use phoenix_client::{Client, ClientOptions};

use super::local_tls::LocalTls;
use super::minio::Minio;
use super::BoxError;
use crate::output::{self, Report};

/// Flags of `phoenix playground`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding every node's data (created if missing, reused if present).
    #[arg(long = "data-dir", default_value = "./phoenix-data")]
    pub data_dir: PathBuf,
    /// Port of node 1; node N listens on base-port + N - 1; 0 = free ports the system
    /// picks (first run only: later runs reuse the addresses recorded in the data
    /// directory, `playground.conf`).
    #[arg(long = "base-port", default_value_t = 7001)]
    pub base_port: u16,
    /// Extra argument passed to every `phoenix server` (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// How long to wait for the cluster to elect leaders before giving up, in seconds.
    #[arg(long = "ready-timeout", default_value_t = 60)]
    pub ready_timeout_s: u64,
    /// Serve TLS with a token on every port (client, peer, Redis): a CA, certificates
    /// and a token are made under <data-dir>/tls on the first run (kept after), and the
    /// ready message says how to connect.
    #[arg(long)]
    pub tls: bool,
    /// Keep every node's tables on a MinIO server the playground starts on loopback
    /// (data in <data-dir>/minio; the logs stay on local disk). A data directory keeps
    /// the storage it was made with.
    #[arg(long = "shared-storage")]
    pub shared_storage: bool,
    /// The MinIO binary for --shared-storage (default: `minio` on the PATH, else
    /// ~/go/bin/minio).
    #[arg(long = "minio", env = "PHOENIX_MINIO", value_name = "PATH")]
    pub minio: Option<PathBuf>,
    /// Start a new cluster from a backup (`phoenix backup`, `s3://bucket/prefix?…`;
    /// credentials from `AWS_*`): once the cluster is up, the backup's keys are written
    /// into it (`phoenix restore`). Refused for a data directory that holds a cluster.
    #[arg(long, value_name = "S3_URL")]
    pub restore: Option<String>,
}

/// Number of nodes of a local cluster: the meta group needs three.
pub const LOCAL_NODES: u64 = 3;

/// Nodes of a spawned cluster in its meta group: the first ones.
pub const META_MEMBERS: usize = 3;

/// Name of the file that records a local cluster's node addresses.
const CONF_FILE: &str = "playground.conf";

/// How to start a local cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Root directory; node N uses `<dir>/node-N`.
    pub dir: PathBuf,
    /// Addresses of nodes 1..=n, in id order.
    pub addrs: Vec<SocketAddr>,
    /// Extra arguments for every server.
    pub server_args: Vec<String>,
    /// Give every node a metrics port (and its status page) and a Redis-protocol port,
    /// picked free at each start.
    pub status_pages: bool,
    /// Serve TLS and ask for a token, with these files.
    pub tls: Option<LocalTls>,
    /// Keep every node's tables on an S3 server: node N's `--sst-store` is this URL
    /// with `/node-N` added to its prefix ([`node_sst_store`]).
    pub sst_store: Option<String>,
    /// Environment every server gets (the table store's credentials).
    pub env: Vec<(String, String)>,
}

/// Node `id`'s table store URL under `base` (`s3://bucket/prefix?settings`): the prefix
/// gains `/node-<id>`, the settings stay.
pub fn node_sst_store(base: &str, id: usize) -> String {
    let (location, query) = base.split_once('?').unwrap_or((base, ""));
    let location = location.trim_end_matches('/');
    if query.is_empty() {
        format!("{location}/node-{id}")
    } else {
        format!("{location}/node-{id}?{query}")
    }
}

impl ClusterSpec {
    /// The spec recorded in `dir`, or a new one on `base_port..` (free ports if 0),
    /// recorded for next time.
    pub fn load_or_create(dir: &Path, base_port: u16) -> Result<Self, BoxError> {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let conf = dir.join(CONF_FILE);
        let addrs = match fs::read_to_string(&conf) {
            Ok(text) => parse_conf(&text).map_err(|e| format!("{}: {e}", conf.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && base_port == 0 => {
                let addrs = free_ports(LOCAL_NODES as usize)?;
                write_conf(&conf, &addrs)?;
                addrs
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let addrs: Vec<SocketAddr> = (0..LOCAL_NODES)
                    .map(|i| {
                        let port = base_port.checked_add(i as u16).ok_or_else(|| {
                            format!(
                                "--base-port {base_port} leaves no room for {LOCAL_NODES} nodes"
                            )
                        })?;
                        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
                    })
                    .collect::<Result<_, BoxError>>()?;
                write_conf(&conf, &addrs)?;
                addrs
            }
            Err(e) => return Err(format!("read {}: {e}", conf.display()).into()),
        };
        Ok(ClusterSpec {
            dir: dir.to_path_buf(),
            addrs,
            server_args: Vec::new(),
            status_pages: false,
            tls: None,
            sst_store: None,
            env: Vec::new(),
        })
    }

    /// A spec on free ephemeral loopback ports (for benchmarks and tests; not recorded).
    pub fn ephemeral(dir: &Path) -> Result<Self, BoxError> {
        Self::ephemeral_nodes(dir, LOCAL_NODES as usize)
    }

    /// As [`ClusterSpec::ephemeral`], with `n` nodes.
    pub fn ephemeral_nodes(dir: &Path, n: usize) -> Result<Self, BoxError> {
        Ok(ClusterSpec {
            dir: dir.to_path_buf(),
            addrs: free_ports(n)?,
            server_args: Vec::new(),
            status_pages: false,
            tls: None,
            sst_store: None,
            env: Vec::new(),
        })
    }

    /// The `--meta` value naming the first [`META_MEMBERS`] nodes:
    /// `1@addr1,2@addr2,3@addr3`.
    pub fn meta_arg(&self) -> String {
        self.addrs
            .iter()
            .take(META_MEMBERS)
            .enumerate()
            .map(|(i, a)| format!("{}@{a}", i + 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Client endpoints (`host:port` of every node).
    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.iter().map(|a| a.to_string()).collect()
    }
}

fn parse_conf(text: &str) -> Result<Vec<SocketAddr>, String> {
    // Grammar: lines `node <id> <ip:port>`, ids 1..=n in order; '#' starts a comment.
    let mut addrs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["node", id, addr] => {
                let id: usize = id
                    .parse()
                    .map_err(|_| format!("line {}: bad id {id:?}", n + 1))?;
                if id != addrs.len() + 1 {
                    return Err(format!(
                        "line {}: expected node {}, got {id}",
                        n + 1,
                        addrs.len() + 1
                    ));
                }
                let addr: SocketAddr = addr
                    .parse()
                    .map_err(|_| format!("line {}: bad address {addr:?}", n + 1))?;
                addrs.push(addr);
            }
            _ => return Err(format!("line {}: expected `node <id> <ip:port>`", n + 1)),
        }
    }
    if addrs.len() != LOCAL_NODES as usize {
        return Err(format!(
            "expected {LOCAL_NODES} nodes, found {}",
            addrs.len()
        ));
    }
    Ok(addrs)
}

fn write_conf(path: &Path, addrs: &[SocketAddr]) -> Result<(), BoxError> {
    let mut text =
        String::from("# Node addresses of this local cluster (read by `phoenix playground`).\n");
    for (i, a) in addrs.iter().enumerate() {
        text.push_str(&format!("node {} {a}\n", i + 1));
    }
    fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()).into())
}

/// `n` distinct free loopback ports, never handed out twice by this process.
///
/// Taken outside the kernel's ephemeral range (read from
/// `/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default): a port the kernel
/// handed out for `bind(0)` and got back can be taken again as the source port of any
/// outgoing connection (a neighbouring node's, another test's) before our server binds
/// it, and that server then fails to start. Outside the range only another process
/// binding that very port can race us. Each candidate is bound and held until all `n`
/// are picked. Processes start at different places, so pickers side by side rarely meet.
pub fn free_ports(n: usize) -> Result<Vec<SocketAddr>, BoxError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, span) = outside_ephemeral_range();
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let tried = NEXT.fetch_add(1, Ordering::Relaxed);
        if tried >= span {
            return Err(format!(
                "no free loopback port left in {low}..{} for this process",
                low + span
            )
            .into());
        }
        let port = u16::try_from(low + (start + tried) % span)
            .map_err(|_| format!("port range {low}+{span} passes 65535"))?;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    held.iter()
        .map(|l| {
            l.local_addr()
                .map_err(|e| format!("local address: {e}").into())
        })
        .collect()
}

/// The first port and the length of a span of ports the kernel does not hand out on
/// its own: below its ephemeral range when there is room there (from 10000), above it
/// otherwise.
fn outside_ephemeral_range() -> (u32, u32) {
    const LOW: u32 = 10_000;
    let (lo, hi) = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u32>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999));
    if lo >= LOW + 4_096 {
        (LOW, lo - LOW)
    } else if hi < 65_535 - 1_024 {
        (hi + 1, 65_535 - hi)
    } else {
        // The whole space is ephemeral: nothing better than the kernel's own range.
        (LOW, 65_535 - LOW + 1)
    }
}

/// One running child process with a name and a log file.
#[derive(Debug)]
pub struct Proc {
    /// What it is ("node 2", "etcd 1").
    pub name: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    child: Option<Child>,
    /// The command line it was started with (for [`Proc::restart`]).
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    /// The environment it was given (set, or removed: `None`).
    envs: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
}

impl Proc {
    /// Starts `cmd` with stdout/stderr appended to `log`.
    pub fn spawn(name: String, mut cmd: Command, log: PathBuf) -> Result<Self, BoxError> {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("dup {}: {e}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd.spawn().map_err(|e| format!("start {name}: {e}"))?;
        Ok(Proc {
            name,
            log,
            child: Some(child),
            program: cmd.get_program().to_os_string(),
            args: cmd.get_args().map(|a| a.to_os_string()).collect(),
            envs: cmd
                .get_envs()
                .map(|(k, v)| (k.to_os_string(), v.map(|v| v.to_os_string())))
                .collect(),
        })
    }

    /// Starts the same command line again (after [`Proc::kill`] or an exit), its output
    /// appended to the same log. Does nothing if it still runs.
    pub fn restart(&mut self) -> Result<(), BoxError> {
        if self.is_running() {
            return Ok(());
        }
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let again = Proc::spawn(self.name.clone(), cmd, self.log.clone())?;
        self.child = Some(again.into_child()?);
        Ok(())
    }

    fn into_child(mut self) -> Result<Child, BoxError> {
        self.child
            .take()
            .ok_or_else(|| format!("{}: no child after spawning", self.name).into())
    }

    /// The exit status if the process has ended (it is then reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status)
            }
            _ => None,
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) if still running.
    pub fn signal(&mut self, signal: i32) {
        if let Some(child) = &self.child {
            let pid = child.id() as libc::pid_t;
            // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own
            // child, not yet reaped (so not reused).
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit.
    pub fn stop(&mut self, grace: Duration) {
        if self.child.is_none() {
            return;
        }
        self.signal(libc::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < grace {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// SIGKILL and wait (a crash, for tests and benchmarks).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// A set of `phoenix server` children forming one cluster.
#[derive(Debug)]
pub struct LocalCluster {
    /// How it was started.
    pub spec: ClusterSpec,
    /// Node N is `nodes[N-1]`.
    pub nodes: Vec<Proc>,
    /// Node N's metrics port, which serves its status page at `/` (None unless the spec
    /// asks for status pages, or when the server arguments name their own
    /// `--metrics-listen`).
    pub metrics: Vec<Option<SocketAddr>>,
    /// Node N's Redis-protocol port (None unless the spec asks for status pages, or when
    /// the server arguments name their own `--resp-listen`).
    pub resp: Vec<Option<SocketAddr>>,
}

impl LocalCluster {
    /// Starts every node of `spec` (each in `<dir>/node-N`).
    pub fn start(spec: ClusterSpec) -> Result<Self, BoxError> {
        let mut held = Vec::new();
        for addr in &spec.addrs {
            match TcpListener::bind(addr) {
                Ok(l) => held.push(l),
                Err(e) => {
                    return Err(format!(
                        "{addr} is not free ({e}): is another cluster running on it? (stop it, \
                         or use another --data-dir / --base-port)"
                    )
                    .into())
                }
            }
        }
        // Each node's metrics port (and status page) and Redis-protocol port, picked at
        // once while the nodes' own ports are held, so that none is picked twice.
        let n = spec.addrs.len();
        let wanted =
            |flag: &str| spec.status_pages && !spec.server_args.iter().any(|a| a.starts_with(flag));
        let (want_metrics, want_resp) = (wanted("--metrics-listen"), wanted("--resp-listen"));
        let mut picked = free_ports(n * (usize::from(want_metrics) + usize::from(want_resp)))?
            .into_iter()
            .map(Some);
        let mut take = |want: bool| -> Vec<Option<SocketAddr>> {
            if want {
                picked.by_ref().take(n).collect()
            } else {
                vec![None; n]
            }
        };
        let metrics = take(want_metrics);
        let resp = take(want_resp);
        drop(held);
        let exe = std::env::current_exe().map_err(|e| format!("locate the phoenix binary: {e}"))?;
        let meta = spec.meta_arg();
        let mut nodes = Vec::new();
        for (i, addr) in spec.addrs.iter().enumerate() {
            let id = i + 1;
            let dir = spec.dir.join(format!("node-{id}"));
            fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let mut cmd = Command::new(&exe);
            cmd.arg("server")
                .arg("--id")
                .arg(id.to_string())
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--data-dir")
                .arg(&dir)
                .arg("--meta")
                .arg(&meta)
                .args(&spec.server_args);
            if let Some(t) = &spec.tls {
                cmd.args(t.server_args());
            }
            if let Some(m) = metrics[i] {
                cmd.arg("--metrics-listen").arg(m.to_string());
            }
            if let Some(r) = resp[i] {
                cmd.arg("--resp-listen").arg(r.to_string());
            }
            if let Some(base) = &spec.sst_store {
                cmd.arg("--sst-store").arg(node_sst_store(base, id));
            }
            cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
            nodes.push(Proc::spawn(
                format!("node {id}"),
                cmd,
                dir.join("server.log"),
            )?);
        }
        Ok(LocalCluster {
            spec,
            nodes,
            metrics,
            resp,
        })
    }

    /// Waits until the cluster serves requests: routes known and every data group has
    /// a leader that answers a read. Fails early if a node process exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<Client, BoxError> {
        let start = Instant::now();
        let mut last_err = String::from("no answer yet");
        let credentials = match &self.spec.tls {
            Some(t) => t.credentials()?,
            None => Default::default(),
        };
        while start.elapsed() < timeout {
            for node in &mut self.nodes {
                if let Some(status) = node.exited() {
                    return Err(format!(
                        "{} exited during startup ({status}); see {}",
                        node.name,
                        node.log.display()
                    )
                    .into());
                }
            }
            let opts = ClientOptions {
                timeout: Duration::from_secs(2),
                credentials: credentials.clone(),
                ..ClientOptions::default()
            };
            match Client::connect(self.spec.endpoints(), opts).await {
                Ok(client) => match client.ready_probe().await {
                    Ok(()) => return Ok(client),
                    Err(e) => last_err = e.to_string(),
                },
                Err(e) => last_err = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!(
            "the cluster did not become ready within {:?} (last: {last_err}); logs: {}/node-*/server.log",
            timeout,
            self.spec.dir.display()
        )
        .into())
    }

    /// Stops every node (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(&mut self) {
        for n in &mut self.nodes {
            n.signal(libc::SIGTERM);
        }
        for n in &mut self.nodes {
            n.stop(Duration::from_secs(10));
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the playground until Ctrl-C.
pub fn run(args: Args, report: Report) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    rt.block_on(serve(args, report))
}

async fn serve(args: Args, report: Report) -> Result<(), BoxError> {
    let reused = args.data_dir.join(CONF_FILE).exists();
    if reused && args.restore.is_some() {
        return Err(format!(
            "--restore starts a new cluster; {} holds one already",
            args.data_dir.display()
        )
        .into());
    }
    let mut spec = ClusterSpec::load_or_create(&args.data_dir, args.base_port)?;
    spec.server_args = args.server_args.clone();
    spec.status_pages = true;
    if args.tls {
        spec.tls = Some(LocalTls::load_or_create(&args.data_dir)?);
    }
    // (A node's directory, not the conf: a first start that failed before any node
    // started leaves the conf but no data.)
    let record = check_storage(
        &args.data_dir,
        has_data(&args.data_dir),
        args.shared_storage,
    )?;
    // (Before anything starts: a SIGTERM while the cluster comes up stops it too.)
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("install the SIGTERM handler: {e}"))?;
    // (Declared before the cluster: dropped after it, once the nodes stopped.)
    let minio = match args.shared_storage {
        true => Some(Minio::start(&args.data_dir, args.minio.clone())?),
        false => None,
    };
    // Recorded once the storage serves, before any node writes to it: a first start that
    // failed before leaves the choice open.
    if let Some(record) = record {
        record.write()?;
    }
    if let Some(m) = &minio {
        spec.sst_store = Some(m.table_store_url("cluster"));
        spec.env = m.client_env();
    }
    let mut cluster = LocalCluster::start(spec)?;
    report.line(format_args!(
        "Starting a PhoenixKV playground: {} nodes, data in {} ({})",
        LOCAL_NODES,
        args.data_dir.display(),
        if reused {
            "reusing existing data"
        } else {
            "new cluster"
        }
    ));
    let client = tokio::select! {
        r = cluster.wait_ready(Duration::from_secs(args.ready_timeout_s)) => r?,
        _ = tokio::signal::ctrl_c() => {
            report.line(format_args!("interrupted; stopping"));
            cluster.stop();
            return Ok(());
        }
        _ = sigterm.recv() => {
            report.line(format_args!("terminated; stopping"));
            cluster.stop();
            return Ok(());
        }
    };
    if let Some(url) = &args.restore {
        // (The URL is not printed: it may carry credentials.)
        report.line(format_args!("restoring the backup into the new cluster..."));
        let work = args.data_dir.join("restore-work");
        let restorer = client.with_timeout(Duration::from_secs(10));
        let restored = tokio::select! {
            r = super::backup::restore(&restorer, url, &work, 16, false) => r,
            _ = tokio::signal::ctrl_c() => {
                report.line(format_args!("interrupted; stopping"));
                cluster.stop();
                return Ok(());
            }
            _ = sigterm.recv() => {
                report.line(format_args!("terminated; stopping"));
                cluster.stop();
                return Ok(());
            }
        };
        match restored {
            Ok(r) => report.line(format_args!(
                "restored {} keys ({} bytes) of {} groups in {:.1} s; {} had expired",
                r.keys, r.bytes, r.groups, r.secs, r.expired
            )),
            Err(e) => {
                cluster.stop();
                return Err(format!("restoring the backup: {e}").into());
            }
        }
    }
    // The client found each group's leader while probing readiness.
    let routes = client.cached_routes();
    drop(client);
    if report.json() {
        report.summary(&ready_json(&cluster, &routes, reused, minio.as_ref()))?;
    } else {
        report.text(&ready_text(&cluster, &routes, minio.as_ref()));
    }

    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                let mut running = 0;
                for n in &mut cluster.nodes {
                    if let Some(status) = n.exited() {
                        output::note(format_args!(
                            "{} exited ({status}); see {}",
                            n.name,
                            n.log.display()
                        ));
                    }
                    if n.is_running() {
                        running += 1;
                    }
                }
                if running == 0 {
                    return Err("every node has exited; see the logs above".into());
                }
            }
        }
    }
    report.line(format_args!("stopping the playground..."));
    cluster.stop();
    drop(minio);
    report.line(format_args!(
        "stopped; the data stays in {}",
        args.data_dir.display()
    ));
    Ok(())
}

/// Name of the file that records where a playground's tables are (`local` or
/// `shared`).
const STORAGE_FILE: &str = "storage";

/// Refuses to start the cluster in `dir` on another storage than it was made with (its
/// tables would not be found: the nodes would start empty). A directory whose nodes
/// hold data (`has_data`) from before the record existed is `local`. On a first start, returns the record to write once the
/// storage serves.
fn check_storage(
    dir: &Path,
    has_data: bool,
    shared: bool,
) -> Result<Option<StorageRecord>, BoxError> {
    let path = dir.join(STORAGE_FILE);
    let want = if shared { "shared" } else { "local" };
    let had = match fs::read_to_string(&path) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && has_data => "local".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Some(StorageRecord { path, want }));
        }
        Err(e) => return Err(format!("read {}: {e}", path.display()).into()),
    };
    match (had.as_str(), shared) {
        ("shared", true) | ("local", false) => Ok(None),
        ("shared", false) => Err(format!(
            "{} holds a cluster whose tables are on MinIO: start it with --shared-storage, \
             or use another --data-dir",
            dir.display()
        )
        .into()),
        ("local", true) => Err(format!(
            "{} holds a cluster whose tables are on local disk: start it without \
             --shared-storage, or use another --data-dir",
            dir.display()
        )
        .into()),
        (other, _) => Err(format!("{}: unknown storage {other:?}", path.display()).into()),
    }
}

/// Whether any node of the playground in `dir` has a data directory (a start got as far
/// as its nodes).
fn has_data(dir: &Path) -> bool {
    (1..=LOCAL_NODES).any(|n| dir.join(format!("node-{n}")).exists())
}

/// The storage a data directory's first start chose, to record.
#[derive(Debug)]
struct StorageRecord {
    path: PathBuf,
    want: &'static str,
}

impl StorageRecord {
    fn write(self) -> Result<(), BoxError> {
        fs::write(&self.path, format!("{}\n", self.want))
            .map_err(|e| format!("write {}: {e}", self.path.display()).into())
    }
}

/// The "playground is up" message: addresses, groups, commands to try.
fn ready_text(cluster: &LocalCluster, routes: &[Route], minio: Option<&Minio>) -> String {
    let mut out = String::new();
    let first = cluster.spec.addrs[0];
    let _ = writeln!(out, "\nPhoenixKV playground is up.");
    for (i, a) in cluster.spec.addrs.iter().enumerate() {
        let _ = writeln!(
            out,
            "  node {}: {a}  (data {}, log {})",
            i + 1,
            cluster.spec.dir.join(format!("node-{}", i + 1)).display(),
            cluster.nodes[i].log.display()
        );
    }
    if let Some(Some(m)) = cluster.metrics.first() {
        let _ = writeln!(
            out,
            "  status page: http://{m}/  (metrics: http://{m}/metrics)"
        );
    }
    if let Some(m) = minio {
        let _ = writeln!(
            out,
            "  tables: on MinIO at {}, bucket {}, prefix cluster/node-N  (data {}, log {})",
            m.endpoint(),
            super::minio::BUCKET,
            m.data().display(),
            m.log().display()
        );
    }
    let tls = cluster.spec.tls.as_ref();
    if let Some(Some(r)) = cluster.resp.first() {
        let tls_flags = tls.map_or(String::new(), |t| {
            format!(" --tls --cacert {} --askpass", t.ca.display())
        });
        let _ = writeln!(
            out,
            "  Redis protocol: redis-cli -h {} -p {}{tls_flags} (every node: --output json lists them)",
            r.ip(),
            r.port()
        );
    }
    for r in routes {
        let leader = r
            .leader
            .map_or("electing".to_string(), |l| format!("node {l}"));
        let _ = writeln!(
            out,
            "  group {}: replicas {:?}, leader {leader}",
            r.group_id, r.replicas
        );
    }
    let _ = writeln!(out, "\nTry, in another terminal:");
    if let Some(t) = tls {
        let _ = writeln!(
            out,
            "  export PHOENIX_TLS_CA={} PHOENIX_TOKEN_FILE={}",
            t.ca.display(),
            t.token_file.display()
        );
    }
    let _ = writeln!(out, "  phoenix put --endpoints {first} hello world");
    let _ = writeln!(out, "  phoenix get --endpoints {first} hello");
    let _ = writeln!(out, "  phoenix scan --endpoints {first} --prefix h");
    let _ = writeln!(out, "  phoenix cluster status --endpoints {first}");
    let _ = writeln!(
        out,
        "\nCtrl-C stops the cluster (the data stays for the next run)."
    );
    out
}

/// The same as one JSON object, for scripts that start a playground. Paths are given as
/// displayed (`json!` would panic on a path that is not UTF-8).
fn ready_json(
    cluster: &LocalCluster,
    routes: &[Route],
    reused: bool,
    minio: Option<&Minio>,
) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = cluster
        .spec
        .addrs
        .iter()
        .zip(&cluster.nodes)
        .enumerate()
        .map(|(i, (a, p))| {
            serde_json::json!({
                "node_id": i + 1,
                "addr": a.to_string(),
                "data_dir": cluster.spec.dir.join(format!("node-{}", i + 1)).display().to_string(),
                "log": p.log.display().to_string(),
                "status_page": cluster.metrics.get(i).copied().flatten().map(|m| format!("http://{m}/")),
                "resp": cluster.resp.get(i).copied().flatten().map(|r| r.to_string()),
            })
        })
        .collect();
    let groups: Vec<serde_json::Value> = routes
        .iter()
        .map(|r| {
            serde_json::json!({
                "group_id": r.group_id,
                "replicas": r.replicas,
                "leader": r.leader,
            })
        })
        .collect();
    let tls = cluster.spec.tls.as_ref().map(|t| {
        serde_json::json!({
            "ca": t.ca.display().to_string(),
            "token_file": t.token_file.display().to_string(),
            "client_cert": t.client_cert.display().to_string(),
            "client_key": t.client_key.display().to_string(),
        })
    });
    let shared_storage = minio.map(|m| {
        serde_json::json!({
            "endpoint": m.endpoint(),
            "bucket": super::minio::BUCKET,
            "prefix": "cluster",
            "data": m.data().display().to_string(),
            "log": m.log().display().to_string(),
        })
    });
    serde_json::json!({
        "ready": true,
        "data_dir": cluster.spec.dir.display().to_string(),
        "reused": reused,
        "endpoints": cluster.spec.endpoints().join(","),
        "nodes": nodes,
        "groups": groups,
        "tls": tls,
        "shared_storage": shared_storage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data directory keeps the storage it was made with: the other is refused with
    /// a message naming the flag; one made before the record is local.
    #[test]
    fn a_data_dir_keeps_its_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        fs::create_dir_all(&shared).unwrap();
        // Not recorded until written: either way is open.
        assert!(check_storage(&shared, false, false).unwrap().is_some());
        check_storage(&shared, false, true)
            .unwrap()
            .unwrap()
            .write()
            .unwrap();
        assert!(check_storage(&shared, true, true).unwrap().is_none());
        let e = check_storage(&shared, true, false).unwrap_err().to_string();
        assert!(e.contains("start it with --shared-storage"), "{e}");
        let local = tmp.path().join("local");
        fs::create_dir_all(&local).unwrap();
        check_storage(&local, false, false)
            .unwrap()
            .unwrap()
            .write()
            .unwrap();
        let e = check_storage(&local, true, true).unwrap_err().to_string();
        assert!(e.contains("without --shared-storage"), "{e}");
        // Made before the record: local.
        let old = tmp.path().join("old");
        fs::create_dir_all(&old).unwrap();
        assert!(check_storage(&old, true, true).is_err());
        check_storage(&old, true, false).unwrap();
        // A first start that failed before its nodes (no MinIO yet) left its conf, not
        // data: either way is still open.
        let failed = tmp.path().join("failed");
        fs::create_dir_all(&failed).unwrap();
        fs::write(failed.join(CONF_FILE), "").unwrap();
        assert!(!has_data(&failed));
        assert!(check_storage(&failed, has_data(&failed), false)
            .unwrap()
            .is_some());
        fs::create_dir_all(failed.join("node-2")).unwrap();
        assert!(has_data(&failed));
        fs::write(old.join(STORAGE_FILE), "tape\n").unwrap();
        let e = check_storage(&old, true, false).unwrap_err().to_string();
        assert!(e.contains("unknown storage"), "{e}");
    }

    #[test]
    fn conf_round_trip_and_errors() {
        let dir = std::env::temp_dir().join(format!("phoenix-pg-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = ClusterSpec::load_or_create(&dir, 17001).unwrap();
        assert_eq!(
            a.endpoints(),
            vec!["127.0.0.1:17001", "127.0.0.1:17002", "127.0.0.1:17003"]
        );
        assert_eq!(
            a.meta_arg(),
            "1@127.0.0.1:17001,2@127.0.0.1:17002,3@127.0.0.1:17003"
        );
        // A second run ignores a different base port: the recorded addresses win.
        let b = ClusterSpec::load_or_create(&dir, 9000).unwrap();
        assert_eq!(a.addrs, b.addrs);
        fs::remove_dir_all(&dir).unwrap();

        // Base port 0: free ports, recorded like any others.
        let free = ClusterSpec::load_or_create(&dir, 0).unwrap();
        assert_eq!(free.addrs.len(), LOCAL_NODES as usize);
        assert!(free
            .addrs
            .iter()
            .all(|a| a.port() != 0 && a.ip().is_loopback()));
        assert_eq!(
            ClusterSpec::load_or_create(&dir, 7001).unwrap().addrs,
            free.addrs
        );
        fs::remove_dir_all(&dir).unwrap();

        assert!(parse_conf("node 1 127.0.0.1:1\nnode 2 127.0.0.1:2\n").is_err());
        assert!(parse_conf("node 1 127.0.0.1:1\nnode 3 127.0.0.1:2\nnode 2 127.0.0.1:3").is_err());
        assert!(parse_conf("node 1 nope\n").is_err());
        let ok =
            parse_conf("# c\nnode 1 127.0.0.1:1\n\nnode 2 127.0.0.1:2 # x\nnode 3 127.0.0.1:3\n");
        assert_eq!(ok.unwrap().len(), 3);
    }

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(3).unwrap();
        let q = free_ports(3).unwrap();
        let all: std::collections::BTreeSet<_> = p.iter().chain(&q).collect();
        assert_eq!(all.len(), 6, "{p:?} {q:?}");
        // None from the range the kernel hands out to bind(0) and to outgoing connections.
        let (low, span) = outside_ephemeral_range();
        for a in all {
            let port = u32::from(a.port());
            assert!(
                (low..low + span).contains(&port),
                "{a} outside {low}+{span}"
            );
        }
    }
}
