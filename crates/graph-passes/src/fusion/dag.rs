//! The group DAG of phases 2 and 3 with a dynamic topological order (Pearce and Kelly): the exact cycle check
//! of a merge, bounded to the groups ordered between the two, and the local reorder after it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::dense::{Dense, NONE};
use super::rules::Groups;

/// Why a contraction cannot proceed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// A path leaves the first group and reaches the second through other groups (names one group on it).
    Cycle(u32),
    /// The search exceeded its budget.
    Budget,
}

/// The groups a contraction reorders: those reachable from the first group and those reaching the second,
/// strictly between them in the order.
pub(super) struct Plan {
    forward: Vec<u32>,
    backward: Vec<u32>,
}

pub(super) struct Dag {
    succ: Vec<Vec<u32>>,
    pred: Vec<Vec<u32>>,
    /// Position of each live group in the topological order (distinct, not dense).
    pub slot: Vec<u32>,
    fmark: Vec<u32>,
    bmark: Vec<u32>,
    stamp: u32,
    budget: u64,
    pub visits: u64,
    pub max_visits: u64,
}

impl Dag {
    /// The DAG of the current groups, ordered by Kahn's algorithm with the lowest member position first.
    pub fn new(d: &Dense<'_>, groups: &Groups, budget: u64) -> Dag {
        let n = groups.g.len();
        let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut pred: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (gi, g) in groups.g.iter().enumerate() {
            if !g.alive {
                continue;
            }
            for &m in &g.members {
                for &c in &d.succ[m as usize] {
                    let h = groups.owner[c as usize];
                    if h != gi as u32 {
                        succ[gi].push(h);
                    }
                }
            }
            succ[gi].sort_unstable();
            succ[gi].dedup();
            for &h in &succ[gi] {
                pred[h as usize].push(gi as u32);
            }
        }
        let mut indeg: Vec<u32> = pred.iter().map(|p| p.len() as u32).collect();
        let mut ready: BinaryHeap<Reverse<(u32, u32)>> = groups
            .g
            .iter()
            .enumerate()
            .filter(|(i, g)| g.alive && indeg[*i] == 0)
            .map(|(i, g)| Reverse((g.lo, i as u32)))
            .collect();
        let mut slot = vec![NONE; n];
        let mut next = 0u32;
        while let Some(Reverse((_, g))) = ready.pop() {
            slot[g as usize] = next;
            next += 1;
            for &h in &succ[g as usize] {
                indeg[h as usize] -= 1;
                if indeg[h as usize] == 0 {
                    ready.push(Reverse((groups.g[h as usize].lo, h)));
                }
            }
        }
        Dag { succ, pred, slot, fmark: vec![0; n], bmark: vec![0; n], stamp: 0, budget, visits: 0, max_visits: 0 }
    }

    /// True when `y` is a direct successor of `x`.
    pub fn has_edge(&self, groups: &Groups, x: u32, y: u32) -> bool {
        self.succ[x as usize].iter().any(|&s| groups.resolve(s) == y)
    }

    /// Groups `x` and `y` in order (`x` first).
    pub fn ordered(&self, x: u32, y: u32) -> (u32, u32) {
        if self.slot[x as usize] <= self.slot[y as usize] {
            (x, y)
        } else {
            (y, x)
        }
    }

