//! The one interval type of the passes: a half-open range of steps `[start, end)`. Buffer lifetimes in launch
//! steps (memory), packing units' lives (memory's pack input), and the debug checks all use it; `[0, 3)` and
//! `[3, 5)` do not overlap, so a buffer whose last reader runs at step 2 can hand its bytes to one written at
//! step 3.

use serde::{Deserialize, Serialize};

/// A half-open interval of steps `[start, end)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    /// First step (inclusive).
    pub start: u32,
    /// One past the last step.
    pub end: u32,
}

impl Interval {
    /// `[start, end)`.
    pub fn new(start: u32, end: u32) -> Interval {
        Interval { start, end }
    }

    /// True when the two intervals share a step. `[0, 3)` and `[3, 5)` do not; an empty interval shares
    /// no step with anything.
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.start < other.end && other.start < self.end && !self.is_empty() && !other.is_empty()
    }

    /// The smallest interval covering both.
    pub fn union(&self, other: &Interval) -> Interval {
        Interval { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// Number of steps covered.
    pub fn len(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    /// True when no step is covered.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_at_the_edges() {
        let a = Interval::new(0, 3);
        assert!(!a.overlaps(&Interval::new(3, 5)));
        assert!(!Interval::new(3, 5).overlaps(&a));
        assert!(a.overlaps(&Interval::new(2, 5)));
        assert!(!a.overlaps(&Interval::new(5, 5)));
        assert!(!a.overlaps(&Interval::new(1, 1)), "an empty interval overlaps nothing");
        assert_eq!(a.union(&Interval::new(4, 6)), Interval::new(0, 6));
        assert_eq!(a.len(), 3);
        assert!(Interval::new(4, 4).is_empty());
    }
}
