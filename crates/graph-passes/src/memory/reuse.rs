//! Reuse edges and the concurrency-aware preference between places of equal cost.
//!
//! **Edges** (DESIGN.md section 3): when buffer B takes bytes that buffer A held, every reader of A (its writer,
//! when unread) must happen-before B's writer. Sweeping buffers by start step over an address map of "most
//! recent occupant" finds, for each B, exactly the buffers whose bytes it takes last, in O(n log n) (a tree of
//! ranges), or O(n + slots) where the layout sits on few slots of a power of two (one occupant per slot).
//!
//! **Preference** (`prefer_ordered`): among the places where a buffer fits without raising the pool, prefer one
//! whose previous occupants' readers are all DAG ancestors of its writer, so that reuse adds no ordering the data
//! edges do not already imply (with one stream such edges are free; with several they serialise work). The
//! packer minimises the pool alone; this pass then revisits, in start order, each unit (a buffer, or an in-place
//! chain moving as one) whose current place would add a new ordering, looks at the gaps left by the units live at
//! the same time (within the packed height), and moves it to the best-fitting gap with no new ordering when there
//! is one. A move never raises the pool and keeps the layout valid (gaps exclude every time-overlapping unit at
//! its current place); later units see the moved ones. Each revisit costs O(k log k) for the k units live with it
//! (capped), plus bounded ancestor queries; where the layout sits on slots of a power of two and the pool spans
//! at most a few slots per neighbour, the units already swept and a window of later ones stay counted per slot,
//! and a revisit costs O(slots) plus the units its window gains or loses, with no sort.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::ids::GroupId;
use crate::interval::Interval;
use crate::memory::reach::Reach;

/// Address map: the most recent occupant of each byte of the pool.
///
/// Where every range sits on slots of a power of two and the slots are few (at most four per range plus a
/// few) and the ranges' sizes sum to a few slots each, one occupant per slot in a flat table: a query or an
/// update reads its range's slots, with no tree walk. Otherwise the maximal ranges, each with its occupant, in
/// address order: in a sorted list while they are few ([`RUNS_MAX`]; a binary search and a short move per
/// update), then in a tree, start offset -> (end offset, occupant). All three answer the same (`occupants` and
/// `occupy` below).
enum AddressMap {
    Tree(BTreeMap<u64, (u64, u32)>),
    /// `(start, end, occupant)` of each range, disjoint, by start (none empty).
    Runs(Vec<(u64, u64, u32)>),
    /// `owner[x]`: the occupant of slot `x` (`1 << shift` bytes), `u32::MAX` when none has been placed there.
    Slots {
        shift: u32,
        owner: Vec<u32>,
    },
}

impl AddressMap {
    /// A map for ranges `(offset, size)` that end at most at `height`; any later range must sit on the
    /// same slots (true of a move to a gap between others: its bounds are other ranges' bounds or the height).
    fn for_ranges(ranges: impl Iterator<Item = (u64, u64)> + Clone, height: u64) -> AddressMap {
        let (mut bits, mut count, mut nonempty) = (height, 0u64, true);
        for (offset, size) in ranges.clone() {
            bits |= offset | size;
            count += 1;
            nonempty &= size > 0 && offset.checked_add(size).is_some_and(|e| e <= height);
        }
        let shift = bits.trailing_zeros().min(63);
        let slots = height >> shift;
        let small = nonempty
            && bits != 0
            && slots <= 4 * count + 64
            && ranges
                .map(|(_, size)| size >> shift)
                .try_fold(0u64, |sum, x| sum.checked_add(x))
                .is_some_and(|sum| sum <= 8 * (count + slots));
        if small {
            AddressMap::Slots { shift, owner: vec![u32::MAX; slots as usize] }
        } else if nonempty {
            AddressMap::Runs(Vec::new())
        } else {
            AddressMap::Tree(BTreeMap::new())
        }
    }

