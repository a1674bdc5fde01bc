//! Merging chains onto at most `k` streams when the chain decomposition has more chains than streams.
//!
//! Each group has an as-soon-as-possible interval `[top, top + time)` from the schedule with unlimited streams.
//! Chains are placed one at a time, critical path first (a chain's priority is the longest path through any of
//! its groups; ties: more work, then the earlier chain), each onto the stream where its groups' intervals overlap
//! the least busy time already placed there (ties: the least loaded stream, then the lowest index). A chain
//! that fits in another's idle gaps thus shares its stream at no modelled cost, and the critical chain never
//! shares with anything that would delay it while an emptier stream exists. Per-stream busy time is a map of
//! disjoint segments: O(N k log N) for N groups.

use std::collections::BTreeMap;

/// Disjoint busy segments `[start, end)` of one stream, keyed by the start's bits (non-negative floats order
/// like their bit patterns).
#[derive(Default)]
struct Busy {
    segs: BTreeMap<u64, f64>,
}

impl Busy {
    fn overlap(&self, a: f64, b: f64) -> f64 {
        if b <= a {
            return 0.0;
        }
        let mut total = 0.0;
        if let Some((&s, &e)) = self.segs.range(..a.to_bits()).next_back() {
            total += (e.min(b) - f64::from_bits(s).max(a)).max(0.0);
        }
        for (&s, &e) in self.segs.range(a.to_bits()..b.to_bits()) {
            total += (e.min(b) - f64::from_bits(s)).max(0.0);
        }
        total
    }

    fn insert(&mut self, a: f64, b: f64) {
        if b <= a {
            return;
        }
        let (mut lo, mut hi) = (a, b);
        if let Some((&s, &e)) = self.segs.range(..a.to_bits()).next_back() {
            if e >= a {
                lo = f64::from_bits(s);
                hi = hi.max(e);
                self.segs.remove(&s);
            }
        }
        let inside: Vec<(u64, f64)> = self.segs.range(a.to_bits()..=b.to_bits()).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in inside {
            hi = hi.max(e);
            self.segs.remove(&s);
        }
        self.segs.insert(lo.to_bits(), hi);
    }
}

/// The stream of each chain. `top`, `time` and `bottom` are per group: earliest start, launch time, and the
/// longest path from the group's start to the end.
pub fn merge(chains: &[Vec<u32>], top: &[f64], time: &[f64], bottom: &[f64], k: usize) -> Vec<u32> {
    let k = k.max(1);
    if chains.len() <= k {
        return (0..chains.len() as u32).collect();
    }
    let prio: Vec<(f64, f64)> = chains
        .iter()
        .map(|c| {
            let p = c.iter().map(|&g| top[g as usize] + bottom[g as usize]).fold(0f64, f64::max);
            let w: f64 = c.iter().map(|&g| time[g as usize]).sum();
            (p, w)
        })
        .collect();
    let mut order: Vec<usize> = (0..chains.len()).collect();
    order.sort_by(|&a, &b| prio[b].0.total_cmp(&prio[a].0).then(prio[b].1.total_cmp(&prio[a].1)).then(a.cmp(&b)));
    let mut busy: Vec<Busy> = (0..k).map(|_| Busy::default()).collect();
    let mut load = vec![0f64; k];
    let mut stream_of = vec![0u32; chains.len()];
    for c in order {
        let mut best = (f64::INFINITY, f64::INFINITY, 0usize);
        for (s, b) in busy.iter().enumerate() {
            let mut cost = 0.0;
            for &g in &chains[c] {
                let g = g as usize;
                cost += b.overlap(top[g], top[g] + time[g]);
                if cost > best.0 {
                    break;
                }
            }
            // Overlaps below a nanosecond are rounding, not contention.
            let better = cost < best.0 - 1e-3 || (cost <= best.0 + 1e-3 && load[s] < best.1);
            if better {
                best = (cost, load[s], s);
            }
        }
        let s = best.2;
        stream_of[c] = s as u32;
        for &g in &chains[c] {
            let g = g as usize;
            busy[s].insert(top[g], top[g] + time[g]);
        }
        load[s] += prio[c].1;
    }
    stream_of
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_segments_merge_and_measure() {
        let mut b = Busy::default();
        b.insert(0.0, 2.0);
        b.insert(5.0, 6.0);
        b.insert(1.0, 5.0);
        assert_eq!(b.segs.len(), 1);
        assert_eq!(b.overlap(3.0, 10.0), 3.0);
        assert_eq!(b.overlap(6.0, 7.0), 0.0);
    }

    #[test]
    fn disjoint_chains_share_a_stream() {
        // Three single-group chains: 0 at [0, 4), 1 at [0, 2), 2 at [2, 4); two streams: 1 and 2 share.
        let chains = vec![vec![0], vec![1], vec![2]];
        let top = [0.0, 0.0, 2.0];
        let time = [4.0, 2.0, 2.0];
        let bottom = [4.0, 4.0, 2.0];
        assert_eq!(merge(&chains, &top, &time, &bottom, 2), vec![0, 1, 1]);
    }
}
