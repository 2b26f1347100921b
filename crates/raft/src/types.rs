//! The plain data types of the consensus core: log entries, hard state, membership,
//! snapshot metadata and the messages nodes exchange.
//!
//! These types have a stable meaning documented field by field; the server's `proto`
//! crate converts them to and from the wire. Node id 0 is reserved to mean "none".

use bytes::Bytes;

use crate::error::Error;

/// A node's identity inside one group. `0` (`NONE`) means "no node".
pub type NodeId = u64;

/// The reserved "no node" id (no leader known, no vote cast).
pub const NONE: NodeId = 0;

/// What an entry's `data` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum EntryKind {
    /// Application command, opaque to the core (empty data = a leader's no-op).
    #[default]
    Normal,
    /// An encoded [`ConfChange`]; the application applies it with
    /// `RawNode::apply_conf_change` once committed.
    ConfChange,
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Entry {
    /// Term of the leader that created the entry.
    pub term: u64,
    /// Position in the log, starting at 1 and contiguous.
    pub index: u64,
    /// How to interpret `data`.
    pub kind: EntryKind,
    /// Opaque payload (cheap to clone: reference counted).
    pub data: Bytes,
    /// Seam for the ParallelRaft mode (see docs/raft.md): the hashes of the keys this
    /// entry writes, so that a later mode can decide which entries conflict. The standard
    /// mode carries it but never reads it.
    pub conflict_keys: Option<Box<[u64]>>,
}

impl Entry {
    /// A normal entry with the given payload (index and term are set by the leader).
    pub fn normal(data: impl Into<Bytes>) -> Entry {
        Entry {
            data: data.into(),
            ..Entry::default()
        }
    }

    /// Approximate size in bytes, used for message size limits.
    pub fn size(&self) -> u64 {
        // Term, index and kind are bounded; the payload dominates.
        self.data.len() as u64 + 24
    }
}

/// The state that must be durable before some messages may leave (see `Ready`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HardState {
    /// Latest term this node has seen.
    pub term: u64,
    /// Candidate voted for in `term` (`NONE` if none).
    pub vote: NodeId,
    /// Highest index known committed (may lag; it is only an optimisation to persist).
    pub commit: u64,
}

/// Group membership: voters decide elections and commits, learners only receive the log.
/// Both lists are sorted and disjoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ConfState {
    /// Voting members, sorted.
    pub voters: Vec<NodeId>,
    /// Non-voting members, sorted.
    pub learners: Vec<NodeId>,
}

impl ConfState {
    /// A configuration of the given voters and no learners.
    pub fn with_voters(voters: impl IntoIterator<Item = NodeId>) -> ConfState {
        let mut v: Vec<NodeId> = voters.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        ConfState {
            voters: v,
            learners: Vec::new(),
        }
    }

    /// Whether `id` is a voter or a learner.
    pub fn contains(&self, id: NodeId) -> bool {
        self.voters.binary_search(&id).is_ok() || self.learners.binary_search(&id).is_ok()
    }

    /// Checks the invariants: sorted, unique, disjoint, no `NONE`.
    pub fn validate(&self) -> Result<(), Error> {
        let sorted = |v: &[NodeId]| v.windows(2).all(|w| w[0] < w[1]);
        if !sorted(&self.voters) || !sorted(&self.learners) {
            return Err(Error::InvalidConfig(
                "conf state lists must be sorted and unique",
            ));
        }
        if self.voters.contains(&NONE) || self.learners.contains(&NONE) {
            return Err(Error::InvalidConfig("node id 0 is reserved"));
        }
        if self
            .voters
            .iter()
            .any(|v| self.learners.binary_search(v).is_ok())
        {
            return Err(Error::InvalidConfig(
                "a node cannot be both voter and learner",
            ));
        }
        Ok(())
    }
}

/// A single-node membership change (see docs/raft.md for why one node at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfChange {
    /// Add `node` as a voter, or promote it if it is a learner.
    AddVoter(NodeId),
    /// Add `node` as a learner, or demote it if it is a voter.
    AddLearner(NodeId),
    /// Remove `node` from the group.
    RemoveNode(NodeId),
}

