//! A seeded xorshift generator for the unit tests' random instances: deterministic, no dependency, one copy.

/// Marsaglia's xorshift64 (13, 7, 17). The seed must not be 0.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number below `m` (`m > 0`; modulo bias is fine for tests).
    pub(crate) fn below(&mut self, m: u64) -> u64 {
        self.next_u64() % m
    }

    /// A random DAG over `0..n` in topological order: each node's predecessors, fewer than `most` draws among
    /// the earlier nodes, sorted and distinct.
    pub(crate) fn earlier_preds(&mut self, n: usize, most: u64) -> Vec<Vec<u32>> {
        (0..n)
            .map(|g| {
                let mut ps: Vec<u32> =
                    (0..self.below(most)).filter(|_| g > 0).map(|_| self.below(g as u64) as u32).collect();
                ps.sort_unstable();
                ps.dedup();
                ps
            })
            .collect()
    }
}
