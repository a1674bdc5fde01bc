//! A compact adjacency list (compressed sparse rows) over dense `u32` node indices: one allocation for a whole
//! graph, so a million-node DAG costs a few bytes per edge.

/// Sort `v[start..]` (a row being built at the end of `v`) and keep each item once, in place: O(k log k) for a
/// row of k items, with no allocation.
pub(crate) fn sort_dedup_tail<T: Ord + Copy>(v: &mut Vec<T>, start: usize) {
    let end = v.len();
    let kept = sort_dedup_down(v, start..end, start);
    v.truncate(kept);
}

/// Sort the run `v[run]` and write each of its items once from `v[to]` on (`to <= run.start`: the run moves
/// down over what lies before it); returns the end of what was written. Rows built in one array, then
/// compacted one after another, share the array this way.
pub(crate) fn sort_dedup_down<T: Ord + Copy>(v: &mut [T], run: std::ops::Range<usize>, to: usize) -> usize {
    v[run.clone()].sort_unstable();
    let mut kept = to;
    for i in run {
        if kept == to || v[i] != v[kept - 1] {
            v[kept] = v[i];
            kept += 1;
        }
    }
    kept
}

/// Rows of `u32` items, row `i` being `items[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    offsets: Vec<usize>,
    items: Vec<u32>,
}

impl Csr {
    /// Build from rows.
    pub fn from_rows<R: AsRef<[u32]>>(rows: impl IntoIterator<Item = R>) -> Csr {
        let mut offsets = vec![0];
        let mut items = Vec::new();
        for r in rows {
            items.extend_from_slice(r.as_ref());
            offsets.push(items.len());
        }
        Csr { offsets, items }
    }

    /// Build from offsets (`n + 1`, non-decreasing, last = `items.len()`) and items.
    pub fn from_offsets(offsets: Vec<usize>, items: Vec<u32>) -> Csr {
        Csr { offsets, items }
    }

    /// The transpose: row `j` lists every `i` whose row holds `j`, in increasing `i`.
    pub fn transpose(&self, n: usize) -> Csr {
        let mut offsets = vec![0usize; n + 1];
        for &j in &self.items {
            offsets[j as usize + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut items = vec![0u32; self.items.len()];
        for i in 0..self.len() {
            for &j in self.row(i) {
                items[fill[j as usize]] = i as u32;
                fill[j as usize] += 1;
            }
        }
        Csr { offsets, items }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total items.
    pub fn num_items(&self) -> usize {
        self.items.len()
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[u32] {
        &self.items[self.offsets[i]..self.offsets[i + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Runs compacted one after another in one array hold what each run sorted and deduplicated apart would,
        // and a tail the same as a sorted, deduplicated copy.
        #[test]
        fn runs_compact_to_their_sorted_distinct_items(
            runs in prop::collection::vec(prop::collection::vec(0u32..8, 0..12), 0..8),
            head in prop::collection::vec(0u32..8, 0..6),
        ) {
            let mut v: Vec<u32> = runs.iter().flatten().copied().collect();
            let (mut start, mut kept) = (0, 0);
            let mut want = Vec::new();
            for r in &runs {
                let first = kept;
                kept = sort_dedup_down(&mut v, start..start + r.len(), first);
                start += r.len();
                let mut w = r.clone();
                w.sort_unstable();
                w.dedup();
                prop_assert_eq!(&v[first..kept], &w[..]);
                want.extend(w);
            }
            prop_assert_eq!(&v[..kept], &want[..]);

            let mut t = head.clone();
            t.extend(runs.iter().flatten());
            let mut w: Vec<u32> = runs.iter().flatten().copied().collect();
            w.sort_unstable();
            w.dedup();
            sort_dedup_tail(&mut t, head.len());
            prop_assert_eq!(&t[..head.len()], &head[..]);
            prop_assert_eq!(&t[head.len()..], &w[..]);
        }
    }
}
