//! A compaction worker in the test's process (`remote_compaction`): it runs the jobs an
//! engine hands out over its own table store on the same storage, the job and its
//! output passing through their byte formats as they would over the wire. It can be told
//! to fail some jobs (the engine then compacts itself) or to hold a job until released.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use phoenix_engine::table::TableCache;
use phoenix_engine::{CompactionJob, CompactionService, JobOutput, SharedTableStore};

/// What the worker does to the jobs it gets.
#[derive(Debug, Default)]
pub struct Behaviour {
    /// Refuse every job whose count (from 1) is a multiple of this (0: none).
    pub fail_every: u64,
    /// Answer with the outputs' numbers shifted by this much (a worker speaking
    /// nonsense); the outputs are written as the job said.
    pub shift_numbers: u64,
    /// Answer without the last output (written all the same): a worker losing work.
    pub omit_last_output: bool,
}

/// A worker over `store` (see the module docs).
#[derive(Debug)]
pub struct Worker {
    store: SharedTableStore,
    tables: Arc<TableCache>,
    behaviour: Behaviour,
    /// Jobs received.
    pub jobs: AtomicU64,
    /// Jobs answered with outputs.
    pub done: AtomicU64,
    /// Every job received, as it arrived.
    pub seen: Mutex<Vec<CompactionJob>>,
    /// While set, a job waits here until the receiver is dropped or sent to.
    pub hold: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Worker {
    /// A worker writing to `store` as `behaviour` says.
    pub fn new(store: SharedTableStore, behaviour: Behaviour) -> Arc<Worker> {
        Arc::new(Worker {
            tables: Arc::new(TableCache::new(Arc::clone(&store), 64, None)),
            store,
            behaviour,
            jobs: AtomicU64::new(0),
            done: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            hold: Mutex::new(None),
        })
    }
}

impl CompactionService for Worker {
    fn compact(&self, job: &CompactionJob) -> Result<JobOutput, String> {
        let job = CompactionJob::decode(&job.encode()).map_err(|e| e.to_string())?;
        let n = self.jobs.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.lock().unwrap().push(job.clone());
        if let Some(rx) = self.hold.lock().unwrap().take() {
            let _ = rx.recv();
        }
        if self.behaviour.fail_every > 0 && n.is_multiple_of(self.behaviour.fail_every) {
            return Err(format!("job {n} refused on purpose"));
        }
        let mut out = phoenix_engine::remote_compaction::execute(&*self.store, &self.tables, &job)
            .map_err(|e| e.to_string())?;
        for f in &mut out.files {
            f.0 += self.behaviour.shift_numbers;
        }
        if self.behaviour.omit_last_output {
            out.files.pop();
        }
        self.done.fetch_add(1, Ordering::SeqCst);
        JobOutput::decode(&out.encode()).map_err(|e| e.to_string())
    }
}
