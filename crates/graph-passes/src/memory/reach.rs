//! "Is group `a` ordered before group `b`?" queries over the group graph's data edges, for the
//! concurrency-aware choices of the memory pass.
//!
//! Groups are numbered in a topological order (the fusion plan's), so every ancestor of `b` on a path from `a`
//! has an index between the two, and its longest-path depth lies strictly between theirs. A query is a backward
//! search from `b` that never leaves that window, bounded by a visit budget: when the budget runs out the answer
//! is "not known to be ordered" (`false`), which only ever costs a missed preference or counts an edge as new,
//! never safety. Queries cost O(visits).

use crate::group_graph::GroupGraph;
use crate::ids::GroupId;

/// Bounded ancestor queries over a [`GroupGraph`].
pub(crate) struct Reach<'a> {
    dag: &'a GroupGraph,
    mark: Vec<u32>,
    stamp: u32,
    stack: Vec<GroupId>,
    /// Most groups one query may visit.
    pub limit: usize,
    /// Queries that ran out of budget (answered `false`).
    pub exhausted: usize,
    /// Visits left to all queries together: linear in the DAG's size, so that a graph with millions of
    /// candidate checks stays near-linear (later queries then see only direct edges).
    total_left: u64,
}

/// Visits per group that all queries together may spend, beyond a fixed allowance.
const VISITS_PER_GROUP: u64 = 256;
/// The fixed allowance of visits, for small graphs.
const VISITS_BASE: u64 = 1 << 20;

impl<'a> Reach<'a> {
    /// Queries over `dag`, each visiting at most `limit` groups.
    pub fn new(dag: &'a GroupGraph, limit: usize) -> Reach<'a> {
        let total_left = VISITS_BASE.saturating_add(VISITS_PER_GROUP.saturating_mul(dag.len() as u64));
        Reach { dag, mark: vec![0; dag.len()], stamp: 0, stack: Vec::new(), limit, exhausted: 0, total_left }
    }

    /// True when `a == b` or a path of data edges leads from `a` to `b`; `false` when there is none or the
    /// search ran out of budget.
    pub fn ordered(&mut self, a: GroupId, b: GroupId) -> bool {
        if a == b {
            return true;
        }
        let (ai, bi) = (a.index(), b.index());
        if a > b || ai >= self.dag.len() || bi >= self.dag.len() || self.dag.depth(a) >= self.dag.depth(b) {
            return false;
        }
        if self.dag.preds(b).binary_search(&a).is_ok() {
            return true;
        }
        if self.total_left == 0 {
            self.exhausted += 1;
            return false;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.mark.iter_mut().for_each(|m| *m = 0);
            self.stamp = 1;
        }
        let da = self.dag.depth(a);
        self.stack.clear();
        self.stack.push(b);
        let mut visits = 0usize;
        while let Some(x) = self.stack.pop() {
            for &p in self.dag.preds(x) {
                if p == a {
                    return true;
                }
                let pi = p.index();
                if p < a || self.dag.depth(p) <= da || self.mark[pi] == self.stamp {
                    continue;
                }
                self.mark[pi] = self.stamp;
                visits += 1;
                self.total_left = self.total_left.saturating_sub(1);
                if visits > self.limit || self.total_left == 0 {
                    self.exhausted += 1;
                    return false;
                }
                self.stack.push(p);
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diamond_and_window() {
        // 0 -> 1 -> 3, 0 -> 2 -> 3, 4 alone.
        let g = GroupId;
        let dag = GroupGraph::from_preds(vec![vec![], vec![g(0)], vec![g(0)], vec![g(1), g(2)], vec![]]);
        assert_eq!((0..5).map(|i| dag.depth(g(i))).collect::<Vec<_>>(), vec![0, 1, 1, 2, 0]);
        let mut r = Reach::new(&dag, 100);
        assert!(r.ordered(g(0), g(3)));
        assert!(r.ordered(g(1), g(3)));
        assert!(r.ordered(g(2), g(2)));
        assert!(!r.ordered(g(1), g(2)));
        assert!(!r.ordered(g(2), g(1)));
        assert!(!r.ordered(g(3), g(0)));
        assert!(!r.ordered(g(4), g(3)));
        assert!(!r.ordered(g(0), g(4)));
        assert_eq!(r.exhausted, 0);
    }

    #[test]
    fn budget_exhaustion_answers_false() {
        // A chain 0 -> 1 -> ... -> 9: from 0 to 9 needs 8 intermediate visits.
        let preds: Vec<Vec<GroupId>> = (0..10u32).map(|i| if i == 0 { vec![] } else { vec![GroupId(i - 1)] }).collect();
        let dag = GroupGraph::from_preds(preds);
        let mut r = Reach::new(&dag, 3);
        assert!(!r.ordered(GroupId(0), GroupId(9)));
        assert_eq!(r.exhausted, 1);
        let mut r = Reach::new(&dag, 8);
        assert!(r.ordered(GroupId(0), GroupId(9)));
    }
}
