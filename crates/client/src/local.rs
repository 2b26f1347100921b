//! A node in the client's own process ([`LocalNode`]): single-key calls addressed to it
//! are served by its request layer directly, with no encoding and no connection, and
//! with everything else the client does unchanged (routing, retries, sessions). A
//! front end that runs inside a node (the Redis protocol) reaches its own node so.

use std::future::Future;
use std::pin::Pin;

use phoenix_proto as pb;

/// One single-key call (get, put, delete, compare-and-swap) and its answer.
pub type LocalRequest = pb::batch_request_item::Request;
/// The answer to a [`LocalRequest`].
pub type LocalResponse = pb::batch_response_item::Response;
/// What [`LocalNode::call`] returns.
pub type LocalCall = Pin<Box<dyn Future<Output = LocalResponse> + Send + 'static>>;

/// The request layer of a node that runs in this process.
pub trait LocalNode: std::fmt::Debug + Send + Sync + 'static {
    /// The address the node advertises, as the routing table names it: calls the client
    /// sends there are served by [`call`](Self::call) instead.
    fn addr(&self) -> &str;
    /// Whether the node serves requests yet; until it does, calls go over the network.
    fn ready(&self) -> bool;
    /// Serves `request` as the node's `Kv` method of that kind would: every refusal is
    /// inside the response, as over the wire.
    fn call(&self, request: LocalRequest) -> LocalCall;
}
