//! `coalesce_messages` (the server's setting, for nodes of many groups that each take
//! few writes): a commit with nothing new to send is not broadcast in empty appends of
//! its own, and a periodic heartbeat skips a follower that answered an append since the
//! previous one. The followers still learn the commit index (from the next heartbeat,
//! append or `Hibernate`), and a read index still asks every follower.

use phoenix_raft::{Config, MessageType, NodeId};

use crate::harness::*;

fn cfg_coalesced(id: NodeId) -> Config {
    let mut c = cfg_default(id);
    c.heartbeat_tick = 2;
    c.coalesce_messages = true;
    c
}

fn tick_leader(net: &mut Network, n: u32) {
    for _ in 0..n {
        net.tick(1);
        net.settle();
    }
}

/// Node 1 elected, the election's messages behind us (two heartbeat intervals).
fn elect_1(net: &mut Network) {
    net.campaign(1);
    tick_leader(net, 4);
}

#[test]
fn one_write_costs_an_append_and_its_answer_per_follower() {
    for coalesce in [false, true] {
        let mut net = Network::new(&[1, 2, 3], move |id| {
            let mut c = cfg_coalesced(id);
            c.coalesce_messages = coalesce;
            c
        });
        net.campaign(1);
        net.settle();
        // Heartbeats until the election's appends are behind us.
        tick_leader(&mut net, 4);
        net.delivered.clear();
        let index = net.propose(1, "x").unwrap();
        net.settle();
        assert_eq!(net.committed(1), index);
        let appends = net.count_delivered(MessageType::Append, |_| true);
        if coalesce {
            assert_eq!(
                appends, 2,
                "one append per follower, no empty commit append"
            );
            // The followers hold the entry; they learn that it committed later.
            assert!(net.committed(2) < index && net.committed(3) < index);
        } else {
            assert_eq!(
                appends, 4,
                "etcd's way: the entry, then the commit, to each"
            );
            assert_eq!((net.committed(2), net.committed(3)), (index, index));
        }
        // The next heartbeat interval skips the followers that just answered; the one
        // after heartbeats them and carries the commit index.
        net.delivered.clear();
        tick_leader(&mut net, 2);
        let heartbeats = net.count_delivered(MessageType::Heartbeat, |_| true);
        assert_eq!(heartbeats, if coalesce { 0 } else { 2 });
        tick_leader(&mut net, 2);
        assert_eq!((net.committed(2), net.committed(3)), (index, index));
        assert_eq!(net.applied_data(2), vec!["x".to_string()]);
        assert_eq!(net.applied_data(3), vec!["x".to_string()]);
    }
}

#[test]
fn hibernate_carries_the_commit_index() {
    let mut net = Network::new(&[1, 2, 3], cfg_coalesced);
    elect_1(&mut net);
    let index = net.propose(1, "x").unwrap();
    net.settle();
    assert!(net.committed(2) < index);
    assert!(
        net.raw(1).hibernate().unwrap(),
        "everyone holds the whole log"
    );
    net.settle();
    assert_eq!((net.committed(2), net.committed(3)), (index, index));
    assert_eq!(net.applied_data(3), vec!["x".to_string()]);
}

#[test]
fn a_read_index_still_asks_every_follower() {
    let mut net = Network::new(&[1, 2, 3], cfg_coalesced);
    elect_1(&mut net);
    net.propose(1, "x").unwrap();
    net.settle();
    net.delivered.clear();
    net.raw(1).read_index(b"r".to_vec()).unwrap();
    net.settle();
    assert_eq!(
        net.count_delivered(MessageType::Heartbeat, |m| !m.context.is_empty()),
        2
    );
    assert_eq!(net.node(1).read_states.len(), 1);
}

#[test]
fn a_follower_that_gets_no_appends_is_still_heartbeaten() {
    // Follower 3 is cut off: its appends are sent and lost, so it is skipped by at most
    // one heartbeat per append; while the leader has nothing to send it (paused), it
    // gets heartbeats, and after the partition heals it catches up from their answers.
    let mut net = Network::new(&[1, 2, 3], cfg_coalesced);
    elect_1(&mut net);
    net.isolate(3);
    for i in 0..3 {
        net.propose(1, &format!("v{i}")).unwrap();
        net.settle();
    }
    net.raw(1).report_unreachable(3);
    net.heal();
    net.delivered.clear();
    tick_leader(&mut net, 4);
    assert!(net.count_delivered(MessageType::Heartbeat, |m| m.to == 3) >= 1);
    tick_leader(&mut net, 4);
    assert_eq!(net.applied_data(3), net.applied_data(1));
    assert_eq!(net.committed(3), net.committed(1));
}