impl ConfChange {
    /// Encoded size: one kind byte and a big-endian u64 node id.
    pub const ENCODED_LEN: usize = 9;

    /// The node this change concerns.
    pub fn node(&self) -> NodeId {
        match *self {
            ConfChange::AddVoter(n) | ConfChange::AddLearner(n) | ConfChange::RemoveNode(n) => n,
        }
    }

    /// Encodes as `kind: u8 (1 = add voter, 2 = add learner, 3 = remove) ‖ node: u64 BE`.
    pub fn encode(&self) -> Bytes {
        let (kind, node) = match *self {
            ConfChange::AddVoter(n) => (1u8, n),
            ConfChange::AddLearner(n) => (2u8, n),
            ConfChange::RemoveNode(n) => (3u8, n),
        };
        let mut out = Vec::with_capacity(Self::ENCODED_LEN);
        out.push(kind);
        out.extend_from_slice(&node.to_be_bytes());
        Bytes::from(out)
    }

    /// Decodes the data of a `ConfChange` entry.
    pub fn decode(data: &[u8]) -> Result<ConfChange, Error> {
        let (kind, rest) = data
            .split_first()
            .ok_or(Error::Malformed("empty conf change entry"))?;
        let node_bytes: [u8; 8] = rest
            .try_into()
            .map_err(|_| Error::Malformed("conf change entry must be 9 bytes"))?;
        let node = u64::from_be_bytes(node_bytes);
        if node == NONE {
            return Err(Error::Malformed("conf change names node 0"));
        }
        match kind {
            1 => Ok(ConfChange::AddVoter(node)),
            2 => Ok(ConfChange::AddLearner(node)),
            3 => Ok(ConfChange::RemoveNode(node)),
            _ => Err(Error::Malformed("unknown conf change kind")),
        }
    }
}

/// Describes a snapshot: the state machine as of `index` (whose entry had `term`), with
/// the membership in force at that index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SnapshotMeta {
    /// Last index the snapshot covers.
    pub index: u64,
    /// Term of the entry at `index`.
    pub term: u64,
    /// Membership as of `index`.
    pub conf: ConfState,
}

/// A snapshot. `data` is opaque to the core; the server may leave it empty and stream
/// the state in chunks beside the message, as long as the receiver has it before it
/// persists the `Ready` that carries this snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Snapshot {
    /// What the snapshot covers.
    pub meta: SnapshotMeta,
    /// Opaque state (or empty when streamed separately).
    pub data: Bytes,
}

/// The kinds of messages between nodes of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MessageType {
    /// Leader → follower: entries after (`index`, `log_term`), and the leader's `commit`.
    Append,
    /// Follower → leader: `index` = last index matched (accept) or the rejected `index`
    /// with `reject_hint` = a guess of the follower's last matching index and `log_term`
    /// = the term at that guess (fast back-off).
    AppendResponse,
    /// Candidate → voter: vote for `from` in `term`; `index`/`log_term` = candidate's last.
    RequestVote,
    /// Voter → candidate.
    RequestVoteResponse,
    /// Pre-candidate → voter: would you vote for me in `term` (not yet our term)?
    RequestPreVote,
    /// Voter → pre-candidate.
    RequestPreVoteResponse,
    /// Leader → follower: liveness, `commit` (capped at the follower's match) and an
    /// optional ReadIndex `context`.
    Heartbeat,
    /// Follower → leader: echo of the heartbeat's `context`.
    HeartbeatResponse,
    /// Leader → follower: install `snapshot`.
    Snapshot,
    /// Leader → transfer target: campaign now, bypassing pre-vote and leases.
    TimeoutNow,
    /// Follower → leader: a ReadIndex request carrying the caller's `context`.
    ReadIndex,
    /// Leader → follower: `index` is safe to read at for `context`.
    ReadIndexResponse,
    /// Leader → follower: everyone is caught up; stop the election timer until the next
    /// message (hibernation of idle groups).
    Hibernate,
}

// (A kind added without its place in `ALL` would index past it.)
const _: () = assert!(MessageType::Hibernate as usize + 1 == MessageType::ALL.len());

