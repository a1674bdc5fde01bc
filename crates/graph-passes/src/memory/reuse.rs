//! Reuse edges and the concurrency-aware preference between places of equal cost.
//!
//! **Edges** (DESIGN.md section 3): when buffer B takes bytes that buffer A held, every reader of A (its writer,
//! when unread) must happen-before B's writer. Sweeping buffers by start step over an address map of "most
//! recent occupant" finds, for each B, exactly the buffers whose bytes it takes last, in O(n log n).
//!
//! **Preference** (`prefer_ordered`): among the places where a buffer fits without raising the pool, prefer one
//! whose previous occupants' readers are all DAG ancestors of its writer, so that reuse adds no ordering the data
//! edges do not already imply (with one stream such edges are free; with several they serialise work). The
//! packer minimises the pool alone; this pass then revisits, in start order, each unit (a buffer, or an in-place
//! chain moving as one) whose current place would add a new ordering, looks at the gaps left by the units live at
//! the same time (within the packed height), and moves it to the best-fitting gap with no new ordering when there
//! is one. A move never raises the pool and keeps the layout valid (gaps exclude every time-overlapping unit at
//! its current place); later units see the moved ones. Each revisit costs O(k log k) for the k units live with it
//! (capped), plus bounded ancestor queries.

use std::collections::BTreeMap;

use crate::ids::GroupId;
use crate::interval::Interval;
use crate::memory::reach::Reach;

/// Address map: start offset -> (end offset, occupant) of the most recent occupant of each byte range.
#[derive(Default)]
struct AddressMap {
    map: BTreeMap<u64, (u64, u32)>,
}

impl AddressMap {
    /// Occupants of `[lo, hi)`, ascending and deduplicated, into `out` (cleared first).
    fn occupants(&self, lo: u64, hi: u64, out: &mut Vec<u32>) {
        out.clear();
        if let Some((_, &(e, j))) = self.map.range(..lo).next_back() {
            if e > lo {
                out.push(j);
            }
        }
        out.extend(self.map.range(lo..hi).map(|(_, &(_, j))| j));
        out.sort_unstable();
        out.dedup();
    }

    /// Make `who` the occupant of `[lo, hi)`; the previous occupants go to `displaced` (cleared first),
    /// ascending and deduplicated. `starts` is scratch space.
    fn occupy(&mut self, lo: u64, hi: u64, who: u32, displaced: &mut Vec<u32>, starts: &mut Vec<u64>) {
        starts.clear();
        displaced.clear();
        if let Some((&s, &(e, _))) = self.map.range(..lo).next_back() {
            if e > lo {
                starts.push(s);
            }
        }
        starts.extend(self.map.range(lo..hi).map(|(&s, _)| s));
        for &s in starts.iter() {
            if let Some((e, j)) = self.map.remove(&s) {
                displaced.push(j);
                if s < lo {
                    self.map.insert(s, (lo, j));
                }
                if e > hi {
                    self.map.insert(hi, (e, j));
                }
            }
        }
        self.map.insert(lo, (hi, who));
        displaced.sort_unstable();
        displaced.dedup();
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
    let mut by_start: Vec<usize> = (0..buffers.len()).collect();
    by_start.sort_by_key(|&i| (buffers[i].live.start, i));
    let mut map = AddressMap::default();
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
    out.sort_unstable();
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
    let mut by_start: Vec<usize> = (0..n).collect();
    by_start.sort_by_key(|&i| (units[i].live.start, i));
    let mut map = AddressMap::default();
    // Units already swept that may still be live, `(end, unit)`, in no order: a unit whose end has passed
    // stays until the next revisit drops it, since start steps only grow. Only the set of neighbours matters,
    // not its order (their ranges are sorted by address below).
    let mut active: Vec<(u32, usize)> = Vec::new();
    let mut stats = PreferStats::default();
    let mut work_left = budget;
    // Offsets are sums of unit sizes: multiples of their common divisor (`sort_by_start` checks it).
    let grain = units.iter().fold(0u64, |g, u| crate::memory::pack::gcd(g, u.size));
    let (mut slots, mut taken) = (Vec::new(), Vec::new());
    let (mut here, mut occ, mut scratch_d, mut scratch_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let adds_order = |reach: &mut Reach<'_>, units: &[Unit<'_>], occupants: &[u32], writers: &[GroupId]| {
        occupants
            .iter()
            .any(|&j| units[j as usize].froms.iter().any(|&f| writers.iter().any(|&w| !reach.ordered(f, w))))
    };
    for (k, &i) in by_start.iter().enumerate() {
        let Interval { start, end } = units[i].live;
        let (size, writer) = (units[i].size, units[i].writers);
        map.occupants(units[i].offset, units[i].offset + size, &mut here);
        if work_left > 0 && adds_order(reach, units, &here, writer) {
            stats.revisited += 1;
            // Byte ranges of every unit live at the same time as this one: the active ones (dropping those that
            // ended) and the later ones that start before it ends.
            active.retain(|&(e, _)| e > start);
            let later = by_start[k + 1..].iter().take_while(|&&j| units[j].live.start < end);
            let range = |j: usize| (units[j].offset, units[j].offset + units[j].size);
            taken.clear();
            taken
                .extend(active.iter().map(|&(_, j)| range(j)).chain(later.map(|&j| range(j))).take(MAX_NEIGHBOURS + 1));
            work_left = work_left.saturating_sub(taken.len() as u64 + 1);
            if taken.len() <= MAX_NEIGHBOURS {
                crate::memory::pack::sort_by_start(&mut taken, grain, &mut slots);
                let mut best: Option<(u64, u64)> = None; // (gap length, offset)
                let mut cursor = 0u64;
                let mut gaps = 0usize;
                for &(lo, hi) in taken.iter().chain(std::iter::once(&(height, height))) {
                    if lo > cursor && lo - cursor >= size && gaps < MAX_GAPS {
                        gaps += 1;
                        let len = lo - cursor;
                        for off in [cursor, lo - size] {
                            if best.is_some_and(|(l, o)| (l, o) <= (len, off)) {
                                continue;
                            }
                            map.occupants(off, off + size, &mut occ);
                            if !adds_order(reach, units, &occ, writer) {
                                best = Some((len, off));
                            }
                        }
                    }
                    cursor = cursor.max(hi);
                }
                if let Some((_, off)) = best {
                    units[i].offset = off;
                    stats.moved += 1;
                }
            }
        }
        map.occupy(units[i].offset, units[i].offset + size, i as u32, &mut scratch_d, &mut scratch_s);
        active.push((end, i));
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_graph::GroupGraph;

    fn g(i: u32) -> GroupId {
        GroupId(i)
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
