//! Raft paper, figure 7: a leader of term 8 meets followers (a)–(f) with missing,
//! extra and conflicting entries; it brings every log to its own.

use crate::harness::*;

const LEADER: &[u64] = &[1, 1, 1, 4, 4, 5, 5, 6, 6, 6];

fn figure7() -> Network {
    let ids = [1, 2, 3, 4, 5, 6, 7];
    let logs: [&[u64]; 7] = [
        LEADER,
        &[1, 1, 1, 4, 4, 5, 5, 6, 6],          // (a) missing one
        &[1, 1, 1, 4],                         // (b) missing many
        &[1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],    // (c) one extra uncommitted
        &[1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7], // (d) extra entries of term 7
        &[1, 1, 1, 4, 4, 4, 4],                // (e) conflicting term-4 tail
        &[1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],    // (f) conflicting terms 2 and 3
    ];
    let stores = ids
        .iter()
        .zip(logs)
        .map(|(&id, terms)| (id, Network::preset_store(&ids, terms, 7)))
        .collect();
    Network::with_stores(stores, cfg_plain)
}

#[test]
fn leader_brings_all_follower_logs_into_agreement() {
    let mut net = figure7();
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1], "1 wins with votes of a, b, e, f");
    assert_eq!(net.term(1), 8);
    let mut expect: Vec<(u64, u64)> = LEADER
        .iter()
        .enumerate()
        .map(|(k, &t)| (k as u64 + 1, t))
        .collect();
    expect.push((11, 8)); // the leader's no-op
    for id in 1..=7 {
        assert_eq!(net.log_terms(id), expect, "log of node {id}");
        assert_eq!(net.committed(id), 11, "commit of node {id}");
    }
    // Everyone applied the same commands.
    let want = net.applied_data(1);
    assert_eq!(want.len(), 10);
    for id in 2..=7 {
        assert_eq!(net.applied_data(id), want);
    }
}

#[test]
fn followers_with_more_up_to_date_logs_refuse_their_vote() {
    let mut net = figure7();
    net.campaign(1);
    // (c) has a longer term-6 log and (d) a term-7 entry: both refused.
    let refused: Vec<u64> = net
        .delivered
        .iter()
        .filter(|m| m.kind == phoenix_raft::MessageType::RequestVoteResponse && m.reject)
        .map(|m| m.from)
        .collect();
    assert_eq!(refused, vec![4, 5]);
}
