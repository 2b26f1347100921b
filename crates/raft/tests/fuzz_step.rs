//! Property test: arbitrary messages stepped into a leader, a follower and a candidate
//! never panic; they are applied or refused with a typed error, and afterwards the node
//! still produces readies and passes its invariant checks unless it reported a broken
//! invariant itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use phoenix_raft::{
    ConfState, Config, Entry, EntryKind, Error, MemStorage, Message, MessageType, RawNode, Snapshot,
};
use proptest::prelude::*;

// Every kind of message.
const KINDS: [MessageType; 13] = MessageType::ALL;

fn num() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 0u64..8, 1 => Just(u64::MAX), 1 => Just(u64::MAX / 2), 1 => any::<u64>()]
}

fn message() -> impl Strategy<Value = Message> {
    (
        0usize..KINDS.len(),
        prop_oneof![4 => 2u64..4, 1 => 0u64..6],
        prop_oneof![4 => Just(1u64), 1 => 0u64..5],
        (num(), num(), num(), num(), num()),
        any::<bool>(),
        proptest::collection::vec((num(), num(), any::<bool>()), 0..4),
        proptest::option::of((num(), num(), proptest::collection::vec(0u64..5, 0..4))),
    )
        .prop_map(
            |(k, from, to, (term, log_term, index, commit, hint), reject, ents, snap)| {
                let mut m = Message::new(KINDS[k], from, to, term);
                m.log_term = log_term;
                m.index = index;
                m.commit = commit;
                m.reject_hint = hint;
                m.reject = reject;
                m.entries = ents
                    .into_iter()
                    .map(|(i, t, cc)| Entry {
                        index: i,
                        term: t,
                        kind: if cc {
                            EntryKind::ConfChange
                        } else {
                            EntryKind::Normal
                        },
                        data: Bytes::from_static(b"x"),
                        conflict_keys: None,
                    })
                    .collect();
                m.snapshot = snap.map(|(i, t, voters)| {
                    let mut s = Snapshot::default();
                    s.meta.index = i;
                    s.meta.term = t;
                    s.meta.conf.voters = voters;
                    Box::new(s)
                });
                m
            },
        )
}

fn drain(n: &mut RawNode<MemStorage>) {
    while n.has_ready() {
        let rd = n.ready().unwrap();
        if let Some(s) = rd.snapshot.clone() {
            n.store_mut().apply_snapshot(s).unwrap();
        }
        n.store_mut().append(&rd.entries).unwrap();
        if let Some(hs) = rd.hard_state {
            n.store_mut().set_hard_state(hs);
        }
        n.advance(rd).unwrap();
    }
}

fn node(role: u8) -> RawNode<MemStorage> {
    let mut s = MemStorage::new_with_conf(ConfState::with_voters([1, 2, 3]));
    let ents: Vec<Entry> = (1..=3)
        .map(|i| Entry {
            index: i,
            term: 1,
            data: Bytes::from_static(b"e"),
            ..Entry::default()
        })
        .collect();
    s.append(&ents).unwrap();
    s.set_hard_state(phoenix_raft::HardState {
        term: 1,
        vote: 0,
        commit: 2,
    });
    let mut c = Config::new(1);
    c.pre_vote = false;
    let mut n = RawNode::new(&c, s).unwrap();
    if role > 0 {
        n.campaign().unwrap();
        drain(&mut n);
        if role > 1 {
            for from in [2, 3] {
                let mut v = Message::new(MessageType::RequestVoteResponse, from, 1, 2);
                v.reject = false;
                n.step(v).unwrap();
            }
            drain(&mut n);
        }
    }
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_messages_never_panic(role in 0u8..3, msgs in proptest::collection::vec(message(), 1..6)) {
        let mut n = node(role);
        for m in msgs {
            let r = n.step(m);
            if std::env::var("PHOENIX_FUZZ_TRACE").is_ok() {
                eprintln!("{r:?}");
            }
            match r {
                Ok(()) => {}
                Err(Error::Invariant(_)) => return Ok(()),
                Err(Error::Storage(_)) => return Ok(()),
                Err(_) => {}
            }
            drain(&mut n);
            prop_assert!(n.check_invariants().is_ok(), "{:?}", n.check_invariants());
        }
    }
}
