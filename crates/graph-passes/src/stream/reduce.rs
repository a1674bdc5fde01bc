//! Transitive reduction of the group DAG with reachability in a sliding window.
//!
//! Groups are in topological order, so `p -> g` implies `p < g`. For each group `g` the pass keeps `anc(g)`, the
//! set of its ancestors among the `W` groups before it, as a `W`-bit set (bit `i` is group `g - 1 - i`), in a
//! ring of the last `W` groups' sets. Visiting `g`'s predecessors latest first, an edge `p -> g` is redundant
//! exactly when `p` is already an ancestor of a later predecessor; otherwise it is kept and `anc(p) + {p}`,
//! shifted into `g`'s frame, joins `anc(g)`.
//!
//! **Exact within the window.** Every path from `p` to `g` visits only groups in `[p, g]`, so when `g - p <= W`
//! all its edges are shorter than `W` and the window sets see the whole path: an edge spanning at most `W`
//! groups is dropped if and only if it is redundant. A longer edge is dropped only when a predecessor of `g`
//! within `W` of `p` reaches it, and kept otherwise (a conservative superset of the reduction, with the same
//! closure). With `W >= N` the result is the exact transitive reduction.
//!
//! Cost: `O((N + E) * W / 64)` time and `O(W^2 / 8 + N + E)` memory (2 MiB of sets for `W = 4096`), never
//! `O(N^2)`.

use super::csr::Csr;

/// Words of a `w`-bit set.
fn words(w: usize) -> usize {
    w.div_ceil(64)
}

/// `dst |= src << shift`, truncated to `dst.len() * 64` bits.
fn or_shifted(dst: &mut [u64], src: &[u64], shift: usize) {
    let (ws, bs) = (shift / 64, shift % 64);
    for i in (ws..dst.len()).rev() {
        let j = i - ws;
        let mut v = src[j] << bs;
        if bs != 0 && j > 0 {
            v |= src[j - 1] >> (64 - bs);
        }
        dst[i] |= v;
    }
}

/// The reduction of `preds` (row `g`: predecessors of `g`, all `< g`) within a window of `window` groups.
/// Rows of the result are sorted ascending.
pub fn transitive_reduction(preds: &Csr, window: usize) -> Csr {
    let n = preds.len();
    let w = window.clamp(1, n.max(1));
    let nw = words(w);
    let mut ring = vec![0u64; w * nw];
    let mut cur = vec![0u64; nw];
    let mut ps: Vec<u32> = Vec::new();
    let mut kept: Vec<u32> = Vec::new();
    let mut out_offsets = Vec::with_capacity(n + 1);
    out_offsets.push(0usize);
    let mut out_items: Vec<u32> = Vec::with_capacity(preds.num_items());
    for g in 0..n {
        ps.clear();
        ps.extend(preds.row(g).iter().copied().filter(|&p| (p as usize) < g));
        ps.sort_unstable_by(|a, b| b.cmp(a));
        ps.dedup();
        cur.iter_mut().for_each(|x| *x = 0);
        kept.clear();
        for &p in &ps {
            let d = g - p as usize;
            if d > w {
                // Beyond the window: all of p's ancestors are older still, so nothing to add to cur.
                kept.push(p);
                continue;
            }
            let bit = d - 1;
            if cur[bit / 64] >> (bit % 64) & 1 == 1 {
                continue; // a later predecessor already reaches p
            }
            kept.push(p);
            cur[bit / 64] |= 1u64 << (bit % 64);
            let slot = (p as usize % w) * nw;
            or_shifted(&mut cur, &ring[slot..slot + nw], d);
        }
        if w > 0 {
            let slot = (g % w) * nw;
            ring[slot..slot + nw].copy_from_slice(&cur);
        }
        kept.sort_unstable();
        out_items.extend_from_slice(&kept);
        out_offsets.push(out_items.len());
    }
    Csr::from_offsets(out_offsets, out_items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifting_crosses_words() {
        let mut dst = vec![0u64; 3];
        let src = vec![1u64 << 63, 1, 0];
        or_shifted(&mut dst, &src, 65);
        assert_eq!(dst, vec![0, 0, (1 << 0) | (1 << 1)]);
    }

    #[test]
    fn diamond_with_shortcut() {
        // 0 -> 1 -> 3, 0 -> 2 -> 3, 0 -> 3 (redundant)
        let preds = Csr::from_rows([vec![], vec![0], vec![0], vec![0, 1, 2]]);
        let r = transitive_reduction(&preds, 64);
        assert_eq!(r.row(3), &[1, 2]);
        // A window of 1 sees only adjacent groups: the longer edges cannot be disproved and stay.
        let r = transitive_reduction(&preds, 1);
        assert_eq!(r.row(3), &[0, 1, 2]);
    }
}
