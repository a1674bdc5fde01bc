//! Exact branch-and-bound over canonical solutions, after MiniMalloc (Moffitt, ASPLOS 2023); ideas only.
//!
//! A solution is *canonical* when every buffer sits at offset 0 or directly on top of a time-overlapping buffer;
//! any packing can be pushed down into a canonical one no taller. Listing a canonical solution's buffers by
//! offset (ties by a preorder rank), each one's offset equals its *minimum offset* (the highest top among placed,
//! overlapping buffers) when its turn comes. The search builds solutions that way: it repeatedly places a buffer
//! whose minimum offset is at least the *floor* (the last placement's offset; at the floor, only later ranks).
//! Rules, each sound for the decision "height <= cap":
//! - *capacity*: a top may not exceed `cap`;
//! - *sections*: in a time section the unplaced buffers all overlap, so they stack above the lowest offset any
//!   of them can still take; that plus their total size must fit. A buffer below the floor (*pending*) can only
//!   end on top of an unplaced overlapping buffer, which raises its lowest offset (no such buffer: dead end);
//! - *dominance*: placing at `x` while another unplaced `k` has `minoff(k) + size(k) <= x` is never needed (`k`
//!   could drop below `x`, giving a solution with smaller offsets that the search reaches elsewhere);
//! - *hatless*: once a buffer nothing unplaced overlaps has failed, its later alternatives fail too;
//! - *symmetry*: identical buffers (same lifetime and size) are placed in index order;
//! - *decomposition*: when no unplaced buffer crosses a section boundary any more, the two sides are independent
//!   subproblems, solved one after the other (a failure of either fails the branch). A subproblem is fully
//!   described by its members and their minimum offsets, so proved failures and found layouts are memoised.
//!
//! Per node the work is O(m + S) for m buffers and S sections (section witnesses are re-validated in O(1) and
//! rescanned only when stale); an effort counter charges that work, so a budget in effort units stops at the
//! same node on every machine. Runs restart with several preorders and doubling limits.

use std::cmp::Reverse;
use std::time::Instant;

use super::instance::Instance;

/// Limits of one `improve` call.
pub(crate) struct Limits {
    /// Effort units available.
    pub effort: u64,
    /// Optional wall-clock deadline.
    pub deadline: Option<Instant>,
    /// Seed for randomised restarts.
    pub seed: u64,
}

/// What `improve` achieved on one component.
pub(crate) struct Outcome {
    /// A better layout (component member order) and its height, if one was found.
    pub improved: Option<(Vec<u64>, u64)>,
    /// A lower bound on the component's optimum proved by exhaustive search (0 if none).
    pub proved_lower_bound: u64,
    /// Search nodes visited.
    pub nodes: u64,
    /// Effort spent.
    pub effort: u64,
    /// Whether the deadline stopped the search.
    pub timed_out: bool,
}

/// The component as the search sees it: local indices, local sections, overlap lists.
pub(crate) struct Problem {
    /// Aligned sizes.
    size: Vec<u64>,
    /// Local first section.
    start: Vec<u32>,
    /// Local one-past-last section.
    end: Vec<u32>,
    /// Number of local sections.
    sections: usize,
    /// Time-overlapping buffers of each buffer.
    adj: Vec<Vec<u32>>,
    /// Buffers live in each section.
    section_members: Vec<Vec<u32>>,
    /// The previous buffer identical to this one (same sections and size), if any.
    twin: Vec<Option<u32>>,
    /// Raw lifetime length.
    length: Vec<u64>,
    /// The gcd of the sizes: every height is a multiple of it.
    grain: u64,
    /// Sweep lower bound of the component.
    lower_bound: u64,
}

