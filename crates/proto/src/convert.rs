//! Conversions between the consensus core's types (`phoenix_raft`) and the wire.
//!
//! Decoding validates: unknown enum values, node id 0 where a node is required,
//! entries that are not contiguous from `index + 1`, malformed membership. A peer
//! sending such a message gets it dropped (with a log line at the caller), never a panic.

use bytes::Bytes;
use phoenix_raft as raft;

use crate::{ConfState, EntryKind, RaftEntry, RaftMessage, RaftMessageType, SnapshotMeta};

/// Why a wire message could not be turned into a raft message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// An enum field holds a value this version does not know.
    #[error("unknown {field} value {value}")]
    UnknownEnum {
        /// Which field.
        field: &'static str,
        /// The value received.
        value: i32,
    },
    /// A field is missing or inconsistent.
    #[error("malformed raft message: {0}")]
    Malformed(&'static str),
}

fn kind_to_wire(k: raft::MessageType) -> RaftMessageType {
    use raft::MessageType as M;
    match k {
        M::Append => RaftMessageType::Append,
        M::AppendResponse => RaftMessageType::AppendResponse,
        M::RequestVote => RaftMessageType::RequestVote,
        M::RequestVoteResponse => RaftMessageType::RequestVoteResponse,
        M::RequestPreVote => RaftMessageType::RequestPreVote,
        M::RequestPreVoteResponse => RaftMessageType::RequestPreVoteResponse,
        M::Heartbeat => RaftMessageType::Heartbeat,
        M::HeartbeatResponse => RaftMessageType::HeartbeatResponse,
        M::Snapshot => RaftMessageType::Snapshot,
        M::TimeoutNow => RaftMessageType::TimeoutNow,
        M::ReadIndex => RaftMessageType::ReadIndex,
        M::ReadIndexResponse => RaftMessageType::ReadIndexResponse,
        M::Hibernate => RaftMessageType::Hibernate,
    }
}

fn kind_from_wire(k: RaftMessageType) -> raft::MessageType {
    use raft::MessageType as M;
    match k {
        RaftMessageType::Append => M::Append,
        RaftMessageType::AppendResponse => M::AppendResponse,
        RaftMessageType::RequestVote => M::RequestVote,
        RaftMessageType::RequestVoteResponse => M::RequestVoteResponse,
        RaftMessageType::RequestPreVote => M::RequestPreVote,
        RaftMessageType::RequestPreVoteResponse => M::RequestPreVoteResponse,
        RaftMessageType::Heartbeat => M::Heartbeat,
        RaftMessageType::HeartbeatResponse => M::HeartbeatResponse,
        RaftMessageType::Snapshot => M::Snapshot,
        RaftMessageType::TimeoutNow => M::TimeoutNow,
        RaftMessageType::ReadIndex => M::ReadIndex,
        RaftMessageType::ReadIndexResponse => M::ReadIndexResponse,
        RaftMessageType::Hibernate => M::Hibernate,
    }
}

/// Entry to the wire.
pub fn entry_to_wire(e: &raft::Entry) -> RaftEntry {
    RaftEntry {
        term: e.term,
        index: e.index,
        kind: match e.kind {
            raft::EntryKind::Normal => EntryKind::Normal as i32,
            raft::EntryKind::ConfChange => EntryKind::ConfChange as i32,
        },
        data: e.data.clone(),
    }
}

/// Entry from the wire.
pub fn entry_from_wire(e: RaftEntry) -> Result<raft::Entry, DecodeError> {
    let kind = match EntryKind::try_from(e.kind) {
        Ok(EntryKind::Normal) => raft::EntryKind::Normal,
        Ok(EntryKind::ConfChange) => raft::EntryKind::ConfChange,
        Err(_) => {
            return Err(DecodeError::UnknownEnum {
                field: "entry kind",
                value: e.kind,
            })
        }
    };
    if e.index == 0 {
        return Err(DecodeError::Malformed("entry index 0"));
    }
    Ok(raft::Entry {
        term: e.term,
        index: e.index,
        kind,
        data: e.data,
        conflict_keys: None,
    })
}

/// Membership to the wire.
pub fn conf_to_wire(c: &raft::ConfState) -> ConfState {
    ConfState {
        voters: c.voters.clone(),
        learners: c.learners.clone(),
    }
}

/// Membership from the wire (validated: sorted, unique, disjoint, no node 0).
pub fn conf_from_wire(c: ConfState) -> Result<raft::ConfState, DecodeError> {
    let conf = raft::ConfState {
        voters: c.voters,
        learners: c.learners,
    };
    conf.validate()
        .map_err(|_| DecodeError::Malformed("invalid membership in snapshot"))?;
    Ok(conf)
}

/// Snapshot metadata to the wire.
pub fn snapshot_meta_to_wire(m: &raft::SnapshotMeta) -> SnapshotMeta {
    SnapshotMeta {
        index: m.index,
        term: m.term,
        conf: Some(conf_to_wire(&m.conf)),
    }
}

