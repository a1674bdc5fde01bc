//! A compact adjacency list (compressed sparse rows) over dense `u32` node indices: one allocation for a whole
//! graph, so a million-node DAG costs a few bytes per edge.

/// Sort `v[start..]` (a row being built at the end of `v`) and keep each item once, in place: O(k log k) for a
/// row of k items, with no allocation.
pub(crate) fn sort_dedup_tail<T: Ord + Copy>(v: &mut Vec<T>, start: usize) {
    v[start..].sort_unstable();
    let mut kept = start;
    for i in start..v.len() {
        if kept == start || v[i] != v[kept - 1] {
            v[kept] = v[i];
            kept += 1;
        }
    }
    v.truncate(kept);
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
