//! Node configuration (from `phoenix server` flags) and its validation.

use std::path::PathBuf;
use std::time::Duration;

use phoenix_proto::security::{Credentials, Gate, TlsFiles};

use crate::error::{Error, Result};

/// One member of the meta group: `id@host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaMember {
    /// Node id.
    pub id: u64,
    /// gRPC address.
    pub addr: String,
}

/// Parses `1@127.0.0.1:7001,2@127.0.0.1:7002,...`.
pub fn parse_meta_members(s: &str) -> Result<Vec<MetaMember>> {
    let mut out: Vec<MetaMember> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('@').ok_or_else(|| {
            Error::Config(format!(
                "meta member {part:?} is not of the form id@host:port"
            ))
        })?;
        let id: u64 = id
            .parse()
            .map_err(|_| Error::Config(format!("meta member {part:?}: bad node id")))?;
        if id == 0 {
            return Err(Error::Config("node id 0 is reserved".into()));
        }
        if out.iter().any(|m| m.id == id || m.addr == addr) {
            return Err(Error::Config(format!("meta member {part:?} listed twice")));
        }
        out.push(MetaMember {
            id,
            addr: addr.to_string(),
        });
    }
    if out.is_empty() {
        return Err(Error::Config("--meta lists no members".into()));
    }
    Ok(out)
}

/// Everything a node needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id (unique in the cluster, not 0).
    pub node_id: u64,
    /// Address to listen on (host:port).
    pub listen: String,
    /// Address other nodes and clients use to reach this node (defaults to `listen`).
    pub advertise: String,
    /// Data directory (engine in `db/`, log store in `log/`).
    pub data_dir: PathBuf,
    /// Meta group members.
    pub meta: Vec<MetaMember>,
    /// Replicas per data group.
    pub replication: usize,
    /// Split keys of the initial data groups (n keys → n + 1 groups).
    pub split_keys: Vec<Vec<u8>>,
    /// Keep the engine's own WAL on (the comparison baseline of seed 000) instead of
    /// relying on the raft log (log-as-WAL).
    pub engine_wal: bool,
    /// Engine memtable size in bytes.
    pub memtable_bytes: usize,
    /// Where the engine keeps its tables and manifest when not in `db/`: an S3 URL
    /// (`s3://bucket/prefix?endpoint=…`, see `ObjectTableStore::from_url`). The prefix is
    /// this node's alone: a second node opening it takes it over and fences this one.
    pub sst_store: Option<String>,
    /// Bytes of the local flash cache of remote table pages (`data/sst-cache/`), with
    /// `sst_store`; 0: none.
    pub sst_cache_bytes: u64,
    /// A compaction worker (`phoenix compactor`, host:port) that runs the engine's
    /// background compactions over `sst_store` (compactor.rs); `None`: they run here.
    pub compactor: Option<String>,
    /// How long the node waits for the worker's answer to one compaction before it
    /// compacts itself.
    pub compactor_timeout: Duration,
    /// Raft tick.
    pub tick: Duration,
    /// Election timeout in ticks (randomized up to twice this).
    pub election_ticks: u32,
    /// Heartbeat interval in ticks.
    pub heartbeat_ticks: u32,
    /// Ticks a leader waits without requests before its group hibernates (its timers
    /// stop on every replica until a message or request; 0: never).
    pub hibernate_ticks: u32,
    /// Entries kept in a group's log below the persisted applied index for followers
    /// that lag; a follower further behind gets a snapshot.
    pub log_keep_entries: u64,
    /// How often logs are truncated to the persisted applied index.
    pub log_truncate_interval: Duration,
    /// Largest value accepted.
    pub value_bytes_max: usize,
    /// Requests in flight at most; beyond, requests get ServerBusy.
    pub inflight_requests_max: usize,
    /// Snapshot streaming rate limit in bytes per second.
    pub snapshot_bytes_per_sec: u64,
    /// Whether a leader whose tables are on a shared store (`sst_store`) sends a group's
    /// snapshot by copy: the receiver copies the group's tables on the store, and only
    /// the rest is streamed (snapshot.rs). Off: every snapshot is streamed whole.
    pub snapshot_by_copy: bool,
    /// Node → meta heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Free bytes kept on the data disk: under them the node refuses client writes
    /// (`DiskFull`) until space returns (0: never).
    pub reserve_space: u64,
    /// How often the data disk's free space is sampled.
    pub disk_check_interval: Duration,
    /// As the meta leader, move leaderships so that every node leads about as many
    /// groups (within 10% of the mean, or one, as far as the placement allows).
    pub balance_leaders: bool,
    /// As the meta leader, move replicas so that every node hosts about as many (within
    /// 10% of the mean, or one), and trim groups to `replication` voters.
    pub balance_replicas: bool,
    /// As the meta leader, replace the replicas of a node not heard from for this long
    /// (`phoenix_meta::repair_replicas`); zero: never.
    pub down_after: Duration,
    /// A group this node leads whose data passes this many bytes (approximately, from
    /// the engine's tables) is split at its middle key (0: not by size).
    pub group_split_bytes: u64,
    /// A group this node leads whose data passes this many entries is split at its
    /// middle key (0: not by key count).
    pub group_split_keys: u64,
    /// A group this node leads that serves more requests a second than this over a
    /// split check interval is split at the median of its requests' keys (0: not by
    /// load).
    pub group_split_qps: u64,
    /// How often the node measures its groups for splitting.
    pub split_check_interval: Duration,
    /// As the meta leader, merge two neighbouring groups (same replicas) whose data
    /// together is under this many bytes and `group_merge_keys` entries (0: never).
    pub group_merge_bytes: u64,
    /// See `group_merge_bytes`.
    pub group_merge_keys: u64,
    /// A group is merged by size only once its range has stayed put this long, as this
    /// meta leader saw it (a group just split by load is not merged back at once).
    pub merge_after: Duration,
    /// As the meta leader, scrub every group once per this long (its replicas checksum
    /// their data at a scrub point and the meta leader compares them); zero: never.
    pub scrub_interval: Duration,
    /// Address of the metrics endpoint (`GET /metrics`, Prometheus text), if any.
    pub metrics_listen: Option<String>,
    /// Serve the `Faults` service (cut links on request), for fault runs only.
    pub fault_injection: bool,
    /// Keep bytes not yet synced in this process's memory instead of the OS page cache,
    /// so that killing the node is a power loss for its files (`PowerLossFs`). For fault
    /// runs only.
    pub unsynced_in_memory: bool,
    /// How a replica's old data leaves the engine when the replica is dropped or a
    /// snapshot replaces it.
    pub drop_mode: DropMode,
    /// TLS and tokens for client, peer and Redis-protocol traffic.
    pub security: Security,
}

