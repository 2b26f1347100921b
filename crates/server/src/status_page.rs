//! The status page every node serves on its metrics port: `GET /` is a plain HTML page
//! with a small script (no build step) that shows the cluster — nodes, groups, leaders,
//! sizes, the meta leader's operators, scrub mismatches — from `GET /status.json`, and
//! a live chart of this node's requests per second and mean latency from `GET /metrics`.
//!
//! `/status.json` is the meta group's view (`Meta.GetCluster`, forwarded to the meta
//! leader as any node does), turned into JSON here; the page polls it and `/metrics`
//! every two seconds.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use phoenix_proto as proto;
use proto::meta_server::Meta as _;
use serde_json::{json, Value};

use crate::control::MetaService;
use crate::shared::Shared;

/// The page (`GET /`).
const PAGE: &str = include_str!("status_page.html");

/// How long `/status.json` waits for the meta leader.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// The routes of the status page, for the metrics server.
pub fn routes(shared: Arc<Shared>) -> axum::Router {
    let svc = MetaService { shared };
    axum::Router::new()
        .route(
            "/",
            axum::routing::get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (header::CACHE_CONTROL, "no-store"),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    ],
                    PAGE,
                )
            }),
        )
        .route(
            "/status.json",
            axum::routing::get(move || {
                let svc = svc.clone();
                async move { status(&svc).await }
            }),
        )
}

async fn status(svc: &MetaService) -> Response {
    let req = tonic::Request::new(proto::GetClusterRequest {
        timeout_ms: STATUS_TIMEOUT.as_millis() as u64,
    });
    let answer = svc.get_cluster(req).await.map(tonic::Response::into_inner);
    let (code, body) = match answer {
        Ok(r) => match &r.error {
            None => (StatusCode::OK, to_json(&r, svc.shared.cfg.node_id)),
            Some(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": e.message, "node_id": svc.shared.cfg.node_id }),
            ),
        },
        Err(s) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": s.message(), "node_id": svc.shared.cfg.node_id }),
        ),
    };
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.to_string(),
    )
        .into_response()
}

/// A key as the page shows it: printable ASCII as is, other bytes escaped.
fn show(k: &[u8]) -> String {
    k.escape_ascii().to_string()
}

/// The cluster as the page reads it; `node_id` is the node serving the page.
pub fn to_json(r: &proto::GetClusterResponse, node_id: u64) -> Value {
    let nodes: Vec<Value> = r
        .nodes
        .iter()
        .map(|n| {
            let s = n.stats.unwrap_or_default();
            json!({
                "node_id": n.node_id,
                "addr": n.addr,
                "alive": n.alive,
                "last_heartbeat_ms_ago": (n.last_heartbeat_ms_ago != u64::MAX)
                    .then_some(n.last_heartbeat_ms_ago),
                "groups": s.groups,
                "leaders": s.leaders,
                "engine_bytes": s.engine_bytes,
                "log_bytes": s.log_bytes,
                "disk_full": s.disk_full,
                "draining": n.draining,
            })
        })
        .collect();
    let groups: Vec<Value> = r
        .groups
        .iter()
        .filter_map(|g| {
            let route = g.route.as_ref()?;
            let leader = g.replicas.iter().find(|x| x.is_leader).map(|x| x.node_id);
            Some(json!({
                "group_id": route.group_id,
                "start": show(&route.start_key),
                "end": show(&route.end_key),
                "epoch": route.epoch,
                "leader": leader.or((route.leader_node_id != 0).then_some(route.leader_node_id)),
                "replicas": route.replicas.iter().map(|x| x.node_id).collect::<Vec<_>>(),
                "learners": route.learners,
                "bytes": g.replicas.iter().map(|x| x.approximate_bytes).max().unwrap_or(0),
                "keys": g.replicas.iter().map(|x| x.approximate_keys).max().unwrap_or(0),
                "applied": g.replicas.iter().map(|x| x.applied_index).max().unwrap_or(0),
                "stopped": g.replicas.iter().filter(|x| !x.stopped.is_empty())
                    .map(|x| json!({ "node_id": x.node_id, "why": x.stopped }))
                    .collect::<Vec<_>>(),
            }))
        })
        .collect();
    let operators: Vec<Value> = r
        .operators
        .iter()
        .map(|o| {
            json!({
                "group_id": o.group_id,
                "kind": proto::OperatorKind::try_from(o.kind)
                    .map_or("unknown", |k| k.as_str_name()),
                "origin": proto::OperatorOrigin::try_from(o.origin)
                    .map_or("unknown", |k| k.as_str_name()),
                "from": o.from_node,
                "to": o.to_node,
                "age_ms": o.age_ms,
                "step": o.step,
            })
        })
        .collect();
    let mismatches: Vec<Value> = r
        .scrub_mismatches
        .iter()
        .map(|m| {
            json!({
                "group_id": m.group_id,
                "index": m.index,
                "nodes": m.replicas.iter().map(|x| x.node_id).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "node_id": node_id,
        "meta_leader": (r.meta_leader_node_id != 0).then_some(r.meta_leader_node_id),
        "nodes": nodes,
        "groups": groups,
        "operators": operators,
        "scrub_mismatches": mismatches,
    })
}
