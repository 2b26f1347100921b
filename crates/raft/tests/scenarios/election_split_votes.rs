//! Two candidates in the same term split the votes: nobody wins that term, and the
//! randomized timeouts resolve it in a later term.

use crate::harness::*;
use phoenix_raft::{MessageType, StateRole};

#[test]
fn split_vote_yields_no_leader_then_randomized_timeouts_resolve() {
    let mut net = Network::new(&[1, 2, 3, 4], cfg_plain);
    // Votes from 1 reach only 2; votes from 3 reach only 4: 2 vs 2 of 4.
    net.cut.insert((1, 3));
    net.cut.insert((1, 4));
    net.cut.insert((3, 1));
    net.cut.insert((3, 2));
    net.raw(1).campaign().unwrap();
    net.raw(3).campaign().unwrap();
    net.settle();
    assert_eq!(net.term(1), 1);
    assert_eq!(net.term(3), 1);
    assert!(
        net.leaders().is_empty(),
        "split vote must not elect: {:?}",
        net.leaders()
    );
    assert_eq!(net.role(1), StateRole::Candidate);
    assert_eq!(net.role(3), StateRole::Candidate);
    // Both got exactly one grant from a peer.
    let grants = net.count_delivered(MessageType::RequestVoteResponse, |m| !m.reject);
    assert_eq!(grants, 2);
    net.heal();
    net.tick_all(60);
    let leaders = net.leaders();
    assert_eq!(leaders.len(), 1);
    assert!(
        net.term(leaders[0]) >= 2,
        "resolution happens in a later term"
    );
}