/// How a node secures its traffic (`phoenix_proto::security`): with `tls`, its port
/// speaks TLS only, with its certificate, and peers check each other against the CA;
/// with `tokens`, callers may come in by one of them. The node presents the first token
/// to its peers (they take it when no certificate lets it in).
#[derive(Clone, Default)]
pub struct Security {
    /// The CA, and this node's certificate and key.
    pub tls: Option<TlsFiles>,
    /// Tokens callers may present.
    pub tokens: Vec<String>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl Security {
    /// What this node presents to the nodes it calls.
    pub fn credentials(&self) -> Result<Credentials> {
        Credentials::new(self.tls.as_ref(), self.tokens.first().map(String::as_str))
            .map_err(|e| Error::Config(e.to_string()))
    }

    /// A gRPC server builder speaking TLS when configured (`what` serves, for messages).
    /// Without tokens a caller can come in by its certificate only.
    pub fn server(&self, what: &str) -> Result<tonic::transport::Server> {
        let server = tonic::transport::Server::builder();
        let Some(t) = &self.tls else {
            return Ok(server);
        };
        let tls = t
            .server_config(!self.tokens.is_empty())
            .map_err(|e| Error::Config(e.to_string()))?;
        server
            .tls_config(tls)
            .map_err(|e| Error::Config(format!("TLS for {what}: {e}")))
    }

    /// What this node asks of its callers.
    pub fn gate(&self) -> Gate {
        Gate::new(self.tokens.clone(), self.tls.is_some())
    }
}

/// How a replica's old data leaves the engine (seed 000, §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DropMode {
    /// Its files are deleted at once (`Db::drop_groups`, `Db::replace_group`): group-cut
    /// compaction keeps each group's data in files of its own.
    #[default]
    Files,
    /// A range tombstone hides it and compaction removes it later
    /// (`Db::replace_group_by_tombstone`), as stock RocksDB users do: the baseline the
    /// repair benchmark compares with. Not for production.
    RangeDelete,
}

