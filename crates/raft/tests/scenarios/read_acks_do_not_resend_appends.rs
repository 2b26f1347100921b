//! A follower the leader is probing (it fell behind, or its stream broke) gets one append
//! at a time; the acknowledgements of read-index heartbeats must not release another
//! one each. With many reads in flight they did: every read's heartbeat answered by the
//! lagging follower sent it a fresh append of up to `max_size_per_msg` read from the log,
//! and on a node serving thousands of reads a second the leader did little else.

use std::cell::Cell;
use std::rc::Rc;

use phoenix_raft::MessageType;

use crate::harness::*;

#[test]
fn read_acks_from_a_probed_follower_send_no_appends() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.settle();
    // Appends to node 3 are lost from now on (it is slow, or they die in its stream).
    let appends_to_3 = Rc::new(Cell::new(0usize));
    let seen = Rc::clone(&appends_to_3);
    net.hook = Some(Box::new(move |m| {
        if m.kind == MessageType::Append && m.to == 3 {
            seen.set(seen.get() + 1);
            return false;
        }
        true
    }));
    for i in 0..5 {
        net.propose(1, &format!("b{i}")).unwrap();
    }
    net.settle();
    // The transport reports node 3 unreachable: the leader probes it from its match.
    net.raw(1).report_unreachable(3);
    appends_to_3.set(0);
    let reads = 50;
    for i in 0..reads {
        net.raw(1).read_index(format!("r{i}").into_bytes()).unwrap();
        net.settle();
    }
    assert_eq!(net.node(1).read_states.len(), reads, "every read answered");
    assert!(
        appends_to_3.get() <= 1,
        "{} appends went to the probed follower for {reads} reads",
        appends_to_3.get()
    );
    // A periodic heartbeat's answer still resumes the probe: node 3 catches up once its
    // appends get through again.
    net.hook = None;
    let hb = cfg_default(1).heartbeat_tick;
    for _ in 0..hb {
        net.tick(1);
    }
    net.settle();
    assert_eq!(net.node(3).applied.len(), net.node(1).applied.len());
}
