//! An ordered map for the passes' small cases: a sorted list while it holds few entries, an ordered tree beyond.
//!
//! On small graphs the memory pass's ordered structures (the validator's live buffers, the online fit's free
//! blocks) hold a few dozen entries, where a `BTreeMap` costs several hundred instructions per operation and a
//! sorted `Vec` a binary search and a short move. Past [`LIST_MAX`] entries the list becomes the tree, so an
//! update never moves more than that many entries and the worst case stays O(log n). Both forms answer alike.

use std::collections::BTreeMap;

/// Entries up to which a [`SortedMap`] keeps its sorted list.
const LIST_MAX: usize = 256;

/// Keys in order, each with a value (see the module docs).
#[derive(Clone, Debug)]
pub(crate) enum SortedMap<K, V> {
    /// By key, distinct.
    List(Vec<(K, V)>),
    Tree(BTreeMap<K, V>),
}

impl<K: Ord + Copy, V: Copy> SortedMap<K, V> {
    pub fn new() -> Self {
        SortedMap::List(Vec::new())
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: K) -> Option<V> {
        match self {
            SortedMap::List(v) => v.binary_search_by(|e| e.0.cmp(&key)).ok().map(|k| v[k].1),
            SortedMap::Tree(m) => m.get(&key).copied(),
        }
    }

    /// The entry with the greatest key below `key`.
    #[inline]
    pub fn last_below(&self, key: K) -> Option<(K, V)> {
        match self {
            SortedMap::List(v) => v[..v.partition_point(|e| e.0 < key)].last().copied(),
            SortedMap::Tree(m) => m.range(..key).next_back().map(|(&k, &x)| (k, x)),
        }
    }

    /// The entry with the least key at or above `key`.
    #[inline]
    pub fn first_from(&self, key: K) -> Option<(K, V)> {
        match self {
            SortedMap::List(v) => v.get(v.partition_point(|e| e.0 < key)).copied(),
            SortedMap::Tree(m) => m.range(key..).next().map(|(&k, &x)| (k, x)),
        }
    }

    /// Set `key`'s value (replacing the one it had).
    #[inline]
    pub fn insert(&mut self, key: K, value: V) {
        match self {
            SortedMap::List(v) => {
                match v.binary_search_by(|e| e.0.cmp(&key)) {
                    Ok(k) => v[k].1 = value,
                    Err(k) => v.insert(k, (key, value)),
                }
                if v.len() > LIST_MAX {
                    *self = SortedMap::Tree(v.iter().copied().collect());
                }
            }
            SortedMap::Tree(m) => {
                m.insert(key, value);
            }
        }
    }

    /// Remove `key`, returning its value.
    #[inline]
    pub fn remove(&mut self, key: K) -> Option<V> {
        match self {
            SortedMap::List(v) => v.binary_search_by(|e| e.0.cmp(&key)).ok().map(|k| v.remove(k).1),
            SortedMap::Tree(m) => m.remove(&key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_answers_as_the_tree_does() {
        // Random inserts, replacements and removals, some runs growing past LIST_MAX entries: every query of the
        // map (list, then tree) gives a BTreeMap's answer.
        let mut rng = crate::test_rng::XorShift::new(7);
        let mut grew = false;
        for case in 0..40 {
            let mut map: SortedMap<u64, u64> = SortedMap::new();
            let mut reference: BTreeMap<u64, u64> = BTreeMap::new();
            let keys = if case % 4 == 0 { 2000 } else { 120 };
            for step in 0..3000 {
                let key = rng.below(keys);
                if rng.below(3) == 0 {
                    assert_eq!(map.remove(key), reference.remove(&key), "case {case}, step {step}: remove {key}");
                } else {
                    let value = rng.below(1000);
                    map.insert(key, value);
                    reference.insert(key, value);
                }
                let q = rng.below(keys + 2);
                let at = format!("case {case}, step {step}, key {q}");
                assert_eq!(map.get(q), reference.get(&q).copied(), "{at}: get");
                assert_eq!(map.last_below(q), reference.range(..q).next_back().map(|(&k, &v)| (k, v)), "{at}");
                assert_eq!(map.first_from(q), reference.range(q..).next().map(|(&k, &v)| (k, v)), "{at}");
            }
            grew |= matches!(map, SortedMap::Tree(_));
        }
        assert!(grew, "no case passed LIST_MAX entries");
    }
}
