//! `phoenix cluster status`: nodes, groups, leaders, sizes and operators, as the meta
//! group sees them; `transfer-leader`: move a group's leadership; `add-replica`,
//! `remove-replica` and `move`: change where a group's replicas are; `drain`: empty a
//! node; `split`: split a group at a key; `scrub`: compare a group's replicas'
//! checksums; `operators`: what the meta leader is doing.

use std::fmt::Write as _;
use std::io::Write as _;

use phoenix_client::{Client, ClusterStatus};
use serde_json::{json, Map, Value};

use super::client::{options, runtime, unreachable_or, Conn};
use super::{CmdError, Outcome};
use crate::output::{self, Bytes, Format, Stdout};

/// `phoenix cluster ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Nodes (alive, last heartbeat, sizes) and groups (range, epoch, leader, replicas).
    Status(StatusArgs),
    /// Move a group's leadership to its replica on another node, and wait until it has
    /// moved.
    TransferLeader(TransferLeaderArgs),
    /// Add a replica of a group on a node (a learner that catches up, then a voter),
    /// and wait until the routing table lists it as a voter.
    AddReplica(AddReplicaArgs),
    /// Remove the replica of a group on a node (its leadership moves away first; the
    /// node may be down), and wait until the routing table no longer lists it. The node
    /// then drops the replica's data.
    RemoveReplica(RemoveReplicaArgs),
    /// Move the replica of a group from one node to another: add the new one (it
    /// catches up and becomes a voter), then remove the old one.
    Move(MoveArgs),
    /// List the changes the meta leader is carrying out (leader transfers, replica
    /// additions and removals) and who started them: a user, the balancers or repair.
    Operators(StatusArgs),
    /// Move every replica off a node (each group gets a replica elsewhere, then loses
    /// the node's; the node takes no new ones), so it can be taken out of the cluster;
    /// `--cancel` stops draining it. Waits until it hosts none with `--wait-ms`.
    Drain(DrainArgs),
    /// Split a group at a key: the keys at or above it move to a new group with the
    /// same replicas. Waits until the routing table holds both groups.
    Split(SplitArgs),
    /// Merge a group into its neighbour (both with the same replicas): the first freezes,
    /// the second takes its range, data and client sessions, and the first goes. Waits
    /// until the routing table holds the merged group.
    Merge(MergeArgs),
    /// Scrub a group: its replicas checksum the group's data at the same log index and
    /// the answers are compared. Exits 0 if every voter's checksum agrees, 1 if they
    /// differ (the replicas hold different data), 2 or more if it could not be done.
    Scrub(ScrubArgs),
}

/// Flags of `phoenix cluster scrub`.
#[derive(Debug, clap::Args)]
pub struct ScrubArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// How long to wait for every voter's checksum, in milliseconds (each replica reads
    /// the whole group).
    #[arg(long = "wait-ms", default_value_t = 60_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster split`.
#[derive(Debug, clap::Args)]
pub struct SplitArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// The first key of the new group (strictly inside the group's range; hex with
    /// `--hex`).
    key: String,
    /// How long to wait for the split, in milliseconds. If the time is up the split
    /// goes on; asking again waits for it.
    #[arg(long = "wait-ms", default_value_t = 30_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The group that goes (an id from `phoenix cluster status`).
    source: u64,
    /// Its neighbour that takes it in.
    target: u64,
    /// How long to wait for the merge, in milliseconds. If the time is up the merge
    /// goes on; asking again waits for it.
    #[arg(long = "wait-ms", default_value_t = 30_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// The node to empty.
    node: u64,
    /// Stop draining the node (its replicas stay where they are by then).
    #[arg(long)]
    cancel: bool,
    /// Wait until the node hosts no replica, up to this many milliseconds (0: return
    /// once the node is marked draining).
    #[arg(long = "wait-ms", default_value_t = 0)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster remove-replica`.
#[derive(Debug, clap::Args)]
pub struct RemoveReplicaArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// The node whose replica goes.
    node: u64,
    /// How long to wait for the removal, in milliseconds.
    #[arg(long = "wait-ms", default_value_t = 60_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster move`.
