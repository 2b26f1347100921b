//! Membership change while a member is down: add a voter and remove the dead one, one
//! node at a time; each change needs a majority of the configuration it creates.

use crate::harness::*;
use phoenix_raft::{ConfChange, Error, MessageType};

#[test]
fn replace_a_dead_member_one_change_at_a_time() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.crash(3);
    net.add_empty_node(4, ConfChange::AddVoter(4));
    net.raw(1)
        .propose_conf_change(ConfChange::AddVoter(4))
        .unwrap();
    // A second change while the first is not applied is refused.
    match net.raw(1).propose_conf_change(ConfChange::RemoveNode(3)) {
        Err(Error::ProposalDropped { .. }) => {}
        other => panic!("second pending change accepted: {other:?}"),
    }
    net.settle();
    net.tick_all(3);
    assert_eq!(net.node(1).conf.voters, vec![1, 2, 3, 4]);
    assert_eq!(net.applied_data(4), vec!["a"]);
    // {1,2,4} is a majority of four: commits continue with 3 down.
    net.propose(1, "b").unwrap();
    assert_eq!(net.applied_data(2), vec!["a", "b"]);
    net.raw(1)
        .propose_conf_change(ConfChange::RemoveNode(3))
        .unwrap();
    net.settle();
    for id in [1, 2, 4] {
        assert_eq!(net.node(id).conf.voters, vec![1, 2, 4], "node {id}");
    }
    // With three voters, losing one more still leaves a quorum.
    net.crash(2);
    net.propose(1, "c").unwrap();
    assert_eq!(net.applied_data(4), vec!["a", "b", "c"]);
}

#[test]
fn removed_leader_steps_down_and_the_rest_elect() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.raw(1)
        .propose_conf_change(ConfChange::RemoveNode(1))
        .unwrap();
    net.settle();
    assert!(net.leaders().is_empty() || net.leaders() != vec![1]);
    net.tick_all(40);
    let leaders = net.leaders();
    assert_eq!(leaders.len(), 1);
    assert_ne!(leaders[0], 1);
    let l = leaders[0];
    net.propose(l, "b").unwrap();
    assert_eq!(net.applied_data(2), vec!["a", "b"]);
    assert_eq!(net.node(l).conf.voters, vec![2, 3]);
}

#[test]
fn change_refused_before_leader_commits_in_its_term() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    // Elected, but its no-op does not reach anyone yet.
    net.hook = Some(Box::new(|m| m.kind != MessageType::Append));
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1]);
    match net.raw(1).propose_conf_change(ConfChange::AddLearner(4)) {
        Err(Error::ProposalDropped { reason, .. }) => assert!(reason.contains("term"), "{reason}"),
        other => panic!("change accepted before an entry of the term committed: {other:?}"),
    }
    net.hook = None;
    net.tick_all(2);
    net.raw(1)
        .propose_conf_change(ConfChange::AddLearner(4))
        .unwrap();
}

/// A member down while a node is added and then leads: back, it has not applied the
/// change adding that leader, yet it takes the leader's appends and catches up (a member
/// that refused a leader outside its own configuration could never catch up while it
/// led).
#[test]
fn a_lagging_member_catches_up_from_a_leader_added_after_it_went_down() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.crash(3);
    net.add_empty_node(4, ConfChange::AddLearner(4));
    net.raw(1)
        .propose_conf_change(ConfChange::AddLearner(4))
        .unwrap();
    net.settle();
    net.tick_all(3);
    net.raw(1)
        .propose_conf_change(ConfChange::AddVoter(4))
        .unwrap();
    net.settle();
    net.tick_all(3);
    assert_eq!(net.node(4).conf.voters, vec![1, 2, 3, 4]);
    net.raw(1).transfer_leader(4).unwrap();
    net.settle();
    assert_eq!(net.leaders(), vec![4]);
    net.propose(4, "b").unwrap();
    // Node 3 returns knowing only {1, 2, 3}.
    net.restart(3);
    assert_eq!(net.node(3).conf.voters, vec![1, 2, 3]);
    net.tick_all(10);
    assert_eq!(net.applied_data(3), vec!["a", "b"]);
    assert_eq!(net.node(3).conf.voters, vec![1, 2, 3, 4]);
    // Votes and answers from outside its configuration stay refused (the
    // malformed-input scenarios).
}
