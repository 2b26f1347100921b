//! Which deadline a read of a remote table gets on this thread. Seed 004 gives user
//! I/O short deadlines and background I/O long ones: a user's read that the store does
//! not answer in time fails (the client may try another replica), while a flush or a
//! compaction waits as long as the store's client keeps trying. The engine's
//! background work marks its threads ([`Background::enter`]); the object store reads
//! the mark ([`is_background`]).
//! Reads that each wait on the store run side by side here too ([`side_by_side`]),
//! their threads keeping the caller's mark.

use std::cell::Cell;

thread_local! {
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// While held, this thread does background work.
pub(crate) struct Background(bool);

impl Background {
    /// Marks this thread as doing background work until the guard drops.
    pub(crate) fn enter() -> Background {
        Background(BACKGROUND.with(|b| b.replace(true)))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        BACKGROUND.with(|b| b.set(self.0));
    }
}

/// Whether this thread does background work now.
pub(crate) fn is_background() -> bool {
    BACKGROUND.with(Cell::get)
}

/// Jobs of one [`side_by_side`] call running at once at most (the rest go in the next
/// wave).
const AT_ONCE: usize = 16;

/// Runs `f` on every job side by side, for reads that each wait on a remote store: in
/// waves of at most 16, each job but a wave's first on a thread of its own (a job whose
/// thread cannot be had runs on the caller's, as the first does). The threads keep this
/// thread's deadline class. Returns each job's outcome in job order (`Err`: it panicked
/// on its thread, with the panic's payload).
pub(crate) fn side_by_side<T: Send, R: Send>(
    jobs: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    let background = is_background();
    let f = &f;
    let mut out = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter();
    loop {
        // (In a cell: a job whose thread is refused is still at hand to run here.)
        let wave: Vec<parking_lot::Mutex<Option<T>>> = jobs
            .by_ref()
            .take(AT_ONCE)
            .map(|j| parking_lot::Mutex::new(Some(j)))
            .collect();
        let Some((first, rest)) = wave.split_first() else {
            return out;
        };
        let here = |cell: &parking_lot::Mutex<Option<T>>| cell.lock().take().map(f);
        std::thread::scope(|s| {
            let threads: Vec<_> = rest
                .iter()
                .map(|cell| {
                    std::thread::Builder::new()
                        .name("table-read".into())
                        .spawn_scoped(s, move || {
                            let _class = background.then(Background::enter);
                            here(cell)
                        })
                        .ok()
                })
                .collect();
            out.extend(here(first).map(Ok));
            for (cell, thread) in rest.iter().zip(threads) {
                let r = match thread {
                    Some(t) => t.join().map(|r| r.into_iter()),
                    None => Ok(here(cell).into_iter()),
                };
                match r {
                    Ok(r) => out.extend(r.map(Ok)),
                    Err(panic) => out.push(Err(panic)),
                }
            }
        });
    }
}
