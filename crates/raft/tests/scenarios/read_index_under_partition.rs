//! ReadIndex: a read is answered only after a quorum confirms the leader; a leader cut
//! off from the majority never answers, the majority's new leader does; followers
//! forward reads to the leader.

use crate::harness::*;

#[test]
fn read_index_confirmed_by_quorum() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.raw(1).read_index("r1").unwrap();
    net.settle();
    let rs = &net.node(1).read_states;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].index, 2);
    assert_eq!(&rs[0].context[..], b"r1");
}

#[test]
fn isolated_leader_never_answers_reads_but_majority_leader_does() {
    let mut net = Network::new(&[1, 2, 3, 4, 5], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.partition(&[1, 2], &[3, 4, 5]);
    net.raw(1).read_index("stale?").unwrap();
    net.settle();
    net.tick(1);
    net.settle();
    assert!(
        net.node(1).read_states.is_empty(),
        "a minority leader must not answer a read"
    );
    net.tick_all(30);
    let l = net
        .leaders()
        .into_iter()
        .find(|l| [3, 4, 5].contains(l))
        .expect("majority leader");
    net.propose(l, "b").unwrap();
    net.raw(l).read_index("fresh").unwrap();
    net.settle();
    let rs = &net.node(l).read_states;
    assert_eq!(rs.len(), 1);
    assert!(
        rs[0].index >= 4,
        "read index covers the write 'b': {}",
        rs[0].index
    );
    assert!(net.node(1).read_states.is_empty());
}

#[test]
fn follower_read_is_forwarded_to_the_leader() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.raw(2).read_index("from-2").unwrap();
    net.settle();
    let rs = &net.node(2).read_states;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].index, 2);
    assert!(net.node(1).read_states.is_empty());
}

#[test]
fn read_before_first_commit_of_term_waits_for_it() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.hook = Some(Box::new(|m| m.kind != phoenix_raft::MessageType::Append));
    net.campaign(1);
    net.raw(1).read_index("early").unwrap();
    net.settle();
    assert!(net.node(1).read_states.is_empty());
    net.hook = None;
    net.tick_all(2);
    assert_eq!(net.node(1).read_states.len(), 1);
    assert_eq!(net.node(1).read_states[0].index, 1);
}

#[test]
fn lease_based_read_answers_without_a_round_trip() {
    let mut net = Network::new(&[1, 2, 3], |id| {
        let mut c = cfg_default(id);
        c.read_only_option = phoenix_raft::ReadOnlyOption::LeaseBased;
        c
    });
    net.campaign(1);
    net.delivered.clear();
    net.raw(1).read_index("lease").unwrap();
    net.process(1);
    assert_eq!(net.node(1).read_states.len(), 1);
    assert!(net.queue.is_empty(), "no heartbeat round for a lease read");
}
