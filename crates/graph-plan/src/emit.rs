//! Step emission: the plan's steps in submission order. The stream pass decided every synchronisation
//! (`StreamPlan::syncs`, and `stream::waits_for_initial_work` for the copies of graph outputs that alias
//! sources); this step only numbers the events and writes the records and waits where those decisions put
//! them:
//! 1. the output copies, on stream 0, then one event after them when another stream reads what they write;
//! 2. per group in submission order: its waits (one per kept sync, sorted by source), its launch or copy, and a
//!    record when another stream waits on it.
//!
//! Events are numbered by their source group's first appearance in the sorted syncs; the copies' event comes
//! last. O(steps).

use graph_ir::ComputeGraph;
use graph_passes::fusion::FusionPlan;
use graph_passes::memory::MemoryPlan;
use graph_passes::stream::{self, StreamPlan};
use graph_passes::PlanResult;
use std::collections::HashMap;

use crate::build::bug;
use crate::ids::{EventId, StreamId};
use crate::lower::{place, Lowered};
use crate::plan::{Access, BufferRef, PlanStep};

/// The steps of the plan (see the module docs).
pub(crate) fn emit(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    mem: &MemoryPlan,
    streams: &StreamPlan,
    lowered: &Lowered,
) -> PlanResult<Vec<PlanStep>> {
    let ng = fusion.groups.len();
    let mut event_of_group: HashMap<usize, EventId> = HashMap::new();
    let mut syncs_into: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for s in &streams.syncs {
        let next = EventId::from_index(event_of_group.len());
        event_of_group.entry(s.from.index()).or_insert(next);
        syncs_into[s.to.index()].push(s.from.index());
    }
    for f in &mut syncs_into {
        f.sort_unstable();
        f.dedup();
    }
    let mut steps = Vec::with_capacity(ng + 2 * streams.syncs.len() + mem.output_copies.len());
    let mut copied: Vec<BufferRef> = Vec::with_capacity(mem.output_copies.len());
    for &(src, dst) in &mem.output_copies {
        let (s, d) = (place(graph, mem, src)?, place(graph, mem, dst)?);
        copied.push(d);
        steps.push(PlanStep::Copy { stream: StreamId(0), src: s, dst: d, bytes: d.bytes.min(s.bytes), node: None });
    }

    // What each group reads and writes, and whether it reads a copied output.
    let mut accesses: Vec<(Vec<BufferRef>, Vec<BufferRef>)> = Vec::with_capacity(ng);
    for (gi, g) in fusion.groups.iter().enumerate() {
        let (mut reads, mut writes) = match lowered.kernel_of_group[gi] {
            Some(k) => {
                let kernel = lowered.kernels.get(k.index()).ok_or_else(|| bug("emit", format!("no kernel {k}")))?;
                let of = |a: Access| kernel.params.iter().filter(|p| p.access == a).map(|p| p.buffer).collect();
                (of(Access::Read), of(Access::Write))
            }
            None => {
                let node = g.nodes.first().map(|&n| graph.node(n)).ok_or_else(|| bug("emit", "empty copy group"))?;
                match (node.inputs.first(), node.outputs.first()) {
                    (Some(&i), Some(&o)) => (vec![place(graph, mem, i)?], vec![place(graph, mem, o)?]),
                    _ => return Err(bug("emit", format!("copy '{}' without operands", node.name))),
                }
            }
        };
        reads.sort_unstable();
        reads.dedup();
        writes.sort_unstable();
        writes.dedup();
        accesses.push((reads, writes));
    }
    let reads_copy: Vec<bool> =
        accesses.iter().map(|(reads, _)| reads.iter().any(|r| copied.iter().any(|c| c.overlaps(r)))).collect();
    let order: Vec<usize> = streams.submission_order().iter().map(|g| g.index()).collect();
    let stream_of: Vec<usize> = streams.stream_of.iter().map(|s| s.index()).collect();
    let event_source: Vec<bool> = (0..ng).map(|g| event_of_group.contains_key(&g)).collect();
    let copy_waits = stream::waits_for_initial_work(
        &order,
        &stream_of,
        &syncs_into,
        &event_source,
        &reads_copy,
        streams.num_streams,
    );
    let copy_event = EventId::from_index(event_of_group.len());
    if copy_waits.iter().any(|&w| w) {
        steps.push(PlanStep::Record { stream: StreamId(0), event: copy_event });
    }

    for &gi in &order {
        let stream = streams.stream_of[gi];
        for f in &syncs_into[gi] {
            let event = *event_of_group.get(f).ok_or_else(|| bug("emit", "a wait on an event never recorded"))?;
            steps.push(PlanStep::Wait { stream, event });
        }
        if copy_waits[gi] {
            steps.push(PlanStep::Wait { stream, event: copy_event });
        }
        let (reads, writes) = std::mem::take(&mut accesses[gi]);
        match lowered.kernel_of_group[gi] {
            Some(kernel) => steps.push(PlanStep::Launch { stream, kernel, reads, writes }),
            None => {
                let (src, dst) = match (reads.first(), writes.first()) {
                    (Some(&s), Some(&d)) => (s, d),
                    _ => return Err(bug("emit", "copy without operands")),
                };
                let node = fusion.groups[gi].nodes.first().map(|&n| graph.node(n).name.clone());
                steps.push(PlanStep::Copy { stream, src, dst, bytes: src.bytes, node });
            }
        }
        if let Some(&event) = event_of_group.get(&gi) {
            steps.push(PlanStep::Record { stream, event });
        }
    }
    Ok(steps)
}