impl Config {
    /// Idle ticks before a group sleeps. Short: a group that takes an occasional write
    /// then sleeps at once costs two `Hibernate` messages, where staying awake costs a
    /// heartbeat round every `heartbeat_ticks` (with writes spread over 10,000 groups,
    /// 2 s awake per write was ~40 heartbeat messages per write and cut throughput to a
    /// seventh). A busy group never reaches it (each request resets the count).
    pub const DEFAULT_HIBERNATE_TICKS: u32 = 5;

    /// Free disk space kept by default: room for a few memtable flushes, the log
    /// segments being filled and a compaction's output while writes are refused.
    pub const DEFAULT_RESERVE_SPACE: u64 = 512 << 20;

    /// How long a node is down before its replicas are replaced, by default: a restart
    /// or a short outage is waited out (TiKV waits 30 min, for a whole store's worth of
    /// snapshots; a metadata group here is small, and each replaced replica is one).
    pub const DEFAULT_DOWN_AFTER: Duration = Duration::from_secs(30);

    /// Size past which a group splits by default (TiKV's region split size).
    pub const DEFAULT_GROUP_SPLIT_BYTES: u64 = 96 << 20;

    /// Entries past which a group splits by default (TiKV's region split keys, about).
    pub const DEFAULT_GROUP_SPLIT_KEYS: u64 = 1_000_000;

    /// Requests a second past which a group splits by load by default (TiKV's
    /// load-based split threshold).
    pub const DEFAULT_GROUP_SPLIT_QPS: u64 = 3000;
    /// Bytes under which two neighbours are merged by default (TiKV's
    /// `max-merge-region-size`).
    pub const DEFAULT_GROUP_MERGE_BYTES: u64 = 20 << 20;
    /// Entries under which two neighbours are merged by default (TiKV's
    /// `max-merge-region-keys`).
    pub const DEFAULT_GROUP_MERGE_KEYS: u64 = 200_000;

