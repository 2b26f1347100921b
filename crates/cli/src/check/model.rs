//! The linearizability checker of `phoenix check`: a history of operations on registers
//! with compare-and-swap, checked per key (a register is P-compositional) the way
//! Knossos and porcupine do it: a Wing–Gong–Lowe depth-first search over linearization
//! points whose visited (linearized set, register value) pairs are cached.
//!
//! A write whose outcome the client could not know is recorded as never completing: it
//! may take effect at any point after its invocation, or never. A read that failed had
//! no effect and is not recorded.

use std::collections::HashSet;

/// Register values are unique numbers (so a read names the write it observed).
pub type Value = u64;

/// What a client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
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
pub enum Output {
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
pub struct Op {
    pub client: usize,
    pub key: usize,
    pub call: u64,
    /// None = the outcome is unknown (the operation never completes).
    pub ret: Option<u64>,
    pub input: Input,
    pub output: Output,
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
pub fn check_history(history: &[Op], keys: usize, budget: u64) -> Result<(), String> {
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

/// Search steps per key before the check gives up (undecided fails the check too).
pub const BUDGET: u64 = 20_000_000;

/// Plants a stale read into a real history: a read, after everything, of the value of
/// a completed write that a later completed write (invoked after the first returned)
/// overwrote. No unknown op can write that value again (values are unique), so the
/// planted history is certainly not linearizable. None if no such pair exists.
pub fn plant_stale_read(history: &[Op]) -> Option<Vec<Op>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
