//! Log divergence repair with fast back-off: a follower with a long conflicting tail of
//! one old term is repaired in a few round trips, not one per entry.

use crate::harness::*;
use phoenix_raft::MessageType;

#[test]
fn long_conflicting_tail_is_repaired_in_few_round_trips() {
    let ids = [1, 2, 3];
    let mut leader_log = vec![1u64; 5];
    leader_log.extend(std::iter::repeat_n(3, 50));
    let mut bad = vec![1u64; 5];
    bad.extend(std::iter::repeat_n(2, 200));
    let stores = vec![
        (1, Network::preset_store(&ids, &leader_log, 3)),
        (2, Network::preset_store(&ids, &leader_log, 3)),
        (3, Network::preset_store(&ids, &bad, 3)),
    ];
    let mut net = Network::with_stores(stores, cfg_plain);
    net.isolate(3);
    net.campaign(1);
    net.heal();
    net.tick_all(3);
    let mut expect: Vec<(u64, u64)> = leader_log
        .iter()
        .enumerate()
        .map(|(k, &t)| (k as u64 + 1, t))
        .collect();
    expect.push((56, 4));
    assert_eq!(net.log_terms(3), expect);
    let rejects = net.count_delivered(MessageType::AppendResponse, |m| m.from == 3 && m.reject);
    assert!(
        rejects <= 3,
        "fast back-off should need few rejections, got {rejects}"
    );
    assert_eq!(net.committed(3), 56);
}

#[test]
fn follower_missing_entries_catches_up() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.isolate(3);
    for k in 0..20 {
        net.propose(1, &format!("v{k}")).unwrap();
    }
    net.heal();
    net.tick_all(3);
    assert_eq!(net.applied_data(3), net.applied_data(1));
    assert_eq!(net.applied_data(3).len(), 20);
}
