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
}
