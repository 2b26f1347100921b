//! phoenix-client: the PhoenixKV client library.
//!
//! [`Client`] talks to a cluster over gRPC (`phoenix-proto`'s Kv and Meta services). It
//! keeps a routing cache (group by key range and epoch, from the meta group) and a
//! leader cache, sends each request to the group's leader, and on NotLeader, StaleEpoch
//! or an unavailable node refreshes and retries with exponential backoff and jitter
//! inside the request's deadline — the router of seed 001 (PolarFS's PolarSwitch).
//! Single-key calls to one node share one `Kv.Batch` stream (see
//! [`ClientOptions::batch_stream`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), phoenix_client::ClientError> {
//! use phoenix_client::{Client, ClientOptions};
//! let client = Client::connect(vec!["127.0.0.1:7001".into()], ClientOptions::default()).await?;
//! client.put(b"hello", b"world").await?;
//! assert_eq!(client.get(b"hello").await?, Some(b"world".to_vec()));
//! # Ok(()) }
//! ```

pub mod backoff;
mod client;
mod error;
mod local;
pub mod routing;

pub use crate::client::{
    prefix_end, BackupStream, CasOutcome, Client, ClientOptions, ClientStats, ClusterStatus,
    ExpireAt, Expiry, GroupStatus, IncrOutcome, KeyTtl, NodeStatus, OperatorStatus, ReplicaStatus,
    ScanPage, ScrubMismatch, ScrubOutcome, ScrubReplica, WriteOp, DISK_FULL_PATIENCE,
};
pub use crate::error::{ClientError, Result};
pub use crate::local::{LocalCall, LocalNode, LocalRequest, LocalResponse};
/// When an expiry change applies (Redis' EXPIRE options: [`Client::expire`]).
pub use phoenix_proto::ExpireCondition;
