#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties of the packer and its checker on random instances.

use graph_passes::memory::pack::{self, check, lower_bound, Budget, Buffer, PackOptions, PackViolation};
use proptest::prelude::*;

fn buffers(max_len: usize, horizon: u64, max_size: u64) -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0..horizon, 1..horizon / 2 + 2, 0..=max_size), 0..max_len)
        .prop_map(|v| v.into_iter().map(|(lower, len, size)| Buffer::new(lower, lower + len, size)).collect())
}

fn aligned(size: u64, alignment: u64) -> u64 {
    size.div_ceil(alignment) * alignment
}

/// Brute-force optimum: first-fit in every order. Placing an optimal layout's buffers by increasing offset with
/// first-fit never puts one above its optimal offset, so the best order reaches the optimum.
fn brute_force(bufs: &[Buffer], alignment: u64) -> u64 {
    fn go(bufs: &[Buffer], sizes: &[u64], placed: &mut Vec<(usize, u64)>, best: &mut u64, height: u64) {
        if height >= *best {
            return;
        }
        if placed.len() == bufs.len() {
            *best = height;
            return;
        }
        for i in 0..bufs.len() {
            if placed.iter().any(|&(j, _)| j == i) {
                continue;
            }
            let mut occ: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&(j, _)| bufs[j].overlaps_in_time(&bufs[i]))
                .map(|&(j, o)| (o, o + sizes[j]))
                .collect();
            occ.sort_unstable();
            let mut at = 0;
            for (lo, hi) in occ {
                if lo >= at + sizes[i] {
                    break;
                }
                at = at.max(hi);
            }
            placed.push((i, at));
            go(bufs, sizes, placed, best, height.max(at + sizes[i]));
            placed.pop();
        }
    }
    let sizes: Vec<u64> = bufs.iter().map(|b| aligned(b.size, alignment)).collect();
    let mut best = u64::MAX;
    go(bufs, &sizes, &mut Vec::new(), &mut best, 0);
    best
}

/// Pairwise overlap test, independent of `check`'s sweep.
fn overlaps_pairwise(bufs: &[Buffer], offsets: &[u64]) -> bool {
    for i in 0..bufs.len() {
        for j in i + 1..bufs.len() {
            let (a, b) = (&bufs[i], &bufs[j]);
            if a.size > 0
                && b.size > 0
                && a.overlaps_in_time(b)
                && offsets[i] < offsets[j] + b.size
                && offsets[j] < offsets[i] + a.size
            {
                return true;
            }
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any instance, any budget: a valid layout between the lower bound and the naive pool, aligned, and the
    /// same again for the same seed and effort.
    #[test]
    fn packing_is_valid_bounded_and_deterministic(
        bufs in buffers(40, 30, 100),
        alignment in prop::sample::select(vec![1u64, 8, 256]),
        effort in prop::sample::select(vec![0u64, 10_000, 1_000_000]),
        seed in 0u64..4,
    ) {
        let opts = PackOptions { alignment, budget: Budget::with_effort(effort), seed };
        let p = pack::pack(&bufs, &opts).unwrap();
        prop_assert_eq!(check(&bufs, &p.offsets), Ok(()));
        prop_assert!(!overlaps_pairwise(&bufs, &p.offsets));
        prop_assert_eq!(p.lower_bound, lower_bound(&bufs, alignment));
        // The peak spans: at the bound at every step inside, below it just outside, in order and disjoint.
        let (bound, spans) = pack::peak_spans(&bufs, alignment);
        prop_assert_eq!(bound, p.lower_bound);
        let live = |t: u64| bufs.iter().filter(|x| x.lower <= t && t < x.upper)
            .map(|x| x.size.div_ceil(alignment) * alignment).sum::<u64>();
        for (i, &(from, to)) in spans.iter().enumerate() {
            prop_assert!(from < to && spans.get(i + 1).is_none_or(|n| to < n.0));
            prop_assert!((from..to).all(|t| live(t) == bound));
            prop_assert!(live(to) < bound && (from == 0 || live(from - 1) < bound));
        }
        prop_assert_eq!(spans.is_empty(), bound == 0);
        prop_assert!(p.height >= p.lower_bound);
        let naive: u64 = bufs.iter().map(|b| aligned(b.size, alignment)).sum();
        prop_assert!(p.height <= naive);
        prop_assert!(p.offsets.iter().all(|o| o % alignment == 0));
        for (b, &o) in bufs.iter().zip(&p.offsets) {
            prop_assert!(o + aligned(b.size, alignment) <= p.height || b.size == 0);
        }
        prop_assert!(p.height >= p.stats.proved_lower_bound || !p.optimal);
        let again = pack::pack(&bufs, &opts).unwrap();
        prop_assert_eq!(&p, &again);
    }

    /// On tiny instances the search is exhaustive: it reaches the brute-force optimum and says so. This also
    /// tests every pruning rule: an unsound one would "prove" a bound above the optimum.
    #[test]
    fn search_finds_the_brute_force_optimum(
        bufs in buffers(7, 10, 9),
        alignment in prop::sample::select(vec![1u64, 4]),
    ) {
        let p = pack::pack(&bufs, &PackOptions { alignment, ..PackOptions::default() }).unwrap();
        let best = brute_force(&bufs, alignment);
        prop_assert_eq!(p.height, best);
        prop_assert!(p.optimal);
    }

    /// The checker agrees with the pairwise definition on arbitrary offsets.
    #[test]
    fn check_agrees_with_pairwise_overlap(
        bufs in buffers(12, 12, 6),
        raw in prop::collection::vec(0u64..12, 12),
    ) {
        let offsets: Vec<u64> = raw[..bufs.len()].to_vec();
        let verdict = check(&bufs, &offsets);
        let overlapping = overlaps_pairwise(&bufs, &offsets);
        prop_assert_eq!(verdict.is_err(), overlapping);
        if let Err(PackViolation::Overlap { first, second, .. }) = verdict {
            let (a, b) = (&bufs[first], &bufs[second]);
            prop_assert!(a.overlaps_in_time(b));
            prop_assert!(offsets[first] < offsets[second] + b.size && offsets[second] < offsets[first] + a.size);
        }
    }
}
