//! Which deadline a read of a remote table gets on this thread. Seed 004 gives user
//! I/O short deadlines and background I/O long ones: a user's read that the store does
//! not answer in time fails (the client may try another replica), while a flush or a
//! compaction waits as long as the store's client keeps trying. The engine's
//! background work marks its threads ([`Background::enter`]); the object store reads
//! the mark ([`is_background`]).

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
