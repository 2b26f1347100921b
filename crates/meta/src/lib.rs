//! phoenix-meta: PhoenixKV's control plane.
//!
//! The meta group is raft group 0, hosted inside the servers listed in `--meta`
//! (`docs/cluster.md`). This crate is its logic, free of I/O, clocks and threads; the
//! server hosts it (runs the raft group, stores the records in its engine, serves the
//! `Meta` gRPC service and proposes what the scheduler decides):
//! - [`state`]: the replicated state machine — node registry and routing table (group
//!   id, key range, epoch, replicas), applied from committed [`phoenix_proto::MetaCommand`]s,
//!   rebuilt from its records; replay-safe;
//! - [`liveness`]: the meta leader's soft state from heartbeats — liveness, node stats,
//!   replica states, group leaders;
//! - [`operator`]: the meta leader's operators (leader transfers, replica additions
//!   and removals) and the leader balancer that starts transfers;
//! - [`repair`]: which replicas of down nodes to replace, and with what;
//! - [`rebalance`]: which replicas to move so every node hosts about as many;
//! - [`merge`]: merges — their phases from the replicas' reports, the steps to ask of
//!   group leaders, which neighbours to merge by size;
//! - [`split`]: splits — which planned ones a group applied, which groups to split by
//!   size;
//! - [`schedule`]: decisions — bootstrap placement (one group, or one per range between
//!   split keys), placement commands for heartbeats, node registration, and the route
//!   and cluster views served to clients;
//! - [`error`]: typed errors ([`Error`] for what cannot be understood, [`Refusal`] for
//!   commands the state declines).

pub mod error;
pub mod liveness;
pub mod merge;
pub mod operator;
pub mod rebalance;
pub mod repair;
pub mod schedule;
pub mod scrub;
pub mod split;
pub mod state;

pub use error::{Error, OperatorError, Refusal, Result};
pub use liveness::{LeaderView, Report, ALIVE_WITHIN};
pub use merge::{
    merge_alignment, merge_commands, merge_steps, settled_leader, small_merges, MERGE_INFLIGHT_MAX,
};
pub use operator::{
    balance_leaders, route_of, AddStep, Operators, Origin, Outcome, RemoveStep,
    BALANCE_INFLIGHT_MAX,
};
pub use rebalance::{balance_replicas, REPLICA_BALANCE_INFLIGHT_MAX};
pub use repair::{down_nodes, repair_replicas, resize_meta, ReplicaMove, REPAIR_INFLIGHT_MAX};
pub use schedule::{
    bootstrap_plan, check_addr, cluster_view, even_split_keys, place, placement_commands,
    placement_commands_quiet, registration, route_table, route_updates, route_updates_quiet,
    routes_view, split_ranges, INITIAL_GROUPS_MAX,
};
pub use scrub::{scrub_mismatches, scrub_report, Scrubs, SCRUB_INFLIGHT_MAX};
pub use split::{finished_splits, size_splits, SPLIT_INFLIGHT_MAX};
pub use state::{
    node_record_key, route_contains, route_record_key, state_record_key, validate_table, Applied,
    MetaState, Write, META_GROUP, PROTOCOL, PROTOCOL_INCR, PROTOCOL_MERGE, PROTOCOL_META_MEMBERS,
    PROTOCOL_NODE_STATE, PROTOCOL_REPLICA_MOVES, PROTOCOL_SPLIT, PROTOCOL_TTL,
};