/// Components with more overlapping pairs than this are not searched.
pub(crate) const MAX_OVERLAPS: usize = 4 << 20;

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Problem {
    /// Extracts component `c` of `inst`: O(m log m + overlapping pairs). `None` when it has more than
    /// [`MAX_OVERLAPS`] overlapping pairs (the overlap lists would not be worth their memory).
    pub fn new(inst: &Instance, c: usize) -> Option<Self> {
        let comp = &inst.components[c];
        let base = comp.sections.0;
        let m = comp.members.len();
        let size: Vec<u64> = comp.members.iter().map(|&i| inst.size[i]).collect();
        let start: Vec<u32> = comp.members.iter().map(|&i| inst.start[i] - base).collect();
        let end: Vec<u32> = comp.members.iter().map(|&i| inst.end[i] - base).collect();
        let length = comp.members.iter().map(|&i| inst.length[i]).collect();
        let sections = (comp.sections.1 - comp.sections.0) as usize;
        // Overlap lists by a sweep over buffers sorted by start.
        let mut by_start: Vec<u32> = (0..m as u32).collect();
        by_start.sort_unstable_by_key(|&i| (start[i as usize], i));
        let mut pairs = 0usize;
        for (k, &a) in by_start.iter().enumerate() {
            pairs += by_start[k + 1..].iter().take_while(|&&b| start[b as usize] < end[a as usize]).count();
            if pairs > MAX_OVERLAPS {
                return None;
            }
        }
        let mut adj = vec![Vec::new(); m];
        for (k, &a) in by_start.iter().enumerate() {
            for &b in &by_start[k + 1..] {
                if start[b as usize] >= end[a as usize] {
                    break;
                }
                adj[a as usize].push(b);
                adj[b as usize].push(a);
            }
        }
        let mut section_members = vec![Vec::new(); sections];
        for i in 0..m {
            for sm in &mut section_members[start[i] as usize..end[i] as usize] {
                sm.push(i as u32);
            }
        }
        let mut twin = vec![None; m];
        let mut seen: std::collections::HashMap<(u32, u32, u64), u32> = std::collections::HashMap::new();
        for i in 0..m {
            if let Some(prev) = seen.insert((start[i], end[i], size[i]), i as u32) {
                twin[i] = Some(prev);
            }
        }
        let grain = size.iter().copied().fold(0, gcd).max(1);
        Some(Problem {
            size,
            start,
            end,
            sections,
            adj,
            section_members,
            twin,
            length,
            grain,
            lower_bound: comp.lower_bound,
        })
    }

    fn len(&self) -> usize {
        self.size.len()
    }
}

/// A tiny deterministic generator (SplitMix64) for restarts.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// How a (sub)search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Every buffer of the (sub)problem is placed under the cap.
    Found,
    /// The whole tree was explored: no placement under the cap exists (given the placed buffers).
    NotFound,
    /// Out of effort or time.
    Aborted,
}

/// A subproblem: unplaced buffers that no other unplaced buffer connects to in time, over sections `lo..hi`.
/// `members` is in index order (memory order, for the per-node scans); `rank` holds each one's preorder rank.
struct Part {
    members: Vec<u32>,
    rank: Vec<u32>,
    lo: usize,
    hi: usize,
}

/// The per-buffer state a node reads, side by side (one cache line per buffer and scan).
#[derive(Clone, Copy)]
struct Hot {
    /// Highest top among placed, overlapping buffers.
    minoff: u64,
    /// Lowest offset the buffer can still take (scratch of `dfs`).
    eff: u64,
    size: u64,
    placed: bool,
}

/// One decision run: is there a placement with every top <= `cap`? Depth-first, one preorder heuristic.
struct Decide<'p> {
    p: &'p Problem,
    cap: u64,
    heuristic: usize,
    /// Random tie-breakers for the randomised heuristics.
    noise: Vec<u64>,
    hot: Vec<Hot>,
    offset: Vec<u64>,
    /// Unplaced size per section.
    rem: Vec<u64>,
    /// Per boundary `s` (between sections `s - 1` and `s`): unplaced buffers crossing it.
    cuts: Vec<u32>,
    /// Placed buffers, in placement order.
    trail: Vec<u32>,
    /// Minimum offsets overwritten, (buffer, old value), for unwinding.
    undo: Vec<(u32, u64)>,
    /// Per section, an unplaced buffer that last showed the section can fit (a hint, checked before use).
    witness: Vec<u32>,
    /// Candidate lists of the nodes on the current path, back to back: (offset, rank, position).
    cands: Vec<(u64, u32, u32)>,
    nodes: u64,
    effort: u64,
    effort_limit: u64,
    deadline: Option<Instant>,
    timed_out: bool,
    /// Results of sub-solves, shared by every run of one decision (same cap).
    memo: &'p mut Memo,
}

