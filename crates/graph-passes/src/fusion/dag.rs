//! The group DAG of phases 2 and 3 with a dynamic topological order (Pearce and Kelly): the exact cycle check
//! of a merge, bounded to the groups ordered between the two, and the local reorder after it.
//!
//! Contracting `x` (ordered first) and `y`: let `F` be the groups ordered strictly between them reachable from
//! `x`, and `B` those reaching `y`. A cycle exists exactly when some group of `F` has `y` as a successor
//! (equivalently, `F` and `B` meet). Without a cycle the new order is `B`, the merged group, `F`, on the slots
//! they held; when `B` is empty the merged group simply takes `x`'s slot, when `F` is empty `y`'s. The two
//! searches run alternately, so a merge with one side empty costs only the other side's first step.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::dense::{Dense, NONE};
use super::rules::Groups;

/// Why a contraction cannot proceed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// A path leaves the first group and reaches the second through other groups (names one group on it).
    Cycle(u32),
    /// The search exceeded its budget (the work done).
    Budget(u64),
}

/// How to reorder after a contraction.
pub(super) enum Plan {
    /// Nothing between reaches `y`: the merged group takes `x`'s slot.
    AtX,
    /// Nothing between is reachable from `x`: the merged group takes `y`'s slot.
    AtY,
    /// Pearce-Kelly: the groups of the check's backward search, the merged group, those of its forward search,
    /// on their slots (the two lists stay in the DAG's scratch until `contract`).
    Reorder,
}

pub(super) struct Dag {
    succ: Vec<Vec<u32>>,
    pred: Vec<Vec<u32>>,
    /// Position of each live group in the topological order (distinct, not dense).
    slot: Vec<u32>,
    fmark: Vec<u32>,
    bmark: Vec<u32>,
    stamp: u32,
    /// Scratch of `check` and `contract`, kept between merges (a merge is one check; most allocate nothing).
    fstack: Vec<u32>,
    bstack: Vec<u32>,
    forward: Vec<u32>,
    backward: Vec<u32>,
    slots: Vec<u32>,
    pub visits: u64,
    pub max_visits: u64,
}

impl Dag {
    /// The DAG of the current groups, ordered by Kahn's algorithm with the lowest member position first.
    pub fn new(d: &Dense<'_>, groups: &Groups) -> Dag {
        let n = groups.g.len();
        let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
        // Successor lists at their exact size (one allocation each, built in one scratch list), then the
        // predecessor lists sized by the in-degrees they imply.
        let mut s: Vec<u32> = Vec::new();
        let mut indeg = vec![0u32; n];
        for gi in 0..n as u32 {
            if !groups.g[gi as usize].alive {
                continue;
            }
            s.clear();
            for &m in groups.members(gi) {
                for &c in d.succ(m) {
                    let h = groups.owner[c as usize];
                    if h != gi {
                        s.push(h);
                    }
                }
            }
            s.sort_unstable();
            s.dedup();
            for &h in &s {
                indeg[h as usize] += 1;
            }
            succ[gi as usize] = s.as_slice().to_vec();
        }
        let mut pred: Vec<Vec<u32>> = indeg.iter().map(|&k| Vec::with_capacity(k as usize)).collect();
        for (gi, list) in succ.iter().enumerate() {
            for &h in list {
                pred[h as usize].push(gi as u32);
            }
        }
        let mut ready: BinaryHeap<Reverse<(u32, u32)>> = (0..n as u32)
            .filter(|&i| groups.g[i as usize].alive && indeg[i as usize] == 0)
            .map(|i| Reverse((groups.g[i as usize].lo, i)))
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
        Dag {
            succ,
            pred,
            slot,
            fmark: vec![0; n],
            bmark: vec![0; n],
            stamp: 0,
            fstack: Vec::new(),
            bstack: Vec::new(),
            forward: Vec::new(),
            backward: Vec::new(),
            slots: Vec::new(),
            visits: 0,
            max_visits: 0,
        }
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
    /// another group. A direct edge is allowed. Exact unless it stops at `budget` work.
    pub fn check(&mut self, groups: &Groups, x: u32, y: u32, budget: u64) -> Result<Plan, Stop> {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.fmark.iter_mut().for_each(|m| *m = 0);
            self.bmark.iter_mut().for_each(|m| *m = 0);
            self.stamp = 1;
        }
        let mut fstack = std::mem::take(&mut self.fstack);
        let mut bstack = std::mem::take(&mut self.bstack);
        let (mut forward, mut backward) = (std::mem::take(&mut self.forward), std::mem::take(&mut self.backward));
        fstack.clear();
        bstack.clear();
        forward.clear();
        backward.clear();
        let result = self.search(groups, x, y, budget, [&mut fstack, &mut bstack, &mut forward, &mut backward]);
        (self.fstack, self.bstack, self.forward, self.backward) = (fstack, bstack, forward, backward);
        result
    }

