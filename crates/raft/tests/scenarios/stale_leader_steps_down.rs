//! A leader of an old term steps down as soon as it sees a higher term, and its stale
//! messages are refused in a way that tells it so.

use crate::harness::*;
use phoenix_raft::{MessageType, StateRole};

#[test]
fn stale_leader_steps_down_on_higher_term_response() {
    let mut net = Network::new(&[1, 2, 3], cfg_plain);
    net.campaign(1);
    net.isolate(1);
    net.campaign(2);
    assert_eq!(net.term(2), 2);
    assert_eq!(
        net.role(1),
        StateRole::Leader,
        "1 has not heard of term 2 yet"
    );
    net.heal();
    // 1's heartbeat reaches 3, whose response carries term 2.
    net.tick_all(1);
    assert_eq!(net.role(1), StateRole::Follower);
    assert_eq!(net.term(1), 2);
    assert_eq!(net.leaders(), vec![2]);
}

#[test]
fn follower_answers_stale_append_with_its_term() {
    // Pre-vote on, check-quorum off: the isolated leader does not step down by itself.
    let mut net = Network::new(&[1, 2, 3], |id| {
        let mut c = cfg_default(id);
        c.check_quorum = false;
        c
    });
    net.campaign(1);
    net.isolate(1);
    net.tick_all(40);
    assert_eq!(net.role(1), StateRole::Leader);
    let new_leader = net
        .leaders()
        .into_iter()
        .find(|&l| l != 1)
        .expect("majority elects");
    net.heal();
    net.delivered.clear();
    net.tick(1);
    net.settle();
    // Followers answered the stale heartbeat with an AppendResponse of the new term.
    let answers = net.count_delivered(MessageType::AppendResponse, |m| m.to == 1 && m.term > 1);
    assert!(answers >= 1);
    assert_ne!(net.role(1), StateRole::Leader);
    assert_eq!(net.leaders(), vec![new_leader]);
}
