//! Malformed or impossible input is refused with a typed error and changes nothing.

use crate::harness::*;
use bytes::Bytes;
use phoenix_raft::{ConfChange, Entry, EntryKind, Error, Message, MessageType, Snapshot};

fn net() -> Network {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net
}

fn append(
    from: u64,
    to: u64,
    term: u64,
    index: u64,
    log_term: u64,
    ents: &[(u64, u64)],
) -> Message {
    let mut m = Message::new(MessageType::Append, from, to, term);
    m.index = index;
    m.log_term = log_term;
    m.entries = ents
        .iter()
        .map(|&(i, t)| Entry {
            index: i,
            term: t,
            kind: EntryKind::Normal,
            data: Bytes::new(),
            conflict_keys: None,
        })
        .collect();
    m
}

/// Votes, vote answers and append answers from a node outside the configuration are
/// refused. (A leader's message at the current term or later is taken: the member may lag
/// behind the change that added that leader, `membership_change_while_member_down`.)
#[test]
fn message_from_unknown_node_is_refused() {
    let mut net = net();
    let before = net.node(2).raw.raft().clone();
    let term = before.term();
    let mut refused = Vec::new();
    for kind in [
        MessageType::RequestVote,
        MessageType::RequestPreVote,
        MessageType::RequestVoteResponse,
        MessageType::AppendResponse,
        MessageType::HeartbeatResponse,
        MessageType::ReadIndex,
    ] {
        let mut m = Message::new(kind, 9, 2, term + 3);
        m.index = 2;
        m.log_term = 1;
        refused.push(m);
    }
    for m in refused {
        let kind = m.kind;
        let err = net.raw(2).step(m).unwrap_err();
        assert!(
            matches!(err, Error::UnknownPeer { from: 9, .. }),
            "{kind:?}: {err}"
        );
        assert_eq!(net.node(2).raw.raft(), &before, "{kind:?}: state unchanged");
    }
}

#[test]
fn non_contiguous_entries_are_refused() {
    let mut net = net();
    let err = net
        .raw(2)
        .step(append(1, 2, 1, 2, 1, &[(3, 1), (5, 1)]))
        .unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
    let err = net
        .raw(2)
        .step(append(1, 2, 1, 2, 1, &[(4, 1)]))
        .unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
}

#[test]
fn entry_terms_beyond_message_term_or_falling_are_refused() {
    let mut net = net();
    let err = net
        .raw(2)
        .step(append(1, 2, 1, 2, 1, &[(3, 2)]))
        .unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
    let err = net
        .raw(2)
        .step(append(1, 2, 3, 2, 2, &[(3, 1)]))
        .unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
}

#[test]
fn misaddressed_zero_term_and_self_messages_are_refused() {
    let mut net = net();
    assert!(matches!(
        net.raw(2).step(append(1, 3, 1, 2, 1, &[])),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        net.raw(2).step(append(1, 2, 0, 2, 1, &[])),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        net.raw(2).step(append(2, 2, 1, 2, 1, &[])),
        Err(Error::Malformed(_))
    ));
    let mut ack = Message::new(MessageType::AppendResponse, 1, 1, 1);
    ack.index = 100;
    assert!(matches!(net.raw(1).step(ack), Err(Error::Malformed(_))));
}

#[test]
fn snapshot_message_without_snapshot_or_with_bad_conf_is_refused() {
    let mut net = net();
    let m = Message::new(MessageType::Snapshot, 1, 2, 1);
    assert!(matches!(net.raw(2).step(m), Err(Error::Malformed(_))));
    let mut m = Message::new(MessageType::Snapshot, 1, 2, 1);
    let mut s = Snapshot::default();
    s.meta.index = 10;
    s.meta.term = 1;
    s.meta.conf.voters = vec![3, 1];
    m.snapshot = Some(Box::new(s));
    assert!(matches!(net.raw(2).step(m), Err(Error::InvalidConfig(_))));
}

#[test]
fn ack_beyond_leader_log_is_refused() {
    let mut net = net();
    let mut m = Message::new(MessageType::AppendResponse, 2, 1, 1);
    m.index = 1000;
    assert!(matches!(net.raw(1).step(m), Err(Error::Malformed(_))));
}

#[test]
fn bad_conf_change_bytes_are_refused() {
    assert!(ConfChange::decode(&[]).is_err());
    assert!(ConfChange::decode(&[1, 0, 0]).is_err());
    assert!(ConfChange::decode(&[7, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
    assert!(ConfChange::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    for cc in [
        ConfChange::AddVoter(5),
        ConfChange::AddLearner(6),
        ConfChange::RemoveNode(u64::MAX),
    ] {
        assert_eq!(ConfChange::decode(&cc.encode()).unwrap(), cc);
    }
    let mut net = net();
    let bad = Entry {
        kind: EntryKind::ConfChange,
        data: Bytes::from_static(b"xx"),
        ..Entry::default()
    };
    assert!(matches!(
        net.raw(1).propose_entries(vec![bad]),
        Err(Error::Malformed(_))
    ));
}

#[test]
fn removing_the_last_voter_is_refused() {
    let mut net = Network::new(&[1], cfg_default);
    net.campaign(1);
    assert!(matches!(
        net.raw(1).propose_conf_change(ConfChange::RemoveNode(1)),
        Err(Error::ProposalDropped { .. })
    ));
}

#[test]
fn indexes_near_u64_max_are_refused_without_overflow() {
    let mut net = net();
    let m = append(1, 2, 1, u64::MAX, 1, &[(0, 1)]);
    assert!(matches!(net.raw(2).step(m), Err(Error::Malformed(_))));
    let mut hb = Message::new(MessageType::Heartbeat, 1, 2, 1);
    hb.commit = u64::MAX;
    assert!(matches!(net.raw(2).step(hb), Err(Error::Malformed(_))));
    let mut v = Message::new(MessageType::RequestVote, 3, 2, u64::MAX);
    v.index = 1;
    assert!(matches!(net.raw(2).step(v), Err(Error::Malformed(_))));
}
