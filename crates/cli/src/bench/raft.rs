//! `phoenix bench raft`: the consensus core alone, in memory. N nodes with `MemStorage`
//! and an in-memory network run in one thread; the leader keeps a window of proposal
//! batches in flight. Reports proposals committed per second, CPU nanoseconds per
//! proposal (thread CPU time from the kernel), and the propose→commit latency of
//! batches. Every node must apply the same commands in the same order, or the run
//! fails (a benchmark of a broken core measures nothing).

use std::collections::VecDeque;
use std::time::Instant;

use phoenix_raft::{
    Bytes, ConfState, Config, EntryKind, MemStorage, Message, NodeId, RawNode, StateRole,
};

use super::common::{latency_histogram, latency_json, latency_summary, progress};
use super::BenchError;
use crate::output::Report;

/// Flags of `phoenix bench raft`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of voting nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Proposals to commit in total.
    #[arg(long, default_value_t = 1_000_000)]
    pub proposals: u64,
    /// Proposals per batch (one `propose_batch` call).
    #[arg(long, default_value_t = 64)]
    pub batch: u64,
    /// Payload bytes per proposal.
    #[arg(long, default_value_t = 128)]
    pub payload: usize,
    /// Batches the leader keeps in flight (proposed, not yet committed).
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Appends in flight per follower (flow-control window).
    #[arg(long, default_value_t = 256)]
    pub max_inflight_msgs: usize,
    /// Compact each node's log every this many applied entries.
    #[arg(long, default_value_t = 50_000)]
    pub compact_every: u64,
}

struct Node {
    raw: RawNode<MemStorage>,
    conf: ConfState,
    applied: u64,
    /// FNV-1a over each applied command's sequence prefix and length: equal on all
    /// nodes or the run fails (hashing whole payloads would bill the checker to raft).
    digest: u64,
    last_compact: u64,
}

fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// CPU time of the calling thread in nanoseconds, if the kernel exposes it.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Persists, sends and applies every ready of `nodes[i]`; returns applied commands.
fn process(nodes: &mut [Node], i: usize, net: &mut VecDeque<Message>) -> Result<u64, BenchError> {
    let mut applied_cmds = 0;
    let n = &mut nodes[i];
    while n.raw.has_ready() {
        let mut rd = n.raw.ready()?;
        net.extend(rd.messages.drain(..));
        if let Some(s) = rd.snapshot.take() {
            return Err(format!(
                "unexpected snapshot at {} in an all-up benchmark",
                s.meta.index
            )
            .into());
        }
        n.raw.store_mut().append(&rd.entries)?;
        if let Some(hs) = rd.hard_state {
            n.raw.store_mut().set_hard_state(hs);
        }
        for e in &rd.committed_entries {
            if e.kind == EntryKind::Normal && !e.data.is_empty() {
                let head = e.data.get(..8).unwrap_or(&e.data);
                n.digest = fnv(fnv(n.digest, head), &(e.data.len() as u64).to_le_bytes());
                applied_cmds += 1;
            }
            n.applied = e.index;
        }
        net.extend(rd.persisted_messages.drain(..));
        n.raw.advance(rd)?;
    }
    Ok(applied_cmds)
}

/// Drops log entries everyone applied, as the server does after its engine persists.
fn maybe_compact(nodes: &mut [Node], every: u64) -> Result<(), BenchError> {
    let min_applied = nodes.iter().map(|n| n.applied).min().unwrap_or(0);
    for n in nodes.iter_mut() {
        if min_applied >= n.last_compact + every {
            let conf = n.conf.clone();
            n.raw
                .store_mut()
                .compact_to_snapshot(min_applied, conf, Default::default())?;
            n.last_compact = min_applied;
        }
    }
    Ok(())
}