/// Snapshot metadata from the wire.
pub fn snapshot_meta_from_wire(m: SnapshotMeta) -> Result<raft::SnapshotMeta, DecodeError> {
    Ok(raft::SnapshotMeta {
        index: m.index,
        term: m.term,
        conf: conf_from_wire(m.conf.unwrap_or_default())?,
    })
}

/// Raft message to the wire. A snapshot's `data` is not carried (it travels over
/// `SendSnapshot`); only its metadata is.
pub fn message_to_wire(m: &raft::Message) -> RaftMessage {
    RaftMessage {
        kind: kind_to_wire(m.kind) as i32,
        from: m.from,
        to: m.to,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries: m.entries.iter().map(entry_to_wire).collect(),
        commit: m.commit,
        reject: m.reject,
        reject_hint: m.reject_hint,
        snapshot: m.snapshot.as_ref().map(|s| snapshot_meta_to_wire(&s.meta)),
        context: m.context.clone(),
        leader_transfer: m.leader_transfer,
    }
}

/// Raft message from the wire, validated. `snapshot_data` becomes the data of the
/// snapshot of a `Snapshot` message (empty when streamed and installed separately).
pub fn message_from_wire(
    m: RaftMessage,
    snapshot_data: Bytes,
) -> Result<raft::Message, DecodeError> {
    let kind = RaftMessageType::try_from(m.kind).map_err(|_| DecodeError::UnknownEnum {
        field: "message kind",
        value: m.kind,
    })?;
    let kind = kind_from_wire(kind);
    if m.from == raft::NONE || m.to == raft::NONE {
        return Err(DecodeError::Malformed("message from or to node 0"));
    }
    let mut entries = Vec::with_capacity(m.entries.len());
    for (i, e) in m.entries.into_iter().enumerate() {
        let e = entry_from_wire(e)?;
        // (Checked: a peer's index near u64::MAX must be refused, not overflow.)
        if Some(e.index) != m.index.checked_add(1 + i as u64) {
            return Err(DecodeError::Malformed("entries not contiguous after index"));
        }
        entries.push(e);
    }
    if !entries.is_empty() && kind != raft::MessageType::Append {
        return Err(DecodeError::Malformed(
            "entries on a message that is not Append",
        ));
    }
    let snapshot = match (kind, m.snapshot) {
        (raft::MessageType::Snapshot, Some(meta)) => Some(Box::new(raft::Snapshot {
            meta: snapshot_meta_from_wire(meta)?,
            data: snapshot_data,
        })),
        (raft::MessageType::Snapshot, None) => {
            return Err(DecodeError::Malformed("Snapshot message without metadata"))
        }
        (_, Some(_)) => return Err(DecodeError::Malformed("snapshot on a non-Snapshot message")),
        (_, None) => None,
    };
    Ok(raft::Message {
        kind,
        from: m.from,
        to: m.to,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries,
        commit: m.commit,
        reject: m.reject,
        reject_hint: m.reject_hint,
        snapshot,
        context: m.context,
        leader_transfer: m.leader_transfer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> raft::Message {
        let mut m = raft::Message::new(raft::MessageType::Append, 1, 2, 5);
        m.index = 10;
        m.log_term = 4;
        m.commit = 9;
        m.entries = vec![
            raft::Entry {
                term: 5,
                index: 11,
                kind: raft::EntryKind::Normal,
                data: Bytes::from_static(b"abc"),
                conflict_keys: None,
            },
            raft::Entry {
                term: 5,
                index: 12,
                kind: raft::EntryKind::ConfChange,
                data: raft::ConfChange::AddVoter(3).encode(),
                conflict_keys: None,
            },
        ];
        m.context = Bytes::from_static(b"ctx");
        m
    }

    #[test]
    fn message_round_trip() {
        let m = sample();
        let back = message_from_wire(message_to_wire(&m), Bytes::new()).unwrap();
        assert_eq!(back, m);

        let mut s = raft::Message::new(raft::MessageType::Snapshot, 1, 3, 7);
        s.snapshot = Some(Box::new(raft::Snapshot {
            meta: raft::SnapshotMeta {
                index: 100,
                term: 6,
                conf: raft::ConfState::with_voters([1, 2, 3]),
            },
            data: Bytes::new(),
        }));
        let back = message_from_wire(message_to_wire(&s), Bytes::new()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn rejects_nonsense() {
        let mut w = message_to_wire(&sample());
        w.kind = 99;
        assert!(matches!(
            message_from_wire(w, Bytes::new()),
            Err(DecodeError::UnknownEnum { .. })
        ));
        let mut w = message_to_wire(&sample());
        w.entries[1].index = 20;
        assert!(message_from_wire(w, Bytes::new()).is_err());
        let mut w = message_to_wire(&sample());
        w.from = 0;
        assert!(message_from_wire(w, Bytes::new()).is_err());
        let mut w = message_to_wire(&raft::Message::new(raft::MessageType::Snapshot, 1, 2, 1));
        w.snapshot = Some(SnapshotMeta {
            index: 1,
            term: 1,
            conf: Some(ConfState {
                voters: vec![2, 1],
                learners: vec![],
            }),
        });
        assert!(message_from_wire(w, Bytes::new()).is_err());
    }
}
