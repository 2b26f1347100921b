//! `phoenix cluster status`: nodes, groups, leaders and sizes, as the meta group sees them.

use std::fmt::Write as _;
use std::time::Duration;

use phoenix_client::{Client, ClientOptions, ClusterStatus};

use super::client::Conn;
use super::CmdError;

/// `phoenix cluster ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Nodes (alive, last heartbeat, sizes) and groups (range, epoch, leader, replicas).
    Status(StatusArgs),
}

/// Flags of `phoenix cluster status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    conn: Conn,
}

/// Runs a `phoenix cluster` command.
pub fn run(cmd: ClusterCmd) -> Result<(), CmdError> {
    match cmd {
        ClusterCmd::Status(args) => status(args),
    }
}

fn status(args: StatusArgs) -> Result<(), CmdError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    rt.block_on(async {
        let opts = ClientOptions {
            timeout: Duration::from_millis(args.conn.timeout_ms),
            ..ClientOptions::default()
        };
        // Lazy: the status must work even while no data group has routes yet.
        let client = Client::new_lazy(args.conn.endpoints.clone(), opts)?;
        let status = client.cluster_status().await?;
        print!("{}", render(&status));
        Ok(())
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

/// The status as two tables.
pub fn render(s: &ClusterStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "meta leader: {}",
        s.meta_leader
            .map_or("unknown".to_string(), |l| format!("node {l}"))
    );
    let _ = writeln!(out, "\nNODES ({})", s.nodes.len());
    let _ = writeln!(
        out,
        "{:>4}  {:<22} {:<6} {:>10} {:>7} {:>8} {:>11} {:>11}",
        "id", "address", "alive", "heartbeat", "groups", "leaders", "engine", "log"
    );
    for n in &s.nodes {
        let _ = writeln!(
            out,
            "{:>4}  {:<22} {:<6} {:>10} {:>7} {:>8} {:>11} {:>11}",
            n.node_id,
            n.addr,
            if n.alive { "yes" } else { "NO" },
            n.last_heartbeat_ms_ago
                .map_or("never".to_string(), |ms| format!("{ms} ms")),
            n.groups,
            n.leaders,
            size(n.engine_bytes),
            size(n.log_bytes)
        );
    }
    let _ = writeln!(out, "\nGROUPS ({})", s.groups.len());
    let _ = writeln!(
        out,
        "{:>5}  {:<24} {:>5} {:>7}  {:<12} {:>9} {:>10}",
        "group", "range", "epoch", "leader", "replicas", "applied", "size"
    );
    for g in &s.groups {
        let range = format!("[{}, {})", key(&g.start, "-inf"), key(&g.end, "+inf"));
        let replicas = g
            .replicas
            .iter()
            .map(u64::to_string)
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
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use phoenix_client::{GroupStatus, NodeStatus};

    #[test]
    fn renders_nodes_and_groups() {
        let s = ClusterStatus {
            meta_leader: Some(2),
            nodes: vec![NodeStatus {
                node_id: 1,
                addr: "127.0.0.1:7001".into(),
                alive: true,
                last_heartbeat_ms_ago: Some(300),
                groups: 2,
                leaders: 1,
                engine_bytes: 3 * 1024 * 1024,
                log_bytes: 512,
            }],
            groups: vec![GroupStatus {
                group_id: 1,
                start: vec![],
                end: b"m".to_vec(),
                epoch: 3,
                leader: None,
                replicas: vec![1, 2, 3],
                replica_status: vec![],
            }],
        };
        let t = render(&s);
        assert!(t.contains("meta leader: node 2"), "{t}");
        assert!(
            t.contains("127.0.0.1:7001") && t.contains("3.0 MiB") && t.contains("512 B"),
            "{t}"
        );
        assert!(t.contains("[-inf, \"m\")") && t.contains("1,2,3"), "{t}");
    }
}
