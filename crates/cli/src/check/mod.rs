//! `phoenix check`: linearizability of a spawned cluster under faults, with a verdict.
//!
//! Starts three `phoenix server` processes (or `--nodes`; the first three form the meta
//! group) on loopback (this same binary, with the fault-injection service on), runs several clients doing random get / put /
//! compare-and-swap on a few keys with unique values, and meanwhile a nemesis plays the
//! chosen rounds in turn, 2.5 s apart: each kills (-9), pauses (SIGSTOP), cuts off
//! from its peers, or fails the disk of the group's leader, a random node, or (kill)
//! every node at once, and brings it back 2 s later (8 s for `kill-random-long`). With `--power-loss` the servers keep
//! unsynced bytes in memory, so every kill also loses what a node never synced. Every
//! operation's invocation and completion time is recorded and the history is checked
//! ([`model`]). The run must also serve again after its last fault: a cluster that lost
//! its state or never recovered completes nothing there, and a history with nothing
//! after the fault would hide the loss. And it must heal: within 60 s of the last
//! fault, every group has 3 voters, all on live nodes, running, no learner left, and a
//! leader (`kill-random-long` keeps a node down past a `--down-after` of 5 s, so the meta
//! leader's repair moves its replicas while the clients go on; the balancers then move
//! replicas and leaders back onto it).
//!
//! With `--splits N` the key space is also split N times during the faults, at keys
//! between the workload's keys (`phoenix cluster split`'s path: planned by the meta
//! leader, applied by every replica, followed by the clients), so reads and writes cross
//! splits that kills, pauses and partitions cut into.
//!
//! The seed decides the workload (operations, keys, values) and the nemesis' choice of
//! nodes; a failing run is replayed with its `--seed` (timings differ, so a replay
//! explores the same schedule, not the same interleaving).

mod model;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phoenix_client::{Client, ClientOptions};
use phoenix_proto as proto;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::bench::nemesis;
use crate::cmd::playground::{ClusterSpec, LocalCluster, META_MEMBERS};
use crate::cmd::{BoxError, CmdError, Outcome};
use crate::output::{self, Format};
use model::{Input, Op, Output, Value};

/// One round of the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Round {
    /// kill -9 the group's leader, restart it 2 s later.
    KillLeader,
    /// kill -9 a random node, restart it 2 s later.
    KillRandom,
    /// kill -9 a random node, restart it 8 s later (past a `--down-after` of 5 s: its
    /// replicas are repaired elsewhere meanwhile).
    KillRandomLong,
    /// kill -9 every node at once, restart them 2 s later (with `--power-loss`: the
    /// whole cluster loses power).
    KillAll,
    /// SIGSTOP the leader, SIGCONT 2 s later: it wakes still believing it leads.
    PauseLeader,
    /// SIGSTOP a random node, SIGCONT 2 s later.
    PauseRandom,
    /// Cut the leader off from its peers (clients still reach it), heal 2 s later.
    PartitionLeader,
    /// Cut a random node off from its peers, heal 2 s later.
    PartitionRandom,
    /// Make the leader's writes and syncs fail; 2 s later kill -9 and restart it.
    #[value(name = "diskerror-leader")]
    DiskErrorLeader,
    /// Make a random node's writes and syncs fail; 2 s later kill -9 and restart it.
    #[value(name = "diskerror-random")]
    DiskErrorRandom,
}

impl Round {
    fn at_leader(self) -> bool {
        matches!(
            self,
            Round::KillLeader
                | Round::PauseLeader
                | Round::PartitionLeader
                | Round::DiskErrorLeader
        )
    }

    /// How long the fault lasts.
    fn lasts(self) -> Duration {
        match self {
            Round::KillRandomLong => Duration::from_secs(8),
            _ => Duration::from_secs(2),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Round::KillLeader | Round::KillRandom | Round::KillRandomLong | Round::KillAll => {
                "kill -9"
            }
            Round::PauseLeader | Round::PauseRandom => "pause (SIGSTOP)",
            Round::PartitionLeader | Round::PartitionRandom => "partition",
            Round::DiskErrorLeader | Round::DiskErrorRandom => "disk error",
        }
    }
}

