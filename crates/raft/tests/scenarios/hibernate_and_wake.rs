//! Hibernation: an idle, caught-up group stops heartbeats and election timers; any
//! proposal or message wakes it, and nobody campaigns while it sleeps.

use crate::harness::*;
use phoenix_raft::{Error, StateRole};

#[test]
fn idle_group_sleeps_without_elections_and_wakes_on_proposal() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    assert!(net.raw(1).hibernate().unwrap());
    net.settle();
    for id in 1..=3 {
        assert!(net.node(id).raw.raft().is_hibernating(), "node {id}");
    }
    net.delivered.clear();
    net.tick_all(200);
    assert!(net.delivered.is_empty(), "a sleeping group sends nothing");
    assert_eq!(net.leaders(), vec![1]);
    assert_eq!(net.term(1), 1);
    net.propose(1, "b").unwrap();
    for id in 1..=3 {
        assert!(!net.node(id).raw.raft().is_hibernating(), "node {id} woke");
        assert_eq!(net.applied_data(id), vec!["a", "b"]);
    }
    net.tick_all(30);
    assert_eq!(net.leaders(), vec![1], "no spurious election after waking");
    assert_eq!(net.term(1), 1);
}

#[test]
fn group_with_lagging_follower_refuses_to_sleep() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(3);
    net.propose(1, "a").unwrap();
    assert!(!net.raw(1).hibernate().unwrap());
    assert!(
        matches!(net.raw(2).hibernate(), Ok(false)),
        "followers never initiate"
    );
    let _: Option<Error> = None;
}

#[test]
fn woken_follower_campaigns_if_leader_is_gone() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    assert!(net.raw(1).hibernate().unwrap());
    net.settle();
    net.crash(1);
    net.tick_all(50);
    assert!(
        net.leaders().is_empty(),
        "asleep: no election without a wake-up"
    );
    net.raw(2).wake();
    net.raw(3).wake();
    net.tick_all(50);
    assert_eq!(net.leaders().len(), 1);
}

#[test]
fn idle_group_state_is_small() {
    // One node hosts thousands of groups: the per-group state must stay small.
    let inline = std::mem::size_of::<phoenix_raft::RawNode<phoenix_raft::MemStorage>>();
    println!("RawNode<MemStorage> inline size: {inline} bytes");
    assert!(inline <= 1024, "RawNode grew to {inline} bytes");
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    for k in 0..2000 {
        net.raw(1).propose(format!("burst-{k}")).unwrap();
        if k % 64 == 0 {
            net.settle();
        }
    }
    net.settle();
    // After the burst, the in-flight windows gave their buffers back.
    let r = net.node(1).raw.raft();
    for id in [2, 3] {
        assert_eq!(r.progress(id).unwrap().inflights.count(), 0);
    }
}

/// A leader whose replica stops (its host failed a step of the group's work) sends
/// nothing more: asleep, its followers would never notice. `abdicate` names the most
/// caught-up follower, which campaigns at once and wakes the other with its vote
/// request — no tick needed.
#[test]
fn an_abdicating_leader_hands_off_to_its_sleeping_followers() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    assert!(net.raw(1).hibernate().unwrap());
    net.settle();
    assert!(net.node(2).raw.raft().is_hibernating());
    let m = net
        .raw(1)
        .abdicate()
        .expect("a leader with voters abdicates");
    assert_eq!(m.kind, phoenix_raft::MessageType::TimeoutNow);
    assert_ne!(m.to, 1);
    // The hand-off reaches its target; nothing else leaves node 1 from now on.
    let target = m.to;
    net.raw(target).step(m.clone()).unwrap();
    net.crash(1);
    net.settle();
    assert_eq!(net.leaders(), vec![target], "the named follower leads");
    assert_eq!(net.term(m.to), 2);
    let other = if m.to == 2 { 3 } else { 2 };
    assert!(
        !net.node(other).raw.raft().is_hibernating(),
        "woken by the vote"
    );
    net.propose(m.to, "b").unwrap();
    net.settle();
    assert_eq!(net.applied_data(other), vec!["a", "b"]);
    assert!(
        net.raw(other).abdicate().is_none(),
        "a follower has nothing to hand off"
    );
}

#[test]
fn abdicate_names_the_follower_with_the_longest_log() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(2);
    net.propose(1, "a").unwrap();
    net.settle();
    let m = net.raw(1).abdicate().unwrap();
    assert_eq!(m.to, 3, "node 2 missed the last entry");
}

/// A follower of a sleeping group that wakes without a reason to doubt the leader (its
/// node restarted, or a client asked it) pre-votes; the leader and the other follower,
/// within their lease, ignore it. The woken leader must still tell it who leads before
/// the group sleeps again — a pre-candidate left out would pre-vote every election
/// timeout, waking the group each time.
#[test]
fn a_woken_pre_candidate_is_told_the_leader_before_the_group_sleeps_again() {
    // The server's timing: a heartbeat every 5 ticks, an election after 50.
    let cfg = |id| {
        let mut c = cfg_default(id);
        c.heartbeat_tick = 5;
        c.election_tick = 50;
        c
    };
    let mut net = Network::new(&[1, 2, 3], cfg);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    assert!(net.raw(1).hibernate().unwrap());
    net.settle();
    net.raw(3).wake();
    let election = cfg(3).election_tick;
    for _ in 0..2 * election {
        net.tick(3);
        net.settle();
        if net.role(3) == StateRole::PreCandidate {
            break;
        }
    }
    assert_eq!(net.role(3), StateRole::PreCandidate, "node 3 pre-votes");
    assert_eq!(net.leaders(), vec![1], "the lease holds: no election");
    // The leader, woken by the pre-vote, ticks; the node calls `hibernate` each tick
    // once the group is idle (as the server does).
    for _ in 0..10 {
        net.tick(1);
        let _ = net.raw(1).hibernate().unwrap();
        net.settle();
    }
    assert_eq!(net.role(3), StateRole::Follower);
    assert_eq!(net.node(3).raw.raft().leader(), 1);
    for id in 1..=3 {
        assert!(net.node(id).raw.raft().is_hibernating(), "node {id} asleep");
    }
    net.delivered.clear();
    net.tick_all(4 * election as usize);
    assert!(
        net.delivered.is_empty(),
        "asleep for good: {:?}",
        net.delivered
    );
}
