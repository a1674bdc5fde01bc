//! The greedy portfolio: several orderings, each placed by best-fit and first-fit; the best run per component wins.
//!
//! A run places buffers one by one at a gap between the byte ranges of already placed, time-overlapping buffers.
//! Those are found through [`PlacedIndex`]: a placed buffer overlaps `[start, end)` iff it covers section `start`
//! (a stabbing query on a segment tree whose nodes list the buffers covering them) or it starts strictly inside
//! (a walk over the start-time lists, skipping empty times with a 64-ary bit tree). One run costs
//! O(n log T + sum of k log k) for k overlapping placed buffers per step. When many buffers are live at once
//! (a random DAG's long lifetimes), runs use [`Occupancy`] instead, whose queries return the occupied bytes
//! as merged ranges (`memory/pack/occupancy.rs`); both give the same gaps, so the same offsets.

use std::cmp::Reverse;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::instance::Instance;
use super::occupancy::Occupancy;
use super::PackError;
use crate::sorted_map::SortedMap;

/// The order in which a greedy run places buffers. Ties break by size (larger first), then input order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Order {
    /// Largest aligned size first (XLA's default).
    Size,
    /// Largest size x lifetime first.
    Area,
    /// Longest lifetime first.
    Lifetime,
    /// Largest total size of time-overlapping buffers first.
    Conflict,
    /// Largest peak load over the buffer's lifetime first (busiest moments first).
    Pressure,
    /// Earliest start first (an online allocator's view).
    Start,
}

impl Order {
    /// Every ordering, in the portfolio's order.
    pub const ALL: [Order; 6] =
        [Order::Size, Order::Area, Order::Lifetime, Order::Conflict, Order::Pressure, Order::Start];
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Order::Size => "size",
            Order::Area => "area",
            Order::Lifetime => "lifetime",
            Order::Conflict => "conflict",
            Order::Pressure => "pressure",
            Order::Start => "start",
        };
        f.write_str(s)
    }
}

/// How a greedy run picks among the gaps that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Fit {
    /// The smallest gap that fits (lowest on ties).
    Best,
    /// The lowest gap that fits.
    First,
    /// An online allocator replayed in time order: at each moment the buffers that end are freed (neighbouring
    /// free blocks coalesce), then those that start take the smallest free block that fits, else the top.
    /// O(n log n) whatever the overlap, so it bounds the portfolio's cost on instances with many live buffers.
    Online,
}

impl fmt::Display for Fit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fit::Best => "best-fit",
            Fit::First => "first-fit",
            Fit::Online => "online-best-fit",
        })
    }
}

/// Above this many buffers the portfolio shrinks to two runs, and above `HUGE` to one (size, best-fit: XLA's
/// default), to keep huge instances well under a second or two.
const LARGE: usize = 200_000;
const HUGE: usize = 500_000;

/// The portfolio's outcome.
pub(crate) struct Portfolio {
    /// Internal offsets, relative to each component's base: each component laid out by its best run.
    pub offsets: Vec<u64>,
    /// Height of each component, relative to its base.
    pub component_heights: Vec<u64>,
    /// The run that laid out each component.
    pub component_runs: Vec<(Order, Fit)>,
    /// The best height a single run reached on the whole instance (components an earlier run settled at their
    /// bound counted at it).
    pub best_single_height: u64,
    /// Runs made (the online run included).
    pub runs: usize,
}

/// Most placed-buffer comparisons (summed over the runs) the gap-scanning runs may cost by default; runs beyond it
/// are left out, keeping the portfolio near-linear when many buffers are live at once (a random DAG's long
/// lifetimes). [`Budget::greedy_work`](super::Budget::greedy_work) overrides it.
pub const WORK_LIMIT: u64 = 40_000_000;

