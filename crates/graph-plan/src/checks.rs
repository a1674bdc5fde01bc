//! Consistency checks run after each pass in debug and test builds (a planner bug surfaces at the pass that
//! made it, not at the end). These check the passes' own outputs; `verify` checks the finished plan
//! independently.

use graph_ir::{ComputeGraph, GraphError, GraphResult, OpCategory};
use graph_passes::fusion::FusionPlan;
use graph_passes::memory::{pack, MemoryPlan};
use graph_passes::topo::TopoOrder;

fn bug(pass: &str, detail: String) -> GraphError {
    GraphError::InvalidOption { option: format!("internal ({pass})"), detail: format!("planner bug: {detail}") }
}

/// Every non-view node is in exactly one group; group order is topological.
pub fn fusion(graph: &ComputeGraph, _order: &TopoOrder, f: &FusionPlan) -> GraphResult<()> {
    let mut seen = 0usize;
    for (gi, g) in f.groups.iter().enumerate() {
        for &n in &g.nodes {
            if f.group_of.get(n).map(|x| x.index()) != Some(gi) {
                return Err(bug(
                    "fusion",
                    format!("node '{}' listed in group {gi} but mapped elsewhere", graph.node(n).name),
                ));
            }
            if graph.node(n).op.category() != OpCategory::View {
                seen += 1;
            }
            for &t in &graph.node(n).inputs {
                if let Some(p) = graph_passes::memory::writer_group(graph, f, t) {
                    if p.index() > gi {
                        return Err(bug("fusion", format!("group {gi} reads from later group {}", p.index())));
                    }
                }
            }
        }
    }
    let non_view = graph.nodes().filter(|(_, n)| n.op.category() != OpCategory::View).count();
    if seen != non_view {
        return Err(bug("fusion", format!("{seen} non-view nodes grouped, graph has {non_view}")));
    }
    Ok(())
}

/// Pool buffers never overlap in both time and space.
pub fn memory(m: &MemoryPlan) -> GraphResult<()> {
    let bufs: Vec<pack::Buffer> = m
        .buffers
        .iter()
        .map(|b| pack::Buffer {
            lower: b.live.start as u64,
            upper: b.live.end.max(b.live.start + 1) as u64,
            size: b.size,
        })
        .collect();
    let offsets: Vec<u64> = m.buffers.iter().map(|b| b.offset).collect();
    // Sweep: sort by start, keep live buffers; quadratic only in the number live at once.
    let mut idx: Vec<usize> = (0..bufs.len()).collect();
    idx.sort_by_key(|&i| bufs[i].lower);
    let mut live: Vec<usize> = Vec::new();
    for &i in &idx {
        live.retain(|&j| bufs[j].upper > bufs[i].lower);
        for &j in &live {
            let (a0, a1) = (offsets[i], offsets[i] + bufs[i].size);
            let (b0, b1) = (offsets[j], offsets[j] + bufs[j].size);
            if a0 < b1 && b0 < a1 {
                return Err(bug("memory", format!("pool buffers {i} and {j} overlap in time and space")));
            }
        }
        live.push(i);
    }
    Ok(())
}
