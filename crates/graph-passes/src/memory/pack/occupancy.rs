//! The occupied bytes of a greedy run, by time: a segment tree over sections whose nodes hold *unions* of byte
//! ranges, so that a query returns the occupied bytes of a time window as a few merged ranges instead of one
//! range per placed buffer.
//!
//! A gap search needs only the union of the byte ranges placed over its window (`choose_gap` reads gaps between
//! occupied runs and the top of the highest one). On a random DAG thousands of placed buffers overlap a long
//! lifetime and listing each makes a run O(n k) for k overlapping buffers; merged where they are recorded, a
//! query costs the size of a few unions instead. The unions stay fragmented (on random DAGs of 10k-30k nodes
//! about half as many runs as buffers), so the gain is 1.2-1.6x there, and below about 256 buffers live at once
//! the per-buffer index is faster (`greedy.rs` picks one per instance).
//!
//! Each node `v` (over a range of sections) keeps:
//! - `cover[v]`: the union of the buffers whose canonical decomposition holds `v` (they cover all of `v`);
//! - `any[v]`: the union of `cover` over `v`'s subtree (every buffer with a canonical node under `v`).
//!
//! A buffer over `[s, e)` goes into `cover` and `any` of its canonical nodes and into `any` of the nodes that
//! overlap `[s, e)` only in part (exactly the canonical nodes' strict ancestors). A query over `[s, e)` reads
//! `any` of its canonical nodes and `cover` of the nodes that overlap it in part: a buffer overlapping the window
//! has a canonical node that lies either under one of the window's canonical nodes or strictly above one (and
//! then overlaps the window in part). O(log T) unions per operation, found as in a bottom-up segment tree with
//! lazy updates.

use super::greedy::Range;

/// No list.
const NIL: u32 = u32::MAX;

/// See the module docs. Lists live in one arena, so an untouched node costs 8 bytes (its two list numbers).
pub(crate) struct Occupancy {
    /// Leaves of the tree (a power of two, at least the number of sections).
    leaves: usize,
    /// Per node, its `cover` and `any` lists' numbers in `lists` (`NIL`: empty).
    cover: Vec<u32>,
    any: Vec<u32>,
    /// The lists; the first `used` are in use, the rest are cleared lists kept for their capacity.
    lists: Vec<Vec<Range>>,
    used: usize,
    /// Nodes with a list (reset by [`Occupancy::clear`]).
    touched: Vec<u32>,
}

impl Occupancy {
    /// An empty index over `sections` time sections.
    pub fn new(sections: usize) -> Self {
        let leaves = sections.max(1).next_power_of_two();
        Occupancy {
            leaves,
            cover: vec![NIL; 2 * leaves],
            any: vec![NIL; 2 * leaves],
            lists: Vec::new(),
            used: 0,
            touched: Vec::new(),
        }
    }

    /// Forgets every placed buffer.
    pub fn clear(&mut self) {
        for &v in &self.touched {
            self.cover[v as usize] = NIL;
            self.any[v as usize] = NIL;
        }
        self.touched.clear();
        self.used = 0;
    }

    /// A cleared list from the arena, by number.
    fn fresh_list(&mut self) -> u32 {
        if self.used == self.lists.len() {
            self.lists.push(Vec::new());
        }
        self.lists[self.used].clear();
        self.used += 1;
        (self.used - 1) as u32
    }

    /// The number of node `v`'s `cover` (`any == false`) or `any` list, given one if it has none.
    fn list_of(&mut self, v: usize, any: bool) -> usize {
        let cur = if any { self.any[v] } else { self.cover[v] };
        if cur != NIL {
            return cur as usize;
        }
        if self.cover[v] == NIL && self.any[v] == NIL {
            self.touched.push(v as u32);
        }
        let k = self.fresh_list();
        if any {
            self.any[v] = k;
        } else {
            self.cover[v] = k;
        }
        k as usize
    }

    fn list(&self, k: u32) -> &[Range] {
        if k == NIL {
            &[]
        } else {
            &self.lists[k as usize]
        }
    }

    /// Records bytes `range` (non-empty) occupied over sections `[start, end)` (`start < end`).
    pub fn insert(&mut self, range: Range, start: u32, end: u32) {
        let leaves = self.leaves;
        canonical_nodes(leaves, start, end, |v| self.record_canonical(v, range));
        partial_nodes(leaves, start, end, |v| self.record_any(v, range));
    }

    fn record_any(&mut self, v: usize, range: Range) {
        let k = self.list_of(v, true);
        union_insert(&mut self.lists[k], range);
    }

    fn record_canonical(&mut self, v: usize, range: Range) {
        let k = self.list_of(v, false);
        union_insert(&mut self.lists[k], range);
        self.record_any(v, range);
    }

