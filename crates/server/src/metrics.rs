//! The node's metrics, served as Prometheus (OpenMetrics) text on `--metrics-listen`
//! (`GET /metrics`). Names and meanings: `docs/metrics.md`.
//!
//! Two kinds: what happens (requests with their result and latency, proposals, leader
//! changes, snapshots) is counted where it happens, in [`NodeMetrics`] (one per node, in
//! `Shared`); what *is* (groups, raft lag, engine levels and compactions, log store
//! figures, disk space) is read from its owner at each scrape by [`NodeCollector`], so no
//! second copy of it is kept up to date.

use std::sync::Arc;
use std::time::{Duration, Instant};

use phoenix_proto as proto;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::shared::Shared;

type Labels = [(&'static str, &'static str); 2];
type MethodLabel = [(&'static str, &'static str); 1];
type HistogramFamily = Family<MethodLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs to about 1.6 s, doubling.
    Histogram::new(exponential_buckets(50e-6, 2.0, 16))
}

/// What the node counts as it happens.
#[derive(Debug)]
pub struct NodeMetrics {
    requests: Family<Labels, Counter>,
    latency: HistogramFamily,
    /// Proposals raft took (client writes and meta commands).
    pub proposals: Counter,
    /// Times a replica on this node became leader.
    pub leader_changes: Counter,
    /// Snapshots this node sent, received and installed.
    pub snapshots: Family<Labels, Counter>,
    /// Bytes of the snapshots this node sent, by how: streamed through it, or copied on
    /// the shared store.
    snapshot_bytes: Family<MethodLabel, Counter>,
    /// Requests this node forwarded to a group leader, by how (forward.rs).
    pub forwards: Family<MethodLabel, Counter>,
}

impl Default for NodeMetrics {
    fn default() -> NodeMetrics {
        NodeMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            proposals: Counter::default(),
            leader_changes: Counter::default(),
            snapshots: Family::default(),
            snapshot_bytes: Family::default(),
            forwards: Family::default(),
        }
    }
}

/// The result label of an answer: `ok`, or the error kind (`not_leader`, `disk_full`, …).
pub fn result_label(e: Option<&proto::Error>) -> &'static str {
    use proto::error::Kind;
    let Some(e) = e else {
        return "ok";
    };
    match &e.kind {
        None => "error",
        Some(Kind::NotLeader(_)) => "not_leader",
        Some(Kind::StaleEpoch(_)) => "stale_epoch",
        Some(Kind::KeyTooLarge(_)) => "key_too_large",
        Some(Kind::ValueTooLarge(_)) => "value_too_large",
        Some(Kind::DeadlineExceeded(_)) => "deadline_exceeded",
        Some(Kind::GroupUnavailable(_)) => "group_unavailable",
        Some(Kind::KeyNotInGroup(_)) => "key_not_in_group",
        Some(Kind::InvalidArgument(_)) => "invalid_argument",
        Some(Kind::RequestTooLarge(_)) => "request_too_large",
        Some(Kind::ServerBusy(_)) => "server_busy",
        Some(Kind::Internal(_)) => "internal",
        Some(Kind::OutcomeUnknown(_)) => "outcome_unknown",
        Some(Kind::SessionExpired(_)) => "session_expired",
        Some(Kind::DiskFull(_)) => "disk_full",
        Some(Kind::Unsupported(_)) => "unsupported",
    }
}

impl NodeMetrics {
    /// Records one answered `Kv` request.
    pub fn request(&self, method: &'static str, result: &'static str, took: Duration) {
        self.requests
            .get_or_create(&[("method", method), ("result", result)])
            .inc();
        self.latency
            .get_or_create(&[("method", method)])
            .observe(took.as_secs_f64());
    }

    /// Records a snapshot event (`what`: sent, received, installed; `result`: ok or
    /// failed).
    pub fn snapshot(&self, what: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.snapshots
            .get_or_create(&[("event", what), ("result", result)])
            .inc();
    }

    /// Records the bytes of a snapshot sent (`how`: streamed or copied).
    pub fn snapshot_bytes(&self, how: &'static str, bytes: u64) {
        self.snapshot_bytes
            .get_or_create(&[("how", how)])
            .inc_by(bytes);
    }
}

