//! Snapshots: when a follower needs entries the leader compacted away, the leader sends
//! its snapshot; the follower installs it, reports, and continues from there.

use crate::harness::*;
use bytes::Bytes;
use phoenix_raft::{MessageType, ProgressState, SnapshotStatus};

#[test]
fn lagging_follower_receives_and_installs_snapshot() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.crash(3);
    for k in 0..10 {
        net.propose(1, &format!("v{k}")).unwrap();
    }
    // The application snapshots at its applied index and compacts the log.
    let applied = net.node(1).raw.status().unwrap().applied;
    assert_eq!(applied, 11);
    let conf = net.node(1).conf.clone();
    net.raw(1)
        .store_mut()
        .compact_to_snapshot(applied, conf, Bytes::from_static(b"state@11"))
        .unwrap();
    net.restart(3);
    net.tick_all(3);
    assert!(net.count_delivered(MessageType::Snapshot, |m| m.to == 3) >= 1);
    let s3 = net.node(3).raw.store().snapshot_ref().clone();
    assert_eq!(s3.meta.index, 11);
    assert_eq!(&s3.data[..], b"state@11");
    assert_eq!(net.committed(3), 11);
    let pr = net.node(1).raw.raft().progress(3).unwrap().clone();
    assert_eq!(pr.matched, 11);
    assert_eq!(pr.state, ProgressState::Replicate);
    net.propose(1, "after").unwrap();
    assert_eq!(
        net.applied_data(3),
        vec!["after"],
        "entries after the snapshot are applied"
    );
    assert_eq!(net.committed(3), 12);
}

#[test]
fn lost_snapshot_is_retried_after_failure_report() {
    let mut net = Network::new(&[1, 2, 3], cfg_default);
    net.campaign(1);
    net.crash(3);
    for k in 0..5 {
        net.propose(1, &format!("v{k}")).unwrap();
    }
    let conf = net.node(1).conf.clone();
    net.raw(1)
        .store_mut()
        .compact_to_snapshot(6, conf, Bytes::new())
        .unwrap();
    net.restart(3);
    // The first snapshot is lost in transit.
    net.hook = Some(Box::new(|m| m.kind != MessageType::Snapshot));
    net.tick_all(3);
    assert_eq!(
        net.node(1).raw.raft().progress(3).unwrap().state,
        ProgressState::Snapshot
    );
    net.hook = None;
    net.raw(1).report_snapshot(3, SnapshotStatus::Failure);
    net.tick_all(3);
    assert_eq!(net.committed(3), 6);
    assert_eq!(
        net.node(1).raw.raft().progress(3).unwrap().state,
        ProgressState::Replicate
    );
}
