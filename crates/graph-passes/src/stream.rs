//! The stream pass: assigns fused groups to at most `max_streams` streams and chooses the cross-stream
//! synchronisations.
//!
//! Baseline algorithm: groups are visited in execution order; a group continues the stream of the predecessor
//! whose chain it extends (the predecessor is that stream's latest group), preferring the predecessor with the
//! longest modelled path; otherwise it opens a new stream while fewer than `max_streams` exist, else takes the
//! least loaded stream. Dependencies are data edges (through views) plus the memory pass's reuse edges.
//!
//! Synchronisation: each stream keeps a vector clock of the latest position of every other stream it is known to
//! have passed; a cross-stream edge gets a Record/Wait only when that clock does not already cover it. One
//! Record (after the producing group) serves every waiter.

use graph_ir::ComputeGraph;
use serde::{Deserialize, Serialize};

use crate::device::{estimate_group, DeviceProfile};
use crate::fusion::FusionPlan;
use crate::ids::{GroupId, StreamId};
use crate::memory::{writer_group, MemoryPlan};

/// Options of the stream pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Most streams to use (>= 1).
    pub max_streams: usize,
    /// The device the cost model describes.
    pub device: DeviceProfile,
}

/// A cross-stream synchronisation: `to` waits for the event recorded after `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SyncEdge {
    /// Group after which the event is recorded.
    pub from: GroupId,
    /// Group before which the stream waits.
    pub to: GroupId,
}

/// The result of the stream pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamPlan {
    /// Streams used (>= 1).
    pub num_streams: usize,
    /// Stream of each group, indexed by `GroupId`.
    pub stream_of: Vec<StreamId>,
    /// Synchronisations kept after reduction, sorted.
    pub syncs: Vec<SyncEdge>,
    /// Cross-stream dependency edges before reduction.
    pub events_before_reduction: usize,
}

/// Predecessors of every group: data edges (looking through views) and reuse edges, deduplicated.
pub fn group_predecessors(graph: &ComputeGraph, fusion: &FusionPlan, memory: &MemoryPlan) -> Vec<Vec<GroupId>> {
    let mut preds: Vec<Vec<GroupId>> = vec![Vec::new(); fusion.groups.len()];
    for (gi, g) in fusion.groups.iter().enumerate() {
        for &t in &g.inputs {
            if let Some(p) = writer_group(graph, fusion, t) {
                if p.index() != gi {
                    preds[gi].push(p);
                }
            }
        }
    }
    for e in &memory.reuse_edges {
        if e.from != e.to {
            preds[e.to.index()].push(e.from);
        }
    }
    for p in &mut preds {
        p.sort_unstable();
        p.dedup();
    }
    preds
}

/// Run the stream pass.
pub fn analyse(graph: &ComputeGraph, fusion: &FusionPlan, memory: &MemoryPlan, opts: &StreamOptions) -> StreamPlan {
    let _span = tracing::debug_span!("stream").entered();
    let n = fusion.groups.len();
    let max_streams = opts.max_streams.max(1);
    let preds = group_predecessors(graph, fusion, memory);
    let time: Vec<f64> = fusion.groups.iter().map(|g| estimate_group(graph, g, &opts.device).1.time_us).collect();
    // Longest path ending at each group (modelled time).
    let mut path = vec![0f64; n];
    for g in 0..n {
        let before = preds[g].iter().map(|p| path[p.index()]).fold(0f64, f64::max);
        path[g] = before + time[g];
    }
    let mut stream_of: Vec<StreamId> = Vec::with_capacity(n);
    let mut last_on: Vec<Option<GroupId>> = Vec::new();
    let mut load: Vec<f64> = Vec::new();
    for g in 0..n {
        let extend = preds[g]
            .iter()
            .filter(|p| last_on[stream_of[p.index()].index()] == Some(**p))
            .max_by(|a, b| path[a.index()].total_cmp(&path[b.index()]).then(b.cmp(a)))
            .map(|p| stream_of[p.index()]);
        let s = match extend {
            Some(s) => s,
            None if last_on.len() < max_streams => {
                last_on.push(None);
                load.push(0.0);
                StreamId::from_index(last_on.len() - 1)
            }
            None => {
                let best = (0..load.len()).min_by(|&a, &b| load[a].total_cmp(&load[b])).unwrap_or(0);
                StreamId::from_index(best)
            }
        };
        stream_of.push(s);
        last_on[s.index()] = Some(GroupId::from_index(g));
        load[s.index()] += time[g];
    }
    let num_streams = last_on.len().max(1);
    let (syncs, before) = reduce_syncs(&preds, &stream_of, num_streams);
    StreamPlan { num_streams, stream_of, syncs, events_before_reduction: before }
}

/// Keep only the cross-stream edges that stream order plus earlier synchronisations do not imply.
/// Returns the kept edges and the number of cross-stream edges before reduction.
pub fn reduce_syncs(preds: &[Vec<GroupId>], stream_of: &[StreamId], num_streams: usize) -> (Vec<SyncEdge>, usize) {
    let n = preds.len();
    // seq[g]: 1-based position of g on its stream.
    let mut seq = vec![0u32; n];
    let mut count = vec![0u32; num_streams];
    for g in 0..n {
        let s = stream_of[g].index();
        count[s] += 1;
        seq[g] = count[s];
    }
    // clock[s][k]: latest position on stream k that stream s is known to have passed.
    let mut clock = vec![vec![0u32; num_streams]; num_streams];
    // The clock of a stream right after each group (needed when another stream waits on it).
    let mut after: Vec<Vec<u32>> = Vec::with_capacity(n);
    let mut syncs = Vec::new();
    let mut before = 0usize;
    for g in 0..n {
        let s = stream_of[g].index();
        let mut ps: Vec<GroupId> = preds[g].iter().copied().filter(|p| stream_of[p.index()].index() != s).collect();
        before += ps.len();
        // Latest first: waiting on a later group tends to cover earlier ones.
        ps.sort_unstable_by(|a, b| b.cmp(a));
        for p in ps {
            let k = stream_of[p.index()].index();
            if clock[s][k] >= seq[p.index()] {
                continue;
            }
            let snapshot = after[p.index()].clone();
            for (c, v) in clock[s].iter_mut().zip(snapshot) {
                *c = (*c).max(v);
            }
            syncs.push(SyncEdge { from: p, to: GroupId::from_index(g) });
        }
        clock[s][s] = seq[g];
        after.push(clock[s].clone());
    }
    syncs.sort_unstable();
    (syncs, before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redundant_waits_are_dropped() {
        // s0: g0 -> g2 ; s1: g1 -> g3; g3 depends on g0 and g2; waiting on g2 implies g0.
        let preds = vec![vec![], vec![], vec![GroupId(0)], vec![GroupId(0), GroupId(1), GroupId(2)]];
        let stream_of = vec![StreamId(0), StreamId(1), StreamId(0), StreamId(1)];
        let (syncs, before) = reduce_syncs(&preds, &stream_of, 2);
        assert_eq!(before, 2);
        assert_eq!(syncs, vec![SyncEdge { from: GroupId(2), to: GroupId(3) }]);
    }
}
