//! Linearizability of a running cluster under kill -9, pauses and partitions, checked the
//! way Knossos and porcupine do it.
//!
//! Three real `phoenix server` processes on loopback; several concurrent clients run
//! random get / put / compare-and-swap on a few keys with unique values while a nemesis
//! kill -9's the group's leader, pauses the leader (SIGSTOP, then SIGCONT), kill -9's a
//! random node, and again, bringing each back after 2 s; in the other test it cuts the
//! leader, then a random node, off from the other nodes (the servers' fault-injection
//! service; clients still reach every node), healing after 2 s, and makes the leader's,
//! then a random node's disk fail (writes and syncs) for 2 s before it is killed and
//! restarted; in the third, servers keep unsynced bytes in memory, so every kill -9 is a
//! power loss, and the whole cluster is killed at once twice. Every operation's invocation
//! and completion time is recorded. A write whose outcome the client cannot know
//! (deadline, outcome unknown, broken connection) is recorded as never completing: it
//! may take effect at any point after its invocation, or never.
//! A read that fails has no effect and is left out.
//!
//! The history is checked per key (a register is P-compositional) against a register
//! with compare-and-swap by a Wing–Gong–Lowe search with memoization (the algorithm of
//! porcupine): a depth-first search over linearization points whose visited
//! (linearized set, register value) pairs are cached.
//!
//! `PHOENIX_SEED` seeds the workload (operation choices, values, the nemesis' choice of
//! node); `PHOENIX_LIN_SECS` sets how long the workload runs (default 27 s; longer runs
//! get more nemesis rounds); `PHOENIX_LIN_LOGS=DIR` keeps the servers' logs there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phoenix_client::{Client, ClientOptions};
use phoenix_proto as proto;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------
// The model and the checker.
// ---------------------------------------------------------------------------------

/// Register values are unique numbers (so a read names the write it observed).
type Value = u64;

/// What a client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Read,
    Write(Value),
    /// Set to `new` if the register holds `expect` (None = absent).
    Cas {
        expect: Option<Value>,
        new: Value,
    },
}

/// What the client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Read(Option<Value>),
    Write,
    /// Whether the swap happened, and the value before it.
    Cas {
        ok: bool,
        prev: Option<Value>,
    },
    /// No answer the client could trust: may have taken effect, or not.
    Unknown,
}

/// One operation of the history, times in nanoseconds since the workload started.
#[derive(Clone, Debug)]
struct Op {
    client: usize,
    key: usize,
    call: u64,
    /// None = the outcome is unknown (the operation never completes).
    ret: Option<u64>,
    input: Input,
    output: Output,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |t: u64| t as f64 / 1e6;
        let ret = match self.ret {
            Some(r) => format!("{:.3}", ms(r)),
            None => "∞".into(),
        };
        write!(
            f,
            "client {} key {} [{:.3} ms, {} ms] {:?} -> {:?}",
            self.client,
            self.key,
            ms(self.call),
            ret,
            self.input,
            self.output
        )
    }
}

/// The register-with-CAS model: the state after applying `op` to `state`, or None if
/// `op`'s recorded output is impossible from `state`.
fn step(state: Option<Value>, op: &Op) -> Option<Option<Value>> {
    match (op.input, op.output) {
        (Input::Read, Output::Read(v)) => (v == state).then_some(state),
        (Input::Read, Output::Unknown) => Some(state),
        (Input::Write(v), Output::Write | Output::Unknown) => Some(Some(v)),
        (Input::Cas { expect, new }, Output::Unknown) => {
            Some(if state == expect { Some(new) } else { state })
        }
        (Input::Cas { expect, new }, Output::Cas { ok, prev }) => {
            if prev != state || ok != (state == expect) {
                None
            } else if ok {
                Some(Some(new))
            } else {
                Some(state)
            }
        }
        _ => panic!("output does not match input: {op}"),
    }
}

/// Why a key's history is not linearizable (or could not be decided).
#[derive(Debug)]
struct Violation {
    /// Operations placed in the deepest partial linearization found, in order.
    linearized: Vec<usize>,
    /// The register's value after them.
    state: Option<Value>,
    /// The operation that completed but could not be placed after them.
    stuck: usize,
    /// The search gave up (step budget) instead of exhausting all orders.
    inconclusive: bool,
}

