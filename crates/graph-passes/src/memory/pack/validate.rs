//! Independent validator: does an offset assignment keep every pair of time-overlapping buffers apart in space?
//!
//! It shares nothing with the packer but the [`Buffer`] type (and the crate's counting sort of its events): a sweep
//! over time (ends before starts at equal times, since lifetimes are half-open) keeps the live buffers by offset
//! (a sorted list while they are few, then an ordered map). The live ranges are disjoint (the sweep stops at the
//! first collision), so a new range `[offset, end)` meets one of them exactly when it meets the live range
//! starting last below `end` (any range it meets starts below `end`, and of disjoint ranges the one starting
//! later also ends later): one query per insertion, O(n log n) in all.
//! Sizes are the buffers' own (unaligned) sizes: the check is about real bytes, not about padding.

use crate::sorted_map::SortedMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Buffer;

/// Why an offset assignment is not a valid packing. Indices are positions in the `buffers` slice.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum PackViolation {
    /// The number of offsets differs from the number of buffers.
    #[error("{offsets} offsets for {buffers} buffers")]
    LengthMismatch {
        /// Number of buffers.
        buffers: usize,
        /// Number of offsets.
        offsets: usize,
    },
    /// A buffer's interval is empty or reversed (`lower >= upper`).
    #[error("buffer {index}: empty lifetime [{lower}, {upper})")]
    InvalidInterval {
        /// Index of the buffer.
        index: usize,
        /// Its `lower`.
        lower: u64,
        /// Its `upper`.
        upper: u64,
    },
    /// `offset + size` does not fit in a `u64`.
    #[error("buffer {index}: offset {offset} + size {size} overflows u64")]
    Overflow {
        /// Index of the buffer.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its size.
        size: u64,
    },
    /// Two buffers are live at the same time and share bytes.
    #[error(
        "buffers {first} and {second} overlap: both live at time {time}, \
         bytes [{first_offset}, {first_end}) and [{second_offset}, {second_end})"
    )]
    Overlap {
        /// The buffer that was already live.
        first: usize,
        /// The buffer whose start collides with it.
        second: usize,
        /// A time at which both are live (the start of `second`).
        time: u64,
        /// Offset of `first`.
        first_offset: u64,
        /// End (exclusive) of `first`'s bytes.
        first_end: u64,
        /// Offset of `second`.
        second_offset: u64,
        /// End (exclusive) of `second`'s bytes.
        second_end: u64,
    },
}