/// The registry a scrape encodes: the node's counters and the collector.
pub fn registry(shared: &Arc<Shared>) -> Registry {
    let mut r = Registry::with_prefix("phoenix");
    let m = &shared.metrics;
    r.register(
        "requests",
        "Kv requests answered by this node, by method and result (ok or the error kind)",
        m.requests.clone(),
    );
    r.register(
        "request_duration_seconds",
        "Time from a Kv request's arrival to its answer, by method",
        m.latency.clone(),
    );
    r.register(
        "raft_proposals",
        "Proposals taken by raft on this node's leaders",
        m.proposals.clone(),
    );
    r.register(
        "raft_leader_changes",
        "Times a replica on this node became leader",
        m.leader_changes.clone(),
    );
    r.register(
        "snapshots",
        "Group snapshots sent, received and installed, by result",
        m.snapshots.clone(),
    );
    r.register(
        "snapshot_bytes",
        "Bytes of the group snapshots this node sent: streamed through it, or copied on the shared store",
        m.snapshot_bytes.clone(),
    );
    r.register(
        "forwards",
        "Requests this node forwarded to their group's leader, by how they went \
         (stream: an item of a Kv.Batch stream; unary: a call of their own)",
        m.forwards.clone(),
    );
    r.register_collector(Box::new(NodeCollector {
        shared: Arc::clone(shared),
    }));
    r
}