#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    call: bool,
}

/// Checks one key's history (all ops on one register, which starts absent).
fn check(ops: &[Op], budget: u64) -> Result<(), Violation> {
    let n = ops.len();
    if n == 0 {
        return Ok(());
    }
    // Entries in time order; a call sorts before a return at the same instant (that
    // makes the two operations concurrent: the permissive reading of a tie).
    let mut entries: Vec<(u64, u8, Entry)> = Vec::with_capacity(2 * n);
    for (i, op) in ops.iter().enumerate() {
        assert!(
            op.ret.is_none_or(|r| r >= op.call),
            "returns before call: {op}"
        );
        entries.push((op.call, 0, Entry { op: i, call: true }));
        entries.push((op.ret.unwrap_or(u64::MAX), 1, Entry { op: i, call: false }));
    }
    entries.sort_by_key(|(t, kind, e)| (*t, *kind, e.op));
    let entries: Vec<Entry> = entries.into_iter().map(|(_, _, e)| e).collect();
    let m = entries.len();
    let head = m; // sentinel of the circular doubly-linked list
    let mut next: Vec<usize> = (0..=m).map(|i| (i + 1) % (m + 1)).collect();
    let mut prev: Vec<usize> = (0..=m).map(|i| (i + m) % (m + 1)).collect();
    let mut call_at = vec![0; n];
    let mut ret_at = vec![0; n];
    for (i, e) in entries.iter().enumerate() {
        if e.call {
            call_at[e.op] = i;
        } else {
            ret_at[e.op] = i;
        }
    }
    let unlink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[x], next[x]);
        next[p] = q;
        prev[q] = p;
    };
    // Dancing links: relinking in the reverse order of unlinking restores the list.
    let relink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[x], next[x]);
        next[p] = x;
        prev[q] = x;
    };

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, Option<Value>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<Value>)> = Vec::new();
    let mut state: Option<Value> = None;
    let mut best: Option<(Vec<usize>, Option<Value>, usize)> = None;
    let mut steps = 0u64;
    let mut entry = next[head];
    while next[head] != head {
        steps += 1;
        if steps > budget {
            let (lin, st, stuck) = best.unwrap_or((Vec::new(), None, entries[entry].op));
            return Err(Violation {
                linearized: lin,
                state: st,
                stuck,
                inconclusive: true,
            });
        }
        assert_ne!(entry, head, "the list always ends with a return entry");
        let e = entries[entry];
        if e.call {
            if let Some(new_state) = step(state, &ops[e.op]) {
                linearized[e.op / 64] |= 1 << (e.op % 64);
                if cache.insert((linearized.clone(), new_state)) {
                    stack.push((e.op, state));
                    state = new_state;
                    unlink(call_at[e.op], &mut next, &mut prev);
                    unlink(ret_at[e.op], &mut next, &mut prev);
                    entry = next[head];
                    continue;
                }
                linearized[e.op / 64] &= !(1 << (e.op % 64));
            }
            entry = next[entry];
        } else {
            // An operation completed before any order could place it: undo the last
            // choice and try the next candidate after it.
            if best.as_ref().is_none_or(|b| stack.len() > b.0.len()) {
                best = Some((stack.iter().map(|x| x.0).collect(), state, e.op));
            }
            let Some((op, old)) = stack.pop() else {
                let (lin, st, stuck) = best.unwrap_or((Vec::new(), None, e.op));
                return Err(Violation {
                    linearized: lin,
                    state: st,
                    stuck,
                    inconclusive: false,
                });
            };
            linearized[op / 64] &= !(1 << (op % 64));
            state = old;
            relink(ret_at[op], &mut next, &mut prev);
            relink(call_at[op], &mut next, &mut prev);
            entry = next[call_at[op]];
        }
    }
    Ok(())
}