/// Flags of `phoenix check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nemesis rounds, played in turn (2.5 s apart, each fault lasting 2 s, 8 s for
    /// kill-random-long).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kill-leader,pause-leader,partition-leader,diskerror-random,kill-random"
    )]
    pub rounds: Vec<Round>,
    /// Servers keep unsynced bytes in memory (`phoenix server --unsynced-in-memory`):
    /// every kill is a power loss that drops what the node never synced.
    #[arg(long = "power-loss")]
    pub power_loss: bool,
    /// How long the workload runs, in seconds (the last 10 s have no fault).
    #[arg(long, default_value_t = 27, value_parser = clap::value_parser!(u64).range(14..))]
    pub secs: u64,
    /// Seed of the workload and of the nemesis' choices (random if not given; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub clients: u64,
    /// Keys the clients share (fewer keys: more contention).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub keys: u64,
    /// Directory for the nodes' data and logs (`node-N/server.log`) and, if the check
    /// fails, the history (`history.txt`). Kept. Without it a temporary directory is used,
    /// removed when the history is linearizable and kept (and named) otherwise.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra argument for every server (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Split the key space this many times while the faults play (at most `--keys`
    /// minus one: the splits are at the workload's keys 1, 2, …).
    #[arg(long, default_value_t = 0)]
    pub splits: u64,
    /// Nodes to start (the first three form the meta group; groups keep 3 replicas).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=9))]
    pub nodes: u64,
}

/// After the last fault, the time every group has to be whole again (3 running voters
/// on live nodes, no learner, a leader).
const HEAL_WITHIN: Duration = Duration::from_secs(60);

/// Completed operations the cluster must serve after the last fault ended.
const MIN_AFTER_LAST_FAULT: usize = 100;

/// What the check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Linearizable,
    NotLinearizable,
    /// The search gave up (budget): neither proved nor refuted.
    Undecided,
    /// Too few operations completed after the last fault.
    NoServiceAfterFaults,
    /// Some group was not whole again within [`HEAL_WITHIN`] of the last fault.
    NotHealed,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Linearizable => "linearizable",
            Verdict::NotLinearizable => "not linearizable",
            Verdict::Undecided => "undecided",
            Verdict::NoServiceAfterFaults => "no service after the last fault",
            Verdict::NotHealed => "not healed after the last fault",
        }
    }
}

/// Runs `phoenix check`: exit code 0 if the history is linearizable and the cluster
/// served after the faults, 1 if not, 4 if the check itself could not run.
pub fn run(args: Args, format: Format) -> Result<Outcome, CmdError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CmdError::Failed(format!("start the async runtime: {e}").into()))?;
    rt.block_on(check(args, format)).map_err(CmdError::Failed)
}

