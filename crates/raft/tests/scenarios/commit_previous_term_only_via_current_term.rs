//! Raft §5.4.2 / figure 8(e): entries of earlier terms become committed only when an
//! entry of the leader's own term is committed after them.

use crate::harness::*;
use phoenix_raft::MessageType;

#[test]
fn previous_term_entries_commit_with_the_no_op_of_the_new_term() {
    let ids = [1, 2, 3];
    let stores = vec![
        (1, Network::preset_store(&ids, &[1, 2, 2], 2)),
        (2, Network::preset_store(&ids, &[1, 2, 2], 2)),
        (3, Network::preset_store(&ids, &[1], 2)),
    ];
    let mut net = Network::with_stores(stores, cfg_plain);
    // Hold back everything but votes and appends without the no-op so the followers
    // get only term-2 entries.
    net.hook = Some(Box::new(|m| {
        if m.kind == MessageType::Append {
            m.entries.retain(|e| e.term != 3);
        }
        true
    }));
    net.campaign(1);
    assert_eq!(net.leaders(), vec![1]);
    assert_eq!(net.term(1), 3);
    net.tick_all(2);
    // Node 3 received the term-2 entries: indexes 2..3 are on all three nodes.
    assert_eq!(net.log_terms(3), vec![(1, 1), (2, 2), (3, 2)]);
    assert_eq!(net.committed(1), 0, "old-term replicas alone never commit");
    // Let the term-3 no-op through: it commits, and with it everything before it.
    net.hook = None;
    net.tick_all(2);
    for id in ids {
        assert_eq!(net.committed(id), 4, "node {id}");
        assert_eq!(net.applied_data(id), vec!["t1i1", "t2i2", "t2i3"]);
    }
}