    /// Appends byte ranges whose union is exactly the bytes occupied at some section of `[start, end)`
    /// (`start < end`) to `out`: sorted within each recorded union, overlapping across them.
    pub fn overlapping(&self, start: u32, end: u32, out: &mut Vec<Range>) {
        canonical_nodes(self.leaves, start, end, |v| out.extend_from_slice(self.list(self.any[v])));
        partial_nodes(self.leaves, start, end, |v| out.extend_from_slice(self.list(self.cover[v])));
    }
}

/// Calls `f` on the canonical nodes of sections `[start, end)` in a tree of `leaves` leaves: the nodes that lie
/// wholly inside the window while their parent does not.
fn canonical_nodes(leaves: usize, start: u32, end: u32, mut f: impl FnMut(usize)) {
    let (mut l, mut r) = (start as usize + leaves, end as usize + leaves);
    while l < r {
        if l & 1 == 1 {
            f(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            f(r);
        }
        l >>= 1;
        r >>= 1;
    }
}

/// Calls `f` once on each node that overlaps sections `[start, end)` only in part (exactly the canonical nodes'
/// strict ancestors), as a bottom-up segment tree with lazy updates finds them.
fn partial_nodes(leaves: usize, start: u32, end: u32, mut f: impl FnMut(usize)) {
    let (l0, r0) = (start as usize + leaves, end as usize + leaves);
    for i in 1..=leaves.trailing_zeros() {
        let left = (l0 >> i) << i != l0;
        if left {
            f(l0 >> i);
        }
        if (r0 >> i) << i != r0 && !(left && (r0 - 1) >> i == l0 >> i) {
            f((r0 - 1) >> i);
        }
    }
}

/// Adds `[lo, hi)` to `list`, a sorted list of disjoint, non-touching ranges, merging what it overlaps or touches.
fn union_insert(list: &mut Vec<Range>, (lo, hi): Range) {
    // First range that ends at or after `lo` (it touches or overlaps, or lies after).
    let i = list.partition_point(|&(_, h)| h < lo);
    // First range that starts after `hi` (from `i` on, ranges up to it touch or overlap).
    let j = i + list[i..].partition_point(|&(l, _)| l <= hi);
    if i == j {
        list.insert(i, (lo, hi));
        return;
    }
    let merged = (lo.min(list[i].0), hi.max(list[j - 1].1));
    list[i] = merged;
    list.drain(i + 1..j);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The union of `ranges` as sorted disjoint non-touching runs.
    fn union(mut ranges: Vec<Range>) -> Vec<Range> {
        ranges.sort_unstable();
        let mut out: Vec<Range> = Vec::new();
        for (lo, hi) in ranges {
            match out.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        out
    }

    #[test]
    fn union_insert_merges_overlapping_and_touching_ranges() {
        let mut l = Vec::new();
        for r in [(10, 20), (30, 40), (0, 5), (20, 25), (45, 50), (38, 46), (5, 6)] {
            union_insert(&mut l, r);
        }
        assert_eq!(l, vec![(0, 6), (10, 25), (30, 50)]);
        union_insert(&mut l, (7, 8));
        assert_eq!(l, vec![(0, 6), (7, 8), (10, 25), (30, 50)]);
        union_insert(&mut l, (0, 100));
        assert_eq!(l, vec![(0, 100)]);
    }

    #[test]
    fn queries_give_the_union_of_the_overlapping_buffers() {
        // Random buffers over up to 37 sections (not a power of two), every query window checked against brute
        // force after each insertion, across a clear.
        let mut rng = crate::test_rng::XorShift::new(0x2545_F491_4F6C_DD1Du64);
        let mut next = |m: u64| rng.below(m);
        for round in 0..12 {
            let sections = 1 + next(37) as u32;
            let mut occ = Occupancy::new(sections as usize);
            occ.clear();
            let mut placed: Vec<(u32, u32, Range)> = Vec::new();
            for k in 0..40 {
                if k == 25 {
                    // A cleared index answers as a fresh one.
                    occ.clear();
                    placed.clear();
                }
                let s = next(u64::from(sections)) as u32;
                let e = s + 1 + next(u64::from(sections - s)) as u32;
                let lo = next(200) * 4;
                let range = (lo, lo + 4 * (1 + next(10)));
                occ.insert(range, s, e);
                placed.push((s, e, range));
                for qs in 0..sections {
                    for qe in qs + 1..=sections {
                        let mut got = Vec::new();
                        occ.overlapping(qs, qe, &mut got);
                        let want: Vec<Range> =
                            placed.iter().filter(|&&(s, e, _)| s < qe && qs < e).map(|&(_, _, r)| r).collect();
                        assert_eq!(union(got), union(want), "round {round}, window [{qs}, {qe})");
                    }
                }
            }
        }
    }
}