/// Checks that no two buffers live at the same time share a byte. Zero-size buffers never conflict.
///
/// Returns the first violation found in time order (for overlaps: the earliest start at which a collision appears).
pub fn check(buffers: &[Buffer], offsets: &[u64]) -> Result<(), PackViolation> {
    if buffers.len() != offsets.len() {
        return Err(PackViolation::LengthMismatch { buffers: buffers.len(), offsets: offsets.len() });
    }
    // Events: (time, kind, index) with kind 0 = end, 1 = start, so that at equal times ends come first; packed into
    // one integer each (time, then kind, then index), which sorts in that order.
    let event = |time: u64, kind: u8, index: usize| (u128::from(time) << 64) | (u128::from(kind) << 63) | index as u128;
    let mut events: Vec<u128> = Vec::with_capacity(2 * buffers.len());
    let mut ends = vec![0u64; buffers.len()];
    for (index, (b, &offset)) in buffers.iter().zip(offsets).enumerate() {
        if b.lower >= b.upper {
            return Err(PackViolation::InvalidInterval { index, lower: b.lower, upper: b.upper });
        }
        let end = offset.checked_add(b.size).ok_or(PackViolation::Overflow { index, offset, size: b.size })?;
        ends[index] = end;
        if b.size > 0 {
            events.push(event(b.lower, 1, index));
            events.push(event(b.upper, 0, index));
        }
    }
    // Pushed in index order, so a stable sort on (time, kind) gives the order of the whole integer: by counting
    // when the times are small (a plan's steps), else by comparison.
    if !crate::counting::sort_small(&mut events, |&e| u64::try_from(e >> 63).unwrap_or(u64::MAX)) {
        events.sort_unstable();
    }

    // Live byte ranges keyed by offset; ranges in the map never overlap (we stop at the first collision), so
    // distinct live buffers have distinct offsets.
    let mut live: SortedMap<u64, usize> = SortedMap::new();
    for &e in &events {
        let (time, start, index) = ((e >> 64) as u64, (e >> 63) & 1 == 1, (e as u64 & (u64::MAX >> 1)) as usize);
        let offset = offsets[index];
        if !start {
            live.remove(offset);
            continue;
        }
        let end = ends[index];
        if let Some((other_offset, other)) = live.last_below(end) {
            let other_end = ends[other];
            if offset < other_end {
                return Err(PackViolation::Overlap {
                    first: other,
                    second: index,
                    time,
                    first_offset: other_offset,
                    first_end: other_end,
                    second_offset: offset,
                    second_end: end,
                });
            }
        }
        live.insert(offset, index);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(lower: u64, upper: u64, size: u64) -> Buffer {
        Buffer { lower, upper, size }
    }

    #[test]
    fn touching_lifetimes_do_not_conflict() {
        let bufs = [b(0, 3, 4), b(3, 5, 4)];
        assert_eq!(check(&bufs, &[0, 0]), Ok(()));
    }

    #[test]
    fn overlap_reports_the_pair() {
        let bufs = [b(0, 4, 4), b(3, 5, 4)];
        let err = check(&bufs, &[0, 2]).unwrap_err();
        assert_eq!(
            err,
            PackViolation::Overlap {
                first: 0,
                second: 1,
                time: 3,
                first_offset: 0,
                first_end: 4,
                second_offset: 2,
                second_end: 6
            }
        );
    }

    #[test]
    fn collision_with_a_non_neighbour_is_found_via_the_predecessor() {
        // A big buffer below, a small one above it, and a newcomer straddling the big one's top.
        let bufs = [b(0, 10, 100), b(0, 10, 10), b(5, 6, 10)];
        let err = check(&bufs, &[0, 200, 95]).unwrap_err();
        assert!(matches!(err, PackViolation::Overlap { first: 0, second: 2, .. }));
    }

    #[test]
    fn zero_size_never_conflicts() {
        let bufs = [b(0, 4, 4), b(1, 2, 0)];
        assert_eq!(check(&bufs, &[0, 1]), Ok(()));
    }

    #[test]
    fn far_times_find_the_same_first_overlap_as_near_ones() {
        // Near times sort by counting, times past u64's top half by comparison: the same instance shifted in time
        // reports the same first collision, and the same valid packing passes.
        let shift = 1u64 << 63;
        let near = [b(0, 4, 4), b(2, 9, 4), b(3, 5, 4), b(4, 6, 4)];
        let far: Vec<Buffer> = near.iter().map(|x| b(x.lower + shift, x.upper + shift, x.size)).collect();
        let offsets = [0, 4, 6, 0];
        let (n, f) = (check(&near, &offsets).unwrap_err(), check(&far, &offsets).unwrap_err());
        assert!(matches!(n, PackViolation::Overlap { first: 1, second: 2, time: 3, .. }), "{n:?}");
        assert!(matches!(f, PackViolation::Overlap { first: 1, second: 2, .. }), "{f:?}");
        assert_eq!(check(&near, &[0, 4, 8, 0]), Ok(()));
        assert_eq!(check(&far, &[0, 4, 8, 0]), Ok(()));
    }

    #[test]
    fn many_live_buffers_are_checked_as_the_pairs_say() {
        // Random instances, some with hundreds of buffers live at once (past the list into the map): a layout
        // the pairwise definition accepts passes, and a reported overlap is a pair the definition refuses.
        let mut rng = crate::test_rng::XorShift::new(3);
        for case in 0..120 {
            let n = 1 + rng.below(if case % 3 == 0 { 900 } else { 60 }) as usize;
            let span = 1 + rng.below(if case % 3 == 0 { 4 } else { 40 });
            let bufs: Vec<Buffer> = (0..n)
                .map(|_| {
                    let lower = rng.below(span);
                    b(lower, lower + 1 + rng.below(span), rng.below(50))
                })
                .collect();
            // Every third case side by side (valid however many are live), one of them then moved onto another.
            let mut offsets: Vec<u64> = if case % 3 == 0 {
                bufs.iter().scan(0, |at, x| Some(std::mem::replace(at, *at + x.size))).collect()
            } else {
                (0..n).map(|_| rng.below(40 * n as u64)).collect()
            };
            if case % 6 == 0 && n > 1 {
                offsets[n - 1] = offsets[rng.below(n as u64 - 1) as usize];
            }
            let meets = |i: usize, j: usize| {
                let (x, y) = (&bufs[i], &bufs[j]);
                x.size > 0
                    && y.size > 0
                    && x.lower < y.upper
                    && y.lower < x.upper
                    && offsets[i] < offsets[j] + y.size
                    && offsets[j] < offsets[i] + x.size
            };
            let any = (0..n).any(|i| (0..i).any(|j| meets(i, j)));
            if case % 6 == 3 {
                assert!(!any, "case {case}: side by side, yet a pair meets");
            }
            match check(&bufs, &offsets) {
                Ok(()) => assert!(!any, "case {case}: an overlap passed"),
                Err(PackViolation::Overlap { first, second, .. }) => {
                    assert!(meets(first, second), "case {case}: {first} and {second} do not overlap")
                }
                Err(e) => panic!("case {case}: {e}"),
            }
        }
    }

    #[test]
    fn structural_errors() {
        assert!(matches!(check(&[b(0, 1, 1)], &[]), Err(PackViolation::LengthMismatch { .. })));
        assert!(matches!(check(&[b(2, 2, 1)], &[0]), Err(PackViolation::InvalidInterval { index: 0, .. })));
        assert!(matches!(check(&[b(0, 1, 2)], &[u64::MAX]), Err(PackViolation::Overflow { index: 0, .. })));
    }
}