async fn check(args: Args, format: Format) -> Result<Outcome, BoxError> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let (dir, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("phoenix-check-{}-{seed}", std::process::id())),
            true,
        ),
    };
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        return Err(format!("{} is not empty: give an empty or new --dir", dir.display()).into());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let progress = |line: String| match format {
        Format::Text => println!("{line}"),
        Format::Json => output::note(format_args!("{line}")),
    };
    progress(format!(
        "phoenix check: seed {seed}, {} nodes, {} s, rounds {:?}{}, data and logs in {}",
        args.nodes,
        args.secs,
        args.rounds,
        if args.power_loss { ", power loss" } else { "" },
        dir.display()
    ));

    let mut spec = ClusterSpec::ephemeral_nodes(&dir, args.nodes as usize)?;
    spec.server_args = args.server_args.clone();
    spec.server_args.push("--fault-injection".into());
    // The key space splits only where `--splits` asks.
    crate::bench::cluster::no_splits_unless_asked(&mut spec.server_args);
    if args.power_loss {
        spec.server_args.push("--unsynced-in-memory".into());
    }
    let endpoints = spec.endpoints();
    let mut cluster = LocalCluster::start(spec)?;
    cluster.wait_ready(Duration::from_secs(60)).await?;

    let keys = args.keys as usize;
    let history = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let stop = start + Duration::from_secs(args.secs);
    let tasks: Vec<_> = (0..args.clients as usize)
        .map(|id| {
            let w = Worker {
                id,
                keys,
                seed,
                start,
                stop,
                history: history.clone(),
            };
            tokio::spawn(w.run(endpoints.clone()))
        })
        .collect();

    if args.splits >= args.keys.max(1) {
        return Err(format!(
            "--splits {} needs more keys: at most --keys minus one ({})",
            args.splits,
            args.keys - 1
        )
        .into());
    }
    let splitter = tokio::spawn(play_splits(
        endpoints.clone(),
        args.splits as usize,
        start,
        stop,
    ));
    let played = play_nemesis(&mut cluster, &endpoints, &args.rounds, seed, start, stop).await;
    let split_events = splitter
        .await
        .map_err(|e| format!("the split task failed: {e}"))?;
    for t in tasks {
        t.await
            .map_err(|e| format!("a client task failed: {e}"))?
            .map_err(|e| format!("a client failed: {e}"))?;
    }
    let (mut events, last_back) = played?;
    events.extend(split_events);
    let healed = wait_healed(
        &endpoints,
        start + last_back,
        replication(&args.server_args),
    )
    .await;
    let healed_after = healed.as_ref().ok().map(|(t, _)| *t);
    // Where the groups ended: how many, and each node's replicas.
    let layout = healed.as_ref().ok().map(|(_, s)| {
        let mut per_node: std::collections::BTreeMap<u64, usize> =
            s.nodes.iter().map(|n| (n.node_id, 0)).collect();
        for g in &s.groups {
            for n in &g.replicas {
                *per_node.entry(*n).or_default() += 1;
            }
        }
        // Group ids are given out in order and never again: the ids below the highest
        // that are not routed went into merges.
        let highest = s.groups.iter().map(|g| g.group_id).max().unwrap_or(0) as usize;
        (
            s.groups.len(),
            per_node,
            highest.saturating_sub(s.groups.len()),
        )
    });
    cluster.stop();
    let history = std::mem::take(
        &mut *history
            .lock()
            .map_err(|_| "a client panicked while recording")?,
    );

    let t = Instant::now();
    let (mut verdict, mut account, after) = judge(&history, keys, last_back);
    if let (Verdict::Linearizable, Err(why)) = (verdict, &healed) {
        verdict = Verdict::NotHealed;
        account = format!(
            "not every group was whole again within {} s of the last fault: {why}",
            HEAL_WITHIN.as_secs()
        );
    }
    let check_time = t.elapsed();
    // The checker must reject this very history with one stale read planted in it: a
    // check that cannot fail proves nothing.
    let planted = model::plant_stale_read(&history).map(|h| {
        matches!(
            model::check_history(&h, keys, model::BUDGET),
            Err(text) if text.contains("NOT linearizable")
        )
    });
    if planted == Some(false) {
        return Err("the checker accepted a history with a planted stale read".into());
    }

    let stats = Stats::of(&history, args.secs);
    let history_file = if verdict == Verdict::Linearizable {
        None
    } else {
        let path = dir.join("history.txt");
        let text: String = history.iter().map(|o| format!("{o}\n")).collect();
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
        Some(path)
    };
    let kept = verdict != Verdict::Linearizable || !temporary;
    match format {
        Format::Json => {
            let doc = json!({
                "verdict": verdict.name(),
                "seed": seed,
                "secs": args.secs,
                "power_loss": args.power_loss,
                "rounds": args.rounds.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(),
                "nemesis": events,
                "ops": {
                    "total": history.len(),
                    "reads": stats.reads,
                    "reads_found": stats.reads_found,
                    "writes": stats.writes,
                    "cas_ok": stats.cas_ok,
                    "cas_failed": stats.cas_failed,
                    "unknown": stats.unknown,
                    "foreign_values": stats.foreign,
                    "after_last_fault": after,
                },
                "completed_per_second": stats.per_sec,
                "check_ms": check_time.as_millis() as u64,
                "nodes": args.nodes,
                "healed_ms_after_last_fault": healed_after.map(|d| d.as_millis() as u64),
                "groups_at_end": layout.as_ref().map(|(g, _, _)| *g),
                "groups_merged_away": layout.as_ref().map(|(_, _, m)| *m),
                "replicas_per_node_at_end": layout.as_ref().map(|(_, p, _)| {
                    p.iter().map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>()
                }),
                "planted_stale_read_rejected": planted,
                "account": account,
                "history_file": history_file.as_ref().map(|p| p.display().to_string()),
                "dir": kept.then(|| dir.display().to_string()),
            });
            output::print_json(&doc)?;
        }
        Format::Text => {
            let mut out = String::new();
            for e in &events {
                out.push_str(&format!("nemesis {e}\n"));
            }
            out.push_str(&format!(
                "history: {} ops: {} reads ({} found), {} writes, {} CAS ok, {} CAS failed, {} \
                 unknown outcome; {after} completed after the last fault\n",
                history.len(),
                stats.reads,
                stats.reads_found,
                stats.writes,
                stats.cas_ok,
                stats.cas_failed,
                stats.unknown
            ));
            if let (Some(h), Some((groups, per_node, merged))) = (healed_after, &layout) {
                out.push_str(&format!(
                    "every group whole again by {:.1} s after the last fault (checked once the \
                     workload ended): {groups} groups ({merged} merged away), replicas per \
                     node {per_node:?}\n",
                    h.as_secs_f64()
                ));
            }
            out.push_str(&format!(
                "completed ops per second: {:?}\nchecked in {check_time:?}; planted stale read \
                 {}\n",
                stats.per_sec,
                match planted {
                    Some(_) => "rejected",
                    None => "not planted (no overwritten write)",
                }
            ));
            if !account.is_empty() {
                out.push_str(&account);
                out.push('\n');
            }
            if let Some(p) = &history_file {
                out.push_str(&format!("full history: {}\n", p.display()));
            }
            if kept {
                out.push_str(&format!("data and logs: {}\n", dir.display()));
            }
            out.push_str(&format!("verdict: {} (seed {seed})\n", verdict.name()));
            use std::io::Write as _;
            let mut o = output::Stdout::lock();
            o.write_all(out.as_bytes())?;
            o.flush()?;
        }
    }
    if !kept {
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(match verdict {
        Verdict::Linearizable => Outcome::Done,
        _ => Outcome::Miss,
    })
}

