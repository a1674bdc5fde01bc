//! "Is group `a` ordered before group `b`?" queries over the group graph's data edges, for the
//! concurrency-aware choices of the memory pass.
//!
//! Groups are numbered in a topological order (the fusion plan's), so every ancestor of `b` on a path from `a`
//! has an index between the two, and its longest-path depth lies strictly between theirs. A query is a backward
//! search from `b` that never leaves that window, bounded by a visit budget: when the budget runs out the answer
//! is "not known to be ordered" (`false`), which only ever costs a missed preference or counts an edge as new,
//! never safety. Queries cost O(visits).
//!
//! On a DAG of at most [`CLOSURE_MAX_GROUPS`] groups, the first query that the direct checks do not settle
//! computes the transitive closure instead (a bit row of ancestors per group, O(E n / 64) words, at most 8 MiB),
//! and every query is then one bit test, exact and free of the budget: a random DAG's memory pass asks tens of
//! thousands of such queries, many of which the bounded search gave up on.
//!
//! On a larger DAG the first such query computes landmark labels instead ([`Labels`], O((N + E) * 128 / 64)
//! words): [`LANDMARKS`] groups spread over the group order, and for each group the landmarks it reaches and
//! those that reach it. They prove a path (`a` reaches a landmark that reaches `b`) and its absence (`b`
//! reaches a landmark `a` does not, or a landmark reaches `a` but not `b`), and the search that is left skips
//! every group the labels show `a` cannot reach (nor, then, any of that group's ancestors). Both only remove
//! visits from the search's sequence, so every query the plain search answers `true` within its budget is
//! still `true`, and queries it gave up on are now mostly decided exactly: at a million nodes, the memory
//! pass's queries were a tenth of the whole build, nearly all spent exhausting the budget.

use crate::group_graph::GroupGraph;
use crate::ids::GroupId;
use crate::landmarks::{Labels, LANDMARKS};

/// Bounded ancestor queries over a [`GroupGraph`].
pub(crate) struct Reach<'a> {
    dag: &'a GroupGraph,
    /// Everything but the DAG: what [`Reach::detach`] keeps.
    s: Detached,
}

/// A [`Reach`] without its DAG ([`Reach::detach`]): every answer and budget so far, kept as they are.
pub(crate) struct Detached {
    mark: Vec<u32>,
    stamp: u32,
    stack: Vec<GroupId>,
    /// Most groups one query may visit.
    limit: usize,
    /// Queries that ran out of budget (answered `false`).
    exhausted: usize,
    /// Visits left to all queries together: linear in the DAG's size, so that a graph with millions of
    /// candidate checks stays near-linear (later queries then see only direct edges).
    total_left: u64,
    /// The ancestors of each group as a bit row of `words` words (module docs), once computed.
    closure: Option<Vec<u64>>,
    words: usize,
    /// Whether queries may use the closure (small enough DAGs; off to test the bounded search).
    use_closure: bool,
    /// The landmark labels, once computed (DAGs too large for the closure).
    labels: Option<Labels>,
    /// Whether queries without the closure may use labels (off to test the plain bounded search).
    use_labels: bool,
}

/// Landmark labels of `dag` with `count` landmarks spread over the group order (a topological one).
fn labels(dag: &GroupGraph, count: usize) -> Labels {
    let order: Vec<u32> = (0..dag.len() as u32).collect();
    // Predecessors come first in group order; a malformed edge is ignored, as the search would.
    Labels::new(dag.len(), &order, count, |g| {
        dag.preds(GroupId::from_index(g as usize)).iter().map(|p| p.index() as u32).filter(move |&p| p < g)
    })
}

/// Most groups for which queries use the transitive closure (8 MiB of bits at this size).
pub(crate) const CLOSURE_MAX_GROUPS: usize = 8192;

/// Visits per group that all queries together may spend, beyond a fixed allowance.
const VISITS_PER_GROUP: u64 = 256;
/// The fixed allowance of visits, for small graphs.
const VISITS_BASE: u64 = 1 << 20;

