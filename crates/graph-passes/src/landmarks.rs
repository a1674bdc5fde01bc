//! Landmark reachability labels: the one builder behind the fusion DAG's cycle checks (`fusion::dag`) and the
//! memory pass's ordering queries (`memory::reach`) on graphs too large for a transitive closure.
//!
//! Up to [`LANDMARKS`] groups spread evenly over a topological order are landmarks. Each group keeps, as two
//! bit sets, the landmarks it reaches and those that reach it, both including itself when it is one: two sweeps
//! of O(N + E) word operations. A landmark in `down[a]` and `up[b]` proves a path from `a` to `b`; a landmark
//! that `b` reaches and `a` does not (or one that reaches `a` but not `b`) proves there is none. Neither answers
//! every pair: the callers search for what the labels leave open.

/// Most landmarks: one bit each in two 64-bit words per group and direction.
pub(crate) const LANDMARKS: usize = 64 * WORDS;

/// Words of a label.
const WORDS: usize = 2;

/// A set of landmarks, one bit each.
pub(crate) type Label = [u64; WORDS];

/// Landmark labels of a DAG (module docs).
pub(crate) struct Labels {
    /// The group each bit stands for, as labelled.
    marks: Vec<u32>,
    /// Per group: the landmarks it reaches (itself included).
    down: Vec<Label>,
    /// Per group: the landmarks that reach it (itself included).
    up: Vec<Label>,
}

impl Labels {
    /// Labels of a DAG over the group ids `0..n`: `order` lists the groups to label in a topological order
    /// (groups not in it keep empty labels), `count` (clamped to `1..=LANDMARKS`) landmarks sit at the middles
    /// of equal spans of it, and `preds(g)` yields `g`'s predecessors, each listed in `order` before `g`.
    pub fn new<I: IntoIterator<Item = u32>>(n: usize, order: &[u32], count: usize, preds: impl Fn(u32) -> I) -> Labels {
        let len = order.len();
        let count = count.clamp(1, LANDMARKS).min(len);
        let marks: Vec<u32> = (0..count).map(|i| order[(2 * i + 1) * len / (2 * count)]).collect();
        let mut down = vec![[0u64; WORDS]; n];
        for (b, &m) in marks.iter().enumerate() {
            down[m as usize][b / 64] |= 1 << (b % 64);
        }
        let mut up = down.clone();
        for &g in order {
            let mut row = up[g as usize];
            for p in preds(g) {
                row = or(row, up[p as usize]);
            }
            up[g as usize] = row;
        }
        for &g in order.iter().rev() {
            let row = down[g as usize];
            for p in preds(g) {
                down[p as usize] = or(down[p as usize], row);
            }
        }
        Labels { marks, down, up }
    }

    /// The group landmark `bit` stood for when labelled.
    pub fn mark(&self, bit: usize) -> u32 {
        self.marks[bit]
    }

    /// The landmarks `a` reaches that reach `b`, as bit numbers in increasing order: each proves a path from
    /// `a` to `b` through it.
    pub fn between(&self, a: usize, b: usize) -> impl Iterator<Item = usize> {
        let common = and(self.down[a], self.up[b]);
        (0..WORDS).flat_map(move |w| bits(common[w]).map(move |i| w * 64 + i))
    }

    /// Some path leads from `a` to `b` (through a landmark; `a == b` when `a` is one).
    pub fn proves_path(&self, a: usize, b: usize) -> bool {
        and(self.down[a], self.up[b]) != [0; WORDS]
    }

    /// No path leads from `a` to `b`: `b` reaches a landmark `a` does not, or a landmark reaches `a` but not `b`.
    pub fn proves_none(&self, a: usize, b: usize) -> bool {
        and(self.down[b], not(self.down[a])) != [0; WORDS] || and(self.up[a], not(self.up[b])) != [0; WORDS]
    }

    /// Group `gone` joined `keep` (a contraction): the merged group reaches and is reached by what either did.
    /// Contraction only adds paths, so every other group's labels stay true (they may miss the new paths).
    pub fn merge(&mut self, keep: usize, gone: usize) {
        self.down[keep] = or(self.down[keep], self.down[gone]);
        self.up[keep] = or(self.up[keep], self.up[gone]);
    }
}