/// The verdict on a history whose last fault ended at `last_back`, with its account
/// (empty when linearizable) and the operations completed after that fault.
fn judge(history: &[Op], keys: usize, last_back: Duration) -> (Verdict, String, usize) {
    let after = history
        .iter()
        .filter(|o| o.ret.is_some_and(|r| r > last_back.as_nanos() as u64))
        .count();
    let (verdict, account) = match model::check_history(history, keys, model::BUDGET) {
        Err(text) if text.contains("NOT linearizable") => (Verdict::NotLinearizable, text),
        Err(text) => (Verdict::Undecided, text),
        Ok(()) if after < MIN_AFTER_LAST_FAULT => (
            Verdict::NoServiceAfterFaults,
            format!(
                "only {after} operations completed after the last fault ended ({:.3} s); at \
                 least {MIN_AFTER_LAST_FAULT} must",
                last_back.as_secs_f64()
            ),
        ),
        Ok(()) => (Verdict::Linearizable, String::new()),
    };
    (verdict, account, after)
}

/// Counts of a history.
struct Stats {
    reads: usize,
    reads_found: usize,
    writes: usize,
    cas_ok: usize,
    cas_failed: usize,
    unknown: usize,
    /// Reads of values no client wrote.
    foreign: usize,
    /// Completions in each second of the run (how long each fault stalled the clients).
    per_sec: Vec<usize>,
}

impl Stats {
    fn of(history: &[Op], secs: u64) -> Stats {
        let count = |f: &dyn Fn(&Op) -> bool| history.iter().filter(|o| f(o)).count();
        let mut per_sec = vec![0usize; secs as usize + 3];
        for o in history {
            if let Some(r) = o.ret {
                let b = ((r / 1_000_000_000) as usize).min(per_sec.len() - 1);
                per_sec[b] += 1;
            }
        }
        Stats {
            reads: count(&|o| matches!(o.output, Output::Read(_))),
            reads_found: count(&|o| matches!(o.output, Output::Read(Some(_)))),
            writes: count(&|o| o.output == Output::Write),
            cas_ok: count(&|o| matches!(o.output, Output::Cas { ok: true, .. })),
            cas_failed: count(&|o| matches!(o.output, Output::Cas { ok: false, .. })),
            unknown: count(&|o| o.output == Output::Unknown),
            foreign: count(&|o| {
                matches!(
                    o.output,
                    Output::Read(Some(FOREIGN))
                        | Output::Cas {
                            prev: Some(FOREIGN),
                            ..
                        }
                )
            }),
            per_sec,
        }
    }
}

/// The value recorded for bytes no client wrote (not a number the clients make): the
/// checker then finds no write that explains the read.
const FOREIGN: Value = u64::MAX;

fn key_name(k: usize) -> Vec<u8> {
    format!("check/key{k}").into_bytes()
}

fn parse_value(bytes: &[u8]) -> Value {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&v| v != FOREIGN)
        .unwrap_or(FOREIGN)
}

/// One client of the workload.
struct Worker {
    id: usize,
    keys: usize,
    seed: u64,
    start: Instant,
    stop: Instant,
    history: Arc<Mutex<Vec<Op>>>,
}