/// Runs the benchmark.
pub fn run(args: Args, report: Report) -> Result<(), BenchError> {
    if args.nodes == 0 || args.batch == 0 || args.window == 0 {
        return Err("--nodes, --batch and --window must be positive".into());
    }
    let ids: Vec<NodeId> = (1..=args.nodes).collect();
    let conf = ConfState::with_voters(ids.iter().copied());
    let mut nodes = Vec::new();
    for &id in &ids {
        let mut cfg = Config::new(id);
        cfg.max_inflight_msgs = args.max_inflight_msgs;
        let raw = RawNode::new(&cfg, MemStorage::new_with_conf(conf.clone()))?;
        nodes.push(Node {
            raw,
            conf: conf.clone(),
            applied: 0,
            digest: 0,
            last_compact: 0,
        });
    }
    let mut net: VecDeque<Message> = VecDeque::new();
    nodes[0].raw.campaign()?;
    // Elect node 1 before timing.
    for _ in 0..100 {
        for i in 0..nodes.len() {
            process(&mut nodes, i, &mut net)?;
        }
        while let Some(m) = net.pop_front() {
            let to = (m.to - 1) as usize;
            nodes[to].raw.step(m)?;
            process(&mut nodes, to, &mut net)?;
        }
        if nodes[0].raw.raft().role() == StateRole::Leader {
            break;
        }
    }
    if nodes[0].raw.raft().role() != StateRole::Leader {
        return Err("node 1 did not become leader".into());
    }

    let payload = vec![0x5Au8; args.payload];
    let bar = progress(args.proposals, "raft");
    let mut hist = latency_histogram();
    // (last index of the batch, proposed at)
    let mut in_flight: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut proposed = 0u64;
    let mut committed = 0u64;
    let cpu0 = thread_cpu_ns();
    let t0 = Instant::now();
    while committed < args.proposals {
        while in_flight.len() < args.window && proposed < args.proposals {
            let k = args.batch.min(args.proposals - proposed);
            let batch = (0..k).map(|j| {
                let mut d = payload.clone();
                let seq = (proposed + j).to_le_bytes();
                let n = seq.len().min(d.len());
                d[..n].copy_from_slice(&seq[..n]);
                Bytes::from(d)
            });
            let last = nodes[0].raw.propose_batch(batch)?;
            in_flight.push_back((last, Instant::now()));
            proposed += k;
        }
        // One round: every node persists/sends/applies, then the network drains.
        for i in 0..nodes.len() {
            let c = process(&mut nodes, i, &mut net)?;
            if i == 0 {
                committed += c;
                bar.inc(c);
            }
        }
        while let Some(m) = net.pop_front() {
            let to = (m.to - 1) as usize;
            nodes[to].raw.step(m)?;
            let c = process(&mut nodes, to, &mut net)?;
            if to == 0 {
                committed += c;
                bar.inc(c);
            }
        }
        let applied = nodes[0].applied;
        while in_flight.front().is_some_and(|(last, _)| *last <= applied) {
            if let Some((_, at)) = in_flight.pop_front() {
                let ns = u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX);
                hist.record(ns.max(1))?;
            }
        }
        maybe_compact(&mut nodes, args.compact_every)?;
        if nodes[0].raw.raft().role() != StateRole::Leader {
            return Err("leader lost leadership during the benchmark".into());
        }
    }
    let wall = t0.elapsed();
    let cpu = match (cpu0, thread_cpu_ns()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    bar.finish_and_clear();

    // Let the followers apply the tail, then check they agree.
    for _ in 0..10 {
        for i in 0..nodes.len() {
            nodes[i].raw.tick()?;
            process(&mut nodes, i, &mut net)?;
        }
        while let Some(m) = net.pop_front() {
            let to = (m.to - 1) as usize;
            nodes[to].raw.step(m)?;
            process(&mut nodes, to, &mut net)?;
        }
    }
    let d0 = nodes[0].digest;
    for (i, n) in nodes.iter().enumerate() {
        if n.applied != nodes[0].applied || n.digest != d0 {
            return Err(format!(
                "node {} diverged: applied {} vs {}",
                i + 1,
                n.applied,
                nodes[0].applied
            )
            .into());
        }
    }

    let secs = wall.as_secs_f64();
    report.line(format_args!(
        "raft: {} nodes, {} proposals, batch {}, payload {} B, window {} batches",
        args.nodes, committed, args.batch, args.payload, args.window
    ));
    report.line(format_args!(
        "raft: {:.0} proposals/s committed ({:.1} MB/s of payload), wall {:.2} s",
        committed as f64 / secs,
        committed as f64 * args.payload as f64 / secs / 1e6,
        secs
    ));
    let cpu_per_proposal = cpu.map(|ns| ns as f64 / committed.max(1) as f64);
    match cpu_per_proposal {
        Some(ns) => report.line(format_args!(
            "raft: {ns:.0} ns CPU per proposal (all {} nodes and the in-memory network, one thread)",
            args.nodes
        )),
        None => report.line(format_args!(
            "raft: CPU time unavailable (no /proc/thread-self/schedstat)"
        )),
    }
    report.line(format_args!(
        "raft: batch propose->commit latency: {}",
        latency_summary(&hist)
    ));
    report.summary(&serde_json::json!({
        "benchmark": "raft",
        "nodes": args.nodes,
        "proposals": committed,
        "batch": args.batch,
        "payload_bytes": args.payload,
        "window": args.window,
        "seconds": secs,
        "proposals_per_sec": committed as f64 / secs,
        "payload_mb_per_sec": committed as f64 * args.payload as f64 / secs / 1e6,
        "cpu_ns_per_proposal": cpu_per_proposal,
        "batch_commit_latency": latency_json(&hist),
    }))?;
    Ok(())
}