impl<'a> Reach<'a> {
    /// Queries over `dag`, each visiting at most `limit` groups.
    pub fn new(dag: &'a GroupGraph, limit: usize) -> Reach<'a> {
        let total_left = VISITS_BASE.saturating_add(VISITS_PER_GROUP.saturating_mul(dag.len() as u64));
        let words = dag.len().div_ceil(64);
        Reach {
            dag,
            s: Detached {
                mark: vec![0; dag.len()],
                stamp: 0,
                stack: Vec::new(),
                limit,
                exhausted: 0,
                total_left,
                closure: None,
                words,
                use_closure: dag.len() <= CLOSURE_MAX_GROUPS,
                labels: None,
                use_labels: true,
            },
        }
    }

    /// The queries' state without the borrow of the DAG, to be resumed over the same DAG ([`Reach::attach`]):
    /// what the memory pass's front ([`super::Prepared`]) keeps between the caller's two uses of it.
    pub fn detach(self) -> Detached {
        self.s
    }

    /// Resume `state` over `dag`, which must be the DAG it was detached from (`None` when its size differs).
    pub fn attach(dag: &'a GroupGraph, state: Detached) -> Option<Reach<'a>> {
        (state.mark.len() == dag.len()).then_some(Reach { dag, s: state })
    }

    /// As [`Reach::new`], but always with the bounded search (no closure, no labels), for tests of the budget.
    #[cfg(test)]
    fn searching(dag: &'a GroupGraph, limit: usize) -> Reach<'a> {
        let mut r = Reach::new(dag, limit);
        (r.s.use_closure, r.s.use_labels) = (false, false);
        r
    }

    /// As [`Reach::new`] on a DAG too large for the closure, with `landmarks` landmarks, for tests.
    #[cfg(test)]
    fn labelled(dag: &'a GroupGraph, limit: usize, landmarks: usize) -> Reach<'a> {
        let mut r = Reach::new(dag, limit);
        (r.s.use_closure, r.s.labels) = (false, Some(labels(dag, landmarks)));
        r
    }

    /// The ancestor rows of every group, in group order (a group's ancestors come before it).
    fn build_closure(&self) -> Vec<u64> {
        let w = self.s.words;
        let mut rows = vec![0u64; self.dag.len() * w];
        for b in 0..self.dag.len() {
            let (done, rest) = rows.split_at_mut(b * w);
            let row = &mut rest[..w];
            for &p in self.dag.preds(GroupId::from_index(b)) {
                let pi = p.index();
                // Predecessors come first in group order; a malformed edge is ignored, as the search would.
                if pi >= b {
                    continue;
                }
                row[pi / 64] |= 1 << (pi % 64);
                for (x, &y) in row.iter_mut().zip(&done[pi * w..(pi + 1) * w]) {
                    *x |= y;
                }
            }
        }
        rows
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
        if self.s.closure.is_none() && self.s.use_closure {
            self.s.closure = Some(self.build_closure());
        }
        if let Some(rows) = &self.s.closure {
            return rows[bi * self.s.words + ai / 64] >> (ai % 64) & 1 == 1;
        }
        if self.s.labels.is_none() && self.s.use_labels {
            self.s.labels = Some(labels(self.dag, LANDMARKS));
        }
        if let Some(l) = &self.s.labels {
            if l.proves_path(ai, bi) {
                return true;
            }
            if l.proves_none(ai, bi) {
                return false;
            }
        }
        if self.s.total_left == 0 {
            self.s.exhausted += 1;
            return false;
        }
        self.s.stamp = self.s.stamp.wrapping_add(1);
        if self.s.stamp == 0 {
            self.s.mark.iter_mut().for_each(|m| *m = 0);
            self.s.stamp = 1;
        }
        let da = self.dag.depth(a);
        self.s.stack.clear();
        self.s.stack.push(b);
        let mut visits = 0usize;
        while let Some(x) = self.s.stack.pop() {
            for &p in self.dag.preds(x) {
                if p == a {
                    return true;
                }
                let pi = p.index();
                if p < a || self.dag.depth(p) <= da || self.s.mark[pi] == self.s.stamp {
                    continue;
                }
                if let Some(l) = &self.s.labels {
                    if l.proves_path(ai, pi) {
                        return true;
                    }
                    // `a` reaches neither `p` nor, then, any of its ancestors: no path through them.
                    if l.proves_none(ai, pi) {
                        continue;
                    }
                }
                self.s.mark[pi] = self.s.stamp;
                visits += 1;
                self.s.total_left = self.s.total_left.saturating_sub(1);
                if visits > self.s.limit || self.s.total_left == 0 {
                    self.s.exhausted += 1;
                    return false;
                }
                self.s.stack.push(p);
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
        assert_eq!(r.s.exhausted, 0);
    }

    #[test]
    fn budget_exhaustion_answers_false() {
        // A chain 0 -> 1 -> ... -> 9: from 0 to 9 needs 8 intermediate visits.
        let preds: Vec<Vec<GroupId>> = (0..10u32).map(|i| if i == 0 { vec![] } else { vec![GroupId(i - 1)] }).collect();
        let dag = GroupGraph::from_preds(preds);
        let mut r = Reach::searching(&dag, 3);
        assert!(!r.ordered(GroupId(0), GroupId(9)));
        assert_eq!(r.s.exhausted, 1);
        let mut r = Reach::searching(&dag, 8);
        assert!(r.ordered(GroupId(0), GroupId(9)));
        // The closure knows without a budget.
        let mut r = Reach::new(&dag, 3);
        assert!(r.ordered(GroupId(0), GroupId(9)));
        assert_eq!(r.s.exhausted, 0);
    }

    #[test]
    fn closure_answers_as_an_unbounded_search() {
        // Random DAGs (preds among earlier groups, up to 3 each, over 1-130 groups so rows span several words):
        // every pair answers the same through the closure and through a search with budget to spare.
        let mut rng = crate::test_rng::XorShift::new(0x1234_5678_9ABC_DEF1u64);
        for _ in 0..20 {
            let n = 1 + rng.below(130) as usize;
            let preds: Vec<Vec<GroupId>> =
                rng.earlier_preds(n, 4).into_iter().map(|p| p.into_iter().map(GroupId).collect()).collect();
            let dag = GroupGraph::from_preds(preds);
            let mut closure = Reach::new(&dag, 1);
            let mut search = Reach::searching(&dag, usize::MAX);
            for a in 0..n as u32 {
                for b in 0..n as u32 {
                    let (a, b) = (GroupId(a), GroupId(b));
                    assert_eq!(closure.ordered(a, b), search.ordered(a, b), "{a:?} -> {b:?} of {n}");
                }
            }
            assert_eq!(search.s.exhausted, 0);
        }
    }

    /// Random DAGs (preds among earlier groups, up to 4 each, some far back) over up to 400 groups, with few
    /// landmarks so that many queries reach the search: with budget to spare the labels answer every pair as the
    /// closure does; with a tight budget every `true` of the plain search is still `true`, a `true` is always a
    /// path, and a `false` is one unless the query gave up.
    #[test]
    fn labels_answer_as_the_closure_and_only_add_paths_under_a_budget() {
        let mut rng = crate::test_rng::XorShift::new(0x0DDB_A11C_0FFE_E123u64);
        let mut next = |m: u64| rng.below(m);
        for round in 0..16 {
            let n = 2 + next(400) as usize;
            let preds: Vec<Vec<GroupId>> = (0..n)
                .map(|i| {
                    let mut p: Vec<GroupId> = (0..next(5))
                        .filter(|_| i > 0)
                        .map(|_| {
                            let back = if next(4) == 0 { next(i as u64) } else { next(8.min(i as u64)) };
                            GroupId((i as u64 - 1 - back.min(i as u64 - 1)) as u32)
                        })
                        .collect();
                    p.sort_unstable();
                    p.dedup();
                    p
                })
                .collect();
            let dag = GroupGraph::from_preds(preds);
            let mut closure = Reach::new(&dag, 1);
            let landmarks = 1 + next(LANDMARKS as u64) as usize;
            let mut labelled = Reach::labelled(&dag, usize::MAX, landmarks);
            let limit = 1 + next(6) as usize;
            let mut tight = Reach::labelled(&dag, limit, landmarks);
            let mut plain = Reach::searching(&dag, limit);
            for a in 0..n as u32 {
                for b in 0..n as u32 {
                    let (a, b) = (GroupId(a), GroupId(b));
                    let exact = closure.ordered(a, b);
                    assert_eq!(labelled.ordered(a, b), exact, "round {round}: {a:?} -> {b:?} of {n}");
                    let gave_up = tight.s.exhausted;
                    let t = tight.ordered(a, b);
                    assert!(!t || exact, "round {round}: {a:?} -> {b:?} is no path");
                    assert!(t || !exact || tight.s.exhausted > gave_up, "round {round}: {a:?} -> {b:?} missed");
                    assert!(!plain.ordered(a, b) || t, "round {round}: {a:?} -> {b:?} lost a path");
                }
            }
            assert_eq!(labelled.s.exhausted, 0);
        }
    }
}