#[derive(Debug, clap::Args)]
pub struct MoveArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// The node whose replica goes.
    from: u64,
    /// The node to hold the new replica.
    to: u64,
    /// How long to wait for each of the two steps, in milliseconds (the addition
    /// includes the new replica's catching up). If the time is up the step goes on;
    /// asking again finishes the move.
    #[arg(long = "wait-ms", default_value_t = 120_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster add-replica`.
#[derive(Debug, clap::Args)]
pub struct AddReplicaArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// The node to hold the new replica.
    node: u64,
    /// How long to wait for the replica to become a voter, in milliseconds (it catches
    /// up first: a few heartbeats, plus a snapshot's transfer). If the time is up the
    /// addition goes on; `phoenix cluster status` shows its step.
    #[arg(long = "wait-ms", default_value_t = 120_000)]
    wait_ms: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster transfer-leader`.
#[derive(Debug, clap::Args)]
pub struct TransferLeaderArgs {
    /// The group (an id from `phoenix cluster status`).
    group: u64,
    /// The node whose replica is to lead it.
    node: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Flags of `phoenix cluster status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    conn: Conn,
}

/// Runs a `phoenix cluster` command.
pub fn run(cmd: ClusterCmd, format: Format) -> Result<Outcome, CmdError> {
    match cmd {
        ClusterCmd::Status(args) => status(args, format),
        ClusterCmd::TransferLeader(args) => transfer_leader(args, format),
        ClusterCmd::AddReplica(args) => add_replica(args, format),
        ClusterCmd::RemoveReplica(args) => remove_replica(args, format),
        ClusterCmd::Move(args) => move_replica(args, format),
        ClusterCmd::Drain(args) => drain(args, format),
        ClusterCmd::Operators(args) => operators(args, format),
        ClusterCmd::Split(args) => split(args, format),
        ClusterCmd::Merge(args) => merge(args, format),
        ClusterCmd::Scrub(args) => scrub(args, format),
    }
}

fn scrub(args: ScrubArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let opts = phoenix_client::ClientOptions {
            timeout: std::time::Duration::from_millis(args.wait_ms.max(1)),
            ..options(&args.conn)?
        };
        let client = Client::new_lazy(args.conn.endpoints.clone(), opts)?;
        let r = client
            .scrub_group(args.group)
            .await
            .map_err(|e| unreachable_or(&args.conn, e))?;
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                writeln!(
                    out,
                    "group {} at index {}: {}",
                    args.group,
                    r.index,
                    if r.consistent {
                        "consistent"
                    } else {
                        "MISMATCH"
                    }
                )?;
                for x in &r.replicas {
                    match &x.error {
                        Some(why) => writeln!(out, "  node {}: FAILED: {why}", x.node_id)?,
                        None => writeln!(
                            out,
                            "  node {}: crc {:08x}, {} keys, {}",
                            x.node_id,
                            x.crc,
                            x.keys,
                            size(x.bytes)
                        )?,
                    }
                }
                out.flush()?;
            }
            Format::Json => output::print_json(&json!({
                "group_id": args.group,
                "index": r.index,
                "consistent": r.consistent,
                "replicas": scrubs_json(&r.replicas),
            }))?,
        }
        Ok(if r.consistent {
            Outcome::Done
        } else {
            Outcome::Miss
        })
    })
}

fn scrubs_json(reps: &[phoenix_client::ScrubReplica]) -> Vec<Value> {
    reps.iter()
        .map(|x| {
            json!({
                "node_id": x.node_id,
                "index": x.index,
                "crc": x.crc,
                "keys": x.keys,
                "bytes": x.bytes,
                "error": x.error,
            })
        })
        .collect()
}

fn merge(args: MergeArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let opts = phoenix_client::ClientOptions {
            timeout: std::time::Duration::from_millis(args.wait_ms.max(1)),
            ..options(&args.conn)?
        };
        let client = Client::new_lazy(args.conn.endpoints.clone(), opts)?;
        let r = client
            .merge_group(args.source, args.target)
            .await
            .map_err(|e| unreachable_or(&args.conn, e))?;
        let end = if r.end.is_empty() {
            "∞".to_string()
        } else {
            args.conn.show(&r.end)
        };
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                writeln!(
                    out,
                    "group {}: [{}, {}) epoch {}",
                    r.group_id,
                    args.conn.show(&r.start),
                    end,
                    r.epoch
                )?;
                out.flush()?;
            }
            Format::Json => {
                let b = args.conn.bytes();
                let mut m = Map::new();
                m.insert("group_id".into(), json!(r.group_id));
                b.put(&mut m, "start", &r.start);
                b.put(&mut m, "end", &r.end);
                m.insert("epoch".into(), json!(r.epoch));
                output::print_json(&Value::Object(m))?
            }
        }
        Ok(Outcome::Done)
    })
}

