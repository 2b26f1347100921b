//! Learners receive the log but neither vote nor count for commit; promoting one makes
//! it a full voter.

use crate::harness::*;
use phoenix_raft::{ConfChange, StateRole};

#[test]
fn learner_catches_up_without_voting_then_is_promoted() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.add_empty_node(4, ConfChange::AddLearner(4));
    net.raw(1)
        .propose_conf_change(ConfChange::AddLearner(4))
        .unwrap();
    net.settle();
    net.tick_all(3);
    assert_eq!(net.node(1).conf.learners, vec![4]);
    assert_eq!(
        net.node(4).conf.learners,
        vec![4],
        "the learner applied its own addition"
    );
    assert_eq!(net.applied_data(4), vec!["a"]);
    // A learner never campaigns.
    for _ in 0..100 {
        net.tick(4);
    }
    net.settle();
    assert_eq!(net.role(4), StateRole::Follower);
    // Learners do not count: with 2 and 3 down, nothing commits.
    net.crash(2);
    net.crash(3);
    let before = net.committed(1);
    net.raw(1).propose("lonely").unwrap();
    net.settle();
    assert_eq!(net.committed(1), before);
    net.restart(2);
    net.restart(3);
    net.tick_all(3);
    // Promote: now 4 counts, so 1 and 4 (+ one more) form quorums of 4 voters.
    net.raw(1)
        .propose_conf_change(ConfChange::AddVoter(4))
        .unwrap();
    net.settle();
    net.tick_all(2);
    assert_eq!(net.node(4).conf.voters, vec![1, 2, 3, 4]);
    assert!(net.node(4).conf.learners.is_empty());
    net.crash(3);
    net.propose(1, "with 1, 2, 4").unwrap();
    assert_eq!(
        net.applied_data(4).last().map(String::as_str),
        Some("with 1, 2, 4")
    );
}
