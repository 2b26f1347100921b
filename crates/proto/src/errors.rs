//! Constructors and inspection of the typed [`Error`] carried in responses.

use crate::error::Kind;
use crate::{
    DeadlineExceeded, DiskFull, Error, GroupUnavailable, Internal, InvalidArgument, KeyNotInGroup,
    KeyTooLarge, NotLeader, OutcomeUnknown, Replica, RequestTooLarge, Route, ServerBusy,
    SessionExpired, StaleEpoch, Unsupported, ValueTooLarge,
};

impl Error {
    fn with(kind: Kind, message: String) -> Error {
        Error {
            message,
            kind: Some(kind),
        }
    }

    /// This replica is not the leader; `leader` is the hint if known.
    pub fn not_leader(group_id: u64, leader: Option<Replica>) -> Error {
        let msg = match &leader {
            Some(l) => format!(
                "group {group_id}: not leader; leader is node {} at {}",
                l.node_id, l.addr
            ),
            None => format!("group {group_id}: not leader; leader unknown"),
        };
        Error::with(Kind::NotLeader(NotLeader { group_id, leader }), msg)
    }

    /// The request's epoch is older than the group's current route.
    pub fn stale_epoch(group_id: u64, request_epoch: u64, current: Route) -> Error {
        let msg = format!(
            "group {group_id}: stale epoch {request_epoch}, current epoch {}",
            current.epoch
        );
        Error::with(
            Kind::StaleEpoch(StaleEpoch {
                group_id,
                request_epoch,
                current: Some(current),
                related: Vec::new(),
            }),
            msg,
        )
    }

    /// A key exceeds the key size limit.
    pub fn key_too_large(size: usize, limit: usize) -> Error {
        Error::with(
            Kind::KeyTooLarge(KeyTooLarge {
                size: size as u64,
                limit: limit as u64,
            }),
            format!("key of {size} bytes exceeds the limit of {limit} bytes"),
        )
    }

    /// A value exceeds the value size limit.
    pub fn value_too_large(size: usize, limit: usize) -> Error {
        Error::with(
            Kind::ValueTooLarge(ValueTooLarge {
                size: size as u64,
                limit: limit as u64,
            }),
            format!("value of {size} bytes exceeds the limit of {limit} bytes"),
        )
    }

    /// The request's deadline passed before it completed.
    pub fn deadline_exceeded(timeout_ms: u64) -> Error {
        Error::with(
            Kind::DeadlineExceeded(DeadlineExceeded { timeout_ms }),
            format!("deadline of {timeout_ms} ms exceeded"),
        )
    }

    /// The group is not hosted here or cannot serve right now.
    pub fn group_unavailable(group_id: u64, why: impl std::fmt::Display) -> Error {
        Error::with(
            Kind::GroupUnavailable(GroupUnavailable { group_id }),
            format!("group {group_id} unavailable: {why}"),
        )
    }

    /// A key lies outside the group's range.
    pub fn key_not_in_group(key: &[u8], group_id: u64, current: Option<Route>) -> Error {
        Error::with(
            Kind::KeyNotInGroup(KeyNotInGroup {
                key: key.to_vec().into(),
                group_id,
                current,
            }),
            format!(
                "key {:?} is not in group {group_id}",
                String::from_utf8_lossy(key)
            ),
        )
    }

    /// The request is malformed.
    pub fn invalid_argument(why: impl Into<String>) -> Error {
        Error::with(Kind::InvalidArgument(InvalidArgument {}), why.into())
    }

    /// The request (or a batch inside it) is too large.
    pub fn request_too_large(what: &str, size: usize, limit: usize) -> Error {
        Error::with(
            Kind::RequestTooLarge(RequestTooLarge {
                size: size as u64,
                limit: limit as u64,
            }),
            format!("{what}: {size} exceeds the limit of {limit}"),
        )
    }

    /// The node is overloaded; back off and retry.
    pub fn server_busy(why: impl Into<String>) -> Error {
        Error::with(Kind::ServerBusy(ServerBusy {}), why.into())
    }

    /// An internal failure (I/O error, corruption) on the server.
    pub fn internal(why: impl Into<String>) -> Error {
        Error::with(Kind::Internal(Internal {}), why.into())
    }

    /// A proposed request whose outcome is unknown (may or may not be applied).
    pub fn outcome_unknown(group_id: u64, why: impl std::fmt::Display) -> Error {
        Error::with(
            Kind::OutcomeUnknown(OutcomeUnknown { group_id }),
            format!("group {group_id}: outcome unknown: {why}"),
        )
    }

    /// A resent write whose first result is forgotten (see `SessionExpired`).
    pub fn session_expired(group_id: u64, client_id: u64, seq: u64) -> Error {
        Error::with(
            Kind::SessionExpired(SessionExpired {
                group_id,
                client_id,
                seq,
            }),
            format!(
                "group {group_id}: write {seq} of client {client_id:#x} was resent after its \
                 result was forgotten; it may or may not have been applied"
            ),
        )
    }

    /// A request for `feature` (brought by protocol level `needed`) not proposed while
    /// the lowest protocol level of the cluster's registered nodes is `cluster` (0: not
    /// known yet).
    pub fn unsupported(feature: &str, needed: u32, cluster: u32) -> Error {
        let known = if cluster == 0 {
            "the levels of the cluster's nodes are not known here yet".to_string()
        } else {
            format!("a registered node runs protocol level {cluster}")
        };
        Error::with(
            Kind::Unsupported(Unsupported {
                feature: feature.into(),
                needed,
                cluster,
            }),
            format!(
                "{feature} needs every node at protocol level {needed} or above, and {known}; \
                 nothing was proposed"
            ),
        )
    }

    /// A write not proposed for lack of disk space: on the refusing node `node_id`
    /// (`available` bytes free, under its `reserve`), or on `full_nodes` of the group's
    /// replicas, leaving no quorum with room.
    pub fn disk_full(
        group_id: u64,
        node_id: u64,
        available: u64,
        reserve: u64,
        full_nodes: Vec<u64>,
    ) -> Error {
        let why = if full_nodes.contains(&node_id) {
            format!(
                "node {node_id}'s disk is full ({available} bytes free, under its reserve of \
                 {reserve})"
            )
        } else {
            format!(
                "nodes {full_nodes:?} holding its replicas are short of disk space, leaving no \
                 quorum with room"
            )
        };
        Error::with(
            Kind::DiskFull(DiskFull {
                group_id,
                node_id,
                available,
                reserve,
                full_nodes,
            }),
            format!(
                "group {group_id}: write not proposed: {why}; reads are served, and writes \
                 are taken again once space is freed"
            ),
        )
    }

    /// Whether a client should refresh routes/leaders and retry (within its deadline).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            Some(
                Kind::NotLeader(_)
                    | Kind::StaleEpoch(_)
                    | Kind::GroupUnavailable(_)
                    | Kind::KeyNotInGroup(_)
                    | Kind::ServerBusy(_)
            )
        )
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_kinds() {
        assert!(Error::not_leader(1, None).is_retryable());
        assert!(Error::group_unavailable(1, "no leader").is_retryable());
        assert!(!Error::key_too_large(5000, 4096).is_retryable());
        assert!(!Error::deadline_exceeded(10).is_retryable());
        let e = Error::not_leader(
            3,
            Some(Replica {
                protocol: 0,
                node_id: 2,
                addr: "127.0.0.1:1".into(),
            }),
        );
        assert!(e.message.contains("node 2"), "{}", e.message);
    }
}