/// Leaves out the unknown-outcome ops whose value nobody observed (no read returned
/// it, no CAS reported it as the previous value or expected it). Such an op changes no
/// completed op's view, so the history is linearizable with it iff without it: in a
/// linearization with it, the ops up to the next write are all unknown CASes that
/// expected something else; removing it and moving those to the end (never observed)
/// keeps the order valid. Without this, every unapplied write doubles the orders the
/// search must exhaust before it can refute a history.
fn prune_unobserved(ops: Vec<Op>) -> Vec<Op> {
    let mut observed = HashSet::new();
    for o in &ops {
        match o.output {
            Output::Read(Some(v)) | Output::Cas { prev: Some(v), .. } => {
                observed.insert(v);
            }
            _ => {}
        }
        if let Input::Cas {
            expect: Some(v), ..
        } = o.input
        {
            observed.insert(v);
        }
    }
    ops.into_iter()
        .filter(|o| {
            o.output != Output::Unknown
                || match o.input {
                    Input::Write(v) | Input::Cas { new: v, .. } => observed.contains(&v),
                    Input::Read => false,
                }
        })
        .collect()
}

/// Checks every key; on failure returns a human-readable account.
fn check_history(history: &[Op], keys: usize, budget: u64) -> Result<(), String> {
    let mut report = String::new();
    for k in 0..keys {
        let ops: Vec<Op> = history.iter().filter(|o| o.key == k).cloned().collect();
        let ops = prune_unobserved(ops);
        if let Err(v) = check(&ops, budget) {
            report.push_str(&describe(k, &ops, &v));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

fn describe(key: usize, ops: &[Op], v: &Violation) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let stuck = &ops[v.stuck];
    let _ = writeln!(
        s,
        "key {key}: {} ({} ops); deepest partial linearization placed {} ops, leaving the \
         register at {:?}; then this completed op could not be placed:\n  {stuck}",
        if v.inconclusive {
            "search budget exhausted, undecided"
        } else {
            "NOT linearizable"
        },
        ops.len(),
        v.linearized.len(),
        v.state,
    );
    let _ = writeln!(s, "last ops of that partial linearization:");
    for &i in v.linearized.iter().rev().take(8).rev() {
        let _ = writeln!(s, "  {}", ops[i]);
    }
    // Everything concurrent with the stuck op, and a little before it.
    let from = stuck.call.saturating_sub(200_000_000);
    let to = stuck.ret.unwrap_or(u64::MAX);
    let _ = writeln!(
        s,
        "ops of key {key} overlapping [stuck.call - 200 ms, stuck.ret]:"
    );
    let mut near: Vec<&Op> = ops
        .iter()
        .filter(|o| o.call <= to && o.ret.is_none_or(|r| r >= from))
        .collect();
    near.sort_by_key(|o| o.call);
    for o in near.iter().take(60) {
        let _ = writeln!(s, "  {o}");
    }
    s
}

/// Search steps per key before the check gives up (undecided fails the test too).
const BUDGET: u64 = 20_000_000;

fn op(client: usize, call: u64, ret: Option<u64>, input: Input, output: Output) -> Op {
    Op {
        client,
        key: 0,
        call,
        ret,
        input,
        output,
    }
}

#[test]
fn checker_accepts_linearizable_histories() {
    use Input as I;
    use Output as O;
    // Concurrent writes; a read overlapping them may see either order.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 5, Some(30), I::Write(2), O::Write),
        op(2, 12, Some(20), I::Read, O::Read(Some(1))),
        op(0, 21, Some(25), I::Read, O::Read(Some(2))),
        op(
            2,
            31,
            Some(40),
            I::Cas {
                expect: Some(2),
                new: 3,
            },
            O::Cas {
                ok: true,
                prev: Some(2),
            },
        ),
        op(
            1,
            35,
            Some(45),
            I::Cas {
                expect: Some(2),
                new: 4,
            },
            O::Cas {
                ok: false,
                prev: Some(3),
            },
        ),
        op(0, 50, Some(60), I::Read, O::Read(Some(3))),
    ];
    check(&h, BUDGET).unwrap();
    // An unknown write may take effect long after it was sent, or never.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 5, None, I::Write(2), O::Unknown),
        op(2, 20, Some(30), I::Read, O::Read(Some(1))),
        op(2, 40, Some(50), I::Read, O::Read(Some(2))),
        op(0, 60, Some(70), I::Read, O::Read(Some(2))),
    ];
    check(&h, BUDGET).unwrap();
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 5, None, I::Write(2), O::Unknown),
        op(
            1,
            6,
            None,
            I::Cas {
                expect: Some(1),
                new: 3,
            },
            O::Unknown,
        ),
        op(2, 20, Some(30), I::Read, O::Read(Some(1))),
    ];
    check(&h, BUDGET).unwrap();
    // Absent at first.
    let h = vec![op(0, 0, Some(1), I::Read, O::Read(None))];
    check(&h, BUDGET).unwrap();
}