impl Worker {
    async fn run(self, endpoints: Vec<String>) -> Result<(), String> {
        let opts = ClientOptions {
            timeout: Duration::from_secs(2),
            // Writes carry the client's session (the default): one resent after an
            // unknown outcome applies at most once, so the history still holds each
            // write's single fate, and the resend's answer is the write's.
            sessions: true,
            seed: self.seed ^ (self.id as u64 + 1),
            ..ClientOptions::default()
        };
        let client = Client::new_lazy(endpoints, opts).map_err(|e| e.to_string())?;
        let mut rng = ChaCha8Rng::seed_from_u64(
            self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.id as u64,
        );
        let mut seen: Vec<Option<Value>> = vec![None; self.keys];
        let mut seq = 0u64;
        let now = || self.start.elapsed().as_nanos() as u64;
        while Instant::now() < self.stop {
            let key = rng.gen_range(0..self.keys);
            let kb = key_name(key);
            seq += 1;
            // Unique across clients.
            let fresh = (self.id as u64 + 1) * 1_000_000_000 + seq;
            let dice = rng.gen_range(0..100);
            let call = now();
            let (input, output) = if dice < 45 {
                match client.get(&kb).await {
                    Ok(v) => {
                        let v = v.map(|b| parse_value(&b));
                        seen[key] = v;
                        (Input::Read, Output::Read(v))
                    }
                    // A failed read had no effect: it is left out of the history.
                    Err(_) => continue,
                }
            } else if dice < 70 {
                let r = client.put(&kb, fresh.to_string().as_bytes()).await;
                let out = if r.is_ok() {
                    Output::Write
                } else {
                    Output::Unknown
                };
                (Input::Write(fresh), out)
            } else {
                // Mostly expect what this client saw last, so many swaps succeed.
                let expect = if rng.gen_bool(0.85) { seen[key] } else { None };
                let exp_bytes = expect.map(|v| v.to_string().into_bytes());
                let r = client
                    .cas(
                        &kb,
                        exp_bytes.as_deref(),
                        Some(fresh.to_string().as_bytes()),
                    )
                    .await;
                let input = Input::Cas { expect, new: fresh };
                match r {
                    Ok(o) => {
                        let prev = o.previous.map(|b| parse_value(&b));
                        seen[key] = if o.succeeded { Some(fresh) } else { prev };
                        (
                            input,
                            Output::Cas {
                                ok: o.succeeded,
                                prev,
                            },
                        )
                    }
                    Err(_) => (input, Output::Unknown),
                }
            };
            let ret = now();
            // Any failed write is taken as possibly applied: sound whatever the error.
            let rec = Op {
                client: self.id,
                key,
                call,
                ret: (output != Output::Unknown).then_some(ret),
                input,
                output,
            };
            self.history
                .lock()
                .map_err(|_| "history lock poisoned")?
                .push(rec);
        }
        Ok(())
    }
}

/// Plays `rounds` in turn, 2.5 s apart from 3 s on, each only if it ends at least 10 s
/// before `stop` (a whole-cluster restart, elections and clients coming back, then the
/// operations that show the cluster serves again). Returns the events and when the last
/// fault ended (offset from `start`).
async fn play_nemesis(
    cluster: &mut LocalCluster,
    endpoints: &[String],
    rounds: &[Round],
    seed: u64,
    start: Instant,
    stop: Instant,
) -> Result<(Vec<String>, Duration), BoxError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xDEAD);
    let n = cluster.nodes.len();
    let mut events = Vec::new();
    let mut last_back = Duration::ZERO;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0.. {
        let r = rounds.get(i % rounds.len().max(1)).copied();
        // Every fault ends at least 10 s before the workload does.
        let Some(r) = r.filter(|r| Instant::now() + r.lasts() + Duration::from_secs(10) <= stop)
        else {
            break;
        };
        let victim = match r.at_leader() {
            true => match current_leader(cluster, endpoints).await {
                Some(l) => l,
                None => rng.gen_range(0..n),
            },
            false => rng.gen_range(0..n),
        };
        let t = start.elapsed();
        match r {
            Round::PauseLeader | Round::PauseRandom => cluster.nodes[victim].signal(libc::SIGSTOP),
            Round::PartitionLeader | Round::PartitionRandom => {
                retried(|| nemesis::partition(endpoints, Some(victim))).await?
            }
            Round::DiskErrorLeader | Round::DiskErrorRandom => {
                retried(|| nemesis::set_disk(&endpoints[victim], true, None)).await?
            }
            Round::KillLeader | Round::KillRandom | Round::KillRandomLong => {
                cluster.nodes[victim].kill()
            }
            Round::KillAll => cluster.nodes.iter_mut().for_each(|p| p.kill()),
        }
        let who = match r {
            Round::KillAll => "every node".to_string(),
            _ => format!("node {}", victim + 1),
        };
        let lead = if r.at_leader() { " (leader)" } else { "" };
        events.push(format!(
            "{:.3} s: {} {who}{lead}",
            t.as_secs_f64(),
            r.what()
        ));
        tokio::time::sleep(r.lasts()).await;
        let back = match r {
            Round::PauseLeader | Round::PauseRandom => {
                cluster.nodes[victim].signal(libc::SIGCONT);
                "continue"
            }
            Round::PartitionLeader | Round::PartitionRandom => {
                retried(|| nemesis::partition(endpoints, None)).await?;
                "heal"
            }
            Round::KillLeader | Round::KillRandom | Round::KillRandomLong => {
                cluster.nodes[victim].restart()?;
                "restart"
            }
            Round::KillAll => {
                for p in &mut cluster.nodes {
                    p.restart()?;
                }
                "restart"
            }
            // The node restarts its storage by itself once its disk takes writes.
            Round::DiskErrorLeader | Round::DiskErrorRandom => {
                retried(|| nemesis::set_disk(&endpoints[victim], false, None)).await?;
                "disk works again for"
            }
        };
        last_back = start.elapsed();
        events.push(format!("{:.3} s: {back} {who}", last_back.as_secs_f64()));
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    let left = stop.saturating_duration_since(Instant::now());
    tokio::time::sleep(left).await;
    Ok((events, last_back))
}

