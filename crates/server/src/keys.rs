//! Key layout inside the shared engine (ARCHITECTURE.md, "Key layout"):
//!
//! ```text
//! engine_key   := group_id: u64 BE ‖ namespace: u8 ‖ rest
//! namespace    := 'd' (user data: rest = user key)
//!               | 'e' (key expiry: rest = user key → expire_at_ms: u64 BE, the leader's
//!                 clock at or after which the key is absent; only for keys that have one)
//!               | 's' (system keys of the group)
//! system keys  := "applied"  → applied_index: u64 BE ‖ applied_term: u64 BE
//!                 "conf"     → voters_count: u32 BE ‖ voter: u64 BE * ‖ learners_count: u32 BE ‖ learner: u64 BE *
//!                 "confidx"  → conf_version: u64 BE (index of the last membership change
//!                              applied, written with "conf"; absent: none yet)
//!                 "sess/" ‖ client_id: u64 BE → a client session (apply.rs, `Session`)
//!                 "sweep"    → log time of the last session expiry sweep (apply.rs)
//!                 "range"    → protobuf GroupRange: the range and range epoch the group
//!                              applied (absent: its route's, as created; written by
//!                              the first split)
//!                 "splitchild" → protobuf Route of the group the last split made
//! ```
//!
//! The "applied" sentinel is written in the same engine batch as the entries it
//! covers, so the engine's persisted tables always pair the group's data with the index
//! it reflects (seed 000).

use phoenix_raft::ConfState;

/// Namespace byte of user data.
pub const NS_DATA: u8 = b'd';
/// Namespace byte of key expiries (apply.rs): between data and system keys, so a
/// key range of user keys maps to one range of each.
pub const NS_EXPIRY: u8 = b'e';
/// Namespace byte of system keys.
pub const NS_SYS: u8 = b's';

/// Engine key of user key `key` in group `g`.
pub fn data_key(g: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&g.to_be_bytes());
    k.push(NS_DATA);
    k.extend_from_slice(key);
    k
}

/// The engine key just past every user key of group `g` (exclusive data bound).
pub fn data_end(g: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.extend_from_slice(&g.to_be_bytes());
    k.push(NS_DATA + 1);
    k
}

/// Engine key of the expiry of user key `key` in group `g`.
pub fn expiry_key(g: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&g.to_be_bytes());
    k.push(NS_EXPIRY);
    k.extend_from_slice(key);
    k
}

/// The engine key just past every expiry of group `g`.
pub fn expiry_end(g: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.extend_from_slice(&g.to_be_bytes());
    k.push(NS_EXPIRY + 1);
    k
}

/// The expiry keys of user keys `[start, end)` of group `g` (`end` empty: unbounded).
pub fn expiry_range(g: u64, start: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let e = if end.is_empty() {
        expiry_end(g)
    } else {
        expiry_key(g, end)
    };
    (expiry_key(g, start), e)
}

