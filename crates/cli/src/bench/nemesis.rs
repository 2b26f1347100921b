//! Faults injected into a spawned cluster while `phoenix bench cluster` runs
//! (`--nemesis kill,pause`): one node at a time, the same schedule for every target.
//!
//! Every 1–3 s (uniform) the nemesis picks a node and a fault: `kill` sends SIGKILL and
//! starts the node again 0.5–2.5 s later (same command line, same data); `pause` sends
//! SIGSTOP and SIGCONT 0.5–2.5 s later. The choices come from a seeded generator, so a
//! run with the same `--seed` faults the same nodes at the same offsets for PhoenixKV
//! and for etcd. When the run ends every node is brought back before the cluster is
//! stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cmd::playground::Proc;

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL a node, restart it later (a crash: the process loses what it never synced
    /// to the OS; the OS keeps the rest).
    Kill,
    /// SIGSTOP a node, SIGCONT it later (a stall: its sockets stay open but silent).
    Pause,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
        }
    }
}

/// Time between the end of one fault and the start of the next, in milliseconds.
const INTERVAL_MS: std::ops::Range<u64> = 1_000..3_001;
/// How long a node stays down or paused, in milliseconds.
const DOWN_MS: std::ops::Range<u64> = 500..2_501;

/// One fault as it happened, offsets from the nemesis' start.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which fault.
    pub fault: Fault,
    /// Index of the node in the process list (node id − 1).
    pub node: usize,
    /// When the fault began.
    pub at: Duration,
    /// How long the node was down or paused.
    pub down: Duration,
    /// Set when bringing the node back failed (the run's figures are then suspect).
    pub error: Option<String>,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7.2}s {} node {} for {:.2}s",
            self.at.as_secs_f64(),
            self.fault.name(),
            self.node + 1,
            self.down.as_secs_f64()
        )?;
        if let Some(e) = &self.error {
            write!(f, " (bringing it back failed: {e})")?;
        }
        Ok(())
    }
}

/// A running nemesis; [`Nemesis::finish`] stops it and hands the processes back.
pub struct Nemesis {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Proc>>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Nemesis {
    /// Starts faulting `procs` (one at a time) with `faults`, choices drawn from `seed`.
    pub fn start(procs: Vec<Proc>, faults: Vec<Fault>, seed: u64) -> Result<Self, String> {
        if faults.is_empty() || procs.is_empty() {
            return Err("the nemesis needs at least one fault and one process".into());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let stop = Arc::clone(&stop);
            let events = Arc::clone(&events);
            std::thread::Builder::new()
                .name("nemesis".into())
                .spawn(move || run(procs, &faults, seed, &stop, &events))
                .map_err(|e| format!("start the nemesis thread: {e}"))?
        };
        Ok(Nemesis {
            stop,
            thread,
            events,
        })
    }

    /// Stops injecting, brings the faulted node back, and returns the processes and
    /// every fault injected.
    pub fn finish(self) -> Result<(Vec<Proc>, Vec<Event>), String> {
        self.stop.store(true, Ordering::Relaxed);
        let procs = self
            .thread
            .join()
            .map_err(|_| "the nemesis thread panicked".to_string())?;
        let events = self.events.lock().map(|e| e.clone()).unwrap_or_default();
        Ok((procs, events))
    }
}

/// Sleeps `d` in short steps; false if `stop` was set meanwhile.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(20)));
    }
    !stop.load(Ordering::Relaxed)
}

fn run(
    mut procs: Vec<Proc>,
    faults: &[Fault],
    seed: u64,
    stop: &AtomicBool,
    events: &Mutex<Vec<Event>>,
) -> Vec<Proc> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7321);
    let start = Instant::now();
    loop {
        // Draw every choice of a round up front so the schedule depends on the seed
        // alone, not on when the run ends.
        let wait = Duration::from_millis(rng.gen_range(INTERVAL_MS));
        let node = rng.gen_range(0..procs.len());
        let fault = faults[rng.gen_range(0..faults.len())];
        let down = Duration::from_millis(rng.gen_range(DOWN_MS));
        if !nap(wait, stop) {
            break;
        }
        let at = start.elapsed();
        let p = &mut procs[node];
        match fault {
            Fault::Kill => p.kill(),
            Fault::Pause => p.signal(libc::SIGSTOP),
        }
        // The node comes back even if the run ends meanwhile: the cluster is handed
        // back whole.
        nap(down, stop);
        let error = match fault {
            Fault::Kill => p.restart().err().map(|e| e.to_string()),
            Fault::Pause => {
                p.signal(libc::SIGCONT);
                None
            }
        };
        let ev = Event {
            fault,
            node,
            at,
            down: start.elapsed().saturating_sub(at),
            error,
        };
        if let Ok(mut e) = events.lock() {
            e.push(ev);
        }
    }
    procs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &std::path::Path, i: usize) -> Proc {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("600");
        Proc::spawn(format!("sleeper {i}"), cmd, dir.join(format!("{i}.log"))).unwrap()
    }

    /// The schedule is a function of the seed, and every faulted process is back when
    /// the nemesis finishes (a killed one restarted, a paused one continued).
    #[test]
    fn faults_follow_the_seed_and_every_node_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let seed = 7;
        let run = |seed| {
            let procs: Vec<Proc> = (0..3).map(|i| sleeper(dir.path(), i)).collect();
            let n = Nemesis::start(procs, vec![Fault::Kill, Fault::Pause], seed).unwrap();
            std::thread::sleep(Duration::from_millis(9_000));
            n.finish().unwrap()
        };
        let (mut procs, events) = run(seed);
        assert!(!events.is_empty(), "seed {seed}: no fault in 9 s");
        for p in &mut procs {
            assert!(p.is_running(), "seed {seed}: {} not running", p.name);
            let pid = p.pid().unwrap();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
            assert_ne!(state, Some("T"), "seed {seed}: {} left stopped", p.name);
        }
        for e in &events {
            assert!(e.error.is_none(), "seed {seed}: {e}");
            assert!(
                e.down >= Duration::from_millis(450),
                "seed {seed}: too short: {e}"
            );
        }
        drop(procs);
        let (_, again) = run(seed);
        let key = |v: &[Event]| v.iter().map(|e| (e.fault, e.node)).collect::<Vec<_>>();
        let n = events.len().min(again.len());
        assert_eq!(
            key(&events[..n]),
            key(&again[..n]),
            "seed {seed}: same seed, other faults"
        );
    }
}
