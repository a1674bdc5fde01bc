//! A counting sort for the memory pass's sweeps, whose keys are time steps: small integers (a plan's steps are
//! at most its groups), so a stable sort by counting runs in O(len + bound) where a comparison sort costs
//! O(len log len) comparisons of wider keys. Callers keep their comparison sort for keys that are not small (a
//! MiniMalloc instance's times are arbitrary).

/// Whether keys below `bound` are small enough for [`sort_by_small_key`] on `len` items: the buckets stay within
/// a few times the items.
pub(crate) fn pays(len: usize, bound: u64) -> bool {
    bound <= 4 * (len as u64) + 1024
}

/// `items` ordered by `key`, stable (items with equal keys keep their order), as `sort_by_key` orders them; every
/// key must be below `bound` (one counting pass, then one placing pass; see [`pays`]).
pub(crate) fn sort_by_small_key<T: Copy>(items: &[T], bound: usize, key: impl Fn(&T) -> usize) -> Vec<T> {
    let mut start = vec![0usize; bound + 1];
    for it in items {
        start[key(it) + 1] += 1;
    }
    for k in 0..bound {
        start[k + 1] += start[k];
    }
    let Some(&first) = items.first() else { return Vec::new() };
    let mut out = vec![first; items.len()];
    for it in items {
        let k = key(it);
        out[start[k]] = *it;
        start[k] += 1;
    }
    out
}

/// The indices `0..n` ordered by `key(i)`, then by index: what `sort_by_key(|&i| (key(i), i))` gives, by
/// counting when the keys are small ([`pays`]), else by that sort.
pub(crate) fn indices_by_key(n: usize, key: impl Fn(usize) -> u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    let bound = (0..n).map(&key).max().map_or(0, |m| m.saturating_add(1));
    if pays(n, bound) {
        // `bound` is at most 4n + 1024 here, so it fits a usize and every key below it does.
        return sort_by_small_key(&idx, bound as usize, |&i| key(i) as usize);
    }
    idx.sort_by_key(|&i| (key(i), i));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The counting sort orders as the standard library's stable sort does, ties included.
        #[test]
        fn counting_orders_as_the_stable_sort(keys in proptest::collection::vec(0usize..64, 0..200)) {
            let items: Vec<(usize, usize)> = keys.iter().copied().enumerate().map(|(i, k)| (k, i)).collect();
            let mut want = items.clone();
            want.sort_by_key(|&(k, _)| k);
            prop_assert_eq!(sort_by_small_key(&items, 64, |&(k, _)| k), want);
        }

        /// Indices come out by key then index, whether the keys are small (counting) or spread (comparison).
        #[test]
        fn indices_by_key_orders_by_key_then_index(
            keys in proptest::collection::vec(0u64..50, 0..300),
            spread in any::<bool>(),
        ) {
            let keys: Vec<u64> = if spread { keys.iter().map(|&k| k << 40).collect() } else { keys };
            let mut want: Vec<usize> = (0..keys.len()).collect();
            want.sort_by_key(|&i| (keys[i], i));
            prop_assert_eq!(indices_by_key(keys.len(), |i| keys[i]), want);
        }
    }

    #[test]
    fn pays_only_for_keys_within_a_few_times_the_items() {
        assert!(pays(0, 1024));
        assert!(pays(1000, 5024));
        assert!(!pays(1000, 5025));
        assert!(!pays(10, u64::MAX));
    }
}