/// Runs the online allocator, then every (order, fit) pair the work limit allows on the components still above
/// their lower bound (a component at its bound cannot improve, and components never share a section, so a run
/// restricted to the open ones lays them out exactly as a run over everything would); stops when none is open.
/// Keeps the best run per component (the earliest on ties).
pub(crate) fn portfolio(inst: &Instance, work_limit: u64) -> Result<Portfolio, PackError> {
    let n = inst.len();
    let nc = inst.components.len();
    let all: Vec<(Order, Fit)> = if n > HUGE {
        vec![(Order::Size, Fit::Best)]
    } else if n > LARGE {
        vec![(Order::Size, Fit::Best), (Order::Pressure, Fit::Best)]
    } else {
        Order::ALL.iter().flat_map(|&o| [(o, Fit::Best), (o, Fit::First)]).collect()
    };
    // One gap-scanning run costs about the sum, over its buffers, of the buffers live when each starts.
    let comp_work = overlap_work(inst);
    let mut runs: Vec<(Order, Fit)> = vec![(Order::Start, Fit::Online)];
    runs.extend(all);
    // Built for the first gap-scanning run (often none runs: the online run reached every bound, or the work
    // limit allows none).
    let mut index: Option<Index> = None;
    let live = comp_work.iter().sum::<u64>() / (inst.free.len() as u64).max(1);
    let new_index = || {
        if live >= UNION_FROM_LIVE {
            Index::Union(Occupancy::new(inst.num_sections))
        } else {
            Index::Each(PlacedIndex::new(inst))
        }
    };
    let mut offsets = vec![0u64; n];
    let mut run_offsets = vec![0u64; n];
    let mut comp_best = vec![u64::MAX; nc];
    let mut comp_runs = vec![runs[0]; nc];
    let mut best_single = u64::MAX;
    let mut open = vec![true; nc];
    let mut work_left = work_limit;
    let mut made = 0usize;
    for &(order, fit) in &runs {
        if fit == Fit::Online {
            online(inst, &mut run_offsets)?;
        } else {
            let cost = comp_work.iter().zip(&open).filter(|(_, &o)| o).map(|(&w, _)| w).sum::<u64>().max(1);
            if cost > work_left {
                break;
            }
            work_left -= cost;
            let mut seq = ordering(inst, order);
            seq.retain(|&i| open[inst.comp_of[i as usize] as usize]);
            run(inst, &seq, fit, index.get_or_insert_with(new_index), &mut run_offsets)?;
        }
        // Heights relative to each component's base (`run` checked that every top fits in u64); a settled
        // component counts at its best (its bound), which no run can beat.
        let mut single = 0u64;
        for (c, comp) in inst.components.iter().enumerate() {
            let h = if open[c] {
                let h = comp.members.iter().map(|&i| run_offsets[i] + inst.size[i]).max().unwrap_or(0);
                if h < comp_best[c] {
                    comp_best[c] = h;
                    comp_runs[c] = (order, fit);
                    for &i in &comp.members {
                        offsets[i] = run_offsets[i];
                    }
                }
                h
            } else {
                comp_best[c]
            };
            single = single.max(comp.base.saturating_add(h));
        }
        best_single = best_single.min(single);
        made += 1;
        tracing::debug!(%order, %fit, single, open = open.iter().filter(|&&o| o).count(), "pack: greedy run");
        for (c, comp) in inst.components.iter().enumerate() {
            open[c] = open[c] && comp_best[c] > comp.lower_bound;
        }
        if !open.contains(&true) {
            break;
        }
    }
    Ok(Portfolio {
        offsets,
        component_heights: comp_best,
        component_runs: comp_runs,
        best_single_height: best_single,
        runs: made,
    })
}

/// Per component, the sum over its free buffers of how many free buffers cover the section where each starts:
/// the cost of one gap-scanning run over it. O(n + T).
fn overlap_work(inst: &Instance) -> Vec<u64> {
    let t = inst.num_sections;
    let mut delta = vec![0i64; t + 1];
    for &i in &inst.free {
        let i = i as usize;
        delta[inst.start[i] as usize] += 1;
        delta[inst.end[i] as usize] -= 1;
    }
    let mut live = vec![0u64; t];
    let mut c = 0i64;
    for (s, l) in live.iter_mut().enumerate() {
        c += delta[s];
        *l = c.max(0) as u64;
    }
    let mut work = vec![0u64; inst.components.len()];
    for &i in &inst.free {
        let i = i as usize;
        work[inst.comp_of[i] as usize] += live.get(inst.start[i] as usize).copied().unwrap_or(0);
    }
    work
}