impl<'p> Decide<'p> {
    fn new(
        p: &'p Problem,
        memo: &'p mut Memo,
        cap: u64,
        heuristic: usize,
        rng: &mut SplitMix,
        effort_limit: u64,
        deadline: Option<Instant>,
    ) -> Self {
        let m = p.len();
        let mut rem = vec![0u64; p.sections];
        let mut cuts = vec![0u32; p.sections + 1];
        let mut work = (m + p.sections) as u64;
        for i in 0..m {
            for r in &mut rem[p.start[i] as usize..p.end[i] as usize] {
                *r += p.size[i];
            }
            for c in &mut cuts[p.start[i] as usize + 1..p.end[i] as usize] {
                *c += 1;
            }
            work += 2 * u64::from(p.end[i] - p.start[i]);
        }
        let noise = if heuristic >= HEURISTICS { (0..m).map(|_| rng.next()).collect() } else { Vec::new() };
        Decide {
            p,
            cap,
            heuristic,
            noise,
            hot: p.size.iter().map(|&size| Hot { minoff: 0, eff: 0, size, placed: false }).collect(),
            offset: vec![0; m],
            rem,
            cuts,
            trail: Vec::with_capacity(m),
            undo: Vec::new(),
            witness: p.section_members.iter().map(|m| m.first().copied().unwrap_or(0)).collect(),
            cands: Vec::new(),
            nodes: 0,
            effort: work,
            effort_limit,
            deadline,
            timed_out: false,
            memo,
        }
    }

    /// Solves the subproblem of the unplaced `members` (index order) over sections `lo..hi` on its own, from
    /// floor 0.
    fn solve(&mut self, members: Vec<u32>, lo: usize, hi: usize) -> Status {
        // The subproblem is fully described by its members and their minimum offsets: placed buffers only act
        // through those. Reuse a proof of failure or a layout found in another branch.
        let key: Vec<(u32, u64)> = members.iter().map(|&b| (b, self.hot[b as usize].minoff)).collect();
        self.effort += key.len() as u64;
        match self.memo.get(&key, self.cap) {
            Some(Known::Failed) => return Status::NotFound,
            Some(Known::Found(offsets)) => {
                let mut ignored = Vec::new();
                for (&(b, _), &x) in key.iter().zip(&offsets) {
                    self.place(b as usize, x, &mut ignored);
                }
                return Status::Found;
            }
            None => {}
        }
        let status = self.search_part(members, lo, hi);
        match status {
            Status::NotFound => self.memo.fail(key, self.cap),
            Status::Found => {
                let offsets = key.iter().map(|&(b, _)| self.offset[b as usize]).collect();
                self.memo.succeed(key, offsets);
            }
            Status::Aborted => {}
        }
        status
    }

    /// Searches the subproblem of `members` over sections `lo..hi` from floor 0, with this run's preorder.
    fn search_part(&mut self, members: Vec<u32>, lo: usize, hi: usize) -> Status {
        let p = self.p;
        // Preorder keys: peak unplaced total over the lifetime (T), lifetime (L), area (A).
        let mut work = 0u64;
        let keyed: Vec<(u64, u64, u128)> = members
            .iter()
            .map(|&b| {
                let b = b as usize;
                let span = &self.rem[p.start[b] as usize..p.end[b] as usize];
                work += span.len() as u64;
                (span.iter().copied().max().unwrap_or(0), p.length[b], u128::from(p.size[b]) * u128::from(p.length[b]))
            })
            .collect();
        self.effort += work + members.len() as u64 * 8;
        let mut order: Vec<usize> = (0..members.len()).collect();
        match self.heuristic {
            0 => order.sort_by_key(|&k| {
                let (t, l, a) = keyed[k];
                (Reverse(t), Reverse(l), Reverse(a), members[k])
            }),
            1 => order.sort_by_key(|&k| {
                let (t, l, a) = keyed[k];
                (Reverse(l), Reverse(a), Reverse(t), members[k])
            }),
            2 => order.sort_by_key(|&k| {
                let (t, l, a) = keyed[k];
                (Reverse(t), Reverse(a), Reverse(l), members[k])
            }),
            // Randomised: pressure first; among equal pressure, a random bucket, then area.
            _ => order.sort_by_key(|&k| {
                let (t, _, a) = keyed[k];
                let n = self.noise[members[k] as usize];
                (Reverse(t), n % 8, Reverse(a), n)
            }),
        }
        let mut rank = vec![0u32; members.len()];
        for (r, &k) in order.iter().enumerate() {
            rank[k] = r as u32;
        }
        let part = Part { members, rank, lo, hi };
        self.dfs(&part, 0, 0)
    }

