//! Concurrent lifetimes (`MemoryOptions::concurrent_lifetimes`): trade pool bytes for overlap. Each unit keeps
//! its bytes until the branches reading it have met — the nearest common post-dominator of its readers' first
//! merges in the group graph, or earlier a merge no data edge spans (a cut) — so no reuse edge chains branches
//! the stream pass could run side by side. Steps are group indices here (the memory pass plans for group
//! order). O(N + E) plus the intersections' walks up the post-dominator tree.

use crate::group_graph::GroupGraph;
use crate::ids::{BufferId, GroupId};
use crate::interval::Interval;

/// Immediate post-dominators with a virtual sink `n` after every group: `ipdom[g] > g`, and every path from `g`
/// to the end passes through `ipdom[g]` (reverse group order with the Cooper-Harvey-Kennedy intersection; group
/// index is a topological numbering). Also, per group, the first post-dominator (itself included) with several
/// predecessors (a merge of branches), and the first merge at or after it that no data edge spans; the sink
/// when none.
struct PostDominators {
    ipdom: Vec<GroupId>,
    merge: Vec<GroupId>,
    next_cut: Vec<GroupId>,
}

impl PostDominators {
    fn new(groups: &GroupGraph) -> PostDominators {
        let n = groups.len();
        let sink = GroupId::from_index(n);
        let mut ipdom = vec![sink; n];
        for g in (0..n).rev() {
            let mut it = groups.succs(GroupId::from_index(g)).iter().copied();
            let Some(first) = it.next() else { continue };
            ipdom[g] = it.fold(first, |x, s| intersect(&ipdom, x, s));
        }
        let preds = |g: usize| groups.preds(GroupId::from_index(g)).len();
        let mut merge = vec![sink; n];
        for g in (0..n).rev() {
            merge[g] = if preds(g) >= 2 {
                GroupId::from_index(g)
            } else {
                merge.get(ipdom[g].index()).copied().unwrap_or(sink)
            };
        }
        // A cut: a merge that no data edge spans (no edge u -> v with u < j < v).
        let mut next_cut = vec![sink; n];
        let mut reach = vec![0usize; n];
        let mut far = 0usize;
        for (j, r) in reach.iter_mut().enumerate() {
            *r = far;
            far = far.max(groups.succs(GroupId::from_index(j)).iter().map(|s| s.index()).max().unwrap_or(j));
        }
        let mut after = sink;
        for j in (0..n).rev() {
            if reach[j] <= j && preds(j) >= 2 {
                after = GroupId::from_index(j);
            }
            next_cut[j] = after;
        }
        PostDominators { ipdom, merge, next_cut }
    }
}

/// Nearest common post-dominator of `a` and `b` (either may be the virtual sink `ipdom.len()`).
fn intersect(ipdom: &[GroupId], mut a: GroupId, mut b: GroupId) -> GroupId {
    let sink = GroupId::from_index(ipdom.len());
    while a != b {
        if a < b {
            a = ipdom.get(a.index()).copied().unwrap_or(sink);
        } else {
            b = ipdom.get(b.index()).copied().unwrap_or(sink);
        }
    }
    a
}

/// Extend each unit's lifetime to where its last member's readers' branches have met. `froms[b]` lists the
/// groups that free buffer `b`'s bytes (its readers, or its writer when unread).
pub(crate) fn extend(groups: &GroupGraph, unit_live: &mut [Interval], last: &[BufferId], froms: &[&[GroupId]]) {
    let pd = PostDominators::new(groups);
    let sink = GroupId::from_index(pd.ipdom.len());
    for (lt, l) in unit_live.iter_mut().zip(last) {
        // Where the readers' branches have met (the writer's, for a buffer nobody reads).
        let met = froms[l.index()].iter().fold(None, |acc: Option<GroupId>, &g| {
            let d = pd.ipdom.get(g.index()).and_then(|p| pd.merge.get(p.index())).copied().unwrap_or(sink);
            Some(acc.map_or(d, |x| intersect(&pd.ipdom, x, d)))
        });
        let met = met.unwrap_or(sink);
        let cut = pd.next_cut.get(lt.end.saturating_sub(1) as usize).copied().unwrap_or(sink);
        lt.end = lt.end.max(met.min(cut).0.saturating_add(1));
    }
}