/// [`Fit::Online`]: replay time; free the buffers ending at each section, then give those starting there (larger
/// first) the smallest free block that fits, or the top of the heap. Free blocks coalesce with their neighbours;
/// the space above the heap's top is one unbounded block. Offsets are relative to 0, which is each component's
/// base: components never overlap in time, so one replay serves them all.
fn online(inst: &Instance, offsets: &mut [u64]) -> Result<(), PackError> {
    let starts = ordering(inst, Order::Start);
    // By end, then index (`free` is ascending and the counting sort stable).
    let mut ends: Vec<u32> = inst.free.clone();
    if !crate::counting::sort_small(&mut ends, |&i| u64::from(inst.end[i as usize])) {
        ends.sort_unstable_by_key(|&i| (inst.end[i as usize], i));
    }
    // Free blocks below the top; everything from `top` up is free.
    let mut blocks = FreeBlocks::default();
    let mut top = 0u64;
    let mut e = 0usize;
    for b in starts {
        let i = b as usize;
        let now = inst.start[i];
        while let Some(&j) = ends.get(e) {
            let j = j as usize;
            if inst.end[j] > now {
                break;
            }
            e += 1;
            // Sizes and offsets were checked when placed: offset + size <= top fits in u64.
            let (mut lo, mut hi) = (offsets[j], offsets[j] + inst.size[j]);
            if let Some((plo, psize)) = blocks.last_below(lo) {
                if plo + psize == lo {
                    blocks.remove(plo, psize);
                    lo = plo;
                }
            }
            if let Some(nsize) = blocks.size_at(hi) {
                blocks.remove(hi, nsize);
                hi += nsize;
            }
            if hi == top {
                top = lo;
            } else {
                blocks.insert(lo, hi - lo);
            }
        }
        let need = inst.size[i];
        if let Some((bsize, off)) = blocks.best_fit(need) {
            blocks.remove(off, bsize);
            if bsize > need {
                blocks.insert(off + need, bsize - need);
            }
            offsets[i] = off;
        } else {
            offsets[i] = top;
            top = top.checked_add(need).ok_or(PackError::Overflow { index: inst.orig[i], size: need })?;
        }
    }
    Ok(())
}

/// The free blocks of [`online`], by offset (-> size) and by (size, offset), each a [`SortedMap`] (a sorted list
/// while the blocks are few).
struct FreeBlocks {
    by_off: SortedMap<u64, u64>,
    by_size: SortedMap<(u64, u64), ()>,
}

impl Default for FreeBlocks {
    fn default() -> Self {
        FreeBlocks { by_off: SortedMap::new(), by_size: SortedMap::new() }
    }
}

impl FreeBlocks {
    /// The block starting last below `offset`, as `(offset, size)`.
    fn last_below(&self, offset: u64) -> Option<(u64, u64)> {
        self.by_off.last_below(offset)
    }

    /// The size of the block starting at `offset`.
    fn size_at(&self, offset: u64) -> Option<u64> {
        self.by_off.get(offset)
    }

    /// The smallest block of at least `need` bytes (the lowest such offset among equals), as `(size, offset)`.
    fn best_fit(&self, need: u64) -> Option<(u64, u64)> {
        self.by_size.first_from((need, 0)).map(|(k, ())| k)
    }

    fn remove(&mut self, offset: u64, size: u64) {
        self.by_off.remove(offset);
        self.by_size.remove((size, offset));
    }

    /// Add a block (its offset free of blocks).
    fn insert(&mut self, offset: u64, size: u64) {
        self.by_off.insert(offset, size);
        self.by_size.insert((size, offset), ());
    }
}

/// The placement order of `order` over the free (not pinned) buffers, deterministic (ties by size, then index).
pub(crate) fn ordering(inst: &Instance, order: Order) -> Vec<u32> {
    let mut seq: Vec<u32> = inst.free.clone();
    let size = &inst.size;
    match order {
        Order::Size => seq.sort_unstable_by_key(|&i| {
            let i = i as usize;
            (Reverse(size[i]), Reverse(inst.length[i]), i)
        }),
        Order::Area => seq.sort_unstable_by_key(|&i| {
            let i = i as usize;
            (Reverse(u128::from(size[i]) * u128::from(inst.length[i])), Reverse(size[i]), i)
        }),
        Order::Lifetime => seq.sort_unstable_by_key(|&i| {
            let i = i as usize;
            (Reverse(inst.length[i]), Reverse(size[i]), i)
        }),
        Order::Conflict => {
            let conflict = conflict_sizes(inst);
            seq.sort_unstable_by_key(|&i| {
                let i = i as usize;
                (Reverse(conflict[i]), Reverse(size[i]), i)
            })
        }
        Order::Pressure => {
            let peak = peak_loads(inst);
            seq.sort_unstable_by_key(|&i| {
                let i = i as usize;
                (Reverse(peak[i]), Reverse(size[i]), Reverse(inst.length[i]), i)
            })
        }
        Order::Start => seq.sort_unstable_by_key(|&i| {
            let i = i as usize;
            (inst.start[i], Reverse(size[i]), Reverse(inst.end[i]), i)
        }),
    }
    seq
}

/// Total size of the buffers that overlap each buffer in time, itself excluded. O(n + T).
fn conflict_sizes(inst: &Instance) -> Vec<u128> {
    let t = inst.num_sections + 1;
    // ended_by[p]: total size of buffers ending at or before point p; started_from[p]: starting at or after p.
    let mut ended_by = vec![0u128; t];
    let mut started_from = vec![0u128; t + 1];
    let mut total = 0u128;
    for i in 0..inst.len() {
        let s = u128::from(inst.size[i]);
        ended_by[inst.end[i] as usize] += s;
        started_from[inst.start[i] as usize] += s;
        total += s;
    }
    for p in 1..t {
        ended_by[p] += ended_by[p - 1];
    }
    for p in (0..t).rev() {
        started_from[p] += started_from[p + 1];
    }
    (0..inst.len())
        .map(|i| {
            let disjoint = ended_by[inst.start[i] as usize] + started_from[inst.end[i] as usize];
            total - disjoint - u128::from(inst.size[i])
        })
        .collect()
}