/// Reads the node's state at each scrape.
pub struct NodeCollector {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector")
            .field("node", &self.shared.cfg.node_id)
            .finish()
    }
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One family of `make`'s metric (a gauge or a counter): a sample per `(label value,
/// value)`.
fn labelled<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    samples: impl IntoIterator<Item = (&'static str, u64)>,
    make: impl Fn(u64) -> M,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, make(0).metric_type())?;
    for (value, n) in samples {
        make(n).encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// One gauge family: a sample per `(label value, value)`.
fn labelled_gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    samples: impl IntoIterator<Item = (&'static str, u64)>,
) -> Result<(), std::fmt::Error> {
    labelled(enc, name, help, label, samples, ConstGauge::new)
}

fn counter<N: prometheus_client::encoding::EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: N,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.shared;
        let (mut hosted, mut leaders, mut asleep, mut stopped) = (0u64, 0u64, 0u64, 0u64);
        let mut apply_lag = 0u64;
        for v in s.groups.read().values() {
            hosted += 1;
            leaders += u64::from(v.is_leader);
            asleep += u64::from(v.hibernating);
            stopped += u64::from(v.failed.is_some());
            apply_lag += v.commit.saturating_sub(v.applied);
        }
        labelled_gauges(
            &mut enc,
            "groups",
            "Replicas hosted on this node, by state (a replica counts in hosted and in each \
             state it is in)",
            "state",
            [
                ("hosted", hosted),
                ("leader", leaders),
                ("hibernating", asleep),
                ("stopped", stopped),
            ],
        )?;
        gauge(
            &mut enc,
            "raft_apply_lag_entries",
            "Committed entries not yet applied, summed over this node's replicas",
            apply_lag,
        )?;
        gauge(
            &mut enc,
            "disk_free_bytes",
            "Free bytes on the data disk at the last sample",
            s.disk.available(),
        )?;
        gauge(
            &mut enc,
            "disk_reserve_bytes",
            "Free bytes the node keeps: under them it refuses client writes",
            s.cfg.reserve_space,
        )?;
        gauge(
            &mut enc,
            "disk_full",
            "1 while the free space is under the reserve (client writes refused)",
            u64::from(s.disk.is_full()),
        )?;
        gauge(
            &mut enc,
            "uptime_seconds",
            "Seconds since the node started (its last storage restart)",
            s.started.elapsed().as_secs_f64(),
        )?;
        gauge(
            &mut enc,
            "cluster_protocol",
            "The lowest protocol level of the cluster's registered nodes, as the meta \
             leader last said (0: not heard yet); commands of a higher level (INCR: 6) \
             are not proposed below it",
            u64::from(s.cluster_protocol()),
        )?;
        gauge(
            &mut enc,
            "storage_restarts",
            "Times the node restarted its storage by itself since its process started \
             (after a write or sync failure, once the disk took writes again)",
            u64::from(s.run.saturating_sub(1)),
        )?;

        let es = s.engine.stats();
        let level = |i: usize| LEVEL_NAMES.get(i).copied().unwrap_or("deeper");
        labelled_gauges(
            &mut enc,
            "engine_level_files",
            "Engine table files per level",
            "level",
            es.levels
                .iter()
                .enumerate()
                .map(|(i, l)| (level(i), l.files as u64)),
        )?;
        labelled_gauges(
            &mut enc,
            "engine_level_bytes",
            "Bytes of engine table files per level",
            "level",
            es.levels
                .iter()
                .enumerate()
                .map(|(i, l)| (level(i), l.bytes)),
        )?;
        gauge(
            &mut enc,
            "engine_memtable_bytes",
            "Bytes in the engine's mutable memtable",
            es.memtable_bytes as u64,
        )?;
        gauge(
            &mut enc,
            "engine_immutable_memtables",
            "Engine memtables waiting for a flush",
            es.immutable_memtables as u64,
        )?;
        gauge(
            &mut enc,
            "engine_block_cache_bytes",
            "Bytes held by the engine's block cache",
            es.block_cache_usage as u64,
        )?;
        counter(
            &mut enc,
            "engine_flushes",
            "Engine memtable flushes",
            es.flushes,
        )?;
        counter(
            &mut enc,
            "engine_flush_bytes",
            "Bytes of tables written by engine flushes",
            es.flush_bytes_written,
        )?;
        counter(
            &mut enc,
            "engine_compactions",
            "Engine compactions (trivial moves included)",
            es.compactions,
        )?;
        counter(
            &mut enc,
            "engine_compaction_read_bytes",
            "Bytes read by engine compactions",
            es.compaction_bytes_read,
        )?;
        counter(
            &mut enc,
            "engine_compaction_write_bytes",
            "Bytes written by engine compactions",
            es.compaction_bytes_written,
        )?;
        counter(
            &mut enc,
            "engine_remote_compactions",
            "Engine compactions a compaction worker ran (--compactor)",
            es.remote_compactions,
        )?;
        counter(
            &mut enc,
            "engine_remote_compaction_fallbacks",
            "Compactions the worker failed or answered wrongly, then run by the node",
            es.remote_compaction_fallbacks,
        )?;
        counter(
            &mut enc,
            "engine_remote_compactions_given_way",
            "Background compactions whose wait for the worker gave way to a group drop, an ingest or a close",
            es.remote_compactions_given_way,
        )?;
        counter(
            &mut enc,
            "engine_write_stalls",
            "Times an engine writer waited for a flush or an L0 compaction",
            es.stall_count,
        )?;
        counter(
            &mut enc,
            "engine_write_stall_seconds",
            "Time engine writers spent stalled or slowed down",
            es.stall_micros as f64 / 1e6,
        )?;
        counter(
            &mut enc,
            "engine_user_write_bytes",
            "Key and value bytes written to the engine",
            es.user_bytes_written,
        )?;

        let ls = s.log.stats();
        gauge(
            &mut enc,
            "log_segments",
            "Log store segment files holding records",
            ls.segments as u64,
        )?;
        gauge(
            &mut enc,
            "log_free_segments",
            "Log store segment files kept for reuse",
            ls.free_segments as u64,
        )?;
        gauge(
            &mut enc,
            "log_bytes",
            "Bytes of frames in the log store's segments",
            ls.total_bytes,
        )?;
        gauge(
            &mut enc,
            "log_live_bytes",
            "Bytes of live entries in the log store",
            ls.live_bytes,
        )?;
        gauge(&mut enc, "log_queues", "Log store queues", ls.queues as u64)?;
        gauge(
            &mut enc,
            "log_streams",
            "Log streams (one per replica)",
            ls.streams as u64,
        )?;
        counter(
            &mut enc,
            "log_ops",
            "Operations submitted to the log store (appends, truncations, …)",
            ls.appends,
        )?;
        counter(
            &mut enc,
            "log_writes",
            "Log store group-commit writes (ops per write = the batch size)",
            ls.writes,
        )?;
        counter(&mut enc, "log_syncs", "Log store fdatasync calls", ls.syncs)?;
        counter(
            &mut enc,
            "log_write_bytes",
            "Bytes written to log segments",
            ls.bytes_written,
        )?;
        counter(
            &mut enc,
            "log_segments_reclaimed",
            "Log segments deleted or recycled by space reclamation",
            ls.segments_reclaimed,
        )?;
        labelled(
            &mut enc,
            "raft_messages_sent",
            "Raft messages queued for other nodes, by kind (snapshots are counted apart)",
            "kind",
            s.transport.sent(),
            ConstCounter::new,
        )?;
        Ok(())
    }
}

const LEVEL_NAMES: [&str; 8] = ["L0", "L1", "L2", "L3", "L4", "L5", "L6", "L7"];

/// Serves `GET /metrics` and the status page (`GET /`, `GET /status.json`:
/// status_page.rs) on `listener` until `stop` turns true.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let registry = Arc::new(registry(&shared));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = Arc::clone(&registry);
                async move { scrape(&registry) }
            }),
        )
        .merge(crate::status_page::routes(Arc::clone(&shared)));
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!("metrics endpoint stopped: {e}");
    }
}

fn scrape(registry: &Registry) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let started = Instant::now();
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => {
            tracing::trace!(us = started.elapsed().as_micros() as u64, "metrics scraped");
            (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                body,
            )
                .into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the metrics failed: {e}"),
        )
            .into_response(),
    }
}
