//! Hibernation: an idle, caught-up group stops heartbeats and election timers; any
//! proposal or message wakes it, and nobody campaigns while it sleeps.

use crate::harness::*;
use phoenix_raft::Error;

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