fn split(args: SplitArgs, format: Format) -> Result<Outcome, CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    runtime()?.block_on(async {
        let opts = phoenix_client::ClientOptions {
            timeout: std::time::Duration::from_millis(args.wait_ms.max(1)),
            ..options(&args.conn)?
        };
        let client = Client::new_lazy(args.conn.endpoints.clone(), opts)?;
        let (left, right) = client
            .split_group(args.group, &key)
            .await
            .map_err(|e| unreachable_or(&args.conn, e))?;
        let show = |b: &[u8]| {
            if b.is_empty() {
                "∞".to_string()
            } else {
                args.conn.show(b)
            }
        };
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                for r in [&left, &right] {
                    writeln!(
                        out,
                        "group {}: [{}, {}) epoch {}",
                        r.group_id,
                        args.conn.show(&r.start),
                        show(&r.end),
                        r.epoch
                    )?;
                }
                out.flush()?;
            }
            Format::Json => {
                let b = args.conn.bytes();
                let one = |r: &phoenix_client::routing::Route| {
                    let mut m = Map::new();
                    m.insert("group_id".into(), json!(r.group_id));
                    b.put(&mut m, "start", &r.start);
                    b.put(&mut m, "end", &r.end);
                    m.insert("epoch".into(), json!(r.epoch));
                    Value::Object(m)
                };
                output::print_json(&json!({ "left": one(&left), "right": one(&right) }))?
            }
        }
        Ok(Outcome::Done)
    })
}

/// The change of `args` (`group`, nodes) made by `change` with a client that waits
/// `wait_ms`; prints the group's voters then.
fn membership_change<F, Fut>(
    conn: &Conn,
    group: u64,
    wait_ms: u64,
    format: Format,
    change: F,
) -> Result<Outcome, CmdError>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = phoenix_client::Result<Vec<u64>>>,
{
    runtime()?.block_on(async {
        let opts = phoenix_client::ClientOptions {
            timeout: std::time::Duration::from_millis(wait_ms.max(1)),
            ..options(conn)?
        };
        let client = Client::new_lazy(conn.endpoints.clone(), opts)?;
        let voters = change(client).await.map_err(|e| unreachable_or(conn, e))?;
        match format {
            Format::Text => {
                let list = voters
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let mut out = Stdout::lock();
                writeln!(out, "group {group}: voters {list}")?;
                out.flush()?;
            }
            Format::Json => output::print_json(&json!({ "group_id": group, "voters": voters }))?,
        }
        Ok(Outcome::Done)
    })
}

fn add_replica(args: AddReplicaArgs, format: Format) -> Result<Outcome, CmdError> {
    let (group, node) = (args.group, args.node);
    membership_change(&args.conn, group, args.wait_ms, format, |c| async move {
        c.add_replica(group, node).await
    })
}

fn remove_replica(args: RemoveReplicaArgs, format: Format) -> Result<Outcome, CmdError> {
    let (group, node) = (args.group, args.node);
    membership_change(&args.conn, group, args.wait_ms, format, |c| async move {
        c.remove_replica(group, node).await
    })
}

fn move_replica(args: MoveArgs, format: Format) -> Result<Outcome, CmdError> {
    let (group, from, to) = (args.group, args.from, args.to);
    membership_change(&args.conn, group, args.wait_ms, format, |c| async move {
        c.move_replica(group, from, to).await
    })
}

fn operators(args: StatusArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let status = fetch_status(&args.conn).await?;
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                out.write_all(render_operators(&status.operators).as_bytes())?;
                out.flush()?;
            }
            Format::Json => {
                output::print_json(&json!({ "operators": operators_json(&status.operators) }))?
            }
        }
        Ok(Outcome::Done)
    })
}