    /// The branch-and-bound step: place the next buffer of `part` at each candidate offset, recurse, undo. One
    /// piece on purpose: the skyline, the budget and the undo log are shared by every branch of one frame, and
    /// the pruning tests must see them together.
    fn dfs(&mut self, part: &Part, floor: u64, min_rank: u32) -> Status {
        let p = self.p;
        self.nodes += 1;
        if self.effort >= self.effort_limit {
            return Status::Aborted;
        }
        if self.nodes % 256 == 0 {
            if let Some(d) = self.deadline {
                if Instant::now() >= d {
                    self.timed_out = true;
                    return Status::Aborted;
                }
            }
        }
        // Lowest possible offsets and the dominance threshold over the unplaced members.
        let mut work = (2 * part.members.len() + part.hi - part.lo) as u64;
        let (mut min1, mut min2, mut arg1) = (u64::MAX, u64::MAX, u32::MAX);
        let mut any = false;
        for (k, &b) in part.members.iter().enumerate() {
            let i = b as usize;
            let h = self.hot[i];
            if h.placed {
                continue;
            }
            any = true;
            let mut e = h.minoff;
            if e < floor || (e == floor && part.rank[k] < min_rank) {
                // Pending: it can only end on top of an unplaced, overlapping buffer placed from now on.
                let mut support = u64::MAX;
                for &j in &p.adj[i] {
                    let o = self.hot[j as usize];
                    if !o.placed {
                        support = support.min(o.minoff.max(floor) + o.size);
                    }
                }
                work += p.adj[i].len() as u64;
                if support == u64::MAX {
                    self.effort += work;
                    return Status::NotFound;
                }
                e = support;
            }
            self.hot[i].eff = e;
            let reach = h.minoff + h.size;
            if reach < min1 {
                (min2, min1, arg1) = (min1, reach, b);
            } else if reach < min2 {
                min2 = reach;
            }
        }
        if !any {
            self.effort += work;
            return Status::Found;
        }
        // Section inference: every section needs an unplaced buffer low enough for the whole unplaced size to fit
        // above it. The witness kept from earlier nodes is re-validated first; stale ones cost only a rescan.
        for s in part.lo..part.hi {
            let r = self.rem[s];
            if r == 0 {
                continue;
            }
            let Some(limit) = self.cap.checked_sub(r) else {
                self.effort += work;
                return Status::NotFound;
            };
            let w = self.hot[self.witness[s] as usize];
            if !w.placed && w.eff <= limit {
                continue;
            }
            let members = &p.section_members[s];
            work += members.len() as u64;
            let hot = &self.hot;
            match members.iter().find(|&&j| {
                let h = hot[j as usize];
                !h.placed && h.eff <= limit
            }) {
                Some(&j) => self.witness[s] = j,
                None => {
                    self.effort += work;
                    return Status::NotFound;
                }
            }
        }
        self.effort += work;
        // Candidates: at or above the floor (at the floor, only later ranks), not dominated, under the cap.
        let base = self.cands.len();
        for (k, &b) in part.members.iter().enumerate() {
            let i = b as usize;
            let h = self.hot[i];
            if h.placed {
                continue;
            }
            let x = h.minoff;
            let rank = part.rank[k];
            if x < floor || (x == floor && rank < min_rank) || x.saturating_add(h.size) > self.cap {
                continue;
            }
            if let Some(t) = p.twin[i] {
                if !self.hot[t as usize].placed {
                    continue;
                }
            }
            let threshold = if b == arg1 { min2 } else { min1 };
            if threshold <= x {
                continue;
            }
            self.cands.push((x, rank, k as u32));
        }
        self.cands[base..].sort_unstable();
        let end = self.cands.len();
        let mut cut_points: Vec<usize> = Vec::new();
        let mut status = Status::NotFound;
        for c in base..end {
            let (x, rank, k) = self.cands[c];
            let b = part.members[k as usize];
            let mark = (self.trail.len(), self.undo.len());
            cut_points.clear();
            let hatless = self.place(b as usize, x, &mut cut_points);
            let child =
                if cut_points.is_empty() { self.dfs(part, x, rank + 1) } else { self.decompose(part, &mut cut_points) };
            if child != Status::NotFound {
                status = child;
                break;
            }
            self.unwind(mark);
            // Nothing can ever sit on `b`: its offset is fixed whatever is placed first, and every later
            // alternative either starts above it (stranding it) or ties with it in a rank order the tie rule
            // forbids. So no alternative can succeed where placing `b` first failed.
            if hatless {
                break;
            }
        }
        self.cands.truncate(base);
        status
    }