    /// Defaults for a node; `listen` is also the advertised address.
    pub fn new(node_id: u64, listen: &str, data_dir: PathBuf, meta: Vec<MetaMember>) -> Config {
        Config {
            node_id,
            listen: listen.to_string(),
            advertise: listen.to_string(),
            data_dir,
            meta,
            replication: 3,
            split_keys: Vec::new(),
            engine_wal: false,
            memtable_bytes: 64 << 20,
            sst_store: None,
            compactor: None,
            compactor_timeout: Duration::from_secs(30 * 60),
            sst_cache_bytes: 1 << 30,
            // Election 0.5–1 s, heartbeat 50 ms: a dead or paused leader is replaced
            // within about a second (pre-vote and check-quorum keep the short timeout
            // from unseating a healthy one; a stalled driver skips ticks rather than
            // bunching them). Only awake groups tick.
            tick: Duration::from_millis(10),
            election_ticks: 50,
            heartbeat_ticks: 5,
            hibernate_ticks: Self::DEFAULT_HIBERNATE_TICKS,
            log_keep_entries: 10_000,
            log_truncate_interval: Duration::from_secs(2),
            value_bytes_max: phoenix_proto::limits::VALUE_BYTES_MAX,
            inflight_requests_max: 8192,
            snapshot_bytes_per_sec: 64 << 20,
            snapshot_by_copy: true,
            heartbeat_interval: Duration::from_secs(1),
            reserve_space: Self::DEFAULT_RESERVE_SPACE,
            disk_check_interval: Duration::from_millis(250),
            balance_leaders: true,
            balance_replicas: true,
            down_after: Self::DEFAULT_DOWN_AFTER,
            group_split_bytes: Self::DEFAULT_GROUP_SPLIT_BYTES,
            group_split_keys: Self::DEFAULT_GROUP_SPLIT_KEYS,
            group_split_qps: Self::DEFAULT_GROUP_SPLIT_QPS,
            split_check_interval: Duration::from_secs(10),
            group_merge_bytes: Self::DEFAULT_GROUP_MERGE_BYTES,
            group_merge_keys: Self::DEFAULT_GROUP_MERGE_KEYS,
            merge_after: Duration::from_secs(600),
            scrub_interval: Duration::from_secs(24 * 3600),
            metrics_listen: None,
            fault_injection: false,
            unsynced_in_memory: false,
            drop_mode: DropMode::Files,
            security: Security::default(),
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: &str| Err(Error::Config(s.to_string()));
        if self.node_id == 0 {
            return bad("node id 0 is reserved");
        }
        if self.compactor.is_some() && self.sst_store.is_none() {
            return bad("a compactor needs the tables on a shared store (--sst-store)");
        }
        if self.replication == 0 || self.replication > 7 {
            return bad("replication must be in 1..=7");
        }
        // The meta leader refuses the heartbeats of a node whose address no one could
        // dial: say so at start, not never.
        for (what, addr) in std::iter::once(("--advertise (or --listen)", &self.advertise))
            .chain(self.meta.iter().map(|m| ("--meta", &m.addr)))
        {
            if let Err(why) = phoenix_meta::check_addr(addr) {
                return Err(Error::Config(format!("{what}: address {addr:?} {why}")));
            }
        }
        // Replicas coalesce messages (a follower may hear nothing for two heartbeat
        // intervals): the election timeout must be longer.
        if self.heartbeat_ticks == 0 || self.election_ticks <= 2 * self.heartbeat_ticks {
            return bad("need 0 < 2 × heartbeat ticks < election ticks");
        }
        if self
            .meta
            .iter()
            .any(|m| m.id == self.node_id && m.addr != self.advertise)
        {
            return bad("--meta lists this node's id with another address than --listen");
        }
        if self
            .meta
            .iter()
            .any(|m| m.addr == self.advertise && m.id != self.node_id)
        {
            return bad("--meta lists this node's address with another id than --id");
        }
        let mut sorted = self.split_keys.clone();
        sorted.sort();
        sorted.dedup();
        if sorted != self.split_keys || self.split_keys.iter().any(|k| k.is_empty()) {
            return bad("split keys must be non-empty, sorted and distinct");
        }
        if self.value_bytes_max == 0 || self.value_bytes_max > (64 << 20) {
            return bad("value limit must be in 1..=64 MiB");
        }
        if self
            .security
            .tls
            .as_ref()
            .is_some_and(|t| !t.has_identity())
        {
            return bad("a node serving TLS needs --tls-cert and --tls-key next to --tls-ca");
        }
        // A node missing a heartbeat or two (a pause, a slow disk, a slow meta leader)
        // is not down: at least as long as a node counts as alive after its last one,
        // and three heartbeat intervals.
        let floor = (3 * self.heartbeat_interval).max(phoenix_meta::ALIVE_WITHIN);
        if !self.down_after.is_zero() && self.down_after < floor {
            return Err(Error::Config(format!(
                "--down-after must be 0 (never) or at least {} ms",
                floor.as_millis()
            )));
        }
        Ok(())
    }

    /// Whether this node hosts a meta replica.
    pub fn is_meta_member(&self) -> bool {
        self.meta.iter().any(|m| m.id == self.node_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose own address, or a meta member's, no one could dial stops at start
    /// with the flag and the reason (the meta leader would refuse its heartbeats).
    #[test]
    fn addresses_no_one_could_dial_are_refused_at_start() {
        let meta = parse_meta_members("1@127.0.0.1:7001,2@127.0.0.1:7002").unwrap();
        let ok = Config::new(1, "127.0.0.1:7001", PathBuf::from("data"), meta);
        ok.validate().unwrap();
        let mut c = ok.clone();
        c.advertise = "127.0.0.1".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--advertise") && e.contains("port"), "{e}");
        let mut c = ok.clone();
        c.meta = parse_meta_members("1@127.0.0.1:7001,2@http://h:7002").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--meta"), "{e}");
    }
}
