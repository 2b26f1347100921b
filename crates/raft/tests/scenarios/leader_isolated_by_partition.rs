//! A leader cut off from the majority cannot commit; the majority elects a new leader;
//! after healing, the old leader's uncommitted entries are replaced.

use crate::harness::*;

#[test]
fn minority_leader_cannot_commit_and_its_entries_are_replaced() {
    let mut net = Network::new(&[1, 2, 3, 4, 5], cfg_default);
    net.campaign(1);
    net.propose(1, "before").unwrap();
    net.partition(&[1, 2], &[3, 4, 5]);
    net.propose(1, "lost").unwrap();
    assert_eq!(net.committed(1), 2, "no quorum for 'lost'");
    net.tick_all(30);
    let majority_leader: Vec<u64> = net
        .leaders()
        .into_iter()
        .filter(|l| [3, 4, 5].contains(l))
        .collect();
    assert_eq!(majority_leader.len(), 1);
    let l = majority_leader[0];
    net.propose(l, "after").unwrap();
    net.heal();
    net.tick_all(10);
    assert_eq!(net.leaders(), vec![l]);
    for id in 1..=5 {
        assert_eq!(net.applied_data(id), vec!["before", "after"], "node {id}");
    }
}
