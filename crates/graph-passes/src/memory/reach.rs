//! The kernel DAG (fused groups and their data edges, looking through views) and "is `a` ordered before `b`"
//! queries on it, for the concurrency-aware choices of the memory pass.
//!
//! Groups are numbered in a topological order (the fusion plan's), so every ancestor of `b` on a path from `a`
//! has an index between the two, and its longest-path depth lies strictly between theirs. A query is a backward
//! search from `b` that never leaves that window, bounded by a visit budget: when the budget runs out the answer
//! is "not known to be ordered" (`false`), which only ever costs a missed preference or counts an edge as new,
//! never safety. Queries cost O(visits); building the DAG is O(N + E).

use graph_ir::ComputeGraph;

use crate::fusion::FusionPlan;
use crate::memory::writer_group;

/// Data edges between fused groups, by group index.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupDag {
    /// Predecessors of each group (deduplicated, ascending).
    pub preds: Vec<Vec<u32>>,
    /// Longest path (in edges) from any source group.
    pub depth: Vec<u32>,
}

impl GroupDag {
    /// The DAG of `fusion`'s groups: `p -> g` when `g` reads a tensor whose bytes `p` writes.
    pub fn new(graph: &ComputeGraph, fusion: &FusionPlan) -> GroupDag {
        let n = fusion.groups.len();
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (gi, g) in fusion.groups.iter().enumerate() {
            for &t in &g.inputs {
                if let Some(p) = writer_group(graph, fusion, t) {
                    if p.index() != gi {
                        preds[gi].push(p.0);
                    }
                }
            }
            preds[gi].sort_unstable();
            preds[gi].dedup();
        }
        GroupDag::from_preds(preds)
    }

    /// The DAG with these predecessor lists (each predecessor index below its successor's).
    pub fn from_preds(preds: Vec<Vec<u32>>) -> GroupDag {
        let n = preds.len();
        let mut depth = vec![0u32; n];
        for (g, ps) in preds.iter().enumerate() {
            for &p in ps {
                // Predecessors come first in the numbering, so their depth is final.
                depth[g] = depth[g].max(depth.get(p as usize).copied().unwrap_or(0) + 1);
            }
        }
        GroupDag { preds, depth }
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.preds.len()
    }
}

/// Bounded ancestor queries over a [`GroupDag`].
pub(crate) struct Reach<'a> {
    dag: &'a GroupDag,
    mark: Vec<u32>,
    stamp: u32,
    stack: Vec<u32>,
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
    pub fn new(dag: &'a GroupDag, limit: usize) -> Reach<'a> {
        let total_left = VISITS_BASE.saturating_add(VISITS_PER_GROUP.saturating_mul(dag.len() as u64));
        Reach { dag, mark: vec![0; dag.len()], stamp: 0, stack: Vec::new(), limit, exhausted: 0, total_left }
    }

    /// True when `a == b` or a path of data edges leads from `a` to `b`; `false` when there is none or the
    /// search ran out of budget.
    pub fn ordered(&mut self, a: u32, b: u32) -> bool {
        if a == b {
            return true;
        }
        let (ai, bi) = (a as usize, b as usize);
        if a > b || ai >= self.dag.len() || bi >= self.dag.len() || self.dag.depth[ai] >= self.dag.depth[bi] {
            return false;
        }
        if self.dag.preds[bi].binary_search(&a).is_ok() {
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
        let da = self.dag.depth[ai];
        self.stack.clear();
        self.stack.push(b);
        let mut visits = 0usize;
        while let Some(x) = self.stack.pop() {
            for &p in &self.dag.preds[x as usize] {
                if p == a {
                    return true;
                }
                let pi = p as usize;
                if p < a || self.dag.depth[pi] <= da || self.mark[pi] == self.stamp {
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
        let dag = GroupDag::from_preds(vec![vec![], vec![0], vec![0], vec![1, 2], vec![]]);
        assert_eq!(dag.depth, vec![0, 1, 1, 2, 0]);
        let mut r = Reach::new(&dag, 100);
        assert!(r.ordered(0, 3));
        assert!(r.ordered(1, 3));
        assert!(r.ordered(2, 2));
        assert!(!r.ordered(1, 2));
        assert!(!r.ordered(2, 1));
        assert!(!r.ordered(3, 0));
        assert!(!r.ordered(4, 3));
        assert!(!r.ordered(0, 4));
        assert_eq!(r.exhausted, 0);
    }

    #[test]
    fn budget_exhaustion_answers_false() {
        // A chain 0 -> 1 -> ... -> 9: from 0 to 9 needs 8 intermediate visits.
        let preds: Vec<Vec<u32>> = (0..10u32).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let dag = GroupDag::from_preds(preds);
        let mut r = Reach::new(&dag, 3);
        assert!(!r.ordered(0, 9));
        assert_eq!(r.exhausted, 1);
        let mut r = Reach::new(&dag, 8);
        assert!(r.ordered(0, 9));
    }
}