/// The largest section load over each buffer's lifetime: range maxima on a bottom-up segment tree.
fn peak_loads(inst: &Instance) -> Vec<u64> {
    let t = inst.num_sections.max(1);
    let p = t.next_power_of_two();
    let mut tree = vec![0u64; 2 * p];
    tree[p..p + inst.num_sections].copy_from_slice(&inst.load);
    for v in (1..p).rev() {
        tree[v] = tree[2 * v].max(tree[2 * v + 1]);
    }
    (0..inst.len())
        .map(|i| {
            let (mut l, mut r) = (inst.start[i] as usize + p, inst.end[i] as usize + p);
            let mut best = 0;
            while l < r {
                if l & 1 == 1 {
                    best = best.max(tree[l]);
                    l += 1;
                }
                if r & 1 == 1 {
                    r -= 1;
                    best = best.max(tree[r]);
                }
                l >>= 1;
                r >>= 1;
            }
            best
        })
        .collect()
}

/// One greedy run: places the buffers of `seq` in order into `offsets`.
pub(crate) fn run(
    inst: &Instance,
    seq: &[u32],
    fit: Fit,
    index: &mut Index,
    offsets: &mut [u64],
) -> Result<(), PackError> {
    index.clear();
    // Every offset a run makes is 0 or the top of a placed buffer: a multiple of the sizes' common divisor.
    let grain = inst.size.iter().fold(0u64, |g, &x| gcd(g, x));
    let mut occupied: Vec<Range> = Vec::new();
    let mut slots: Vec<u64> = Vec::new();
    for &b in seq {
        let i = b as usize;
        let (s, e, size) = (inst.start[i], inst.end[i], inst.size[i]);
        occupied.clear();
        index.overlapping(s, e, &mut occupied);
        sort_by_start(&mut occupied, grain, &mut slots);
        let offset = choose_gap(&occupied, size, fit);
        let top = offset.checked_add(size).ok_or(PackError::Overflow { index: inst.orig[i], size })?;
        offsets[i] = offset;
        index.insert((offset, top), s, e);
    }
    Ok(())
}

/// Greatest common divisor (`gcd(0, x) = x`).
pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Sorts non-empty byte ranges `(lo, hi)` by `lo`, keeping of the ranges that share a `lo` only the one reaching
/// highest: the gap scan of [`choose_gap`] reads nothing else (a range that
/// starts where an earlier one starts opens no gap). When every `lo` is a multiple of `grain` and the highest
/// `hi` spans at most a few slots of `grain` per range, a counting pass over those slots replaces the comparison
/// sort: O(k + top / grain) instead of O(k log k), which matters when thousands of placed buffers overlap each
/// query (a random DAG's long lifetimes). `slots` is scratch space.
fn sort_by_start(ranges: &mut Vec<Range>, grain: u64, slots: &mut Vec<u64>) {
    let top = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let limit = 4 * ranges.len() as u64 + 64;
    let countable = grain > 0 && top / grain <= limit && ranges.iter().all(|r| r.0 % grain == 0 && r.1 > r.0);
    if !countable {
        ranges.sort_unstable();
        return;
    }
    slots.clear();
    slots.resize((top / grain) as usize + 1, 0);
    for &(lo, hi) in ranges.iter() {
        let s = &mut slots[(lo / grain) as usize];
        *s = (*s).max(hi);
    }
    ranges.clear();
    ranges.extend(slots.iter().enumerate().filter(|(_, &hi)| hi > 0).map(|(k, &hi)| (k as u64 * grain, hi)));
}

/// The offset for a buffer of `size` among the `occupied` byte ranges, sorted by start (they may overlap each
/// other).
fn choose_gap(occupied: &[(u64, u64)], size: u64, fit: Fit) -> u64 {
    let mut cursor = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap length, offset)
    for &(lo, hi) in occupied.iter() {
        if lo > cursor {
            let gap = lo - cursor;
            if gap >= size {
                match fit {
                    Fit::First => return cursor,
                    Fit::Best | Fit::Online => {
                        if best.is_none_or(|(g, _)| gap < g) {
                            best = Some((gap, cursor));
                        }
                    }
                }
            }
        }
        cursor = cursor.max(hi);
    }
    best.map_or(cursor, |(_, o)| o)
}