#[test]
fn checker_rejects_violations() {
    use Input as I;
    use Output as O;
    // Stale read: write 2 completed after write 1, then a read returns 1.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 20, Some(30), I::Write(2), O::Write),
        op(2, 40, Some(50), I::Read, O::Read(Some(1))),
    ];
    let v = check(&h, BUDGET).unwrap_err();
    assert!(!v.inconclusive);
    assert_eq!(v.stuck, 2, "the stale read is the op that cannot be placed");
    // Two overlapping writes seen in an order their intervals forbid: write 1 must
    // land by 10, so after a read of 2 (at 12..20) nothing can bring back 1.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 5, Some(30), I::Write(2), O::Write),
        op(2, 12, Some(20), I::Read, O::Read(Some(2))),
        op(0, 21, Some(25), I::Read, O::Read(Some(1))),
    ];
    assert!(check(&h, BUDGET).is_err());
    // Lost update: two sequential CAS from the same expected value both succeed.
    let cas = |c, t, new| {
        op(
            c,
            t,
            Some(t + 5),
            I::Cas {
                expect: Some(1),
                new,
            },
            O::Cas {
                ok: true,
                prev: Some(1),
            },
        )
    };
    let h = vec![
        op(0, 0, Some(1), I::Write(1), O::Write),
        cas(1, 10, 2),
        cas(2, 20, 3),
    ];
    assert!(check(&h, BUDGET).is_err());
    // A read of a value nobody wrote.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 20, Some(30), I::Read, O::Read(Some(7))),
    ];
    assert!(check(&h, BUDGET).is_err());
    // A failed CAS must report the value it saw.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(
            1,
            20,
            Some(30),
            I::Cas {
                expect: Some(5),
                new: 6,
            },
            O::Cas {
                ok: false,
                prev: None,
            },
        ),
    ];
    assert!(check(&h, BUDGET).is_err());
    // An unknown write seen, then a read of the value before it (with nothing able
    // to restore it): not linearizable.
    let h = vec![
        op(0, 0, Some(10), I::Write(1), O::Write),
        op(1, 5, None, I::Write(2), O::Unknown),
        op(2, 20, Some(30), I::Read, O::Read(Some(2))),
        op(2, 40, Some(50), I::Read, O::Read(Some(1))),
    ];
    assert!(check(&h, BUDGET).is_err());
    // The account names the key and the stuck op.
    let text = check_history(&h, 1, BUDGET).unwrap_err();
    assert!(text.contains("NOT linearizable"), "{text}");
}

#[test]
fn checker_refutes_quickly_despite_many_unknown_writes() {
    use Input as I;
    use Output as O;
    // 40 writes that never answered (and were never seen) around a stale read: without
    // pruning, the search would try 2^40 subsets of them before giving up.
    let mut h = vec![op(0, 0, Some(10), I::Write(1), O::Write)];
    for i in 0..40 {
        h.push(op(
            3 + i,
            11 + i as u64,
            None,
            I::Write(100 + i as u64),
            O::Unknown,
        ));
    }
    h.push(op(1, 100, Some(110), I::Write(2), O::Write));
    h.push(op(2, 120, Some(130), I::Read, O::Read(Some(1))));
    let text = check_history(&h, 1, 1_000_000).unwrap_err();
    assert!(text.contains("NOT linearizable"), "{text}");
    // One of them observed stays, and explains a read that would otherwise be stale.
    h.push(op(2, 140, Some(150), I::Read, O::Read(Some(120))));
    h.retain(|o| o.input != I::Read || o.output != O::Read(Some(1)));
    check_history(&h, 1, 1_000_000).unwrap();
    assert_eq!(prune_unobserved(h.clone()).len(), 4);
}

