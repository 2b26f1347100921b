//! Durability ordering: vote requests, votes and append acknowledgements are handed
//! out only in
//! `persisted_messages`; a node's own vote and own append count only once its ready is
//! reported durable; readies are numbered and may be acknowledged later, in batches.

use phoenix_raft::{ConfState, Config, MemStorage, MessageType, RawNode, StateRole};

fn node(id: u64) -> RawNode<MemStorage> {
    let store = MemStorage::new_with_conf(ConfState::with_voters([1, 2, 3]));
    let mut c = Config::new(id);
    c.pre_vote = false;
    RawNode::new(&c, store).unwrap()
}

#[test]
fn vote_grant_waits_for_persistence_of_the_vote() {
    let mut n1 = node(1);
    let mut n2 = node(2);
    n1.campaign().unwrap();
    let rd = n1.ready().unwrap();
    assert_eq!(rd.number(), 1);
    assert_eq!(rd.hard_state.map(|h| (h.term, h.vote)), Some((1, 1)));
    assert!(
        rd.persisted_messages.iter().all(|m| m.to != 1),
        "own vote is stepped internally"
    );
    assert!(
        rd.messages.is_empty(),
        "vote requests wait for the durable term and vote"
    );
    let req = rd
        .persisted_messages
        .iter()
        .find(|m| m.to == 2)
        .unwrap()
        .clone();
    assert_eq!(req.kind, MessageType::RequestVote);
    n2.step(req).unwrap();
    let rd2 = n2.ready().unwrap();
    assert!(rd2
        .messages
        .iter()
        .all(|m| m.kind != MessageType::RequestVoteResponse));
    let resp = rd2
        .persisted_messages
        .iter()
        .find(|m| m.kind == MessageType::RequestVoteResponse)
        .unwrap();
    assert!(!resp.reject);
    assert_eq!(
        rd2.hard_state.map(|h| h.vote),
        Some(1),
        "the vote is in the same ready"
    );
    // 1 got 2's vote, but its own vote is not durable yet: not leader.
    n1.step(resp.clone()).unwrap();
    assert_eq!(n1.raft().role(), StateRole::Candidate);
    n1.on_persist_ready(rd.number()).unwrap();
    assert_eq!(n1.raft().role(), StateRole::Leader);
}

#[test]
fn leader_appends_go_out_before_its_own_persistence_but_commit_waits_for_it() {
    let (mut n1, mut n2) = (node(1), node(2));
    n1.campaign().unwrap();
    let rd = n1.ready().unwrap();
    n2.step(
        rd.persisted_messages
            .iter()
            .find(|m| m.to == 2)
            .unwrap()
            .clone(),
    )
    .unwrap();
    let r2 = n2.ready().unwrap();
    n2.on_persist_ready(r2.number()).unwrap();
    n1.on_persist_ready(rd.number()).unwrap();
    n1.step(r2.persisted_messages[0].clone()).unwrap();
    assert_eq!(n1.raft().role(), StateRole::Leader);
    // The ready carrying the leader's no-op also carries the appends of it.
    let rd = n1.ready().unwrap();
    let noop = rd.entries.last().unwrap().index;
    assert!(rd
        .messages
        .iter()
        .any(|m| m.kind == MessageType::Append && m.entries.iter().any(|e| e.index == noop)));
    for m in rd
        .messages
        .iter()
        .filter(|m| m.to == 2 && m.kind == MessageType::Append)
    {
        n2.step(m.clone()).unwrap();
    }
    let r2 = n2.ready().unwrap();
    assert!(r2
        .messages
        .iter()
        .all(|m| m.kind != MessageType::AppendResponse));
    n2.store_mut().append(&r2.entries).unwrap();
    n2.on_persist_ready(r2.number()).unwrap();
    for m in r2.persisted_messages {
        n1.step(m).unwrap();
    }
    // 2's copy is durable, the leader's own is not: no quorum of durable copies yet.
    assert!(n1.raft().committed() < noop);
    n1.store_mut().append(&rd.entries).unwrap();
    n1.on_persist_ready(rd.number()).unwrap();
    assert_eq!(n1.raft().committed(), noop);
}

#[test]
fn readies_can_be_acknowledged_in_a_batch_and_out_of_order_is_refused() {
    let mut n1 = node(1);
    n1.campaign().unwrap();
    let a = n1.ready().unwrap();
    n1.tick().unwrap();
    let _b = n1.ready().unwrap();
    assert_eq!(a.number() + 1, _b.number());
    assert!(n1.on_persist_ready(99).is_err());
    n1.on_persist_ready(_b.number()).unwrap();
    // Both were covered: a second acknowledgement of the first is a no-op.
    n1.on_persist_ready(a.number()).unwrap();
}