/// Buffers covering at most this many sections may be indexed per section; longer ones in the segment tree.
const SHORT: u32 = 16;
/// Per-section slots are limited to this many per buffer on average (memory bound): the short threshold is
/// lowered until the slots fit.
const SLOTS_PER_BUFFER: usize = 4;

/// A placed buffer's byte range, `(offset, top)`.
pub(crate) type Range = (u64, u64);

/// From this many buffers live, on average, where each free buffer starts, runs use [`Occupancy`] (unions of
/// byte ranges) instead of [`PlacedIndex`] (one range per placed buffer). Measured on random DAGs (the memory pass
/// at 1 and 4 streams, same plans): at about 130 live the per-buffer index is 5-20% faster, from about 400 the
/// unions are (1.2x at 400, 1.6x at 1,200).
const UNION_FROM_LIVE: u64 = 256;

/// The time index of a gap-scanning run: either answers "the bytes occupied over sections `[start, end)`" as
/// ranges whose union is exact, which is all `choose_gap` reads.
pub(crate) enum Index {
    /// One range per placed buffer.
    Each(PlacedIndex),
    /// Merged ranges.
    Union(Occupancy),
}

impl Index {
    fn clear(&mut self) {
        match self {
            Index::Each(x) => x.clear(),
            Index::Union(x) => x.clear(),
        }
    }

    fn insert(&mut self, range: Range, start: u32, end: u32) {
        match self {
            Index::Each(x) => x.insert(range, start, end),
            Index::Union(x) => x.insert(range, start, end),
        }
    }

    fn overlapping(&self, start: u32, end: u32, out: &mut Vec<Range>) {
        match self {
            Index::Each(x) => x.overlapping(start, end, out),
            Index::Union(x) => x.overlapping(start, end, out),
        }
    }
}

/// Placed buffers indexed by time, for "the byte ranges of placed buffers overlapping sections `[start, end)`".
///
/// Short buffers are listed in every section they cover, in slots preallocated per section (contiguous, so a
/// query reads one short run of memory). Long buffers are listed on the O(log T) segment tree nodes that
/// partition their span. Every placed buffer is also listed at its start section, so that a query finds the
/// buffers covering its first section plus those starting strictly inside, each exactly once. Slots hold the
/// byte ranges themselves, so a query touches no per-buffer array.
pub(crate) struct PlacedIndex {
    /// Buffers covering at most this many sections use the per-section slots.
    short: u32,
    /// Per section, (first slot, filled count) of its list of covering short buffers.
    cover: Vec<(u32, u32)>,
    cover_slots: Vec<Range>,
    /// The same layout for the buffers starting in each section.
    begin: Vec<(u32, u32)>,
    start_slots: Vec<Range>,
    /// Sections where some placed buffer starts.
    starts: BitTree,
    /// Leaves of the segment tree over sections (a power of two).
    leaves: usize,
    /// Head of each tree node's list of long buffers covering the node's whole range.
    node_head: Vec<u32>,
    /// List cells: (byte range, next cell).
    cells: Vec<(Range, u32)>,
    /// Whether any long buffer is placed (else the tree walk is skipped).
    any_long: bool,
}

const NIL: u32 = u32::MAX;

/// Slot lists laid out back to back: (first slot, 0 filled) per list, and the total number of slots.
fn csr(counts: &[u32]) -> (Vec<(u32, u32)>, usize) {
    let mut lists = Vec::with_capacity(counts.len());
    let mut acc = 0u32;
    for &c in counts {
        lists.push((acc, 0));
        acc += c;
    }
    (lists, acc as usize)
}

impl PlacedIndex {
    /// An empty index shaped for the free buffers of `inst`.
    pub fn new(inst: &Instance) -> Self {
        let sections = inst.num_sections.max(1);
        // The largest short threshold whose slots fit the memory bound.
        let mut by_span = vec![0usize; SHORT as usize + 1];
        for &i in &inst.free {
            let span = (inst.end[i as usize] - inst.start[i as usize]) as usize;
            if span <= SHORT as usize {
                by_span[span] += span;
            }
        }
        let bound = SLOTS_PER_BUFFER * inst.free.len() + 64;
        let mut short = 0u32;
        let mut slots = 0usize;
        for (span, &slots_of_span) in by_span.iter().enumerate().skip(1) {
            slots += slots_of_span;
            if slots > bound {
                break;
            }
            short = span as u32;
        }
        let mut cover = vec![0u32; sections];
        let mut start = vec![0u32; sections];
        for &i in &inst.free {
            let i = i as usize;
            let (s, e) = (inst.start[i], inst.end[i]);
            start[s as usize] += 1;
            if e - s <= short {
                for c in &mut cover[s as usize..e as usize] {
                    *c += 1;
                }
            }
        }
        let (cover, cover_total) = csr(&cover);
        let (begin, begin_total) = csr(&start);
        let leaves = sections.next_power_of_two();
        PlacedIndex {
            short,
            cover,
            cover_slots: vec![(0, 0); cover_total],
            begin,
            start_slots: vec![(0, 0); begin_total],
            starts: BitTree::new(sections),
            leaves,
            node_head: vec![NIL; 2 * leaves],
            cells: Vec::new(),
            any_long: false,
        }
    }