impl MessageType {
    /// Every kind, in declaration order (`kind as usize` indexes it).
    pub const ALL: [MessageType; 13] = [
        MessageType::Append,
        MessageType::AppendResponse,
        MessageType::RequestVote,
        MessageType::RequestVoteResponse,
        MessageType::RequestPreVote,
        MessageType::RequestPreVoteResponse,
        MessageType::Heartbeat,
        MessageType::HeartbeatResponse,
        MessageType::Snapshot,
        MessageType::TimeoutNow,
        MessageType::ReadIndex,
        MessageType::ReadIndexResponse,
        MessageType::Hibernate,
    ];

    /// The kind's name in snake case (metrics labels).
    pub const fn name(self) -> &'static str {
        match self {
            MessageType::Append => "append",
            MessageType::AppendResponse => "append_response",
            MessageType::RequestVote => "request_vote",
            MessageType::RequestVoteResponse => "request_vote_response",
            MessageType::RequestPreVote => "request_pre_vote",
            MessageType::RequestPreVoteResponse => "request_pre_vote_response",
            MessageType::Heartbeat => "heartbeat",
            MessageType::HeartbeatResponse => "heartbeat_response",
            MessageType::Snapshot => "snapshot",
            MessageType::TimeoutNow => "timeout_now",
            MessageType::ReadIndex => "read_index",
            MessageType::ReadIndexResponse => "read_index_response",
            MessageType::Hibernate => "hibernate",
        }
    }
}

/// A message between two nodes of one group. Fields not used by a kind are zero/empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// What the message is.
    pub kind: MessageType,
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// Sender's term (for `RequestPreVote`: the term it would campaign in).
    pub term: u64,
    /// Term of the entry at `index` (meaning per kind, see [`MessageType`]).
    pub log_term: u64,
    /// An index (meaning per kind, see [`MessageType`]).
    pub index: u64,
    /// Entries of an `Append`, contiguous from `index + 1`.
    pub entries: Vec<Entry>,
    /// Sender's commit index.
    pub commit: u64,
    /// Whether a response refuses.
    pub reject: bool,
    /// On a rejected `AppendResponse`: the follower's hint of where logs may match.
    pub reject_hint: u64,
    /// The snapshot of a `Snapshot` message.
    pub snapshot: Option<Box<Snapshot>>,
    /// Opaque ReadIndex request context.
    pub context: Bytes,
    /// On `RequestVote`: the campaign was started by a leader transfer (`TimeoutNow`),
    /// so voters must not refuse it because they recently heard from a leader.
    pub leader_transfer: bool,
}

impl Message {
    /// A message of `kind` with all other fields empty.
    pub fn new(kind: MessageType, from: NodeId, to: NodeId, term: u64) -> Message {
        Message {
            kind,
            from,
            to,
            term,
            log_term: 0,
            index: 0,
            entries: Vec::new(),
            commit: 0,
            reject: false,
            reject_hint: 0,
            snapshot: None,
            context: Bytes::new(),
            leader_transfer: false,
        }
    }

    /// Whether the sender must have made its state durable before this message leaves:
    /// acknowledgements and votes promise something about durable state, and a vote
    /// request must not leave before the candidate's new term and self-vote are durable
    /// (else a crash could let it win the same term twice with different logs).
    pub fn needs_persistence(&self) -> bool {
        matches!(
            self.kind,
            MessageType::AppendResponse
                | MessageType::RequestVote
                | MessageType::RequestVoteResponse
                | MessageType::RequestPreVoteResponse
        )
    }
}

/// A linearizable read point: reading the state machine once it has applied `index`
/// answers the read request identified by `context`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadState {
    /// The commit index at the time the read was confirmed by a quorum (or lease).
    pub index: u64,
    /// The caller's request context.
    pub context: Bytes,
}

/// The role of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StateRole {
    /// Follows a leader (or waits for one).
    #[default]
    Follower,
    /// Asks for pre-votes without raising its term.
    PreCandidate,
    /// Asks for votes in a new term.
    Candidate,
    /// Leads the term.
    Leader,
}

/// Leader's view of a snapshot sent to a follower, reported by the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotStatus {
    /// The follower received the whole snapshot.
    Finish,
    /// Sending failed; the leader will probe again.
    Failure,
}