    /// The search of `check` on its scratch lists (`fstack`, `bstack`, `forward`, `backward`).
    fn search(
        &mut self,
        groups: &Groups,
        x: u32,
        y: u32,
        budget: u64,
        lists: [&mut Vec<u32>; 4],
    ) -> Result<Plan, Stop> {
        let [fstack, bstack, forward, backward] = lists;
        let stamp = self.stamp;
        let (lo, hi) = (self.slot[x as usize], self.slot[y as usize]);
        let mut work = 0u64;
        for &s in &self.succ[x as usize] {
            let s = groups.resolve(s);
            if s != y && s != x && self.slot[s as usize] < hi && self.fmark[s as usize] != stamp {
                self.fmark[s as usize] = stamp;
                fstack.push(s);
            }
        }
        work += self.succ[x as usize].len() as u64;
        if fstack.is_empty() {
            self.account(work);
            return Ok(Plan::AtY);
        }
        for &p in &self.pred[y as usize] {
            let p = groups.resolve(p);
            if p != x && p != y && self.slot[p as usize] > lo && self.bmark[p as usize] != stamp {
                if self.fmark[p as usize] == stamp {
                    self.account(work);
                    return Err(Stop::Cycle(p));
                }
                self.bmark[p as usize] = stamp;
                bstack.push(p);
            }
        }
        work += self.pred[y as usize].len() as u64;
        if bstack.is_empty() {
            self.account(work);
            return Ok(Plan::AtX);
        }
        let (mut fdone, mut bdone) = (false, false);
        while !(fdone && bdone) {
            if work > budget {
                self.account(work);
                return Err(Stop::Budget(work));
            }
            // Expand the side that has done less so far, until both are complete.
            let forward_turn = !fdone && (bdone || forward.len() <= backward.len());
            if forward_turn {
                let Some(z) = fstack.pop() else {
                    fdone = true;
                    continue;
                };
                forward.push(z);
                work += 1 + self.succ[z as usize].len() as u64;
                for &s in &self.succ[z as usize] {
                    let s = groups.resolve(s);
                    if s == y || self.bmark[s as usize] == stamp {
                        self.account(work);
                        return Err(Stop::Cycle(z));
                    }
                    if s != x && self.slot[s as usize] < hi && self.fmark[s as usize] != stamp {
                        self.fmark[s as usize] = stamp;
                        fstack.push(s);
                    }
                }
            } else {
                let Some(z) = bstack.pop() else {
                    bdone = true;
                    continue;
                };
                backward.push(z);
                work += 1 + self.pred[z as usize].len() as u64;
                for &p in &self.pred[z as usize] {
                    let p = groups.resolve(p);
                    if p == x || self.fmark[p as usize] == stamp {
                        self.account(work);
                        return Err(Stop::Cycle(z));
                    }
                    if p != y && self.slot[p as usize] > lo && self.bmark[p as usize] != stamp {
                        self.bmark[p as usize] = stamp;
                        bstack.push(p);
                    }
                }
            }
        }
        self.account(work);
        Ok(Plan::Reorder)
    }

    fn account(&mut self, work: u64) {
        self.visits = self.visits.saturating_add(work);
        self.max_visits = self.max_visits.max(work);
    }

    /// After `groups.merge` kept `keep` and absorbed `gone` (the groups `x` and `y` of `plan`): merge the
    /// adjacency and reorder.
    pub fn contract(&mut self, groups: &Groups, plan: Plan, x: u32, y: u32, keep: u32, gone: u32) {
        let (sx, sy) = (self.slot[x as usize], self.slot[y as usize]);
        match plan {
            Plan::AtX => self.slot[keep as usize] = sx,
            Plan::AtY => self.slot[keep as usize] = sy,
            Plan::Reorder => {
                let (mut forward, mut backward) =
                    (std::mem::take(&mut self.forward), std::mem::take(&mut self.backward));
                let mut slots = std::mem::take(&mut self.slots);
                slots.clear();
                slots.extend(forward.iter().chain(&backward).map(|&g| self.slot[g as usize]));
                slots.push(sx);
                slots.push(sy);
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
                (self.forward, self.backward, self.slots) = (forward, backward, slots);
            }
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
