//! Completion of an op: a blocking/async handle or a callback.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result};

enum SlotState {
    Pending(Option<Waker>),
    Done(Result<()>),
    Taken,
}

struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

/// Completes when an append is acknowledged: call [`wait`](AppendHandle::wait) or
/// `.await` it.
#[must_use = "an append is only known to be durable once its handle completes"]
pub struct AppendHandle {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for AppendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AppendHandle")
    }
}

impl AppendHandle {
    /// Blocks until the append is acknowledged (durable, or written for non-durable ones).
    pub fn wait(self) -> Result<()> {
        let mut st = self.slot.state.lock();
        loop {
            match std::mem::replace(&mut *st, SlotState::Taken) {
                SlotState::Done(r) => return r,
                SlotState::Taken => {
                    return Err(Error::InvalidArgument(
                        "handle polled after completion".into(),
                    ))
                }
                p @ SlotState::Pending(_) => {
                    *st = p;
                    self.slot.cv.wait(&mut st);
                }
            }
        }
    }
}

impl Future for AppendHandle {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut st = self.slot.state.lock();
        match std::mem::replace(&mut *st, SlotState::Taken) {
            SlotState::Done(r) => Poll::Ready(r),
            SlotState::Taken => Poll::Ready(Err(Error::InvalidArgument(
                "handle polled after completion".into(),
            ))),
            SlotState::Pending(_) => {
                *st = SlotState::Pending(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

/// How a queued op reports its outcome.
pub(crate) enum Completion {
    /// Fill an [`AppendHandle`].
    Handle(SlotDone),
    /// Call a callback.
    Callback(Box<dyn FnOnce(Result<()>) + Send + 'static>),
}

/// The completing side of a handle.
pub(crate) struct SlotDone {
    slot: Arc<Slot>,
}

impl Completion {
    /// Reports `r`.
    pub(crate) fn complete(self, r: Result<()>) {
        match self {
            Completion::Handle(done) => {
                let waker = {
                    let mut st = done.slot.state.lock();
                    let prev = std::mem::replace(&mut *st, SlotState::Done(r));
                    done.slot.cv.notify_all();
                    match prev {
                        SlotState::Pending(w) => w,
                        _ => None,
                    }
                };
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Completion::Callback(cb) => cb(r),
        }
    }
}

/// A fresh handle and its completing side.
pub(crate) fn pair() -> (AppendHandle, Completion) {
    let slot = Arc::new(Slot {
        state: Mutex::new(SlotState::Pending(None)),
        cv: Condvar::new(),
    });
    (
        AppendHandle { slot: slot.clone() },
        Completion::Handle(SlotDone { slot }),
    )
}