/// Review finding: the server puts an idle group to sleep before its tick's heartbeat.
/// A follower that campaigned meanwhile at a higher term (here with its votes lost)
/// must still depose the sleeping leader: it answers the stale `Hibernate` as it
/// answers a stale heartbeat. Before, it dropped it, the leader slept on at the old
/// term, and the follower stayed out of the group until the next write.
#[test]
fn a_stale_hibernate_tells_its_leader_the_higher_term() {
    let mut net = Network::new(&[1, 2, 3], |id| {
        let mut c = cfg_coalesced(id);
        // Node 3 campaigns at once (its pre-vote would be refused by the leased others).
        c.pre_vote = id != 3;
        c
    });
    elect_1(&mut net);
    net.propose(1, "x").unwrap();
    net.settle();
    let term = net.term(1);
    net.isolate(3);
    net.raw(3).campaign().unwrap();
    net.settle();
    net.heal();
    assert_eq!(net.term(3), term + 1);
    // The leader, idle, sleeps before its next heartbeat.
    assert!(net.raw(1).hibernate().unwrap());
    net.settle();
    assert_eq!(
        net.term(1),
        term + 1,
        "the sleeping leader learned the higher term"
    );
    // And the group elects a leader that all three follow.
    for _ in 0..60 {
        net.tick_all(1);
        if net.leaders().len() == 1 && net.term(1) == net.term(2) && net.term(2) == net.term(3) {
            break;
        }
    }
    assert_eq!(net.leaders().len(), 1);
    assert!(net.term(1) == net.term(2) && net.term(2) == net.term(3));
}

/// Review finding: answers to appends wait for the follower's fsync; heartbeat answers
/// do not. A follower whose disk stalls (its append answers never come) must still get
/// heartbeats, or check-quorum deposes a healthy leader that keeps sending appends.
#[test]
fn followers_whose_append_answers_stall_are_still_heartbeaten() {
    let mut net = Network::new(&[1, 2, 3], cfg_coalesced);
    elect_1(&mut net);
    net.hook = Some(Box::new(|m| {
        m.kind != phoenix_raft::MessageType::AppendResponse
    }));
    let election = cfg_coalesced(1).election_tick;
    for i in 0..3 * election {
        // An append to every follower in every tick.
        net.propose(1, &format!("w{i}")).unwrap();
        net.settle();
        net.tick(1);
        net.settle();
    }
    assert_eq!(
        net.role(1),
        phoenix_raft::StateRole::Leader,
        "heartbeat answers keep the leader in place"
    );
    assert_eq!(
        net.committed(1),
        1,
        "nothing commits while no follower answers"
    );
    // Once the answers come, everything commits, and the followers learn it within two
    // heartbeat intervals.
    net.hook = None;
    tick_leader(&mut net, 4);
    assert_eq!(net.applied_data(1).len(), 3 * election as usize);
    tick_leader(&mut net, 4);
    assert_eq!(net.applied_data(2), net.applied_data(1));
    assert_eq!(net.applied_data(3), net.applied_data(1));
}

/// Review finding: a membership change that commits is told to the followers at once
/// (a removed follower hears nothing more from the leader afterwards).
#[test]
fn a_committed_membership_change_is_broadcast_at_once() {
    let mut net = Network::new(&[1, 2, 3], cfg_coalesced);
    elect_1(&mut net);
    let index = net
        .raw(1)
        .propose_conf_change(phoenix_raft::ConfChange::RemoveNode(3))
        .unwrap();
    net.settle();
    assert!(net.committed(1) >= index);
    assert!(
        net.committed(3) >= index,
        "the removed follower learned that its removal committed"
    );
}

#[test]
fn coalescing_needs_an_election_timeout_over_two_heartbeats() {
    let mut c = cfg_coalesced(1);
    c.election_tick = 2 * c.heartbeat_tick;
    assert!(c.validate().is_err());
    c.election_tick += 1;
    assert!(c.validate().is_ok());
}