fn drain(args: DrainArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let client = Client::new_lazy(args.conn.endpoints.clone(), options(&args.conn)?)?;
        let mut left = client
            .drain_node(args.node, args.cancel)
            .await
            .map_err(|e| unreachable_or(&args.conn, e))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(args.wait_ms);
        while !args.cancel && left > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            // (A status that fails to come is asked for again until the deadline.)
            if let Ok(s) = client.cluster_status().await {
                // (Its meta replica counts: it is replaced too.)
                left = s
                    .groups
                    .iter()
                    .chain(&s.meta_group)
                    .filter(|g| g.replicas.contains(&args.node))
                    .count() as u64;
            }
        }
        let draining = !args.cancel;
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                let what = if draining { "draining" } else { "not draining" };
                let plural = if left == 1 { "" } else { "s" };
                writeln!(
                    out,
                    "node {}: {what}, {left} replica{plural} on it",
                    args.node
                )?;
                out.flush()?;
            }
            Format::Json => output::print_json(&json!({
                "node_id": args.node,
                "draining": draining,
                "replicas": left,
            }))?,
        }
        if draining && left > 0 && args.wait_ms > 0 {
            return Err(CmdError::Failed(
                format!(
                    "node {} still hosts {left} replicas after {} ms (the drain goes on)",
                    args.node, args.wait_ms
                )
                .into(),
            ));
        }
        Ok(Outcome::Done)
    })
}

fn transfer_leader(args: TransferLeaderArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let client = Client::new_lazy(args.conn.endpoints.clone(), options(&args.conn)?)?;
        let leader = client
            .transfer_leader(args.group, args.node)
            .await
            .map_err(|e| unreachable_or(&args.conn, e))?;
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                writeln!(out, "group {}: leader is node {leader}", args.group)?;
                out.flush()?;
            }
            Format::Json => {
                output::print_json(&json!({ "group_id": args.group, "leader": leader }))?
            }
        }
        Ok(Outcome::Done)
    })
}

/// The cluster status from the nodes `conn` names.
async fn fetch_status(conn: &Conn) -> Result<ClusterStatus, CmdError> {
    // Lazy: the status must work even while no data group has routes yet.
    let client = Client::new_lazy(conn.endpoints.clone(), options(conn)?)?;
    client
        .cluster_status()
        .await
        .map_err(|e| unreachable_or(conn, e))
}

fn status(args: StatusArgs, format: Format) -> Result<Outcome, CmdError> {
    runtime()?.block_on(async {
        let status = fetch_status(&args.conn).await?;
        match format {
            Format::Text => {
                let mut out = Stdout::lock();
                out.write_all(render(&status).as_bytes())?;
                out.flush()?;
            }
            Format::Json => output::print_json(&to_json(&status, args.conn.bytes()))?,
        }
        Ok(Outcome::Done)
    })
}

/// The status as one JSON object: the fields of [`ClusterStatus`] by their names; a
/// group's `start`/`end` are byte strings (empty = unbounded), unknown values are null.
pub fn to_json(s: &ClusterStatus, bytes: Bytes) -> Value {
    let nodes: Vec<Value> = s
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "addr": n.addr,
                "alive": n.alive,
                "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago,
                "groups": n.groups,
                "leaders": n.leaders,
                "engine_bytes": n.engine_bytes,
                "log_bytes": n.log_bytes,
                "disk_free_bytes": n.disk_free_bytes,
                "disk_full": n.disk_full,
                "draining": n.draining,
            })
        })
        .collect();
    let groups: Vec<Value> = s
        .groups
        .iter()
        .map(|g| {
            let mut m = Map::new();
            m.insert("group_id".into(), g.group_id.into());
            bytes.put(&mut m, "start", &g.start);
            bytes.put(&mut m, "end", &g.end);
            m.insert("epoch".into(), g.epoch.into());
            m.insert("leader".into(), json!(g.leader));
            m.insert("replicas".into(), json!(g.replicas));
            m.insert("learners".into(), json!(g.learners));
            let replicas: Vec<Value> = g
                .replica_status
                .iter()
                .map(|r| {
                    json!({
                        "node_id": r.node_id,
                        "is_leader": r.is_leader,
                        "term": r.term,
                        "commit_index": r.commit_index,
                        "applied_index": r.applied_index,
                        "log_first_index": r.log_first_index,
                        "approximate_bytes": r.approximate_bytes,
                        "stopped": r.stopped,
                        "hibernating": r.hibernating,
                    })
                })
                .collect();
            m.insert("replica_status".into(), Value::Array(replicas));
            Value::Object(m)
        })
        .collect();
    let operators = operators_json(&s.operators);
    let mismatches: Vec<Value> = s
        .scrub_mismatches
        .iter()
        .map(|m| json!({ "group_id": m.group_id, "index": m.index, "replicas": scrubs_json(&m.replicas) }))
        .collect();
    let (meta_members, meta_learners) = meta_members(s);
    json!({
        "meta_leader": s.meta_leader,
        "meta_members": meta_members,
        "meta_learners": meta_learners,
        "nodes": nodes,
        "groups": groups,
        "operators": operators,
        "scrub_mismatches": mismatches,
    })
}

