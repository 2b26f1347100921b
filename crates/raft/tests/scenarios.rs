//! Scenario tests of the consensus core. Each file under `tests/scenarios/` is one
//! classic case (Raft paper figures, etcd-raft scenarios), so the list of files is the
//! list of behaviours checked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "harness/mod.rs"]
mod harness;

#[path = "scenarios/async_persistence_ordering.rs"]
mod async_persistence_ordering;
#[path = "scenarios/check_quorum_leader_steps_down.rs"]
mod check_quorum_leader_steps_down;
#[path = "scenarios/coalesced_commit_and_heartbeats.rs"]
mod coalesced_commit_and_heartbeats;
#[path = "scenarios/commit_previous_term_only_via_current_term.rs"]
mod commit_previous_term_only_via_current_term;
#[path = "scenarios/election_basic.rs"]
mod election_basic;
#[path = "scenarios/election_split_votes.rs"]
mod election_split_votes;
#[path = "scenarios/figure7_new_leader_repairs_follower_logs.rs"]
mod figure7_new_leader_repairs_follower_logs;
#[path = "scenarios/figure8_previous_term_entry_not_committed.rs"]
mod figure8_previous_term_entry_not_committed;
#[path = "scenarios/hibernate_and_wake.rs"]
mod hibernate_and_wake;
#[path = "scenarios/leader_isolated_by_partition.rs"]
mod leader_isolated_by_partition;
#[path = "scenarios/leader_transfer.rs"]
mod leader_transfer;
#[path = "scenarios/learner_promotion.rs"]
mod learner_promotion;
#[path = "scenarios/log_divergence_fast_backoff.rs"]
mod log_divergence_fast_backoff;
#[path = "scenarios/malformed_input_rejected.rs"]
mod malformed_input_rejected;
#[path = "scenarios/membership_change_while_member_down.rs"]
mod membership_change_while_member_down;
#[path = "scenarios/pre_vote_prevents_term_inflation.rs"]
mod pre_vote_prevents_term_inflation;
#[path = "scenarios/read_acks_do_not_resend_appends.rs"]
mod read_acks_do_not_resend_appends;
#[path = "scenarios/read_index_under_partition.rs"]
mod read_index_under_partition;
#[path = "scenarios/snapshot_send_and_install.rs"]
mod snapshot_send_and_install;
#[path = "scenarios/stale_leader_steps_down.rs"]
mod stale_leader_steps_down;