/// Plants a stale read into a real history: a read, after everything, of the value of
/// a completed write that a later completed write (invoked after the first returned)
/// overwrote. No unknown op can write that value again (values are unique), so the
/// planted history is certainly not linearizable. None if no such pair exists.
fn plant_stale_read(history: &[Op]) -> Option<Vec<Op>> {
    let end = history.iter().filter_map(|o| o.ret).max()? + 1;
    let written = |o: &Op| match (o.input, o.output) {
        (Input::Write(v), Output::Write) => Some(v),
        (Input::Cas { new, .. }, Output::Cas { ok: true, .. }) => Some(new),
        _ => None,
    };
    for a in history {
        let (Some(va), Some(ra)) = (written(a), a.ret) else {
            continue;
        };
        let overwritten = history
            .iter()
            .any(|b| b.key == a.key && b.call > ra && b.ret.is_some() && written(b).is_some());
        if overwritten {
            let mut h = history.to_vec();
            h.push(Op {
                client: usize::MAX,
                key: a.key,
                call: end,
                ret: Some(end + 1),
                input: Input::Read,
                output: Output::Read(Some(va)),
            });
            return Some(h);
        }
    }
    None
}

// ---------------------------------------------------------------------------------
// The cluster (the process harness of cluster_kill.rs).
// ---------------------------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cluster {
    addrs: Vec<String>,
    meta: String,
    dir: tempfile::TempDir,
    procs: Vec<Option<Child>>,
    /// Extra arguments of every server.
    args: Vec<String>,
}

impl Cluster {
    fn new(n: usize, args: &[&str]) -> Cluster {
        let addrs: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let meta = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}@{a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            addrs,
            meta,
            dir: tempfile::tempdir().unwrap(),
            procs: (0..n).map(|_| None).collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        for i in 0..n {
            c.start(i);
        }
        c
    }