/// Decodes an expiry record (8 bytes; longer records are a later format, refused).
pub fn decode_expiry(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

/// Engine key of system key `name` of group `g`.
pub fn sys_key(g: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.extend_from_slice(&g.to_be_bytes());
    k.push(NS_SYS);
    k.extend_from_slice(name);
    k
}

/// The group's applied-index sentinel key.
pub fn applied_key(g: u64) -> Vec<u8> {
    sys_key(g, b"applied")
}

/// The group's membership key.
pub fn conf_key(g: u64) -> Vec<u8> {
    sys_key(g, b"conf")
}

/// The group's membership version key: the index of the last membership change applied.
pub fn conf_version_key(g: u64) -> Vec<u8> {
    sys_key(g, b"confidx")
}

/// Decodes a membership version; `None` if the value is not 8 bytes.
pub fn decode_conf_version(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

/// The group's applied range key (protobuf `GroupRange`).
pub fn range_key(g: u64) -> Vec<u8> {
    sys_key(g, b"range")
}

/// The route of the group the last split of `g` made (protobuf `Route`).
pub fn split_child_key(g: u64) -> Vec<u8> {
    sys_key(g, b"splitchild")
}

/// Format of the `GroupRange` record written.
pub const RANGE_FORMAT: u32 = 1;
/// Format of a `GroupRange` record that carries a merge's state (frozen, merged, or
/// having taken one in): a binary that predates merges refuses it rather than take a
/// frozen or merged group for a live one.
pub const RANGE_FORMAT_MERGE: u32 = 2;

/// The log index and term a group made by a split starts at: its state (the parent's
/// upper keys) stands for entries up to it, so its log begins after it and a new
/// replica of it always needs a snapshot — an empty replica of it cannot be mistaken
/// for one that applied its first entries (as a fresh replica of a group made at index
/// 0 could).
pub const SPLIT_INIT_INDEX: u64 = 5;
/// See [`SPLIT_INIT_INDEX`].
pub const SPLIT_INIT_TERM: u64 = 5;

/// System key prefix of the client sessions of group `g` (apply.rs).
pub fn sessions_prefix(g: u64) -> Vec<u8> {
    sys_key(g, b"sess/")
}

/// The record of client session `client_id` in group `g`.
pub fn session_key(g: u64, client_id: u64) -> Vec<u8> {
    let mut k = sessions_prefix(g);
    k.extend_from_slice(&client_id.to_be_bytes());
    k
}

/// The group's session sweep time (apply.rs): log time of the last expiry sweep.
pub fn session_sweep_key(g: u64) -> Vec<u8> {
    sys_key(g, b"sweep")
}

/// The client id of a session record key of group `g` (None: not one).
pub fn session_client(g: u64, key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(sessions_prefix(g).as_slice())?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

/// First engine key of group `g` (any namespace).
pub fn group_start(g: u64) -> Vec<u8> {
    g.to_be_bytes().to_vec()
}

/// Exclusive end of group `g`'s engine keys (`None` for the last possible group).
pub fn group_end(g: u64) -> Option<Vec<u8>> {
    g.checked_add(1).map(|n| n.to_be_bytes().to_vec())
}

/// Encodes (applied index, applied term).
pub fn encode_applied(index: u64, term: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&index.to_be_bytes());
    out[8..].copy_from_slice(&term.to_be_bytes());
    out
}

/// Decodes (applied index, applied term); `None` if the value is not 16 bytes.
pub fn decode_applied(v: &[u8]) -> Option<(u64, u64)> {
    let idx: [u8; 8] = v.get(..8)?.try_into().ok()?;
    let term: [u8; 8] = v.get(8..16)?.try_into().ok()?;
    (v.len() == 16).then(|| (u64::from_be_bytes(idx), u64::from_be_bytes(term)))
}

/// Encodes a membership.
pub fn encode_conf(c: &ConfState) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 8 * (c.voters.len() + c.learners.len()));
    for list in [&c.voters, &c.learners] {
        out.extend_from_slice(&(list.len() as u32).to_be_bytes());
        for id in list.iter() {
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    out
}

/// Decodes a membership; `None` if malformed.
pub fn decode_conf(mut v: &[u8]) -> Option<ConfState> {
    let mut lists = [Vec::new(), Vec::new()];
    for list in lists.iter_mut() {
        let n = u32::from_be_bytes(v.get(..4)?.try_into().ok()?) as usize;
        v = v.get(4..)?;
        if v.len() < n.checked_mul(8)? {
            return None;
        }
        for _ in 0..n {
            list.push(u64::from_be_bytes(v.get(..8)?.try_into().ok()?));
            v = v.get(8..)?;
        }
    }
    if !v.is_empty() {
        return None;
    }
    let [voters, learners] = lists;
    let c = ConfState { voters, learners };
    c.validate().ok()?;
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_orders_groups_and_namespaces() {
        assert!(data_key(1, b"zzz") < sys_key(2, b"applied"));
        assert!(data_key(2, b"") < data_end(2));
        assert!(data_key(2, &[0xff; 10]) < data_end(2));
        assert!(data_end(2) <= sys_key(2, b""));
        assert_eq!(data_end(2), expiry_key(2, b""));
        assert!(expiry_key(2, &[0xff; 10]) < expiry_end(2));
        assert!(expiry_end(2) <= sys_key(2, b""));
        assert_eq!(
            expiry_range(2, b"a", b""),
            (expiry_key(2, b"a"), expiry_end(2))
        );
        assert_eq!(decode_expiry(&7u64.to_be_bytes()), Some(7));
        assert_eq!(decode_expiry(&[0; 9]), None);
        assert!(sys_key(2, b"x") < group_end(2).unwrap());
        assert_eq!(decode_applied(&encode_applied(7, 3)), Some((7, 3)));
        assert_eq!(decode_applied(&[0; 15]), None);
        let c = ConfState::with_voters([1, 2, 3]);
        assert_eq!(decode_conf(&encode_conf(&c)), Some(c));
        assert_eq!(decode_conf(&[0, 0, 0, 1]), None);
    }
}
