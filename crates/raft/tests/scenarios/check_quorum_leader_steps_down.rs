//! Check-quorum: a leader that hears from no quorum for an election timeout steps
//! down; followers that hear from a leader ignore disruptive vote requests.

use crate::harness::*;
use phoenix_raft::{Message, MessageType, StateRole};

#[test]
fn leader_without_quorum_steps_down_within_an_election_timeout() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(1);
    let mut ticks = 0;
    while net.role(1) == StateRole::Leader {
        net.tick(1);
        net.settle();
        ticks += 1;
        assert!(
            ticks <= 2 * 10,
            "leader still leads after {ticks} ticks without a quorum"
        );
    }
    assert_eq!(net.role(1), StateRole::Follower);
    assert_eq!(net.term(1), 1, "stepping down does not raise the term");
}

#[test]
fn leader_with_quorum_keeps_leading() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(3);
    net.tick_all(50);
    assert_eq!(net.role(1), StateRole::Leader);
    assert_eq!(net.term(1), 1);
}

#[test]
fn follower_in_lease_ignores_vote_request_of_higher_term() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "x").unwrap();
    // A vote request from 3 at a much higher term, e.g. after it was partitioned.
    let mut m = Message::new(MessageType::RequestVote, 3, 2, 9);
    m.index = 2;
    m.log_term = 1;
    net.raw(2).step(m).unwrap();
    net.settle();
    assert_eq!(net.term(2), 1, "in lease: term not raised");
    assert_eq!(net.leaders(), vec![1]);
}