/// Splits the key space `n` times, evenly over the time the faults play (from 4 s on,
/// until 10 s before `stop`), at the workload's keys 1..=n (so key k-1 and key k end in
/// different groups): the group holding each key is split there. A split
/// that fails (its group's leader killed meanwhile, the meta leader changing) is asked
/// again until it is done or its time is up. Returns the events, as the nemesis does.
async fn play_splits(
    endpoints: Vec<String>,
    n: usize,
    start: Instant,
    stop: Instant,
) -> Vec<String> {
    let mut events = Vec::new();
    if n == 0 {
        return events;
    }
    let opts = ClientOptions {
        timeout: Duration::from_secs(8),
        ..ClientOptions::default()
    };
    let client = match Client::connect(endpoints, opts).await {
        Ok(c) => c,
        Err(e) => {
            events.push(format!("split: no client ({e})"));
            return events;
        }
    };
    let first = start + Duration::from_secs(4);
    let last = stop.checked_sub(Duration::from_secs(10)).unwrap_or(first);
    let every = last.saturating_duration_since(first) / n as u32;
    for i in 0..n {
        tokio::time::sleep_until((first + every * i as u32).into()).await;
        let key = key_name(i + 1);
        loop {
            let t = start.elapsed();
            let group = match client.cluster_status().await {
                Ok(s) => s
                    .groups
                    .iter()
                    .find(|g| {
                        g.start.as_slice() <= key.as_slice()
                            && (g.end.is_empty() || key.as_slice() < g.end.as_slice())
                    })
                    .map(|g| g.group_id),
                Err(_) => None,
            };
            let outcome = match group {
                Some(g) => client.split_group(g, &key).await.map(|(l, r)| (g, l, r)),
                None => Err(phoenix_client::ClientError::InvalidArgument(
                    "no group holds the key yet".into(),
                )),
            };
            match outcome {
                Ok((g, _, r)) => {
                    events.push(format!(
                        "{:.3} s: split group {g} at {} into group {} (epoch {})",
                        t.as_secs_f64(),
                        key.escape_ascii(),
                        r.group_id,
                        r.epoch
                    ));
                    break;
                }
                Err(e) if Instant::now() + Duration::from_secs(10) < stop => {
                    tracing::debug!("split at {}: {e}; asked again", key.escape_ascii());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    events.push(format!(
                        "{:.3} s: split at {} not done: {e}",
                        t.as_secs_f64(),
                        key.escape_ascii()
                    ));
                    break;
                }
            }
        }
    }
    events
}

/// A fault-injection call, retried for up to 10 s (a node may still be starting).
async fn retried<F, Fut>(call: F) -> Result<(), BoxError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("fault injection failed for 10 s: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The servers' `--replication` as `server_args` give it (3 if they do not).
fn replication(server_args: &[String]) -> usize {
    let mut it = server_args.iter();
    let mut found = None;
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--replication=") {
            found = v.parse().ok();
        } else if a == "--replication" {
            found = it.next().and_then(|v| v.parse().ok());
        }
    }
    found.unwrap_or(3)
}

