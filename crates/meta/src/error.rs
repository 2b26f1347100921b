//! Errors of the control plane.
//!
//! Two kinds, kept apart because they mean different things to the host:
//! - [`Error`]: input that cannot be understood (an undecodable command or stored
//!   record, a malformed heartbeat, a bad bootstrap plan). For a committed log entry or
//!   a stored record this is corruption: the host stops the group.
//! - [`Refusal`]: a well-formed command that the state machine declines in its current
//!   state. Refusals are deterministic (every replica refuses the same entry), leave
//!   the state unchanged and are reported to the proposer; they are not failures.

/// What could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A committed meta command does not decode.
    #[error("meta entry {index}: undecodable meta command: {source}")]
    DecodeCommand {
        /// Log index of the entry.
        index: u64,
        /// The decoder's error.
        source: prost::DecodeError,
    },
    /// A stored record of the meta state does not decode.
    #[error("meta record {key:?}: {source}")]
    DecodeRecord {
        /// The record's key (relative to the meta key space).
        key: Vec<u8>,
        /// The decoder's error.
        source: prost::DecodeError,
    },
    /// A stored record has a key that belongs to no record kind.
    #[error("unknown meta record key {0:?}")]
    UnknownRecord(Vec<u8>),
    /// A stored record's key does not match its value (e.g. a node record stored under
    /// another node's id).
    #[error("meta record {key:?} holds {what}")]
    MismatchedRecord {
        /// The record's key.
        key: Vec<u8>,
        /// What the value says instead.
        what: String,
    },
    /// Stored records that together break an invariant of the state (e.g. two nodes
    /// at one address, or routes that do not form a whole table).
    #[error("meta records break an invariant: {0}")]
    BrokenInvariant(String),
    /// A heartbeat without the fields every heartbeat needs, or with an address other
    /// nodes could not dial.
    #[error("bad heartbeat: {0}")]
    BadHeartbeat(String),
    /// Split keys that cannot delimit ranges.
    #[error("split keys must be non-empty, sorted and distinct")]
    BadSplitKeys,
}

/// Why a well-formed command was declined (the state is unchanged).
///
/// The `Display` texts are what the proposer sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The command carries no operation.
    #[error("empty meta command")]
    EmptyCommand,
    /// Node id 0 means "none" everywhere.
    #[error("node id 0 is reserved")]
    ReservedNodeId,
    /// Another node is registered at that address.
    #[error("address {addr} already belongs to node {owner}")]
    AddressTaken {
        /// The address asked for.
        addr: String,
        /// The node registered there.
        owner: u64,
    },
    /// A node registration without an address.
    #[error("node {0} has no address")]
    NoAddress(u64),
    /// `CreateGroups` with no routes.
    #[error("no groups to create")]
    NoGroups,
    /// A group id that is the meta group's or already in the routing table.
    #[error("group {0} already exists")]
    GroupExists(u64),
    /// Data groups are created once, at bootstrap.
    #[error("the cluster is already bootstrapped")]
    AlreadyBootstrapped,
    /// The routes of a `CreateGroups` do not form a valid routing table.
    #[error("invalid routing table: {0}")]
    InvalidRoutes(String),
    /// A `SetNodeState` for a node not registered.
    #[error("node {0} is not registered")]
    UnknownNode(u64),
    /// An `UpdateRoute` for a group not in the table.
    #[error("group {0} is not in the routing table")]
    UnknownGroup(u64),
    /// An `UpdateRoute` whose range or epoch differs from the route's (it may change
    /// the membership only).
    #[error("group {0}: a membership update must keep the route's range and epoch")]
    RangeChanged(u64),
    /// An `UpdateRoute` not newer than the route.
    #[error("group {group}: membership {got} is not newer than the table's {have}")]
    StaleMembership {
        /// The group.
        group: u64,
        /// The table's conf version.
        have: u64,
        /// The update's.
        got: u64,
    },
    /// A split that cannot be planned or finished as asked.
    #[error("group {group}: {why}")]
    BadSplit {
        /// The group split.
        group: u64,
        /// What is wrong with it.
        why: String,
    },
    /// A merge that cannot be planned, moved on or finished as asked.
    #[error("merge of group {source_group} into group {target}: {why}")]
    BadMerge {
        /// The group that goes.
        source_group: u64,
        /// The group that takes it in.
        target: u64,
        /// What is wrong with it.
        why: String,
    },
}

/// Why an operator (a change the meta leader drives, e.g. a leader transfer) cannot
/// start. The `Display` texts are what the asker sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorError {
    /// The group is not in the routing table.
    #[error("group {0} is not in the routing table")]
    UnknownGroup(u64),
    /// The routing table places no replica of the group on the node.
    #[error("node {node} holds no replica of group {group}")]
    NotAReplica {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
    },
    /// The node has not reported its replica of the group yet (being created).
    #[error("node {node} has not reported its replica of group {group} yet")]
    ReplicaNotReported {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
    },
    /// The node's replica of the group stopped after a failure in its work.
    #[error("the replica of group {group} on node {node} is stopped: {why}")]
    ReplicaStopped {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
        /// The cause it reported.
        why: String,
    },
    /// The group is in a merge plan: its membership stays until the merge ends.
    #[error("group {group} is in the merge of group {source_group} into group {target}")]
    Merging {
        /// The group asked for.
        group: u64,
        /// The merge's source.
        source_group: u64,
        /// The merge's target.
        target: u64,
    },
    /// No heartbeat from the node lately.
    #[error("node {0} is down (no heartbeat lately)")]
    NodeDown(u64),
    /// The node's disk is under its reserve: it refuses writes.
    #[error("node {0}'s disk is full")]
    DiskFull(u64),
    /// The node is stopping and hands its leaderships away.
    #[error("node {0} is stopping")]
    NodeStopping(u64),
    /// No replica of the group has reported leading it yet.
    #[error("group {0} has no known leader yet")]
    NoLeader(u64),
    /// The node's replica of the group is a learner: it cannot lead.
    #[error("the replica of group {group} on node {node} is a learner")]
    Learner {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
    },
    /// A meta member runs a binary that does not apply the meta commands the operator
    /// needs (upgrade it first).
    #[error("meta member node {0} runs an older version that cannot record membership changes")]
    OldMetaMember(u64),
    /// The node is not registered.
    #[error("node {0} is not registered")]
    UnknownNode(u64),
    /// The node runs a binary that cannot host a group that split (upgrade it first).
    #[error("node {node} runs an older version that cannot host group {group}, which has split")]
    OldNode {
        /// The node.
        node: u64,
        /// The group.
        group: u64,
    },
    /// The node runs a binary that cannot host or report a meta replica (upgrade it
    /// first).
    #[error("node {0} runs an older version that cannot take part in meta membership changes")]
    OldMetaNode(u64),
    /// Removing the replica would leave the group without a voter.
    #[error("the replica of group {group} on node {node} is its last voter")]
    LastVoter {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
    },
    /// Without the replica, fewer than a quorum of the group's voters would be alive:
    /// the group could commit the removal and then nothing more.
    #[error(
        "removing node {node} from group {group} would leave {live} of its {voters} \
         other voters alive, not a quorum"
    )]
    NoQuorumAfter {
        /// The group.
        group: u64,
        /// The node asked for.
        node: u64,
        /// Voters left that are alive.
        live: usize,
        /// Voters left.
        voters: usize,
    },
    /// Another operator is under way on the group.
    #[error("group {group} already has an operator under way (to node {to})")]
    Busy {
        /// The group.
        group: u64,
        /// That operator's target.
        to: u64,
    },
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