/// The meta group's voters and learners, by node id (empty from a meta leader that
/// does not report them).
fn meta_members(s: &ClusterStatus) -> (Vec<u64>, Vec<u64>) {
    s.meta_group.as_ref().map_or((Vec::new(), Vec::new()), |g| {
        let voters = g
            .replicas
            .iter()
            .copied()
            .filter(|n| !g.learners.contains(n))
            .collect();
        (voters, g.learners.clone())
    })
}

/// Human-readable size.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn key(k: &[u8], empty: &str) -> String {
    if k.is_empty() {
        empty.to_string()
    } else {
        format!("{:?}", k.escape_ascii().to_string())
    }
}

/// The operators as a table (`OPERATORS (n)` and a row each).
pub fn render_operators(ops: &[phoenix_client::OperatorStatus]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "OPERATORS ({})", ops.len());
    let _ = writeln!(
        out,
        "{:>5}  {:<16} {:<8} {:>5} {:>5} {:>9}  step",
        "group", "kind", "origin", "from", "to", "age"
    );
    let node = |n: u64| {
        if n == 0 {
            "-".to_string()
        } else {
            n.to_string()
        }
    };
    for o in ops {
        let _ = writeln!(
            out,
            "{:>5}  {:<16} {:<8} {:>5} {:>5} {:>9}  {}",
            o.group_id,
            o.kind,
            o.origin,
            node(o.from),
            node(o.to),
            format!("{} ms", o.age_ms),
            o.step
        );
    }
    out
}

/// The operators as JSON objects, by field name.
fn operators_json(ops: &[phoenix_client::OperatorStatus]) -> Vec<Value> {
    ops.iter()
        .map(|o| {
            json!({
                "group_id": o.group_id,
                "kind": o.kind,
                "origin": o.origin,
                "step": o.step,
                "from": o.from,
                "to": o.to,
                "age_ms": o.age_ms,
            })
        })
        .collect()
}