/// Waits until every group of the cluster is whole (`replication` voters on live
/// nodes, each replica reported running, no learner, a leader), up to [`HEAL_WITHIN`]
/// after `since` (the last fault's end). Returns how long after `since` it was first
/// seen whole (the workload runs at least 10 s past the last fault: so that long at
/// least) and the cluster then, or what was last missing.
async fn wait_healed(
    endpoints: &[String],
    since: Instant,
    replication: usize,
) -> Result<(Duration, phoenix_client::ClusterStatus), String> {
    let deadline = since + HEAL_WITHIN;
    let opts = ClientOptions {
        timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        match Client::connect(endpoints.to_vec(), opts.clone()).await {
            Ok(c) => match c.cluster_status().await {
                Ok(s) => match unhealed(&s, replication) {
                    None => return Ok((since.elapsed(), s)),
                    Some(why) => last = why,
                },
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// What keeps the cluster `s` from being whole with `replication` voters a group (None:
/// nothing).
fn unhealed(s: &phoenix_client::ClusterStatus, replication: usize) -> Option<String> {
    let alive: std::collections::HashSet<u64> = s
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| n.node_id)
        .collect();
    if s.groups.is_empty() {
        return Some("no group in the routing table".into());
    }
    // The meta group heals too: a dead member replaced, back to as many as it started
    // with (a meta leader that predates reporting it says nothing of it).
    let meta = s
        .meta_group
        .as_ref()
        .map(|g| (g, META_MEMBERS.min(s.nodes.len())));
    for (g, want) in meta
        .into_iter()
        .chain(s.groups.iter().map(|g| (g, replication)))
    {
        if let Some(why) = group_unhealed(g, want, &alive) {
            return Some(why);
        }
    }
    None
}

/// What keeps group `g` from being whole with `want` voters on the `alive` nodes.
fn group_unhealed(
    g: &phoenix_client::GroupStatus,
    replication: usize,
    alive: &std::collections::HashSet<u64>,
) -> Option<String> {
    {
        let id = g.group_id;
        // A leader: a voter's own report, of the highest term any replica reports (the
        // meta leader's last word on the leader is not cleared when it steps down).
        let top = g.replica_status.iter().map(|r| r.term).max().unwrap_or(0);
        let led = g.replica_status.iter().any(|r| {
            r.is_leader
                && r.term == top
                && g.replicas.contains(&r.node_id)
                && !g.learners.contains(&r.node_id)
                && alive.contains(&r.node_id)
        });
        if !led {
            return Some(format!("group {id} has no leader"));
        }
        if !g.learners.is_empty() {
            return Some(format!("group {id} has learners {:?}", g.learners));
        }
        if g.replicas.len() != replication {
            return Some(format!("group {id} has replicas {:?}", g.replicas));
        }
        for &n in &g.replicas {
            if !alive.contains(&n) {
                return Some(format!("group {id} has a replica on node {n}, not alive"));
            }
            match g.replica_status.iter().find(|r| r.node_id == n) {
                None => return Some(format!("group {id}: node {n} reports no replica")),
                Some(r) if !r.stopped.is_empty() => {
                    return Some(format!(
                        "group {id}: replica on node {n} stopped: {}",
                        r.stopped
                    ))
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// The live node that serves reads of the data group as its leader right now (the meta
/// group's report lags by a heartbeat, so each node is asked directly), if any.
async fn current_leader(cluster: &mut LocalCluster, endpoints: &[String]) -> Option<usize> {
    let live: Vec<bool> = cluster.nodes.iter_mut().map(|p| p.is_running()).collect();
    let mut group = None;
    for (i, a) in endpoints.iter().enumerate() {
        if !live[i] {
            continue;
        }
        let Ok(Ok(mut m)) = tokio::time::timeout(
            Duration::from_secs(1),
            proto::meta_client::MetaClient::connect(format!("http://{a}")),
        )
        .await
        else {
            continue;
        };
        let Ok(Ok(r)) = tokio::time::timeout(
            Duration::from_secs(2),
            m.get_routes(proto::GetRoutesRequest { timeout_ms: 1000 }),
        )
        .await
        else {
            continue;
        };
        // The group holding the probe key (the key space may have split).
        let probe: &[u8] = b"check/probe";
        if let Some(route) = r.into_inner().routes.iter().find(|r| {
            r.start_key.as_ref() <= probe && (r.end_key.is_empty() || probe < r.end_key.as_ref())
        }) {
            group = Some(route.group_id);
            break;
        }
    }
    let group = group?;
    for (i, a) in endpoints.iter().enumerate() {
        if !live[i] {
            continue;
        }
        let Ok(Ok(mut kv)) = tokio::time::timeout(
            Duration::from_secs(1),
            proto::kv_client::KvClient::connect(format!("http://{a}")),
        )
        .await
        else {
            continue;
        };
        let req = proto::GetRequest {
            header: Some(proto::RequestHeader {
                group_id: group,
                epoch: 0,
                timeout_ms: 1000,
                // A follower must refuse, not pass the probe on to the leader.
                no_forward: true,
                ..Default::default()
            }),
            key: b"check/probe".to_vec().into(),
        };
        if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(2), kv.get(req)).await {
            if resp.into_inner().error.is_none() {
                return Some(i);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(client: usize, call: u64, v: Value) -> Op {
        Op {
            client,
            key: 0,
            call,
            ret: Some(call + 10),
            input: Input::Write(v),
            output: Output::Write,
        }
    }

    fn read(client: usize, call: u64, v: Option<Value>) -> Op {
        Op {
            client,
            key: 0,
            call,
            ret: Some(call + 10),
            input: Input::Read,
            output: Output::Read(v),
        }
    }

    #[test]
    fn verdicts() {
        let secs = |s: u64| s * 1_000_000_000;
        // A history that serves after the fault (at 1 s).
        let mut h = vec![write(0, 0, 1)];
        for i in 0..MIN_AFTER_LAST_FAULT as u64 {
            h.push(read(1, secs(2) + i * 100, Some(1)));
        }
        let (v, account, after) = judge(&h, 1, Duration::from_secs(1));
        assert_eq!(
            (v, account.as_str(), after),
            (Verdict::Linearizable, "", 100)
        );
        // Too little after the fault.
        let (v, account, _) = judge(&h, 1, Duration::from_secs(3));
        assert_eq!(v, Verdict::NoServiceAfterFaults);
        assert!(account.contains("only 0 operations"), "{account}");
        // A lost acknowledged write: a read after it sees the value before it.
        h.push(write(2, secs(3), 2));
        h.push(read(1, secs(4), Some(1)));
        let (v, account, _) = judge(&h, 1, Duration::from_secs(1));
        assert_eq!(v, Verdict::NotLinearizable);
        assert!(account.contains("key 0"), "{account}");
        // A value no client wrote cannot be explained.
        assert_eq!(parse_value(b"garbage"), FOREIGN);
        assert_eq!(parse_value(FOREIGN.to_string().as_bytes()), FOREIGN);
        assert_eq!(parse_value(b"7"), 7);
        let h = vec![write(0, 0, 1), read(1, 20, Some(FOREIGN))];
        assert_eq!(judge(&h, 1, Duration::ZERO).0, Verdict::NotLinearizable);
    }

    #[test]
    fn rounds_parse_by_name() {
        use clap::ValueEnum;
        for (name, r) in [
            ("kill-leader", Round::KillLeader),
            ("kill-all", Round::KillAll),
            ("diskerror-random", Round::DiskErrorRandom),
            ("partition-leader", Round::PartitionLeader),
            ("pause-random", Round::PauseRandom),
            ("kill-random-long", Round::KillRandomLong),
        ] {
            assert_eq!(Round::from_str(name, false), Ok(r));
        }
        assert_eq!(Round::KillRandomLong.lasts(), Duration::from_secs(8));
        assert_eq!(Round::KillRandom.lasts(), Duration::from_secs(2));
    }

    /// A cluster is whole only with 3 running voters on live nodes, no learner and a
    /// leader in every group.
    #[test]
    fn unhealed_names_what_is_missing() {
        use phoenix_client::{ClusterStatus, GroupStatus, NodeStatus, ReplicaStatus};
        let node = |id: u64, alive: bool| NodeStatus {
            node_id: id,
            addr: String::new(),
            alive,
            last_heartbeat_ms_ago: Some(1),
            groups: 1,
            leaders: 0,
            engine_bytes: 0,
            log_bytes: 0,
            disk_free_bytes: None,
            disk_full: false,
            draining: false,
        };
        let rep = |id: u64| ReplicaStatus {
            node_id: id,
            is_leader: id == 1,
            term: 1,
            commit_index: 1,
            applied_index: 1,
            log_first_index: 1,
            approximate_bytes: 0,
            stopped: String::new(),
            hibernating: false,
        };
        let whole = ClusterStatus {
            meta_leader: Some(1),
            meta_group: None,
            nodes: (1..=4).map(|i| node(i, true)).collect(),
            groups: vec![GroupStatus {
                group_id: 7,
                start: vec![],
                end: vec![],
                epoch: 1,
                leader: Some(1),
                replicas: vec![1, 2, 3],
                learners: vec![],
                replica_status: (1..=3).map(rep).collect(),
            }],
            operators: vec![],
            scrub_mismatches: vec![],
        };
        assert_eq!(unhealed(&whole, 3), None);
        let mut s = whole.clone();
        s.nodes[2].alive = false;
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("node 3, not alive")));
        let mut s = whole.clone();
        s.groups[0].replica_status[0].is_leader = false;
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("no leader")));
        // A leader of an older term than another replica reports: none now.
        let mut s = whole.clone();
        s.groups[0].replica_status[2].term = 2;
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("no leader")));
        assert!(unhealed(&whole, 5).is_some_and(|w| w.contains("replicas [1, 2, 3]")));
        // The meta group: whole with 3 voters on live nodes, not with a member down.
        let mut s = whole.clone();
        s.meta_group = Some(GroupStatus {
            group_id: 0,
            ..whole.groups[0].clone()
        });
        assert_eq!(unhealed(&s, 3), None);
        s.nodes[1].alive = false;
        s.groups[0].replicas = vec![1, 3, 4];
        s.groups[0].replica_status = [1, 3, 4].map(rep).to_vec();
        assert!(unhealed(&s, 3)
            .is_some_and(|w| w.contains("group 0 has a replica on node 2, not alive")));
        assert_eq!(replication(&["--replication=5".into()]), 5);
        assert_eq!(replication(&["--replication".into(), "1".into()]), 1);
        assert_eq!(replication(&["--down-after=5s".into()]), 3);
        let mut s = whole.clone();
        s.groups[0].replicas.push(4);
        s.groups[0].learners.push(4);
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("learners")));
        let mut s = whole.clone();
        s.groups[0].replica_status[1].stopped = "disk".into();
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("stopped")));
        let mut s = whole.clone();
        s.groups[0].replica_status.pop();
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("reports no replica")));
        let mut s = whole;
        s.groups[0].replicas.pop();
        assert!(unhealed(&s, 3).is_some_and(|w| w.contains("replicas [1, 2]")));
    }
}
