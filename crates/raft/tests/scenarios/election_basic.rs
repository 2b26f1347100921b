//! A leader is elected, proposals commit everywhere, and a second campaign in the same
//! term cannot produce a second leader.

use crate::harness::*;
use phoenix_raft::StateRole;

#[test]
fn three_nodes_elect_one_leader_and_replicate() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1]);
    assert_eq!(net.term(1), 1);
    for id in [2, 3] {
        assert_eq!(net.role(id), StateRole::Follower);
        assert_eq!(net.node(id).raw.raft().leader(), 1);
    }
    net.propose(1, "a").unwrap();
    net.propose(1, "b").unwrap();
    for id in [1, 2, 3] {
        assert_eq!(net.applied_data(id), vec!["a", "b"], "node {id}");
        assert_eq!(net.committed(id), 3, "no-op plus two proposals");
    }
}

#[test]
fn election_by_timeout_without_explicit_campaign() {
    let mut net = Network::new(&[1, 2, 3, 4, 5], cfg_default);
    net.tick_all(40);
    let leaders = net.leaders();
    assert_eq!(leaders.len(), 1, "exactly one leader: {leaders:?}");
    let l = leaders[0];
    let term = net.term(l);
    for id in 1..=5 {
        assert_eq!(net.term(id), term);
    }
}

#[test]
fn proposal_on_follower_is_refused_with_leader_hint() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    match net.propose(2, "x") {
        Err(phoenix_raft::Error::ProposalDropped { leader, .. }) => assert_eq!(leader, 1),
        other => panic!("expected ProposalDropped, got {other:?}"),
    }
}

#[test]
fn single_node_commits_alone() {
    let mut net = Network::new(&[1], cfg_default);
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1]);
    net.propose(1, "solo").unwrap();
    assert_eq!(net.applied_data(1), vec!["solo"]);
}

#[test]
fn restart_keeps_term_vote_and_log() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.crash(2);
    net.restart(2);
    let r = net.node(2).raw.raft();
    assert_eq!(r.term(), 1);
    assert_eq!(r.committed(), 2);
    net.settle();
    // Restarted node re-applies from its (empty) snapshot.
    net.propose(1, "b").unwrap();
    assert_eq!(net.applied_data(2), vec!["a", "b"]);
}