    /// The unplaced members split at `cut_points`: solve each side on its own; all must succeed.
    fn decompose(&mut self, part: &Part, cut_points: &mut [usize]) -> Status {
        let p = self.p;
        cut_points.sort_unstable();
        let mut lo = part.lo;
        for k in 0..=cut_points.len() {
            let hi = cut_points.get(k).copied().unwrap_or(part.hi);
            let members: Vec<u32> = part
                .members
                .iter()
                .copied()
                .filter(|&b| {
                    let i = b as usize;
                    !self.hot[i].placed && (p.start[i] as usize) < hi && (p.end[i] as usize) > lo
                })
                .collect();
            self.effort += part.members.len() as u64;
            if !members.is_empty() {
                let status = self.solve(members, lo, hi);
                if status != Status::Found {
                    return status;
                }
            }
            lo = hi;
        }
        Status::Found
    }

    /// Places `i` at `x`, collecting boundaries no unplaced buffer crosses any more. Returns whether no unplaced
    /// buffer overlaps `i` (it is "hatless").
    fn place(&mut self, i: usize, x: u64, cut_points: &mut Vec<usize>) -> bool {
        let p = self.p;
        let size = p.size[i];
        let (a, z) = (p.start[i] as usize, p.end[i] as usize);
        self.hot[i].placed = true;
        self.offset[i] = x;
        self.trail.push(i as u32);
        for v in &mut self.rem[a..z] {
            *v -= size;
        }
        for s in a + 1..z {
            self.cuts[s] -= 1;
            if self.cuts[s] == 0 {
                cut_points.push(s);
            }
        }
        let t = x + size;
        let mut hatless = true;
        for &j in &p.adj[i] {
            let h = &mut self.hot[j as usize];
            if h.placed {
                continue;
            }
            hatless = false;
            if h.minoff < t {
                self.undo.push((j, h.minoff));
                h.minoff = t;
            }
        }
        self.effort += (p.adj[i].len() + 2 * (z - a)) as u64;
        hatless
    }

    /// Undoes every placement and minimum-offset change made after `mark`.
    fn unwind(&mut self, mark: (usize, usize)) {
        let p = self.p;
        while self.trail.len() > mark.0 {
            let Some(b) = self.trail.pop() else { break };
            let i = b as usize;
            let (a, z) = (p.start[i] as usize, p.end[i] as usize);
            self.hot[i].placed = false;
            for v in &mut self.rem[a..z] {
                *v += p.size[i];
            }
            for c in &mut self.cuts[a + 1..z] {
                *c += 1;
            }
            self.effort += 2 * (z - a) as u64;
        }
        while self.undo.len() > mark.1 {
            let Some((j, old)) = self.undo.pop() else {
                break;
            };
            self.hot[j as usize].minoff = old;
        }
    }

    fn height(&self) -> u64 {
        (0..self.p.len()).map(|i| self.offset[i] + self.p.size[i]).max().unwrap_or(0)
    }
}