    /// Check that contracting `x` and `y` (`x` ordered first) creates no cycle: no path from `x` to `y` through
    /// another group. A direct edge is allowed. Exact; bounded to groups ordered strictly between them.
    pub fn check(&mut self, groups: &Groups, x: u32, y: u32) -> Result<Plan, Stop> {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.fmark.iter_mut().for_each(|m| *m = 0);
            self.bmark.iter_mut().for_each(|m| *m = 0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        let (lo, hi) = (self.slot[x as usize], self.slot[y as usize]);
        let mut work = 0u64;
        // Forward from x: groups before y reachable from x. Reaching y from one of them is a cycle.
        let mut forward = Vec::new();
        let mut stack: Vec<u32> = Vec::new();
        for &s in &self.succ[x as usize] {
            let s = groups.resolve(s);
            if s != y && s != x && self.slot[s as usize] < hi && self.fmark[s as usize] != stamp {
                self.fmark[s as usize] = stamp;
                stack.push(s);
            }
        }
        while let Some(z) = stack.pop() {
            forward.push(z);
            work += 1 + self.succ[z as usize].len() as u64;
            if work > self.budget {
                self.account(work);
                return Err(Stop::Budget);
            }
            for &s in &self.succ[z as usize] {
                let s = groups.resolve(s);
                if s == y {
                    self.account(work);
                    return Err(Stop::Cycle(z));
                }
                if s != x && self.slot[s as usize] < hi && self.fmark[s as usize] != stamp {
                    self.fmark[s as usize] = stamp;
                    stack.push(s);
                }
            }
        }
        // Backward from y: groups after x that reach y (disjoint from `forward`, or there would be a cycle).
        let mut backward = Vec::new();
        for &p in &self.pred[y as usize] {
            let p = groups.resolve(p);
            if p != x && p != y && self.slot[p as usize] > lo && self.bmark[p as usize] != stamp {
                self.bmark[p as usize] = stamp;
                stack.push(p);
            }
        }
        while let Some(z) = stack.pop() {
            backward.push(z);
            work += 1 + self.pred[z as usize].len() as u64;
            if work > self.budget {
                self.account(work);
                return Err(Stop::Budget);
            }
            for &p in &self.pred[z as usize] {
                let p = groups.resolve(p);
                if p != x && p != y && self.slot[p as usize] > lo && self.bmark[p as usize] != stamp {
                    self.bmark[p as usize] = stamp;
                    stack.push(p);
                }
            }
        }
        self.account(work);
        Ok(Plan { forward, backward })
    }

    fn account(&mut self, work: u64) {
        self.visits = self.visits.saturating_add(work);
        self.max_visits = self.max_visits.max(work);
    }

    /// After `groups.merge` kept `keep` and absorbed `gone` (the two groups of `plan`, `x` and `y`): merge the
    /// adjacency and reorder the affected groups as groups reaching `y`, the merged group, groups reachable
    /// from `x`.
    pub fn contract(&mut self, groups: &Groups, plan: Plan, x: u32, y: u32, keep: u32, gone: u32) {
        let Plan { mut forward, mut backward } = plan;
        let mut slots: Vec<u32> = forward.iter().chain(&backward).map(|&g| self.slot[g as usize]).collect();
        slots.push(self.slot[x as usize]);
        slots.push(self.slot[y as usize]);
        slots.sort_unstable();
        backward.sort_unstable_by_key(|&g| self.slot[g as usize]);
        forward.sort_unstable_by_key(|&g| self.slot[g as usize]);
        for (i, &g) in backward.iter().enumerate() {
            self.slot[g as usize] = slots[i];
        }
        self.slot[keep as usize] = slots[backward.len()];
        let top = slots.len() - forward.len();
        for (i, &g) in forward.iter().enumerate() {
            self.slot[g as usize] = slots[top + i];
        }
        self.slot[gone as usize] = NONE;
        // Adjacency of the merged group; neighbours keep stale ids, resolved on read.
        let mut s = std::mem::take(&mut self.succ[gone as usize]);
        s.append(&mut self.succ[keep as usize]);
        self.succ[keep as usize] = Self::clean(groups, s, keep);
        let mut p = std::mem::take(&mut self.pred[gone as usize]);
        p.append(&mut self.pred[keep as usize]);
        self.pred[keep as usize] = Self::clean(groups, p, keep);
    }

    fn clean(groups: &Groups, mut v: Vec<u32>, me: u32) -> Vec<u32> {
        for x in v.iter_mut() {
            *x = groups.resolve(*x);
        }
        v.retain(|&x| x != me);
        v.sort_unstable();
        v.dedup();
        v
    }
}
