//! Raft paper, figure 8: an entry of an earlier term stored on a majority may still be
//! overwritten, so a leader must not count replicas of it to commit it.
//!
//! State (c) of the figure: S1 (leader of term 4) has replicated index 2 of term 2 to
//! S2 and S3; S5 holds index 2 of term 3. If S1 counted that majority, and S5 then won
//! term 5 (votes of S2, S3, S4 — its last term 3 beats their 2), S5 would overwrite a
//! "committed" entry. The test plays exactly that and checks nothing of term 2 at
//! index 2 was ever committed or applied.

use crate::harness::*;
use phoenix_raft::MessageType;

fn figure8c() -> Network {
    let ids = [1, 2, 3, 4, 5];
    let logs: [&[u64]; 5] = [&[1, 2], &[1, 2], &[1], &[1], &[1, 3]];
    let stores = ids
        .iter()
        .zip(logs)
        .map(|(&id, t)| (id, Network::preset_store(&ids, t, 3)))
        .collect();
    Network::with_stores(stores, cfg_plain)
}

#[test]
fn majority_of_old_term_entry_is_not_committed_and_may_be_overwritten() {
    let mut net = figure8c();
    net.isolate(5);
    // The leader's appends carry index 2 (term 2) and its term-4 no-op at 3. Deliver
    // only index 2 to S2/S3 and nothing to S4: S1, S2, S3 then hold index 2 of term 2
    // — a majority of an old-term entry.
    net.hook = Some(Box::new(|m| {
        if m.kind == MessageType::Append && m.from == 1 {
            if m.to == 4 {
                return false;
            }
            m.entries.retain(|e| e.index <= 2);
        }
        true
    }));
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1]);
    assert_eq!(net.term(1), 4);
    net.tick_all(3);
    net.settle();
    assert_eq!(net.log_terms(3), vec![(1, 1), (2, 2)]);
    assert!(
        net.committed(1) < 2,
        "old-term entry counted for commit: commit {}",
        net.committed(1)
    );
    // Figure 8(d): S1 crashes; S5 wins term 5 and overwrites index 2 everywhere.
    net.crash(1);
    net.hook = None;
    net.heal();
    // Its first try in term 4 fails (everyone voted in 4 already); term 5 wins.
    net.campaign(5);
    if net.leaders().is_empty() {
        net.campaign(5);
    }
    assert_eq!(net.leaders(), vec![5]);
    assert_eq!(net.term(5), 5);
    net.settle();
    for id in [2, 3, 4, 5] {
        let log = net.log_terms(id);
        assert_eq!(
            log[1],
            (2, 3),
            "index 2 now holds S5's term-3 entry on node {id}"
        );
    }
    for id in [2, 3, 4, 5] {
        assert!(net
            .node(id)
            .applied
            .iter()
            .all(|(i, t, _)| !(*i == 2 && *t == 2)));
    }
}