    fn start(&mut self, i: usize) {
        assert!(self.procs[i].is_none());
        let data = self.dir.path().join(format!("node-{}", i + 1));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{}.log", i + 1)))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_phoenix"))
            .args([
                "server",
                "--id",
                &(i + 1).to_string(),
                "--listen",
                &self.addrs[i],
                "--fault-injection",
            ])
            .arg("--data-dir")
            .arg(&data)
            .args(["--meta", &self.meta])
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs[i] = Some(child);
    }

    fn kill9(&mut self, i: usize) {
        let mut c = self.procs[i].take().unwrap();
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    /// Sends `kill -<sig>` to node `i` (STOP / CONT).
    fn signal(&self, i: usize, sig: &str) {
        let pid = self.procs[i].as_ref().unwrap().id();
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill -{sig} {pid} failed");
    }

    /// Cuts node `isolated` off from the other nodes (`None`: heals every link).
    async fn partition(&self, isolated: Option<usize>) {
        for (i, a) in self.addrs.iter().enumerate() {
            let cut: Vec<u64> = match isolated {
                None => Vec::new(),
                Some(n) if n == i => (0..self.addrs.len())
                    .filter(|&j| j != n)
                    .map(|j| j as u64 + 1)
                    .collect(),
                Some(n) => vec![n as u64 + 1],
            };
            let r = faults_call(a, |mut f| {
                let cut = cut.clone();
                async move {
                    f.set_links(proto::SetLinksRequest { cut_nodes: cut })
                        .await
                        .map(|r| r.into_inner().error)
                }
            })
            .await;
            assert!(r.is_none(), "node {}: {r:?}", i + 1);
        }
    }

    /// Makes node `i`'s writes and syncs fail.
    async fn fail_disk(&self, i: usize) {
        let r = faults_call(&self.addrs[i], |mut f| async move {
            f.set_disk(proto::SetDiskRequest {
                fail_writes: true,
                fail_syncs: true,
            })
            .await
            .map(|r| r.into_inner().error)
        })
        .await;
        assert!(r.is_none(), "node {}: {r:?}", i + 1);
    }

    fn is_live(&self, i: usize) -> bool {
        self.procs[i].is_some()
    }

    fn dump_logs(&self) {
        for i in 0..self.addrs.len() {
            let p = self.dir.path().join(format!("node-{}.log", i + 1));
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("---- node {} log tail ----", i + 1);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        if let Ok(to) = std::env::var("PHOENIX_LIN_LOGS") {
            for i in 0..self.addrs.len() {
                let name = format!("node-{}.log", i + 1);
                let _ = std::fs::copy(self.dir.path().join(&name), Path::new(&to).join(&name));
            }
        }
        for c in self.procs.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

type FaultsClient = proto::faults_client::FaultsClient<tonic::transport::Channel>;

/// One call to node `addr`'s fault-injection service, retried for up to 10 s while the
/// node cannot be reached (it may still be starting after a restart); the call's error.
async fn faults_call<F, Fut>(addr: &str, call: F) -> Option<proto::Error>
where
    F: Fn(FaultsClient) -> Fut,
    Fut: std::future::Future<Output = Result<Option<proto::Error>, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match FaultsClient::connect(format!("http://{addr}")).await {
            Ok(f) => match call(f).await {
                Ok(e) => return e,
                Err(s) => s.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "fault injection at {addr} unreachable for 10 s: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The live node that serves reads of the data group as its leader right now (the meta
/// group's report lags by a heartbeat, so each node is asked directly), if any.
async fn current_leader(c: &Cluster) -> Option<usize> {
    let mut group = None;
    for (i, a) in c.addrs.iter().enumerate() {
        if !c.is_live(i) {
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
        if let Some(route) = r.into_inner().routes.first() {
            group = Some(route.group_id);
            break;
        }
    }
    let group = group?;
    for (i, a) in c.addrs.iter().enumerate() {
        if !c.is_live(i) {
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
                ..Default::default()
            }),
            key: b"lin/probe".to_vec().into(),
        };
        if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(2), kv.get(req)).await {
            if resp.into_inner().error.is_none() {
                return Some(i);
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------
// The workload and the nemesis.
// ---------------------------------------------------------------------------------

const KEYS: usize = 3;
const CLIENTS: usize = 6;

fn key_name(k: usize) -> Vec<u8> {
    format!("lin/key{k}").into_bytes()
}

fn parse_value(bytes: &[u8]) -> Value {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("read a value no client wrote: {bytes:?}"))
}

async fn client_loop(
    id: usize,
    endpoints: Vec<String>,
    seed: u64,
    start: Instant,
    stop: Instant,
    history: Arc<Mutex<Vec<Op>>>,
) {
    let opts = ClientOptions {
        timeout: Duration::from_secs(2),
        // Writes carry the client's session (the default): one resent after an unknown
        // outcome applies at most once, so the history still holds each write's single
        // fate, and the checker sees the resend's answer as the write's.
        sessions: true,
        seed: seed ^ (id as u64 + 1),
        ..ClientOptions::default()
    };
    let client = Client::new_lazy(endpoints, opts).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id as u64);
    let mut seen: [Option<Value>; KEYS] = [None; KEYS];
    let mut seq = 0u64;
    let now = || start.elapsed().as_nanos() as u64;
    while Instant::now() < stop {
        let key = rng.gen_range(0..KEYS);
        let kb = key_name(key);
        seq += 1;
        // Unique across clients and runs of this loop.
        let fresh = (id as u64 + 1) * 1_000_000_000 + seq;
        let dice = rng.gen_range(0..100);
        let call = now();
        let (input, output, ok) = if dice < 45 {
            match client.get(&kb).await {
                Ok(v) => {
                    let v = v.map(|b| parse_value(&b));
                    seen[key] = v;
                    (Input::Read, Output::Read(v), true)
                }
                // A failed read had no effect: it is left out of the history.
                Err(_) => continue,
            }
        } else if dice < 70 {
            let r = client.put(&kb, fresh.to_string().as_bytes()).await;
            (Input::Write(fresh), Output::Write, r.is_ok())
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
                        true,
                    )
                }
                Err(_) => (input, Output::Unknown, false),
            }
        };
        let ret = now();
        // Any failed write is taken as possibly applied: sound whatever the error was.
        let rec = Op {
            client: id,
            key,
            call,
            ret: ok.then_some(ret),
            input,
            output: if ok { output } else { Output::Unknown },
        };
        history.lock().unwrap().push(rec);
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Prints the seed if the test panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "linearizability test failed; replay the workload with PHOENIX_SEED={}",
                self.0
            );
        }
    }
}

