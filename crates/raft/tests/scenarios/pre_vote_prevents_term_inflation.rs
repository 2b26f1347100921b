//! Pre-vote: a node partitioned away keeps timing out but does not raise its term, so
//! when it comes back it does not depose the healthy leader. Without pre-vote it does.

use crate::harness::*;
use phoenix_raft::StateRole;

fn run(pre_vote: bool) -> (u64, u64, u64) {
    let mut net = Network::new(&[1, 2, 3], move |id| {
        let mut c = cfg_default(id);
        c.pre_vote = pre_vote;
        c.check_quorum = false;
        c
    });
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.isolate(3);
    // The isolated node falls behind, so no one would vote for it.
    net.propose(1, "b").unwrap();
    for _ in 0..100 {
        net.tick(3);
        net.settle();
    }
    let isolated_term = net.term(3);
    net.heal();
    net.tick_all(30);
    let leader = net.leaders()[0];
    (isolated_term, net.term(leader), leader)
}

#[test]
fn with_pre_vote_the_isolated_node_keeps_its_term_and_the_leader_stays() {
    let (isolated_term, term, leader) = run(true);
    assert_eq!(isolated_term, 1, "pre-vote rounds never raise the term");
    assert_eq!(term, 1);
    assert_eq!(leader, 1);
}

#[test]
fn without_pre_vote_the_isolated_node_inflates_its_term_and_disrupts() {
    let (isolated_term, term, _) = run(false);
    assert!(isolated_term > 3, "term inflated to {isolated_term}");
    assert!(
        term >= isolated_term,
        "the cluster had to move past the inflated term"
    );
}

#[test]
fn pre_candidate_role_is_visible_while_waiting() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.isolate(1);
    net.raw(1).campaign().unwrap();
    net.settle();
    assert_eq!(net.role(1), StateRole::PreCandidate);
    assert_eq!(net.term(1), 0);
}
