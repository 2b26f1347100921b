//! The node's request layer for a front end in the same process ([`Requests`]): the
//! Redis protocol serves its commands through it, with the admission, deadline, epoch
//! and range checks of the gRPC `Kv` methods and without a connection to its own node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use phoenix_proto as proto;
use proto::batch_request_item::Request as Req;
use proto::batch_response_item::Response as Resp;
use tokio::sync::RwLock;

use crate::service::Services;

/// A handle on a node's request layer, made before the node runs
/// ([`run_with`](crate::run_with)) and serving while the node does.
#[derive(Clone, Default)]
pub struct Requests {
    /// Set when the node starts serving, cleared when it stops. A call holds it read
    /// while it runs, so clearing it waits for the calls under way, as the gRPC server
    /// drains its handlers before the engine closes.
    services: Arc<RwLock<Option<Services>>>,
    /// Requests served through this handle.
    served: Arc<AtomicU64>,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("ready", &self.ready())
            .field("served", &self.served())
            .finish()
    }
}

impl Requests {
    /// Whether the node serves requests (not while it is being cleared).
    pub fn ready(&self) -> bool {
        self.services
            .try_read()
            .is_ok_and(|s| s.as_ref().is_some_and(|svc| !*svc.stop.borrow()))
    }

    /// Serves a single-key request as the `Kv` method of its kind does. Before the node
    /// serves and once it is stopping, the request is refused unserved
    /// (`GroupUnavailable`), as the `Kv.Batch` stream refuses its items then.
    pub async fn serve(&self, request: Req) -> Resp {
        let services = self.services.read().await;
        match services.as_ref().filter(|svc| !*svc.stop.borrow()) {
            Some(svc) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                crate::batch::serve_request(svc, request).await
            }
            None => {
                let group = crate::batch::group_of_request(&request);
                crate::batch::refusal(
                    &request,
                    proto::Error::group_unavailable(group, "the node is not serving"),
                )
            }
        }
    }

    /// How many requests this handle has served (refusals while not serving aside).
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Starts (Some) or ends (None) serving; ending waits for the calls under way.
    pub(crate) async fn set(&self, services: Option<Services>) {
        *self.services.write().await = services;
    }

    /// A guard that ends serving when dropped, unless [disarmed](ClearOnDrop::disarm)
    /// (the node ended serving itself).
    pub(crate) fn clear_on_drop(&self) -> ClearOnDrop {
        ClearOnDrop(Some(self.clone()))
    }
}

/// See [`Requests::clear_on_drop`].
pub(crate) struct ClearOnDrop(Option<Requests>);

impl ClearOnDrop {
    /// Serving ended cleanly: the drop leaves the handle alone (it may serve a node
    /// started again by then).
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        let Some(requests) = self.0.take() else {
            return;
        };
        if let Ok(mut s) = requests.services.try_write() {
            *s = None;
            return;
        }
        // Calls under way: clear once they end, if a runtime is there to wait.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let services = Arc::clone(&requests.services);
            rt.spawn(async move {
                *services.write().await = None;
            });
        }
    }
}