    /// Occupants of `[lo, hi)`, ascending and deduplicated, into `out` (cleared first).
    fn occupants(&self, lo: u64, hi: u64, out: &mut Vec<u32>) {
        out.clear();
        match self {
            AddressMap::Tree(map) => {
                if let Some((_, &(e, j))) = map.range(..lo).next_back() {
                    if e > lo {
                        out.push(j);
                    }
                }
                out.extend(map.range(lo..hi).map(|(_, &(_, j))| j));
            }
            AddressMap::Slots { shift, owner } => {
                push_placed(&owner[(lo >> shift) as usize..(hi >> shift) as usize], out);
            }
            AddressMap::Runs(runs) => {
                let (i, j) = overlapping(runs, lo, hi);
                out.extend(runs[i..j].iter().map(|r| r.2));
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// Make `who` the occupant of `[lo, hi)`; the previous occupants go to `displaced` (cleared first),
    /// ascending and deduplicated. `starts` is scratch space.
    fn occupy(&mut self, lo: u64, hi: u64, who: u32, displaced: &mut Vec<u32>, starts: &mut Vec<u64>) {
        displaced.clear();
        match self {
            AddressMap::Slots { shift, owner } => {
                let slots = &mut owner[(lo >> *shift) as usize..(hi >> *shift) as usize];
                push_placed(slots, displaced);
                slots.fill(who);
            }
            AddressMap::Tree(map) => {
                starts.clear();
                if let Some((&s, &(e, _))) = map.range(..lo).next_back() {
                    if e > lo {
                        starts.push(s);
                    }
                }
                starts.extend(map.range(lo..hi).map(|(&s, _)| s));
                for &s in starts.iter() {
                    if let Some((e, j)) = map.remove(&s) {
                        displaced.push(j);
                        if s < lo {
                            map.insert(s, (lo, j));
                        }
                        if e > hi {
                            map.insert(hi, (e, j));
                        }
                    }
                }
                map.insert(lo, (hi, who));
            }
            AddressMap::Runs(runs) => {
                let (i, j) = overlapping(runs, lo, hi);
                displaced.extend(runs[i..j].iter().map(|r| r.2));
                // The first and last runs met may stick out below `lo` and above `hi`: those parts stay theirs.
                let (first, last) = (runs[i..j].first(), runs[i..j].last());
                let before = first.filter(|r| r.0 < lo).map(|r| (r.0, lo, r.2));
                let after = last.filter(|r| r.1 > hi).map(|r| (hi, r.1, r.2));
                runs.splice(i..j, before.into_iter().chain([(lo, hi, who)]).chain(after));
                if runs.len() > RUNS_MAX {
                    *self = AddressMap::Tree(runs.iter().map(|&(s, e, j)| (s, (e, j))).collect());
                }
            }
        }
        displaced.sort_unstable();
        displaced.dedup();
    }
}

/// Ranges up to which [`AddressMap::Runs`] keeps them in a list (an update moves at most this many).
const RUNS_MAX: usize = 256;

/// The runs meeting `[lo, hi)`: `runs[i..j]` (disjoint and by start, so their ends are by start too).
fn overlapping(runs: &[(u64, u64, u32)], lo: u64, hi: u64) -> (usize, usize) {
    let i = runs.partition_point(|r| r.1 <= lo);
    let j = i + runs[i..].partition_point(|r| r.0 < hi);
    (i, j)
}

/// The occupants of a run of slots onto `out`, each once per stretch of slots it holds (empty slots skipped).
fn push_placed(slots: &[u32], out: &mut Vec<u32>) {
    let mut last = u32::MAX;
    for &j in slots {
        if j != last && j != u32::MAX {
            out.push(j);
        }
        last = j;
    }
}

/// A buffer as the edge sweep sees it.
pub(crate) struct SweepBuffer<'a> {
    /// Live steps `[start, end)`.
    pub live: Interval,
    /// Offset and aligned size.
    pub offset: u64,
    /// Aligned size.
    pub size: u64,
    /// The groups that write it (several for an eliminated Concat's output: every slot's producer).
    pub writers: &'a [GroupId],
    /// Groups that must finish before its bytes are taken (its readers, or its writer when unread).
    pub froms: &'a [GroupId],
}

/// For each buffer, the buffers whose bytes it takes last, as `(from, to)` group edges (from != to), sorted and
/// deduplicated.
pub(crate) fn edges(buffers: &[SweepBuffer<'_>]) -> Vec<(GroupId, GroupId)> {
    let by_start = crate::counting::indices_by_key(buffers.len(), |i| u64::from(buffers[i].live.start));
    let height = buffers.iter().map(|b| b.offset.saturating_add(b.size)).max().unwrap_or(0);
    let mut map = AddressMap::for_ranges(buffers.iter().map(|b| (b.offset, b.size)), height);
    let mut out = Vec::new();
    let (mut displaced, mut starts) = (Vec::new(), Vec::new());
    for &i in &by_start {
        let b = &buffers[i];
        map.occupy(b.offset, b.offset + b.size, i as u32, &mut displaced, &mut starts);
        for &j in &displaced {
            for &from in buffers[j as usize].froms {
                for &w in b.writers {
                    if from != w {
                        out.push((from, w));
                    }
                }
            }
        }
    }
    // In (from, to) order: two stable counting passes, on `to` then on `from`, when the groups are few enough.
    let counted = crate::counting::sort_small(&mut out, |e| e.1.index() as u64)
        && crate::counting::sort_small(&mut out, |e| e.0.index() as u64);
    if !counted {
        out.sort_unstable();
    }
    out.dedup();
    out
}

/// A unit of placement: a buffer, or an in-place chain whose members share one offset.
#[derive(Clone, Debug)]
pub(crate) struct Unit<'a> {
    /// Live steps of the whole chain.
    pub live: Interval,
    /// Aligned size.
    pub size: u64,
    /// Offset in the pool.
    pub offset: u64,
    /// Writers of the first member (the ones that take the bytes).
    pub writers: &'a [GroupId],
    /// Groups that must finish before the bytes are taken from the last member.
    pub froms: &'a [GroupId],
}

/// Units live with one unit that a revisit may look at; above it the unit stays where it is.
const MAX_NEIGHBOURS: usize = 4096;
/// Gaps tried per revisit.
const MAX_GAPS: usize = 64;

/// What the preference pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PreferStats {
    /// Units whose place would have added an ordering.
    pub revisited: usize,
    /// Units moved to a place with none.
    pub moved: usize,
}

/// Move units whose place adds orderings to equally good places that add none (see the module docs). `height`
/// is the pool size the packer reached; no unit ends above it.
pub(crate) fn prefer_ordered(units: &mut [Unit<'_>], height: u64, reach: &mut Reach<'_>, budget: u64) -> PreferStats {
    let n = units.len();
    let by_start = crate::counting::indices_by_key(n, |i| u64::from(units[i].live.start));
    let mut map = AddressMap::for_ranges(units.iter().map(|u| (u.offset, u.size)), height);
    // Units already swept that may still be live, `(end, unit)`, earliest end first: a unit whose end has
    // passed stays until the next revisit pops it (start steps only grow), so a revisit drops the ended ones
    // without walking the live ones. Only the set of neighbours matters, not its order (their ranges are
    // counted per slot or sorted by address below).
    let mut active: BinaryHeap<Reverse<(u32, usize)>> = BinaryHeap::new();
    let mut stats = PreferStats::default();
    let mut work_left = budget;
    // The active units' byte ranges are also kept as coverage changes per slot (`Gaps`), where the layout
    // allows, so that a revisit beside thousands of them (a random DAG's long lifetimes) adds only the later
    // ones and scans the slots, with no sort.
    let mut free = Gaps::new(units, height);
    let (mut here, mut occ, mut scratch_d, mut scratch_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let adds_order = |reach: &mut Reach<'_>, units: &[Unit<'_>], occupants: &[u32], writers: &[GroupId]| {
        occupants
            .iter()
            .any(|&j| units[j as usize].froms.iter().any(|&f| writers.iter().any(|&w| !reach.ordered(f, w))))
    };
    let range = |u: &Unit<'_>| (u.offset, u.offset + u.size);
    // `free` counts the active units and the window `by_start[k + 1..window]` of later ones, moved at each
    // revisit to the later units beside it: each unit enters and leaves at most as often as the window's end
    // passes it, not once per revisit. A unit leaves the window when its turn comes (its place may change).
    let mut window = 0usize;
    // The slots of each unit's range, by start position: the window walks them in that order, so they are read
    // in sequence instead of from the units (empty on the sorting path, where coverage is not counted). A unit
    // leaves the window at its own turn, before it may move, so its entry stays right while it is read.
    let at: Vec<(u32, u32)> = if free.cover.is_empty() {
        Vec::new()
    } else {
        by_start.iter().map(|&j| free.slots(range(&units[j]))).collect()
    };
    for (k, &i) in by_start.iter().enumerate() {
        if let Some(&x) = at.get(k).filter(|_| k < window) {
            free.cover_slots(x, -1);
        }
        window = window.max(k + 1);
        let Interval { start, end } = units[i].live;
        let (size, writer) = (units[i].size, units[i].writers);
        map.occupants(units[i].offset, units[i].offset + size, &mut here);
        if work_left > 0 && adds_order(reach, units, &here, writer) {
            stats.revisited += 1;
            // Every unit live at the same time as this one: the active ones (dropping those that ended) and the
            // later ones that start before it ends (a prefix of the rest, by start).
            while let Some(&Reverse((e, j))) = active.peek() {
                if e > start {
                    break;
                }
                active.pop();
                free.cover(range(&units[j]), -1);
            }
            let later_end = k + 1 + by_start[k + 1..].partition_point(|&j| units[j].live.start < end);
            let later = &by_start[k + 1..later_end];
            let neighbours = (active.len() + later.len()).min(MAX_NEIGHBOURS + 1);
            work_left = work_left.saturating_sub(neighbours as u64 + 1);
            if neighbours <= MAX_NEIGHBOURS {
                for &x in at.get(window..later_end).unwrap_or_default() {
                    free.cover_slots(x, 1);
                }
                for &x in at.get(later_end..window).unwrap_or_default() {
                    free.cover_slots(x, -1);
                }
                window = later_end;
                let gaps = if free.counts(neighbours) {
                    free.counted()
                } else {
                    free.sorted(active.iter().map(|r| r.0 .1).chain(later.iter().copied()).map(|j| range(&units[j])))
                };
                let mut best: Option<(u64, u64)> = None; // (gap length, offset)
                for &(lo, hi) in gaps.iter().filter(|&&(lo, hi)| hi - lo >= size).take(MAX_GAPS) {
                    let len = hi - lo;
                    for off in [lo, hi - size] {
                        if best.is_some_and(|(l, o)| (l, o) <= (len, off)) {
                            continue;
                        }
                        map.occupants(off, off + size, &mut occ);
                        if !adds_order(reach, units, &occ, writer) {
                            best = Some((len, off));
                        }
                    }
                }
                if let Some((_, off)) = best {
                    units[i].offset = off;
                    stats.moved += 1;
                }
            }
        }
        map.occupy(units[i].offset, units[i].offset + size, i as u32, &mut scratch_d, &mut scratch_s);
        free.cover(range(&units[i]), 1);
        active.push(Reverse((end, i)));
    }
    stats
}

/// The free byte ranges below the pool's height among placed units, for the ordered-reuse preference.
///
/// Offsets are sums of unit sizes, so their bounds are multiples of the largest power of two dividing every
/// size, and a move keeps them so (a gap's bounds are other units' bounds or the height). When that holds (and
/// the height spans at most four such slots per unit, plus a few), `cover` holds the coverage changes per slot
/// of the units the caller adds (and takes out again), and the gaps among them are one scan of the slots,
/// however many they are. Otherwise (or beside few units, where a sort is cheaper than the scan) the ranges are
/// sorted.
struct Gaps {
    height: u64,
    /// Slots are `1 << shift` bytes.
    shift: u32,
    /// Coverage changes per slot (empty when the units do not fit the counting path).
    cover: Vec<i32>,
    /// The ranges, sorted (the comparison path).
    sorted: Vec<(u64, u64)>,
    /// The gaps found, `[lo, hi)` in address order.
    gaps: Vec<(u64, u64)>,
}

impl Gaps {
    fn new(units: &[Unit<'_>], height: u64) -> Gaps {
        let shift = units.iter().fold(0u64, |bits, u| bits | u.size).trailing_zeros().min(63);
        let mask = (1u64 << shift) - 1;
        let counting = height >> shift <= 4 * units.len() as u64 + 64
            && height & mask == 0
            && units.iter().all(|u| u.size > 0 && u.offset & mask == 0 && u.offset + u.size <= height);
        let cover = if counting { vec![0; (height >> shift) as usize + 1] } else { Vec::new() };
        Gaps { height, shift, cover, sorted: Vec::new(), gaps: Vec::new() }
    }

    /// Add (`delta` 1) or remove (-1) a unit's byte range from the coverage (nothing on the sorting path).
    fn cover(&mut self, range: (u64, u64), delta: i32) {
        self.cover_slots(self.slots(range), delta);
    }

    /// The first slot of a byte range and the slot just past it (on the counting path).
    fn slots(&self, (lo, hi): (u64, u64)) -> (u32, u32) {
        ((lo >> self.shift) as u32, (hi >> self.shift) as u32)
    }

    /// [`Gaps::cover`] of a range given by its [`Gaps::slots`] (the counting path only).
    fn cover_slots(&mut self, (lo, hi): (u32, u32), delta: i32) {
        if let Some(c) = self.cover.get_mut(lo as usize) {
            *c += delta;
        }
        if let Some(c) = self.cover.get_mut(hi as usize) {
            *c -= delta;
        }
    }

    /// Whether the gaps among `neighbours` ranges are cheaper to count than to sort.
    fn counts(&self, neighbours: usize) -> bool {
        !self.cover.is_empty() && self.cover.len() as u64 <= 4 * neighbours as u64 + 65
    }

    /// The gaps among the covered ranges: maximal ranges of `[0, height)` that none covers, in address order.
    ///
    /// Only slots with a change can open or close a gap, and most have none (at most two per range among four
    /// slots per neighbour), so blocks of slots without one are passed over with one test each.
    fn counted(&mut self) -> &[(u64, u64)] {
        /// Slots tested at once for a change (a few vector operations).
        const BLOCK: usize = 16;
        let Gaps { height, shift, cover, gaps, .. } = self;
        gaps.clear();
        let (mut depth, mut open) = (0i32, Some(0u64));
        let mut change = |x: usize, c: i32| {
            let at = (x as u64) << *shift;
            let was = depth;
            depth += c;
            if was == 0 && depth != 0 {
                if let Some(lo) = open.take().filter(|&lo| lo < at) {
                    gaps.push((lo, at));
                }
            } else if was != 0 && depth == 0 {
                open = Some(at);
            }
        };
        let mut blocks = cover.chunks_exact(BLOCK);
        for (b, block) in blocks.by_ref().enumerate() {
            if block.iter().fold(0, |any, &c| any | c) != 0 {
                for (k, &c) in block.iter().enumerate() {
                    if c != 0 {
                        change(b * BLOCK + k, c);
                    }
                }
            }
        }
        let rest = blocks.remainder();
        let base = cover.len() - rest.len();
        for (k, &c) in rest.iter().enumerate() {
            if c != 0 {
                change(base + k, c);
            }
        }
        if let Some(lo) = open.filter(|&lo| lo < *height) {
            gaps.push((lo, *height));
        }
        gaps
    }

    /// The gaps among `ranges` below the height, by a scan of them sorted: between consecutive ranges (an empty
    /// range splits the gap it lies in) and up to the height.
    fn sorted(&mut self, ranges: impl Iterator<Item = (u64, u64)>) -> &[(u64, u64)] {
        self.sorted.clear();
        self.sorted.extend(ranges);
        self.sorted.sort_unstable();
        self.gaps.clear();
        let mut cursor = 0u64;
        for &(lo, hi) in self.sorted.iter().chain(std::iter::once(&(self.height, self.height))) {
            if lo > cursor {
                self.gaps.push((cursor, lo));
            }
            cursor = cursor.max(hi);
        }
        &self.gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_graph::GroupGraph;

    fn g(i: u32) -> GroupId {
        GroupId(i)
    }

    #[test]
    fn counted_gaps_are_the_sorted_scans_gaps() {
        // Random layouts on 256-byte slots (and on 768-byte sizes: slots of their largest power-of-two
        // divisor). Each counted answer is the gap list a scan of all ranges sorted gives, and the coverage is
        // empty again after removing the units.
        let mut rng = crate::test_rng::XorShift::new(11);
        for case in 0..300 {
            let unit = if case % 3 == 0 { 768 } else { 256 };
            let n = 1 + rng.below(40) as usize;
            // At most four slots per unit plus a few: 768-byte units count in 256-byte slots.
            let height = unit * (1 + rng.below(if unit == 256 { 3 * n as u64 + 8 } else { n as u64 + 8 }));
            let units: Vec<Unit<'_>> = (0..n)
                .map(|_| {
                    let size = unit * (1 + rng.below(4));
                    let offset = unit * rng.below((height.saturating_sub(size) / unit) + 1);
                    Unit { live: Interval::new(0, 1), size: size.min(height), offset, writers: &[], froms: &[] }
                })
                .collect();
            let mut free = Gaps::new(&units, height);
            assert!(!free.cover.is_empty(), "case {case}: aligned units take the counting path");
            let split = rng.below(n as u64 + 1) as usize;
            let range = |u: &Unit<'_>| (u.offset, u.offset + u.size);
            // All added, some taken out and put back (as units leave and re-enter the window), then all
            // removed.
            for u in &units {
                free.cover(range(u), 1);
            }
            for u in &units[..split] {
                free.cover(range(u), -1);
            }
            for u in &units[..split] {
                free.cover(range(u), 1);
            }
            let counted = free.counted().to_vec();
            let sorted = free.sorted(units.iter().map(range)).to_vec();
            assert_eq!(counted, sorted, "case {case}");
            for u in &units {
                free.cover(range(u), -1);
            }
            assert!(free.cover.iter().all(|&c| c == 0), "case {case}: coverage left behind");
        }
        // A unit off the slots (or an empty one) sends every revisit to the sort.
        let odd = [Unit { live: Interval::new(0, 1), size: 256, offset: 128, writers: &[], froms: &[] }];
        assert!(Gaps::new(&odd, 512).cover.is_empty());
        let empty = [Unit { live: Interval::new(0, 1), size: 0, offset: 0, writers: &[], froms: &[] }];
        assert!(Gaps::new(&empty, 512).cover.is_empty());
        // The sort's scan: gaps between ranges and up to the height, an empty range splitting its gap.
        let mut free = Gaps::new(&odd, 512);
        assert_eq!(free.sorted([(128, 384), (448, 448)].into_iter()), &[(0, 128), (384, 448), (448, 512)]);
    }

    /// Occupy `ranges` in turn (range `i` by occupant `i`) in `map` and in a tree, asking both before each step
    /// for the occupants of a range from `query`: every answer and every displaced list must agree.
    fn answers_as_the_tree(
        case: usize,
        map: &mut AddressMap,
        ranges: &[(u64, u64)],
        mut query: impl FnMut() -> (u64, u64),
    ) {
        let mut tree = AddressMap::Tree(BTreeMap::new());
        let (mut a, mut b, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
        for (who, &(lo, size)) in ranges.iter().enumerate() {
            let (q, q_end) = query();
            map.occupants(q, q_end, &mut a);
            tree.occupants(q, q_end, &mut b);
            assert_eq!(a, b, "case {case}: occupants of [{q}, {q_end})");
            map.occupy(lo, lo + size, who as u32, &mut a, &mut scratch);
            tree.occupy(lo, lo + size, who as u32, &mut b, &mut scratch);
            assert_eq!(a, b, "case {case}: displaced by [{lo}, {})", lo + size);
        }
    }

    #[test]
    fn slot_table_answers_as_the_tree_does() {
        // Random sweeps of ranges on 256-byte slots: every query and every update of the slot table gives the
        // tree's answer, including ranges that split or cover earlier ones.
        let mut rng = crate::test_rng::XorShift::new(5);
        for case in 0..300 {
            let n = 1 + rng.below(30) as usize;
            let height = 256 * (1 + rng.below(2 * n as u64 + 8));
            let ranges: Vec<(u64, u64)> = (0..n)
                .map(|_| {
                    let size = 256 * (1 + rng.below(3)).min(height / 256);
                    (256 * rng.below((height - size) / 256 + 1), size)
                })
                .collect();
            let mut slots = AddressMap::for_ranges(ranges.iter().copied(), height);
            assert!(matches!(slots, AddressMap::Slots { .. }), "case {case}: aligned ranges take the slot table");
            answers_as_the_tree(case, &mut slots, &ranges, || {
                let q = 256 * rng.below(height / 256);
                (q, (q + 256 * (1 + rng.below(4))).min(height))
            });
        }
        // Ranges off the slots or too many slots for the ranges take the sorted list; an empty range or one past
        // the height, the tree.
        assert!(matches!(AddressMap::for_ranges([(128, 256)].into_iter(), 512), AddressMap::Slots { shift: 7, .. }));
        assert!(matches!(AddressMap::for_ranges([(0, 0), (0, 256)].into_iter(), 512), AddressMap::Tree(_)));
        assert!(matches!(AddressMap::for_ranges([(0, 256)].into_iter(), 256 * 1024), AddressMap::Runs(_)));
        assert!(matches!(AddressMap::for_ranges([(0, 512)].into_iter(), 256), AddressMap::Tree(_)));
    }

    #[test]
    fn sorted_runs_answer_as_the_tree_does() {
        // Random sweeps of unaligned ranges: every query and update of the sorted list gives the tree's answer,
        // through its change to a tree past `RUNS_MAX` ranges.
        let mut rng = crate::test_rng::XorShift::new(11);
        let mut grew = 0;
        for case in 0..200 {
            let n = 1 + rng.below(if case % 4 == 0 { 2000 } else { 40 }) as usize;
            let height = 1 + rng.below(64 * n as u64 + 100);
            let ranges: Vec<(u64, u64)> = (0..n)
                .map(|_| {
                    let most = 1 + rng.below(600);
                    let size = 1 + rng.below(height.min(most));
                    (rng.below(height - size + 1), size)
                })
                .collect();
            let mut runs = AddressMap::for_ranges(ranges.iter().copied(), height);
            if matches!(runs, AddressMap::Slots { .. }) {
                continue;
            }
            assert!(matches!(runs, AddressMap::Runs(_)), "case {case}: non-empty ranges start as a list");
            answers_as_the_tree(case, &mut runs, &ranges, || {
                let q = rng.below(height);
                (q, (q + 1 + rng.below(300)).min(height))
            });
            grew += usize::from(matches!(runs, AddressMap::Tree(_)));
        }
        assert!(grew > 0, "no case passed RUNS_MAX ranges");
        assert!(matches!(AddressMap::for_ranges([(0, 300), (5, 7)].into_iter(), 512), AddressMap::Runs(_)));
    }

    #[test]
    fn sweep_finds_last_occupants_only() {
        // a [0,2) at 0, b [2,4) at 0 (takes a's bytes), c [4,6) at 0 (takes b's, not a's).
        let r0 = [g(1)];
        let r1 = [g(3)];
        let r2 = [g(5)];
        let bufs = [
            SweepBuffer { live: Interval::new(0, 2), offset: 0, size: 256, writers: &[GroupId(0)], froms: &r0 },
            SweepBuffer { live: Interval::new(2, 4), offset: 0, size: 256, writers: &[GroupId(2)], froms: &r1 },
            SweepBuffer { live: Interval::new(4, 6), offset: 0, size: 256, writers: &[GroupId(4)], froms: &r2 },
        ];
        assert_eq!(edges(&bufs), vec![(g(1), g(2)), (g(3), g(4))]);
    }

    #[test]
    fn a_unit_moves_to_a_gap_its_writer_already_follows_and_every_writer_counts() {
        // Groups: 0 -> 1 -> 3 and 0 -> 2 (a side branch). Units (froms are the groups that must finish first):
        // A [0,1) froms {1} at 0; B [0,1) froms {2} at 256; C [1,2) writer 3 at 256 (takes B's bytes).
        // 2 is not an ancestor of 3, 1 is: C should move to offset 0 (A's bytes).
        let dag = GroupGraph::from_preds(vec![vec![], vec![g(0)], vec![g(0)], vec![g(1)]]);
        let mut reach = Reach::new(&dag, 64);
        let mut units = vec![
            Unit { live: Interval::new(0, 1), size: 256, offset: 0, writers: &[GroupId(1)], froms: &[GroupId(1)] },
            Unit { live: Interval::new(0, 1), size: 256, offset: 256, writers: &[GroupId(2)], froms: &[GroupId(2)] },
            Unit { live: Interval::new(1, 2), size: 256, offset: 256, writers: &[GroupId(3)], froms: &[GroupId(3)] },
        ];
        let s = prefer_ordered(&mut units, 512, &mut reach, u64::MAX);
        assert_eq!(s, PreferStats { revisited: 1, moved: 1 });
        assert_eq!(units[2].offset, 0);
    }

    #[test]
    fn a_buffer_with_several_writers_is_ordered_after_each() {
        // An eliminated Concat's output written by groups 2 and 3 takes the bytes a buffer read by 1 held:
        // both writers must follow 1.
        let r0 = [g(1)];
        let r1 = [g(4)];
        let bufs = [
            SweepBuffer { live: Interval::new(0, 2), offset: 0, size: 512, writers: &[GroupId(0)], froms: &r0 },
            SweepBuffer {
                live: Interval::new(2, 5),
                offset: 0,
                size: 512,
                writers: &[GroupId(2), GroupId(3)],
                froms: &r1,
            },
        ];
        assert_eq!(edges(&bufs), vec![(g(1), g(2)), (g(1), g(3))]);
    }
}