/// Results of subproblems, keyed by (member, minimum offset) pairs sorted by member. Full keys are stored, so a
/// hash collision can never return a wrong answer. A failure proved under some cap holds under every lower cap,
/// in every run; found layouts are kept for the current run only, so that reusing one never changes the run's
/// course (a re-search with the same preorder would find the same layout). Bounded in size.
#[derive(Default)]
struct Memo {
    /// The highest cap under which each subproblem was proved infeasible.
    failed: std::collections::HashMap<Vec<(u32, u64)>, u64>,
    found: std::collections::HashMap<Vec<(u32, u64)>, Vec<u64>>,
    stored: usize,
}

/// What the memo knows about a subproblem.
enum Known {
    Failed,
    Found(Vec<u64>),
}

impl Memo {
    /// Entries beyond this many (member, offset) pairs in total are not stored.
    const CAPACITY: usize = 1 << 21;

    fn get(&self, key: &[(u32, u64)], cap: u64) -> Option<Known> {
        if self.failed.get(key).is_some_and(|&c| cap <= c) {
            return Some(Known::Failed);
        }
        self.found.get(key).map(|o| Known::Found(o.clone()))
    }

    fn fail(&mut self, key: Vec<(u32, u64)>, cap: u64) {
        if let Some(c) = self.failed.get_mut(&key) {
            *c = (*c).max(cap);
        } else if self.stored + key.len() <= Self::CAPACITY {
            self.stored += key.len();
            self.failed.insert(key, cap);
        }
    }

    fn succeed(&mut self, key: Vec<(u32, u64)>, offsets: Vec<u64>) {
        if self.stored + 2 * key.len() <= Self::CAPACITY {
            self.stored += 2 * key.len();
            self.found.insert(key, offsets);
        }
    }

    /// Forgets the found layouts (a new run, with another preorder or cap, starts).
    fn new_run(&mut self) {
        for k in self.found.keys() {
            self.stored -= 2 * k.len();
        }
        self.found.clear();
    }
}

/// Fixed preorder heuristics; heuristic `HEURISTICS` is the randomised one.
const HEURISTICS: usize = 3;
/// Per round, the randomised runs at the target get this many times the fixed preorders' effort: on tight
/// instances, success tends to come from a lucky preorder that needs few backtracks.
const RANDOM_SHARE: u64 = 4;

/// The Luby sequence 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, ... (`i` from 1): restart lengths within a log factor of the
/// best fixed schedule whatever the run-length distribution.
fn luby(i: u64) -> u64 {
    let mut i = i.max(1);
    loop {
        // k: the smallest with 2^k - 1 >= i.
        let k = 64 - i.leading_zeros();
        if i == (1u64 << k) - 1 {
            return 1u64 << (k - 1);
        }
        i -= (1u64 << (k - 1)) - 1;
    }
}

/// The answer of [`attempt`].
struct Decision {
    status: Status,
    /// The layout and its height when found.
    solution: Option<(Vec<u64>, u64)>,
    nodes: u64,
    effort: u64,
    timed_out: bool,
}

/// Is there a layout with height <= `cap`? One run per preorder heuristic listed, each stopped after
/// `limit` effort units (and all together after `left`). A run that explores its whole tree answers "no".
#[allow(clippy::too_many_arguments)]
fn attempt(
    p: &Problem,
    memo: &mut Memo,
    cap: u64,
    heuristics: &[usize],
    limit: u64,
    left: u64,
    deadline: Option<Instant>,
    rng: &mut SplitMix,
) -> Decision {
    let mut out = Decision { status: Status::Aborted, solution: None, nodes: 0, effort: 0, timed_out: false };
    for &h in heuristics {
        let left = left.saturating_sub(out.effort);
        if left == 0 {
            break;
        }
        memo.new_run();
        let mut d = Decide::new(p, memo, cap, h, rng, limit.min(left), deadline);
        let all: Vec<u32> = (0..p.len() as u32).collect();
        let status = d.solve(all, 0, p.sections);
        out.nodes += d.nodes;
        out.effort += d.effort;
        out.timed_out |= d.timed_out;
        match status {
            Status::Found => {
                out.status = Status::Found;
                out.solution = Some((d.offset.clone(), d.height()));
                return out;
            }
            Status::NotFound => {
                out.status = Status::NotFound;
                return out;
            }
            Status::Aborted if d.timed_out => return out,
            Status::Aborted => {}
        }
    }
    out
}