fn or(x: Label, y: Label) -> Label {
    std::array::from_fn(|w| x[w] | y[w])
}

fn and(x: Label, y: Label) -> Label {
    std::array::from_fn(|w| x[w] & y[w])
}

fn not(x: Label) -> Label {
    x.map(|w| !w)
}

/// The set bits of `w`, lowest first.
fn bits(mut w: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (w != 0).then(|| {
            let i = w.trailing_zeros() as usize;
            w &= w - 1;
            i
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ancestor sets of a DAG given by predecessor lists (group ids topological), by brute force.
    fn closure(preds: &[Vec<u32>]) -> Vec<Vec<bool>> {
        let n = preds.len();
        let mut anc = vec![vec![false; n]; n];
        for b in 0..n {
            for &p in &preds[b] {
                anc[b][p as usize] = true;
                let row = anc[p as usize].clone();
                for (x, y) in anc[b].iter_mut().zip(row) {
                    *x |= y;
                }
            }
        }
        anc
    }

    #[test]
    fn labels_prove_only_true_answers_and_decide_pairs_around_landmarks() {
        let mut rng = crate::test_rng::XorShift::new(7);
        for case in 0..40 {
            let n = 2 + rng.below(300) as usize;
            let preds = rng.earlier_preds(n, 4);
            let order: Vec<u32> = (0..n as u32).collect();
            let count = 1 + rng.below(LANDMARKS as u64) as usize;
            let l = Labels::new(n, &order, count, |g| preds[g as usize].iter().copied());
            let anc = closure(&preds);
            let reaches = |a: usize, b: usize| a == b || anc[b][a];
            for a in 0..n {
                for b in 0..n {
                    if l.proves_path(a, b) {
                        assert!(reaches(a, b), "case {case}: path {a} -> {b} proved, none exists");
                    }
                    if l.proves_none(a, b) {
                        assert!(!reaches(a, b), "case {case}: no path {a} -> {b} proved, one exists");
                    }
                    for bit in l.between(a, b) {
                        let m = l.mark(bit) as usize;
                        assert!(reaches(a, m) && reaches(m, b), "case {case}: landmark {m} not between {a} and {b}");
                    }
                }
                // A landmark decides every pair it takes part in.
                if l.marks.contains(&(a as u32)) {
                    for b in 0..n {
                        assert_eq!(l.proves_path(a, b), reaches(a, b), "case {case}: from landmark {a} to {b}");
                        assert_eq!(l.proves_none(a, b), !reaches(a, b), "case {case}: from landmark {a} to {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn landmarks_sit_at_the_middles_of_equal_spans_of_the_order() {
        // Order 9, 8, ..., 0 of ten unconnected groups; three landmarks at positions 1, 5 and 8.
        let order: Vec<u32> = (0..10).rev().collect();
        let l = Labels::new(10, &order, 3, |_| std::iter::empty());
        assert_eq!(l.marks, vec![8, 4, 1]);
        // More landmarks than groups: each group is one.
        let l = Labels::new(3, &[0, 1, 2], LANDMARKS, |g| g.checked_sub(1));
        assert_eq!(l.marks, vec![0, 1, 2]);
        assert_eq!(l.between(0, 2).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(l.proves_none(2, 0));
    }

    #[test]
    fn a_merged_group_reaches_what_either_did() {
        // 0 -> 1 and 2 -> 3, every group a landmark; merging 3 into 1 makes 0 reach 3's landmark through 1.
        let preds = [vec![], vec![0], vec![], vec![2]];
        let mut l = Labels::new(4, &[0, 1, 2, 3], 4, |g| preds[g as usize].iter().copied());
        assert!(!l.proves_path(2, 1));
        l.merge(1, 3);
        assert!(l.proves_path(2, 1));
        assert_eq!(l.between(2, 1).collect::<Vec<_>>(), vec![2, 3]);
        assert!(l.proves_path(1, 1));
    }
}
