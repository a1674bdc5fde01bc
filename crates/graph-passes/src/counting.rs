//! Sorts by counting, for keys a comparison sort handles slowly. The memory pass's sweeps sort by time step:
//! small integers (a plan's steps are at most its groups), so a stable counting sort runs in O(len + bound)
//! where a comparison sort costs O(len log len) comparisons of wider keys; callers keep their comparison sort
//! for keys that are not small (a MiniMalloc instance's times are arbitrary). Fusion's phase-2 candidates sort
//! by a 128-bit key packing a score and two positions: a radix sort on the bytes that vary.

/// Whether keys below `bound` are small enough for a counting sort of `len` items: the buckets stay within a few
/// times the items.
fn pays(len: usize, bound: u64) -> bool {
    bound <= 4 * (len as u64) + 1024
}

/// Sort `items` stably by `key` (items with equal keys keep their order, as `sort_by_key` leaves them) by counting,
/// when the keys are small ([`pays`]); otherwise leave them as they are and return false, for the caller's
/// comparison sort.
pub(crate) fn sort_small<T: Copy>(items: &mut Vec<T>, key: impl Fn(&T) -> u64) -> bool {
    let bound = items.iter().map(&key).max().map_or(0, |m| m.saturating_add(1));
    if !pays(items.len(), bound) {
        return false;
    }
    // `bound` is at most 4 len + 1024 here, so it fits a usize and every key below it does.
    *items = sort_by_small_key(items, bound as usize, |it| key(it) as usize);
    true
}

/// `items` ordered by `key`, stable; every key must be below `bound` (one counting pass, then one placing pass).
fn sort_by_small_key<T: Copy>(items: &[T], bound: usize, key: impl Fn(&T) -> usize) -> Vec<T> {
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
/// counting when the keys are small, else by that sort.
pub(crate) fn indices_by_key(n: usize, key: impl Fn(usize) -> u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if !sort_small(&mut idx, |&i| key(i)) {
        idx.sort_by_key(|&i| (key(i), i));
    }
    idx
}

/// `items` sorted by a 128-bit `key`, ascending and stable: a least-significant-digit radix sort on bytes that
/// skips every byte all keys share (a key packing a few small fields varies in a handful of its 16 bytes), so it
/// reads the items about once per varying byte instead of comparing 128-bit keys O(n log n) times. Short lists
/// use the comparison sort.
pub(crate) fn sort_by_u128_key<T: Copy>(items: &mut Vec<T>, key: impl Fn(&T) -> u128) {
    // Below it the histograms (16 of 256 counters) cost more than the comparisons they save (random_dag 1k's
    // phase 2: 0.4% more instructions with the radix sort from 64 items).
    const SHORT: usize = 4096;
    radix_from(items, key, SHORT);
}

/// [`sort_by_u128_key`] with the comparison sort below `short` items.
fn radix_from<T: Copy>(items: &mut Vec<T>, key: impl Fn(&T) -> u128, short: usize) {
    if items.len() < short {
        items.sort_by_key(&key);
        return;
    }
    // Every byte's histogram in one read of the keys.
    let mut hist = vec![[0usize; 256]; 16];
    for it in items.iter() {
        let k = key(it);
        for (d, h) in hist.iter_mut().enumerate() {
            h[((k >> (8 * d)) & 0xff) as usize] += 1;
        }
    }
    let mut from = std::mem::take(items);
    let mut to = from.clone();
    for (d, h) in hist.iter().enumerate() {
        if h.contains(&from.len()) {
            continue;
        }
        let mut at = [0usize; 256];
        let mut sum = 0;
        for (a, &c) in at.iter_mut().zip(h) {
            *a = sum;
            sum += c;
        }
        for it in &from {
            let b = ((key(it) >> (8 * d)) & 0xff) as usize;
            to[at[b]] = *it;
            at[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *items = from;
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

    proptest! {
        /// The radix sort orders 128-bit keys as the stable comparison sort does (ties included), on every list
        /// length against the threshold. Each byte takes one of three values, so every byte position decides
        /// some comparisons; with `mask` some bytes are constant (skipped) and ties are common.
        #[test]
        fn radix_orders_as_the_stable_sort(
            bytes in proptest::collection::vec(proptest::collection::vec(0u8..3, 16), 0..300),
            mask in any::<u16>(),
        ) {
            let items: Vec<(u128, usize)> = bytes
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let k = b.iter().enumerate().fold(0u128, |k, (d, &v)| {
                        let v = if mask & (1 << d) != 0 { 0 } else { u128::from(v) };
                        k | (v << (8 * d))
                    });
                    (k, i)
                })
                .collect();
            let mut want = items.clone();
            want.sort_by_key(|e| e.0);
            for short in [0, 64, usize::MAX] {
                let mut got = items.clone();
                radix_from(&mut got, |e| e.0, short);
                prop_assert_eq!(&got, &want);
            }
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
