//! Majority arithmetic over a set of voters: the committed index and election results.
//! Kept apart so the commit rule has one home (the ParallelRaft mode will add its own
//! per-entry rule beside it).

use crate::types::NodeId;

/// Outcome of counting votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteResult {
    /// Not decided yet: more answers may still win or lose it.
    Pending,
    /// A majority refused.
    Lost,
    /// A majority granted.
    Won,
}

/// The highest index that a majority of `voters` has (per `matched`). An empty voter
/// set commits nothing (returns `u64::MAX` never: 0).
pub fn committed_index(voters: &[NodeId], matched: impl Fn(NodeId) -> u64) -> u64 {
    if voters.is_empty() {
        return 0;
    }
    // Small groups: a stack array avoids allocating on every commit check.
    let mut buf = [0u64; 7];
    let mut heap;
    let idx: &mut [u64] = if voters.len() <= buf.len() {
        let s = &mut buf[..voters.len()];
        for (slot, v) in s.iter_mut().zip(voters) {
            *slot = matched(*v);
        }
        s
    } else {
        heap = voters.iter().map(|v| matched(*v)).collect::<Vec<_>>();
        &mut heap
    };
    idx.sort_unstable_by(|a, b| b.cmp(a));
    // With n voters, a majority is n/2+1; the (n/2+1)-th largest is held by a majority.
    idx[voters.len() / 2]
}

/// Counts `votes` (None = no answer yet) of `voters`.
pub fn vote_result(voters: &[NodeId], vote: impl Fn(NodeId) -> Option<bool>) -> VoteResult {
    if voters.is_empty() {
        // An empty configuration wins trivially (like etcd); callers never campaign then.
        return VoteResult::Won;
    }
    let (mut yes, mut missing) = (0usize, 0usize);
    for v in voters {
        match vote(*v) {
            Some(true) => yes += 1,
            Some(false) => {}
            None => missing += 1,
        }
    }
    let q = voters.len() / 2 + 1;
    if yes >= q {
        VoteResult::Won
    } else if yes + missing >= q {
        VoteResult::Pending
    } else {
        VoteResult::Lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute_commit(matched: &[u64]) -> u64 {
        let n = matched.len();
        let mut best = 0;
        for &cand in matched {
            let holders = matched.iter().filter(|&&m| m >= cand).count();
            if holders > n / 2 {
                best = best.max(cand);
            }
        }
        best
    }

    /// Enumerates every way the missing answers could go.
    fn brute_vote(votes: &[Option<bool>]) -> VoteResult {
        let n = votes.len();
        let missing: Vec<usize> = (0..n).filter(|&i| votes[i].is_none()).collect();
        let (mut any_win, mut all_win) = (false, true);
        for mask in 0u32..(1 << missing.len()) {
            let mut full: Vec<bool> = votes.iter().map(|v| v.unwrap_or(false)).collect();
            for (bit, &i) in missing.iter().enumerate() {
                full[i] = mask & (1 << bit) != 0;
            }
            let win = full.iter().filter(|&&y| y).count() * 2 > n;
            any_win |= win;
            all_win &= win;
        }
        if all_win {
            VoteResult::Won
        } else if any_win {
            VoteResult::Pending
        } else {
            VoteResult::Lost
        }
    }

    proptest! {
        #[test]
        fn committed_index_matches_brute_force(matched in proptest::collection::vec(0u64..20, 1..12)) {
            let voters: Vec<NodeId> = (1..=matched.len() as u64).collect();
            let got = committed_index(&voters, |v| matched[(v - 1) as usize]);
            prop_assert_eq!(got, brute_commit(&matched));
        }

        #[test]
        fn vote_result_matches_brute_force(votes in proptest::collection::vec(proptest::option::of(any::<bool>()), 1..12)) {
            let voters: Vec<NodeId> = (1..=votes.len() as u64).collect();
            let got = vote_result(&voters, |v| votes[(v - 1) as usize]);
            let expect = brute_vote(&votes);
            prop_assert_eq!(got, expect);
        }
    }

    #[test]
    fn empty_voters_commit_nothing() {
        assert_eq!(committed_index(&[], |_| 5), 0);
    }
}
