//! Consistency checks run after each pass in debug and test builds (Cranelift's verify-after-each-pass): a
//! planner bug surfaces as an [`InternalError`] naming the pass that made it, not at the end. These check the
//! passes' own outputs against their contracts; `verify` checks the finished plan independently. In release
//! builds every function here returns `Ok(())` at once.

use graph_ir::{ComputeGraph, OpCategory};
use graph_passes::fusion::FusionPlan;
use graph_passes::group_graph::GroupGraph;
use graph_passes::interval::Interval;
use graph_passes::memory::MemoryPlan;
use graph_passes::stream::StreamPlan;
use graph_passes::{InternalError, PlanError, PlanResult};

/// Whether the checks run (debug and test builds).
pub(crate) const ON: bool = cfg!(debug_assertions);

fn bug(pass: &'static str, detail: String) -> PlanError {
    PlanError::Internal(InternalError::new(pass, detail))
}

/// The precision transform's contract: the rewritten graph validates, every original node is there under its
/// name with the same op type, and the graph inputs and outputs are the same names in the same order.
pub fn after_precision(input: &ComputeGraph, rewritten: &ComputeGraph) -> PlanResult<()> {
    if !ON {
        return Ok(());
    }
    rewritten.validate().map_err(|e| bug("precision", format!("the rewritten graph does not validate: {e}")))?;
    for (_, n) in input.nodes() {
        let same = rewritten.node_id(&n.name).map(|m| rewritten.node(m).op.name() == n.op.name());
        if same != Some(true) {
            return Err(bug("precision", format!("node '{}' ({}) is missing or changed op", n.name, n.op.name())));
        }
    }
    let names = |g: &ComputeGraph, ts: &[graph_ir::TensorId]| -> Vec<String> {
        ts.iter().map(|&t| g.tensor(t).name.to_string()).collect()
    };
    if names(input, input.inputs()) != names(rewritten, rewritten.inputs())
        || names(input, input.outputs()) != names(rewritten, rewritten.outputs())
    {
        return Err(bug("precision", "graph inputs or outputs were renamed or reordered".into()));
    }
    Ok(())
}

/// Every non-view node is in exactly one group, and mapped back to it, but eliminated Concats, which are in none;
/// the slots of an eliminated Concat tile its output's bytes.
pub fn after_fusion(graph: &ComputeGraph, f: &FusionPlan) -> PlanResult<()> {
    if !ON {
        return Ok(());
    }
    let mut seen = 0usize;
    for (gi, g) in f.groups.iter().enumerate() {
        for &n in &g.nodes {
            if f.group_of.get(n).map(|x| x.index()) != Some(gi) {
                let name = &graph.node(n).name;
                return Err(bug("fusion", format!("node '{name}' listed in group {gi} but mapped elsewhere")));
            }
            if graph.node(n).op.category() != OpCategory::View {
                seen += 1;
            }
        }
    }
    let mut eliminated = 0usize;
    for (n, node) in graph.nodes() {
        if !f.is_eliminated(graph, n) {
            continue;
        }
        eliminated += 1;
        let mut at = 0u64;
        for &t in &node.inputs {
            match f.concat_slots.get(t) {
                Some(s) if s.concat == n && s.offset == at => at += graph.tensor(t).size_bytes() as u64,
                _ => {
                    let t = &graph.tensor(t).name;
                    return Err(bug(
                        "fusion",
                        format!("input '{t}' of eliminated '{}' is not at byte {at}", node.name),
                    ));
                }
            }
        }
        if node.outputs.first().map(|&o| graph.tensor(o).size_bytes() as u64) != Some(at) {
            return Err(bug("fusion", format!("the slots of eliminated '{}' do not tile its output", node.name)));
        }
    }
    let non_view = graph.nodes().filter(|(_, n)| n.op.category() != OpCategory::View).count() - eliminated;
    if seen != non_view {
        return Err(bug("fusion", format!("{seen} non-view nodes grouped, graph has {non_view}")));
    }
    Ok(())
}

/// Group order is topological: every data predecessor of a group comes before it.
pub fn after_groups(groups: &GroupGraph) -> PlanResult<()> {
    if !ON {
        return Ok(());
    }
    for (g, ps) in groups.all_preds().iter().enumerate() {
        if let Some(p) = ps.iter().find(|p| p.index() >= g) {
            return Err(bug("fusion", format!("group g{g} reads from later group {p}")));
        }
    }
    Ok(())
}

/// Pool buffers never overlap in both time and space.
pub fn after_memory(m: &MemoryPlan) -> PlanResult<()> {
    if !ON {
        return Ok(());
    }
    let live = |i: usize| {
        let l = m.buffers[i].live;
        Interval::new(l.start, l.end.max(l.start + 1))
    };
    // Sweep: sort by start, keep live buffers; quadratic only in the number live at once.
    let mut idx: Vec<usize> = (0..m.buffers.len()).collect();
    idx.sort_by_key(|&i| live(i).start);
    let mut active: Vec<usize> = Vec::new();
    for &i in &idx {
        active.retain(|&j| live(j).overlaps(&live(i)));
        let (a, b0) = (&m.buffers[i], m.buffers[i].offset);
        for &j in &active {
            let b = &m.buffers[j];
            if b0 < b.offset + b.size && b.offset < b0 + a.size {
                return Err(bug("memory", format!("pool buffers {i} and {j} overlap in time and space")));
            }
        }
        active.push(i);
    }
    Ok(())
}

/// Every group has a stream below the plan's count, every kept sync crosses streams forwards in group order.
pub fn after_stream(s: &StreamPlan, groups: usize, max_streams: usize) -> PlanResult<()> {
    if !ON {
        return Ok(());
    }
    if s.stream_of.len() != groups || s.num_streams == 0 || s.num_streams > max_streams.max(1) {
        return Err(bug(
            "stream",
            format!(
                "{} groups assigned, {groups} expected, on {} streams (limit {max_streams})",
                s.stream_of.len(),
                s.num_streams
            ),
        ));
    }
    if let Some(g) = s.stream_of.iter().position(|st| st.index() >= s.num_streams) {
        return Err(bug("stream", format!("group g{g} on stream {} of {}", s.stream_of[g], s.num_streams)));
    }
    let order = s.submission_order();
    let mut pos = vec![usize::MAX; groups];
    for (i, g) in order.iter().enumerate() {
        if let Some(p) = pos.get_mut(g.index()) {
            *p = i;
        }
    }
    if pos.contains(&usize::MAX) {
        return Err(bug("stream", "the submission order is not a permutation of the groups".into()));
    }
    for e in &s.syncs {
        let (a, b) = (e.from.index(), e.to.index());
        if a >= groups || b >= groups || s.stream_of[a] == s.stream_of[b] || pos[a] >= pos[b] {
            return Err(bug("stream", format!("sync {} -> {} is not a forward cross-stream edge", e.from, e.to)));
        }
    }
    Ok(())
}