    /// Forgets every placed buffer.
    pub fn clear(&mut self) {
        self.cover.iter_mut().for_each(|l| l.1 = 0);
        self.begin.iter_mut().for_each(|l| l.1 = 0);
        self.starts.clear();
        if self.any_long {
            self.node_head.fill(NIL);
        }
        self.cells.clear();
        self.any_long = false;
    }

    /// Records a buffer covering sections `[start, end)` placed at `range`.
    pub fn insert(&mut self, range: Range, start: u32, end: u32) {
        let s = start as usize;
        let list = &mut self.begin[s];
        self.start_slots[(list.0 + list.1) as usize] = range;
        list.1 += 1;
        self.starts.set(s);
        if end - start <= self.short {
            for list in &mut self.cover[s..end as usize] {
                self.cover_slots[(list.0 + list.1) as usize] = range;
                list.1 += 1;
            }
            return;
        }
        self.any_long = true;
        let (mut l, mut r) = (s + self.leaves, end as usize + self.leaves);
        while l < r {
            if l & 1 == 1 {
                self.cells.push((range, self.node_head[l]));
                self.node_head[l] = (self.cells.len() - 1) as u32;
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.cells.push((range, self.node_head[r]));
                self.node_head[r] = (self.cells.len() - 1) as u32;
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// Appends the byte range of every recorded buffer overlapping sections `[start, end)` to `out` (each once).
    pub fn overlapping(&self, start: u32, end: u32, out: &mut Vec<Range>) {
        let s = start as usize;
        // Buffers covering section `start`: short ones from its slots, long ones on its tree path.
        let (first, len) = self.cover[s];
        out.extend_from_slice(&self.cover_slots[first as usize..(first + len) as usize]);
        if self.any_long {
            let mut v = s + self.leaves;
            while v >= 1 {
                let mut c = self.node_head[v];
                while c != NIL {
                    let (range, next) = self.cells[c as usize];
                    out.push(range);
                    c = next;
                }
                v >>= 1;
            }
        }
        // Buffers starting strictly inside.
        let mut t = s + 1;
        while let Some(u) = self.starts.next_at_or_after(t) {
            if u >= end as usize {
                break;
            }
            let (first, len) = self.begin[u];
            out.extend_from_slice(&self.start_slots[first as usize..(first + len) as usize]);
            t = u + 1;
        }
    }
}

/// A set of small integers with "next member at or after i" in O(log_64 n).
pub(crate) struct BitTree {
    /// Level 0 holds one bit per member; bit j of level k+1 says whether word j of level k is non-zero.
    levels: Vec<Vec<u64>>,
}

impl BitTree {
    /// An empty set over `0..n`.
    pub fn new(n: usize) -> Self {
        let mut levels = Vec::new();
        let mut len = n.max(1);
        loop {
            let words = len.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            len = words;
        }
        BitTree { levels }
    }

    /// Removes every member.
    pub fn clear(&mut self) {
        for l in &mut self.levels {
            l.fill(0);
        }
    }

    /// Adds `i`.
    pub fn set(&mut self, mut i: usize) {
        for level in &mut self.levels {
            level[i / 64] |= 1u64 << (i % 64);
            i /= 64;
        }
    }

    /// The smallest member `>= i`.
    pub fn next_at_or_after(&self, i: usize) -> Option<usize> {
        self.next_in(0, i)
    }

    fn next_in(&self, level: usize, i: usize) -> Option<usize> {
        let words = &self.levels[level];
        let w = i / 64;
        if w >= words.len() {
            return None;
        }
        let masked = words[w] & (!0u64 << (i % 64));
        if masked != 0 {
            return Some(w * 64 + masked.trailing_zeros() as usize);
        }
        if level + 1 == self.levels.len() {
            return None;
        }
        let next_word = self.next_in(level + 1, w + 1)?;
        Some(next_word * 64 + words[next_word].trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_blocks_answer_as_two_trees_do() {
        // Random disjoint blocks taken and given back: every query of the free blocks (their maps growing past a
        // sorted list's size in some cases) gives the answer of a BTreeMap by offset and a BTreeSet by size.
        use std::collections::{BTreeMap, BTreeSet};
        let mut rng = crate::test_rng::XorShift::new(7);
        for case in 0..40 {
            let mut blocks = FreeBlocks::default();
            let (mut by_off, mut by_size) = (BTreeMap::new(), BTreeSet::new());
            // Blocks on a grid of 16-byte cells so that they stay disjoint: cell k holds [16k, 16k + size).
            let mut held: Vec<Option<u64>> = vec![None; if case % 4 == 0 { 700 } else { 60 }];
            for step in 0..3000 {
                let k = rng.below(held.len() as u64) as usize;
                let off = 16 * k as u64;
                match held[k] {
                    Some(size) => {
                        blocks.remove(off, size);
                        by_off.remove(&off);
                        by_size.remove(&(size, off));
                        held[k] = None;
                    }
                    None => {
                        let size = 1 + rng.below(16);
                        blocks.insert(off, size);
                        by_off.insert(off, size);
                        by_size.insert((size, off));
                        held[k] = Some(size);
                    }
                }
                let cells = held.len() as u64 + 1;
                let q = if step % 2 == 0 { 16 * rng.below(cells) } else { rng.below(16 * cells) };
                let need = 1 + rng.below(17);
                let at = format!("case {case}, step {step}");
                let below = by_off.range(..q).next_back().map(|(&o, &s)| (o, s));
                assert_eq!(blocks.last_below(q), below, "{at}: last below {q}");
                assert_eq!(blocks.size_at(q), by_off.get(&q).copied(), "{at}: size at {q}");
                assert_eq!(blocks.best_fit(need), by_size.range((need, 0)..).next().copied(), "{at}: fit {need}");
            }
        }
    }

    #[test]
    fn bit_tree_finds_next_members() {
        let mut t = BitTree::new(10_000);
        for i in [3, 64, 4095, 4096, 9999] {
            t.set(i);
        }
        assert_eq!(t.next_at_or_after(0), Some(3));
        assert_eq!(t.next_at_or_after(4), Some(64));
        assert_eq!(t.next_at_or_after(65), Some(4095));
        assert_eq!(t.next_at_or_after(4096), Some(4096));
        assert_eq!(t.next_at_or_after(4097), Some(9999));
        assert_eq!(t.next_at_or_after(10_000), None);
        t.clear();
        assert_eq!(t.next_at_or_after(0), None);
    }

    #[test]
    fn online_reuses_freed_blocks_and_coalesces() {
        use crate::memory::pack::Buffer;
        // a [0,2) 4B, b [0,4) 2B, c [2,4) 4B: c takes a's freed block. d [4,6) 6B: a's and b's blocks have
        // coalesced with the top by then, so d starts at 0.
        let bufs = [Buffer::new(0, 2, 4), Buffer::new(0, 4, 2), Buffer::new(2, 4, 4), Buffer::new(4, 6, 6)];
        let inst = Instance::new(&bufs, 1).unwrap();
        let mut off = vec![0u64; inst.len()];
        online(&inst, &mut off).unwrap();
        let by_orig: std::collections::BTreeMap<usize, u64> =
            inst.free.iter().map(|&i| (inst.orig[i as usize], off[i as usize])).collect();
        for (o, want) in [(0, 0), (1, 4), (2, 0), (3, 0)] {
            if let Some(&got) = by_orig.get(&o) {
                assert_eq!(got, want, "buffer {o}");
            }
        }
        // Whatever was pinned, the run is valid: no two live-together free buffers share bytes.
        for (x, &i) in inst.free.iter().enumerate() {
            for &j in &inst.free[x + 1..] {
                let (i, j) = (i as usize, j as usize);
                let time = inst.start[i] < inst.end[j] && inst.start[j] < inst.end[i];
                let space = off[i] < off[j] + inst.size[j] && off[j] < off[i] + inst.size[i];
                assert!(!(time && space), "{i} and {j} overlap");
            }
        }
    }

    #[test]
    fn both_time_indexes_place_every_buffer_at_the_same_offset() {
        // Random instances with long lifetimes (many buffers live at once, where runs switch to unions) and
        // short ones, every order and fit: the two indexes answer with the same gaps, so the runs agree exactly.
        let mut rng = crate::test_rng::XorShift::new(0x9E37_79B9_7F4A_7C15u64);
        let mut next = |m: u64| rng.below(m);
        for round in 0..30 {
            let n = 20 + next(200) as usize;
            let horizon = 10 + next(300);
            let long = round % 2 == 0;
            let bufs: Vec<crate::memory::pack::Buffer> = (0..n)
                .map(|_| {
                    let s = next(horizon);
                    let span = if long { 1 + next(horizon) } else { 1 + next(8) };
                    crate::memory::pack::Buffer::new(s, s + span, 16 * (1 + next(32)))
                })
                .collect();
            let inst = Instance::new(&bufs, 16).unwrap();
            let mut each = Index::Each(PlacedIndex::new(&inst));
            let mut union = Index::Union(Occupancy::new(inst.num_sections));
            for order in Order::ALL {
                for fit in [Fit::Best, Fit::First] {
                    let seq = ordering(&inst, order);
                    let (mut a, mut b) = (vec![0u64; inst.len()], vec![0u64; inst.len()]);
                    run(&inst, &seq, fit, &mut each, &mut a).unwrap();
                    run(&inst, &seq, fit, &mut union, &mut b).unwrap();
                    assert_eq!(a, b, "round {round}, {order} {fit}");
                }
            }
        }
    }

    #[test]
    fn placed_index_matches_brute_force() {
        // Unit buffers make 50 sections; then short and long (more than SHORT sections) buffers.
        let mut spans: Vec<(u64, u64)> = (0..50).map(|t| (t, t + 1)).collect();
        spans.extend([(0, 50), (5, 45), (10, 30), (3, 10), (20, 37), (49, 50), (0, 17)]);
        let bufs: Vec<crate::memory::pack::Buffer> =
            spans.iter().map(|&(s, e)| crate::memory::pack::Buffer::new(s, e, 1)).collect();
        let inst = Instance::new(&bufs, 1).unwrap();
        let mut idx = PlacedIndex::new(&inst);
        for round in 0..2 {
            idx.clear();
            let mut inserted = Vec::new();
            // (0, 50) spans everything and is pinned: the index serves the free buffers only.
            let order =
                (0..bufs.len()).map(|k| (k * 23 + round * 7) % bufs.len()).filter(|&b| inst.free.contains(&(b as u32)));
            for b in order {
                // The "range" (b, b) identifies the buffer.
                idx.insert((b as u64, b as u64), inst.start[b], inst.end[b]);
                inserted.push(b);
                for qs in 0..inst.num_sections as u32 {
                    for qe in qs + 1..=inst.num_sections as u32 {
                        let mut got = Vec::new();
                        idx.overlapping(qs, qe, &mut got);
                        got.sort_unstable();
                        let mut want: Vec<(u64, u64)> = inserted
                            .iter()
                            .filter(|&&j| inst.start[j] < qe && qs < inst.end[j])
                            .map(|&j| (j as u64, j as u64))
                            .collect();
                        want.sort_unstable();
                        assert_eq!(got, want, "round {round}, query [{qs}, {qe})");
                    }
                }
            }
        }
    }

    #[test]
    fn gaps_best_and_first_fit() {
        let occ = [(0, 4), (6, 10), (11, 20), (30, 40)];
        assert_eq!(choose_gap(&occ, 1, Fit::Best), 10);
        assert_eq!(choose_gap(&occ, 1, Fit::First), 4);
        assert_eq!(choose_gap(&occ, 5, Fit::Best), 20);
        assert_eq!(choose_gap(&occ, 11, Fit::Best), 40);
    }

    #[test]
    fn counting_sort_keeps_the_highest_range_per_start_and_matches_the_comparison_sort() {
        let mut slots = Vec::new();
        // Multiples of 4, few slots: the counting pass.
        let mut r = vec![(8, 12), (0, 4), (8, 20), (4, 8), (0, 16)];
        sort_by_start(&mut r, 4, &mut slots);
        assert_eq!(r, vec![(0, 16), (4, 8), (8, 20)]);
        // An offset off the grain: the comparison sort, every range kept.
        let mut r = vec![(8, 12), (2, 4), (0, 4)];
        sort_by_start(&mut r, 4, &mut slots);
        assert_eq!(r, vec![(0, 4), (2, 4), (8, 12)]);
        // Both paths give the same gaps on random ranges.
        let mut rng = crate::test_rng::XorShift::new(0x9E37_79B9_7F4A_7C15);
        for round in 0..200 {
            let k = 1 + round % 40;
            let ranges: Vec<(u64, u64)> = (0..k)
                .map(|_| {
                    let x = rng.next_u64();
                    let lo = (x % 64) * 8;
                    (lo, lo + 8 * (1 + (x >> 20) % 6))
                })
                .collect();
            let mut fast = ranges.clone();
            sort_by_start(&mut fast, 8, &mut slots);
            let mut slow = ranges.clone();
            slow.sort_unstable();
            for size in [8, 16, 40] {
                for fit in [Fit::Best, Fit::First] {
                    assert_eq!(choose_gap(&fast, size, fit), choose_gap(&slow, size, fit), "round {round}");
                }
            }
        }
    }
}
