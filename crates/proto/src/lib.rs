//! phoenix-proto: PhoenixKV's wire protocol.
//!
//! The protobuf messages and gRPC services (`proto/*.proto`, package `phoenix.v1`):
//! - [`kv_server`]/[`kv_client`]: the client-facing key-value service (get, put, delete,
//!   batch get, atomic batch write, scan, delete range, compare-and-swap);
//! - [`meta_server`]/[`meta_client`]: routes, cluster status, node heartbeats;
//! - [`raft_transport_server`]/[`raft_transport_client`]: batched raft messages between
//!   nodes and chunked snapshot upload;
//! - [`faults_server`]/[`faults_client`]: fault injection for fault runs (cut links),
//!   served only by nodes started with `--fault-injection`;
//! - [`compactor_server`]/[`compactor_client`]: compaction jobs a node hands to a
//!   worker (`phoenix compactor`) over its table store.
//!
//! Errors travel inside responses as [`Error`] (a typed `oneof`); gRPC statuses are
//! reserved for transport failures. [`convert`] maps raft messages to and from the
//! wire, validating everything that arrives. [`counter`] holds the integer rules of
//! `Incr` (Redis' INCR), which every replica must apply alike. [`limits`] names the size limits both
//! sides check. [`batch_link`] carries many calls to one node on one `Kv.Batch` stream.
//! [`security`] holds TLS and tokens for every hop.

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]
mod generated {
    tonic::include_proto!("phoenix.v1");
}

pub use generated::*;

pub mod batch_link;
pub mod convert;
pub mod counter;
#[cfg(feature = "dev-certs")]
pub mod dev_certs;
pub mod errors;
pub mod limits;
pub mod security;