/// Tries to lower the height of component `c` from `height` to `max(goal, its lower bound)` or below, within
/// `limits`; `None` if the component is too dense to search (see [`Problem::new`]). Rounds with doubling per-run limits; each round runs (1) the decision at the target (the goal, or
/// the bound proved so far if higher) over the preorder portfolio, and (2) with as much effort again, a descent
/// from the best height: decisions at `best - step`, the step halving after each failure to answer. Decision
/// difficulty is erratic in the cap, so the descent keeps probing different caps rather than bisecting once.
pub(crate) fn improve(inst: &Instance, c: usize, height: u64, goal: u64, limits: &Limits) -> Option<Outcome> {
    let p = Problem::new(inst, c)?;
    let grain = p.grain;
    let mut rng = SplitMix::new(limits.seed);
    let mut memo = Memo::default();
    let mut out = Outcome { improved: None, proved_lower_bound: p.lower_bound, nodes: 0, effort: 0, timed_out: false };
    let goal = goal.max(p.lower_bound);
    let mut best = height;
    let mut target = goal;
    let mut limit = (64 * (p.len() + p.sections) as u64).max(1024);
    // About one full dive: every buffer placed once, each node scanning the members and sections.
    let dive = (p.len() as u64 * (2 * p.len() + p.sections) as u64).max(limit);
    let mut luby_index = 0u64;
    let mut start_shift = 1u32;
    let mut round = 0usize;
    let record = |out: &mut Outcome, d: &Decision| {
        out.nodes += d.nodes;
        out.effort += d.effort;
        out.timed_out |= d.timed_out;
    };
    while best > goal && best > out.proved_lower_bound && out.effort < limits.effort && !out.timed_out {
        let count = HEURISTICS + 1;
        let fixed: Vec<usize> = (0..HEURISTICS).collect();
        // (1) The descent, with the effort of six runs at this round's limit: decisions
        // at `best - step`, one heuristic per probe, rotating. The step halves after every probe that cannot
        // answer and is kept after a success; each round starts one step bolder than the last success.
        let quota = 2 * HEURISTICS as u64 * limit;
        let descent_start = out.effort;
        let mut shift = start_shift;
        let mut probe = 0usize;
        while best > target + grain
            && out.effort - descent_start < quota
            && out.effort < limits.effort
            && !out.timed_out
        {
            let gap = best - target;
            let step = ((gap >> shift) / grain * grain).max(grain);
            let cap = best - step;
            let left = (limits.effort - out.effort).min(quota - (out.effort - descent_start));
            let h = [(round + probe) % count];
            probe += 1;
            let d = attempt(&p, &mut memo, cap, &h, limit, left, limits.deadline, &mut rng);
            record(&mut out, &d);
            tracing::trace!(round, limit, cap, status = ?d.status, effort = d.effort, total = out.effort, "pack descent");
            match (d.status, d.solution) {
                (Status::Found, Some((sol, h))) => {
                    best = h;
                    out.improved = Some((sol, h));
                    start_shift = shift.saturating_sub(1).max(1);
                }
                (Status::NotFound, _) => {
                    out.proved_lower_bound = out.proved_lower_bound.max(cap + grain);
                    target = target.max(cap + grain);
                }
                _ => {
                    if step == grain {
                        shift = 1;
                    } else {
                        shift += 1;
                    }
                }
            }
        }
        if best <= goal || best <= out.proved_lower_bound {
            break;
        }
        // (2) The target: the fixed preorders at this round's limit, then randomised preorders with Luby-sequence
        // limits (mostly short runs: some random preorders solve hard instances almost in one dive, most do not)
        // for `RANDOM_SHARE` times that effort.
        let mut random_spent = 0u64;
        let mut first = true;
        while target < best && out.effort < limits.effort && !out.timed_out {
            let (heuristics, run_limit) = if first {
                (&fixed[..], limit)
            } else if random_spent < RANDOM_SHARE * HEURISTICS as u64 * limit {
                luby_index += 1;
                (&[HEURISTICS][..], dive.saturating_mul(luby(luby_index)))
            } else {
                break;
            };
            let left = limits.effort - out.effort;
            let d = attempt(&p, &mut memo, target, heuristics, run_limit, left, limits.deadline, &mut rng);
            record(&mut out, &d);
            if !first {
                random_spent += d.effort;
            }
            first = false;
            tracing::trace!(round, limit = run_limit, target, status = ?d.status, effort = d.effort, total = out.effort, "pack target");
            match (d.status, d.solution) {
                (Status::Found, Some((sol, h))) => {
                    best = h;
                    out.improved = Some((sol, h));
                }
                (Status::NotFound, _) => {
                    out.proved_lower_bound = target + grain;
                    target += grain;
                }
                _ => {}
            }
        }
        if best <= goal {
            break;
        }
        limit = limit.saturating_mul(2);
        round += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::pack::Buffer;
    use proptest::prelude::*;

    /// Brute-force optimum of one component: first-fit in every order of its members.
    fn brute_force(p: &Problem) -> u64 {
        fn go(p: &Problem, placed: &mut Vec<(usize, u64)>, best: &mut u64, height: u64) {
            if height >= *best {
                return;
            }
            if placed.len() == p.len() {
                *best = height;
                return;
            }
            for i in 0..p.len() {
                if placed.iter().any(|&(j, _)| j == i) {
                    continue;
                }
                let mut occ: Vec<(u64, u64)> = placed
                    .iter()
                    .filter(|&&(j, _)| p.start[j] < p.end[i] && p.start[i] < p.end[j])
                    .map(|&(j, o)| (o, o + p.size[j]))
                    .collect();
                occ.sort_unstable();
                let mut at = 0;
                for (lo, hi) in occ {
                    if lo >= at + p.size[i] {
                        break;
                    }
                    at = at.max(hi);
                }
                placed.push((i, at));
                go(p, placed, best, height.max(at + p.size[i]));
                placed.pop();
            }
        }
        let mut best = u64::MAX;
        go(p, &mut Vec::new(), &mut best, 0);
        best
    }

    fn instance() -> impl Strategy<Value = Vec<Buffer>> {
        prop::collection::vec((0u64..8, 1u64..6, 1u64..7), 1..8)
            .prop_map(|v| v.into_iter().map(|(l, len, s)| Buffer::new(l, l + len, s)).collect())
    }

    #[test]
    fn luby_sequence() {
        let first: Vec<u64> = (1..=15).map(luby).collect();
        assert_eq!(first, [1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// The decision is exact under every preorder: a layout at the optimum is found, none below it.
        #[test]
        fn decision_matches_brute_force(bufs in instance(), seed in 0u64..1000) {
            let inst = Instance::new(&bufs, 1).unwrap();
            for c in 0..inst.components.len() {
                let p = Problem::new(&inst, c).unwrap();
                let opt = brute_force(&p);
                let mut rng = SplitMix::new(seed);
                for h in [0, 1, 2, HEURISTICS] {
                    let mut memo = Memo::default();
                    let found = attempt(&p, &mut memo, opt, &[h], u64::MAX, u64::MAX, None, &mut rng);
                    prop_assert_eq!(found.status, Status::Found, "heuristic {} at the optimum {}", h, opt);
                    let (offsets, height) = found.solution.unwrap();
                    prop_assert!(height <= opt);
                    for i in 0..p.len() {
                        for j in p.adj[i].iter().map(|&j| j as usize) {
                            prop_assert!(
                                offsets[i] + p.size[i] <= offsets[j] || offsets[j] + p.size[j] <= offsets[i]
                            );
                        }
                    }
                    // Reusing the memo of the successful run must not change the answer below the optimum.
                    let below = attempt(&p, &mut memo, opt - 1, &[h], u64::MAX, u64::MAX, None, &mut rng);
                    prop_assert_eq!(below.status, Status::NotFound, "heuristic {} below the optimum {}", h, opt);
                }
            }
        }
    }
}