/// One round of the nemesis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    KillLeader,
    /// SIGSTOP: the leader wakes up later still believing it leads, the classic way to
    /// get a deposed leader answering.
    PauseLeader,
    KillRandom,
    /// kill -9 every node at once (a power loss of the whole cluster, with
    /// `--unsynced-in-memory`: only what each node synced survives).
    KillAll,
    /// Cut the leader off from its followers: it keeps its clients while the others
    /// elect (a deposed leader that still answers, without a pause).
    PartitionLeader,
    PartitionRandom,
    /// The disk fails (writes and syncs), then the node is killed and restarted.
    DiskErrorLeader,
    DiskErrorRandom,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_linearizable_under_kill_9() {
    use Round::*;
    linearizable_under(&[KillLeader, PauseLeader, KillRandom, KillLeader], &[]).await;
}

/// Every kill is a power loss: the servers keep unsynced bytes in memory, so a killed
/// node comes back with only what it synced, and twice the whole cluster loses power at
/// once (an acknowledgement sent before its fsync shows up as a lost write or a stale
/// read: with syncs that persist nothing, this test fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_linearizable_under_power_loss() {
    use Round::*;
    let lossy = ["--unsynced-in-memory"];
    linearizable_under(&[KillLeader, KillAll, KillRandom, KillAll], &lossy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_linearizable_under_partitions_and_disk_errors() {
    use Round::*;
    linearizable_under(
        &[
            PartitionLeader,
            DiskErrorLeader,
            PartitionRandom,
            DiskErrorRandom,
        ],
        &[],
    )
    .await;
}

/// Runs the workload with the nemesis playing `rounds` in turn against servers started
/// with `server_args` too, then checks the history.
async fn linearizable_under(rounds: &[Round], server_args: &[&str]) {
    let seed = env_u64("PHOENIX_SEED", 0x5EED_11AE);
    let secs = env_u64("PHOENIX_LIN_SECS", 27);
    let _guard = SeedGuard(seed);
    eprintln!("PHOENIX_SEED={seed} PHOENIX_LIN_SECS={secs}");
    let mut nemesis_rng = ChaCha8Rng::seed_from_u64(seed ^ 0xDEAD);

    let mut c = Cluster::new(3, server_args);
    // Ready: a write goes through (group created, leader elected).
    let probe = Client::new_lazy(
        c.addrs.clone(),
        ClientOptions {
            timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    probe.put(b"lin/probe", b"ready").await.unwrap();

    let history = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let stop = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|id| {
            tokio::spawn(client_loop(
                id,
                c.addrs.clone(),
                seed,
                start,
                stop,
                history.clone(),
            ))
        })
        .collect();

    // Nemesis, in rounds of 4.5 s while time is left, playing `rounds` in turn. A
    // killed node restarts, a paused one continues, a cut one is healed, after 2 s.
    let mut events = Vec::new();
    // When the last fault ended: the cluster must serve again after it.
    let mut last_back = Duration::ZERO;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for round in 0.. {
        // A round takes 2 s; at least 8 s must follow the last one (a whole-cluster
        // restart, elections, clients backing off and coming back) for the liveness
        // check below.
        if Instant::now() + Duration::from_secs(10) > stop {
            break;
        }
        let r = rounds[round % rounds.len()];
        let (what, leader_round) = match r {
            Round::KillLeader => ("kill -9", true),
            Round::PauseLeader => ("pause (SIGSTOP)", true),
            Round::KillRandom => ("kill -9", false),
            Round::KillAll => ("kill -9", false),
            Round::PartitionLeader => ("partition", true),
            Round::PartitionRandom => ("partition", false),
            Round::DiskErrorLeader => ("disk error", true),
            Round::DiskErrorRandom => ("disk error", false),
        };
        let victim = match leader_round {
            true => match current_leader(&c).await {
                Some(l) => l,
                None => nemesis_rng.gen_range(0..3),
            },
            false => nemesis_rng.gen_range(0..3),
        };
        let t = start.elapsed();
        match r {
            Round::PauseLeader => c.signal(victim, "STOP"),
            Round::PartitionLeader | Round::PartitionRandom => c.partition(Some(victim)).await,
            Round::DiskErrorLeader | Round::DiskErrorRandom => c.fail_disk(victim).await,
            Round::KillLeader | Round::KillRandom => c.kill9(victim),
            Round::KillAll => (0..3).for_each(|i| c.kill9(i)),
        }
        let who = match r {
            Round::KillAll => "every node".to_string(),
            _ => format!("node {}", victim + 1),
        };
        events.push(format!(
            "{:.3} s: {what} {who}{}",
            t.as_secs_f64(),
            if leader_round { " (leader)" } else { "" }
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let back = match r {
            Round::PauseLeader => {
                c.signal(victim, "CONT");
                "continue"
            }
            Round::PartitionLeader | Round::PartitionRandom => {
                c.partition(None).await;
                "heal"
            }
            Round::KillLeader | Round::KillRandom => {
                c.start(victim);
                "restart"
            }
            Round::KillAll => {
                (0..3).for_each(|i| c.start(i));
                "restart"
            }
            Round::DiskErrorLeader | Round::DiskErrorRandom => {
                c.kill9(victim);
                c.start(victim);
                "kill -9 and restart"
            }
        };
        last_back = start.elapsed();
        events.push(format!("{:.3} s: {back} {who}", last_back.as_secs_f64()));
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    for e in &events {
        eprintln!("nemesis {e}");
    }

    let count = |f: &dyn Fn(&Op) -> bool| history.iter().filter(|o| f(o)).count();
    let reads = count(&|o| matches!(o.output, Output::Read(_)));
    let reads_some = count(&|o| matches!(o.output, Output::Read(Some(_))));
    let writes = count(&|o| o.output == Output::Write);
    let cas_ok = count(&|o| matches!(o.output, Output::Cas { ok: true, .. }));
    let cas_fail = count(&|o| matches!(o.output, Output::Cas { ok: false, .. }));
    let unknown = count(&|o| o.output == Output::Unknown);
    eprintln!(
        "history: {} ops: {reads} reads ({reads_some} found), {writes} writes, \
         {cas_ok} CAS ok, {cas_fail} CAS failed, {unknown} unknown outcome",
        history.len()
    );
    // Completions per second, to see how long each failover stalled the clients.
    let mut per_sec = vec![0usize; secs as usize + 3];
    for o in &history {
        if let Some(r) = o.ret {
            let b = ((r / 1_000_000_000) as usize).min(per_sec.len() - 1);
            per_sec[b] += 1;
        }
    }
    eprintln!("completed ops per second: {per_sec:?}");
    // The check must have something to bite on.
    assert!(
        events.len() >= 6,
        "the nemesis did not run its three rounds"
    );
    assert!(
        reads_some >= 50 && writes >= 20 && cas_ok >= 10,
        "too few operations completed"
    );
    // A cluster that lost its state (or never recovered) completes nothing after the
    // last fault, and a history without operations there hides the loss.
    let after = history
        .iter()
        .filter(|o| o.ret.is_some_and(|r| r > last_back.as_nanos() as u64))
        .count();
    assert!(
        after >= 100,
        "only {after} operations completed after the last fault ended ({:.3} s)",
        last_back.as_secs_f64()
    );

    let t = Instant::now();
    let verdict = check_history(&history, KEYS, BUDGET);
    eprintln!("checked in {:?}", t.elapsed());
    if let Err(report) = verdict {
        let path = std::env::temp_dir().join(format!("phoenix-lin-history-{seed}.txt"));
        let text: String = history.iter().map(|o| format!("{o}\n")).collect();
        let _ = std::fs::write(&path, text);
        panic!(
            "history is not linearizable (seed {seed}; full history in {}):\n{report}",
            path.display()
        );
    }

    // The checker must reject this very history with one stale read planted in it.
    let planted = plant_stale_read(&history).expect("no overwritten completed write to plant");
    let report = check_history(&planted, KEYS, BUDGET)
        .expect_err("the checker accepted a planted stale read");
    assert!(report.contains("NOT linearizable"), "{report}");
    eprintln!("planted stale read rejected:\n{report}");
}
