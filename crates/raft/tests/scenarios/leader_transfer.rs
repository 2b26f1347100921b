//! Leader transfer: the leader brings the target up to date, tells it to campaign at
//! once (bypassing pre-vote and leases), and refuses proposals meanwhile.

use crate::harness::*;
use phoenix_raft::{Error, MessageType, StateRole};

#[test]
fn transfer_to_up_to_date_follower() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.raw(1).transfer_leader(2).unwrap();
    net.settle();
    assert_eq!(net.leaders(), vec![2]);
    assert_eq!(net.term(2), 2);
    assert_eq!(net.role(1), StateRole::Follower);
    net.propose(2, "b").unwrap();
    assert_eq!(net.applied_data(1), vec!["a", "b"]);
}

#[test]
fn transfer_to_lagging_follower_catches_it_up_first() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(3);
    for k in 0..5 {
        net.propose(1, &format!("v{k}")).unwrap();
    }
    net.heal();
    net.raw(1).transfer_leader(3).unwrap();
    // Proposals are refused while the transfer is under way.
    match net.raw(1).propose("blocked") {
        Err(Error::ProposalDropped { .. }) => {}
        other => panic!("proposal during transfer: {other:?}"),
    }
    net.settle();
    assert_eq!(
        net.count_delivered(MessageType::TimeoutNow, |m| m.to == 3),
        1
    );
    assert_eq!(net.leaders(), vec![3]);
    assert_eq!(net.applied_data(3).len(), 5);
}

#[test]
fn transfer_to_unreachable_target_is_abandoned_after_election_timeout() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(3);
    net.raw(1).transfer_leader(3).unwrap();
    net.settle();
    assert_eq!(net.node(1).raw.raft().lead_transferee(), 3);
    net.tick_all(10);
    assert_eq!(net.node(1).raw.raft().lead_transferee(), 0);
    assert_eq!(net.leaders(), vec![1]);
    net.propose(1, "resumed").unwrap();
}

#[test]
fn transfer_to_non_voter_is_refused() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    assert!(net.raw(1).transfer_leader(9).is_err());
    assert!(net.raw(1).transfer_leader(1).is_err());
    assert!(
        net.raw(2).transfer_leader(3).is_err(),
        "only the leader transfers"
    );
}
