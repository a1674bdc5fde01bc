//! Event minimisation: which cross-stream edges need a Record/Wait pair.
//!
//! Groups are visited in submission order (any topological order; positions below are submission positions). Each stream keeps a vector clock: for every other stream, the latest
//! position on it known to have finished before the stream's next group (stream order plus the waits so far).
//! A cross-stream edge `p -> g` needs a wait only when `g`'s stream clock does not already cover `p`; when it
//! does not, the wait merges `p`'s clock (taken right after `p`) into the stream's.
//!
//! **No redundant wait survives.** A path into `g` other than a wait edge ends at `g`'s stream predecessor or at
//! another wait source of `g`, all decided before `g`. Predecessors are visited latest first, and a happens-before
//! path from `p` to `q` implies `p < q`, so by the time `p` is considered every wait source that could imply it
//! has been merged: the kept waits are exactly the cross-stream edges of the transitive reduction of the final
//! happens-before order, the fewest any synchronisation of this assignment can have. O((N + E) k) time for `k`
//! streams; clocks are kept only for groups another stream waits on.

use super::csr::Csr;

/// The kept waits `(from, to)` in increasing `(from, to)` order. `order` is the submission order (a
/// topological order of `preds`), `stream_of` each group's stream (`< num_streams`).
pub fn reduce(preds: &Csr, stream_of: &[u32], order: &[u32], num_streams: usize) -> Vec<(u32, u32)> {
    let n = preds.len();
    let k = num_streams.max(1);
    // seq[g]: 1-based position of g on its stream; pos[g]: submission position.
    let mut seq = vec![0u32; n];
    let mut pos = vec![0u32; n];
    let mut count = vec![0u32; k];
    // Only groups with a successor on another stream ever have their clock read.
    let mut snapshot_of = vec![u32::MAX; n];
    for (i, &g) in order.iter().enumerate() {
        let g = g as usize;
        let s = stream_of[g] as usize;
        count[s] += 1;
        seq[g] = count[s];
        pos[g] = i as u32;
        for &p in preds.row(g) {
            if stream_of[p as usize] as usize != s {
                snapshot_of[p as usize] = 0;
            }
        }
    }
    let mut snapshots: Vec<u32> = Vec::new();
    let mut clock = vec![0u32; k * k];
    let mut syncs = Vec::new();
    let mut ps: Vec<u32> = Vec::new();
    for &g in order {
        let g = g as usize;
        let s = stream_of[g] as usize;
        ps.clear();
        ps.extend(preds.row(g).iter().copied().filter(|&p| stream_of[p as usize] as usize != s));
        // Latest first: a later source may already imply an earlier one, never the reverse.
        ps.sort_unstable_by(|a, b| pos[*b as usize].cmp(&pos[*a as usize]));
        ps.dedup();
        for &p in &ps {
            let ks = stream_of[p as usize] as usize;
            if clock[s * k + ks] >= seq[p as usize] {
                continue;
            }
            let at = snapshot_of[p as usize] as usize;
            for j in 0..k {
                let v = snapshots[at * k + j];
                let c = &mut clock[s * k + j];
                *c = (*c).max(v);
            }
            syncs.push((p, g as u32));
        }
        clock[s * k + s] = seq[g];
        if snapshot_of[g] != u32::MAX {
            snapshot_of[g] = (snapshots.len() / k) as u32;
            snapshots.extend_from_slice(&clock[s * k..s * k + k]);
        }
    }
    syncs.sort_unstable();
    syncs
}

/// Which groups must wait for the work stream 0 submits before every group (the copies of graph outputs that
/// alias sources, followed by one event): a group that reads what that work writes (`reads_initial[g]`) waits
/// on the event unless its stream already knows the work is done. Stream 0 always knows; another stream learns
/// it by waiting on an event recorded by a stream that knew. `syncs_into[g]` lists the groups whose events `g`
/// waits on, `event_source[g]` whether another stream waits on `g`'s event; `order` is the submission order.
/// The first waiter of each stream waits; later ones on that stream are covered by stream order.
pub fn waits_for_initial_work(
    order: &[usize],
    stream_of: &[usize],
    syncs_into: &[Vec<usize>],
    event_source: &[bool],
    reads_initial: &[bool],
    num_streams: usize,
) -> Vec<bool> {
    let mut knows = vec![false; num_streams.max(1)];
    knows[0] = true;
    // Per group whose event others wait on: whether its stream knew when the event was recorded.
    let mut event_knows = vec![false; stream_of.len()];
    let mut wait = vec![false; stream_of.len()];
    for &g in order {
        let s = stream_of[g];
        if syncs_into[g].iter().any(|&f| event_knows[f]) {
            knows[s] = true;
        }
        if !knows[s] && reads_initial[g] {
            wait[g] = true;
            knows[s] = true;
        }
        if event_source[g] {
            event_knows[g] = knows[s];
        }
    }
    wait
}