/// The status as two tables.
pub fn render(s: &ClusterStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "meta leader: {}",
        s.meta_leader
            .map_or("unknown".to_string(), |l| format!("node {l}"))
    );
    let (voters, learners) = meta_members(s);
    if !voters.is_empty() {
        let list = |v: &[u64]| {
            v.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = write!(out, "meta members: {}", list(&voters));
        if !learners.is_empty() {
            let _ = write!(out, " (learners: {})", list(&learners));
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "\nNODES ({})", s.nodes.len());
    let _ = writeln!(
        out,
        "{:>4}  {:<22} {:<6} {:>10} {:>7} {:>8} {:>11} {:>11} {:>16}",
        "id", "address", "alive", "heartbeat", "groups", "leaders", "engine", "log", "disk free"
    );
    for n in &s.nodes {
        let free = match (n.disk_free_bytes, n.disk_full) {
            (Some(b), true) => format!("FULL {}", size(b)),
            (Some(b), false) => size(b),
            (None, true) => "FULL".to_string(),
            (None, false) => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<22} {:<6} {:>10} {:>7} {:>8} {:>11} {:>11} {:>16}",
            n.node_id,
            n.addr,
            match (n.alive, n.draining) {
                (false, _) => "NO",
                (true, true) => "drain",
                (true, false) => "yes",
            },
            n.last_heartbeat_ms_ago
                .map_or("never".to_string(), |ms| format!("{ms} ms")),
            n.groups,
            n.leaders,
            size(n.engine_bytes),
            size(n.log_bytes),
            free
        );
    }
    // Asleep: every reported replica of the group hibernates (idle, no heartbeats).
    let asleep = s
        .groups
        .iter()
        .filter(|g| !g.replica_status.is_empty() && g.replica_status.iter().all(|r| r.hibernating))
        .count();
    let _ = writeln!(out, "\nGROUPS ({}, {asleep} asleep)", s.groups.len());
    let _ = writeln!(
        out,
        "{:>5}  {:<24} {:>5} {:>7}  {:<12} {:>9} {:>10}",
        "group", "range", "epoch", "leader", "replicas", "applied", "size"
    );
    for g in &s.groups {
        let range = format!("[{}, {})", key(&g.start, "-inf"), key(&g.end, "+inf"));
        // A learner is marked "L" (it catches up and does not vote).
        let replicas = g
            .replicas
            .iter()
            .map(|id| {
                if g.learners.contains(id) {
                    format!("{id}L")
                } else {
                    id.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        let applied = g
            .replica_status
            .iter()
            .map(|r| r.applied_index)
            .max()
            .unwrap_or(0);
        let bytes = g
            .replica_status
            .iter()
            .map(|r| r.approximate_bytes)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "{:>5}  {:<24} {:>5} {:>7}  {:<12} {:>9} {:>10}",
            g.group_id,
            range,
            g.epoch,
            g.leader.map_or("-".to_string(), |l| l.to_string()),
            replicas,
            applied,
            size(bytes)
        );
        // A replica stopped by a failure in its work, with the cause (node.rs fail_group).
        for r in g.replica_status.iter().filter(|r| !r.stopped.is_empty()) {
            let _ = writeln!(
                out,
                "       replica on node {} STOPPED: {}",
                r.node_id, r.stopped
            );
        }
    }
    if !s.operators.is_empty() {
        out.push('\n');
        out.push_str(&render_operators(&s.operators));
    }
    for m in &s.scrub_mismatches {
        let reps: Vec<String> = m
            .replicas
            .iter()
            .map(|r| match &r.error {
                Some(why) => format!("node {} failed: {why}", r.node_id),
                None => format!("node {} crc {:08x} keys {}", r.node_id, r.crc, r.keys),
            })
            .collect();
        let _ = writeln!(
            out,
            "\nSCRUB MISMATCH: group {} at index {}: {}",
            m.group_id,
            m.index,
            reps.join("; ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use phoenix_client::{GroupStatus, NodeStatus, OperatorStatus, ReplicaStatus};

    fn sample() -> ClusterStatus {
        ClusterStatus {
            meta_leader: Some(2),
            meta_group: Some(GroupStatus {
                group_id: 0,
                start: vec![],
                end: vec![],
                epoch: 1,
                leader: Some(2),
                replicas: vec![1, 2, 3, 4],
                learners: vec![4],
                replica_status: vec![],
            }),
            nodes: vec![NodeStatus {
                node_id: 1,
                addr: "127.0.0.1:7001".into(),
                alive: true,
                last_heartbeat_ms_ago: Some(300),
                groups: 2,
                leaders: 1,
                engine_bytes: 3 * 1024 * 1024,
                log_bytes: 512,
                disk_free_bytes: Some(100 << 20),
                disk_full: true,
                draining: true,
            }],
            groups: vec![GroupStatus {
                group_id: 1,
                start: vec![],
                end: b"m".to_vec(),
                epoch: 3,
                leader: None,
                replicas: vec![1, 2, 3, 4],
                learners: vec![4],
                replica_status: vec![ReplicaStatus {
                    node_id: 3,
                    is_leader: false,
                    term: 4,
                    commit_index: 9,
                    applied_index: 7,
                    log_first_index: 1,
                    approximate_bytes: 0,
                    stopped: "log append failed: disk full".into(),
                    hibernating: false,
                }],
            }],
            operators: vec![OperatorStatus {
                group_id: 1,
                kind: "transfer-leader".into(),
                origin: "balance".into(),
                from: 3,
                to: 1,
                age_ms: 120,
                step: String::new(),
            }],
            scrub_mismatches: vec![phoenix_client::ScrubMismatch {
                group_id: 1,
                index: 40,
                replicas: vec![
                    phoenix_client::ScrubReplica {
                        node_id: 1,
                        index: 40,
                        crc: 0xabcd,
                        keys: 3,
                        bytes: 30,
                        error: None,
                    },
                    phoenix_client::ScrubReplica {
                        node_id: 3,
                        index: 40,
                        crc: 0x1234,
                        keys: 2,
                        bytes: 20,
                        error: None,
                    },
                    phoenix_client::ScrubReplica {
                        node_id: 4,
                        index: 40,
                        crc: 0,
                        keys: 0,
                        bytes: 0,
                        error: Some("corruption: block checksum".into()),
                    },
                ],
            }],
        }
    }

    #[test]
    fn renders_nodes_and_groups() {
        let s = sample();
        let t = render(&s);
        assert!(t.contains("meta leader: node 2"), "{t}");
        assert!(t.contains("meta members: 1, 2, 3 (learners: 4)"), "{t}");
        assert!(
            t.contains("127.0.0.1:7001") && t.contains("3.0 MiB") && t.contains("512 B"),
            "{t}"
        );
        assert!(t.contains("[-inf, \"m\")") && t.contains("1,2,3,4L"), "{t}");
        assert!(
            t.contains("disk free") && t.contains("FULL 100.0 MiB"),
            "{t}"
        );
        assert!(
            t.contains("replica on node 3 STOPPED: log append failed: disk full"),
            "{t}"
        );
        assert!(t.contains("OPERATORS (1)"), "{t}");
        assert!(
            t.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["1", "transfer-leader", "balance", "3", "1", "120", "ms"]),
            "{t}"
        );
        let ops = render_operators(&s.operators);
        assert!(ops.starts_with("OPERATORS (1)"), "{ops}");
        assert!(render_operators(&[]).starts_with("OPERATORS (0)"));
        assert!(
            t.contains("SCRUB MISMATCH: group 1 at index 40: node 1 crc 0000abcd keys 3; node 3 crc 00001234 keys 2; node 4 failed: corruption: block checksum"),
            "{t}"
        );
        // No operators, no mismatch: no section.
        let mut quiet = s.clone();
        quiet.operators.clear();
        quiet.scrub_mismatches.clear();
        assert!(!render(&quiet).contains("OPERATORS"));
        assert!(!render(&quiet).contains("SCRUB"));
    }

    #[test]
    fn json_has_every_field() {
        let v = to_json(&sample(), Bytes::Text);
        assert_eq!(v["meta_leader"], 2);
        assert_eq!(v["meta_members"], json!([1, 2, 3]));
        assert_eq!(v["meta_learners"], json!([4]));
        assert_eq!(v["nodes"][0]["addr"], "127.0.0.1:7001");
        assert_eq!(v["nodes"][0]["engine_bytes"], 3 * 1024 * 1024);
        assert_eq!(v["nodes"][0]["disk_free_bytes"], 100 << 20);
        assert_eq!(v["nodes"][0]["disk_full"], true);
        assert_eq!(v["groups"][0]["start"], "");
        assert_eq!(v["groups"][0]["end"], "m");
        assert!(v["groups"][0]["leader"].is_null());
        assert_eq!(v["groups"][0]["replicas"], json!([1, 2, 3, 4]));
        assert_eq!(v["groups"][0]["learners"], json!([4]));
        assert_eq!(
            v["groups"][0]["replica_status"][0]["stopped"],
            "log append failed: disk full"
        );
        assert_eq!(v["operators"][0]["kind"], "transfer-leader");
        assert_eq!(v["operators"][0]["origin"], "balance");
        assert_eq!(v["operators"][0]["from"], 3);
        assert_eq!(v["operators"][0]["to"], 1);
        assert_eq!(v["scrub_mismatches"][0]["group_id"], 1);
        assert_eq!(v["scrub_mismatches"][0]["replicas"][1]["crc"], 0x1234);
        let h = to_json(&sample(), Bytes::Hex);
        assert_eq!(h["groups"][0]["end_hex"], "6d");
    }
}
