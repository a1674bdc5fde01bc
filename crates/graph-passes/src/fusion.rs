//! The fusion pass: partitions the non-view nodes into groups, each of which becomes one kernel launch.
//!
//! Baseline algorithm (vertical elementwise chains): visit nodes in topological order; an elementwise node joins
//! the group of the producer of its first input when that tensor has exactly one consumer, is not a graph output,
//! the producer's group is elementwise, the caps allow it, and every other input of the node is a source or is
//! produced before the group's first node (so no path can leave the group and come back: legal by construction).
//! Views are not kernels and stay outside groups. Groups are then ordered by Kahn's algorithm on the group DAG,
//! ties broken by the position of the group's first node. O((N + E) log N).
//!
//! Fused-away intermediates (read only inside their group) are not materialised: they leave the pool.

use graph_ir::{ComputeGraph, NodeId, OpCategory, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::ids::GroupId;
use crate::topo::TopoOrder;

/// What a backend can build: the plan never asks for a kernel outside these limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionCaps {
    /// MatMul accepts an elementwise epilogue.
    pub matmul_epilogue: bool,
    /// Gemm accepts an elementwise epilogue.
    pub gemm_epilogue: bool,
    /// Conv accepts an elementwise epilogue.
    pub conv_epilogue: bool,
    /// MaxPool/AveragePool accept an elementwise epilogue.
    pub pool_epilogue: bool,
    /// Reductions accept elementwise producers (input fusion) and epilogues.
    pub reduction_fusion: bool,
    /// A kernel may write intermediates that other kernels read (multi-output fusion).
    pub multi_output: bool,
    /// Most distinct external inputs of one kernel.
    pub max_inputs: usize,
    /// Most ops in one kernel.
    pub max_ops: usize,
}

impl FusionCaps {
    /// Everything allowed, with generous limits (the simulator can run any program).
    pub fn all() -> Self {
        FusionCaps {
            matmul_epilogue: true,
            gemm_epilogue: true,
            conv_epilogue: true,
            pool_epilogue: true,
            reduction_fusion: true,
            multi_output: true,
            max_inputs: 64,
            max_ops: 256,
        }
    }
}

impl Default for FusionCaps {
    fn default() -> Self {
        FusionCaps::all()
    }
}

/// Options of the fusion pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionOptions {
    /// Fuse at all (off: one group per non-view node).
    pub enabled: bool,
    /// Fuse small independent siblings that read the same input.
    pub horizontal: bool,
    /// The target backend's capabilities.
    pub caps: FusionCaps,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions { enabled: true, horizontal: false, caps: FusionCaps::all() }
    }
}

/// The shape of a group's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupKind {
    /// Only elementwise ops (and views): one thread per output element.
    Elementwise,
    /// An anchor (MatMul, Gemm, Conv, pool) with optional elementwise prologue-free epilogue.
    Anchor,
    /// A reduction with optional elementwise producers and epilogue.
    Reduction,
    /// One data-movement op (with optional elementwise epilogue).
    DataMovement,
    /// A host <-> device copy.
    Copy,
    /// A user kernel.
    Custom,
}

impl GroupKind {
    /// The kind of a group founded by a node of `cat`.
    pub fn of(cat: OpCategory) -> GroupKind {
        match cat {
            OpCategory::Elementwise | OpCategory::View => GroupKind::Elementwise,
            OpCategory::Anchor => GroupKind::Anchor,
            OpCategory::Reduction => GroupKind::Reduction,
            OpCategory::DataMovement => GroupKind::DataMovement,
            OpCategory::Copy => GroupKind::Copy,
            OpCategory::Custom => GroupKind::Custom,
        }
    }
}

/// One fused group: the nodes of one kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusedGroup {
    /// Nodes in topological order (views fused inside included).
    pub nodes: Vec<NodeId>,
    /// The kernel's shape.
    pub kind: GroupKind,
    /// Tensors read from outside the group, in first-use order.
    pub inputs: Vec<TensorId>,
    /// Tensors the group writes that outlive it (read by another group or a graph output), in production order.
    pub outputs: Vec<TensorId>,
}

/// Why two nodes were not fused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectReason {
    /// Fusion is switched off.
    Disabled,
    /// Fusing would create a cycle between groups.
    WouldCycle,
    /// The producer's result has other consumers (and multi-output fusion did not apply).
    MultiConsumer,
    /// The producer's result is a graph output.
    GraphOutput,
    /// The backend's caps forbid the combination or the size.
    CapsExceeded,
    /// One side is a custom kernel.
    AcrossCustom,
    /// One side is a host/device copy.
    AcrossCopy,
    /// The pair's op categories do not fuse in this pattern.
    Pattern,
    /// Fusing would serialise work that could run concurrently.
    LosesConcurrency,
}

/// One fusion decision between a producer and a consumer node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionDecision {
    /// Producer node name.
    pub producer: String,
    /// Consumer node name.
    pub consumer: String,
    /// `None` when fused; otherwise why not.
    pub rejected: Option<RejectReason>,
}

/// The result of the fusion pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FusionPlan {
    /// Groups in execution (topological) order; `GroupId(i)` is `groups[i]`.
    pub groups: Vec<FusedGroup>,
    /// The group of every node that runs in a kernel (views outside groups are absent).
    pub group_of: SecondaryMap<NodeId, GroupId>,
    /// Decisions on producer/consumer pairs that were candidates.
    pub decisions: Vec<FusionDecision>,
}

impl FusionPlan {
    /// True when `t` needs memory: it is read or written outside the group that produces it, or is a source.
    pub fn is_materialized(&self, graph: &ComputeGraph, t: TensorId) -> bool {
        let Some(p) = graph.producer(t) else { return true };
        let Some(&g) = self.group_of.get(p) else { return true };
        if graph.tensor(t).role == TensorRole::Output {
            return true;
        }
        graph.consumers(t).iter().any(|&c| self.group_of.get(c) != Some(&g))
    }
}

/// Run the fusion pass.
pub fn analyse(graph: &ComputeGraph, order: &TopoOrder, opts: &FusionOptions) -> FusionPlan {
    let _span = tracing::debug_span!("fusion").entered();
    // Provisional groups as lists of nodes; `gid[n]` indexes them.
    let mut members: Vec<Vec<NodeId>> = Vec::new();
    let mut kinds: Vec<GroupKind> = Vec::new();
    let mut first_pos: Vec<u32> = Vec::new();
    let mut gid: SecondaryMap<NodeId, usize> = SecondaryMap::with_capacity(graph.num_nodes());
    let mut decisions = Vec::new();
    for &n in &order.order {
        let node = graph.node(n);
        let cat = node.op.category();
        if cat == OpCategory::View {
            continue;
        }
        let mut joined = None;
        if cat == OpCategory::Elementwise {
            if let Some(&t) = node.inputs.first() {
                if let Some(p) = graph.producer(t) {
                    if let Some(&g) = gid.get(p) {
                        let reason = check_join(graph, order, opts, t, n, g, &members, &kinds, &first_pos);
                        decisions.push(FusionDecision {
                            producer: graph.node(p).name.clone(),
                            consumer: node.name.clone(),
                            rejected: reason,
                        });
                        if reason.is_none() {
                            joined = Some(g);
                        }
                    }
                }
            }
        }
        match joined {
            Some(g) => {
                members[g].push(n);
                gid.insert(n, g);
            }
            None => {
                gid.insert(n, members.len());
                members.push(vec![n]);
                kinds.push(GroupKind::of(cat));
                first_pos.push(order.position[n]);
            }
        }
    }
    finish(graph, order, members, kinds, gid, decisions)
}

#[allow(clippy::too_many_arguments)] // the provisional state of one pass, passed explicitly
fn check_join(
    graph: &ComputeGraph,
    order: &TopoOrder,
    opts: &FusionOptions,
    t: TensorId,
    n: NodeId,
    g: usize,
    members: &[Vec<NodeId>],
    kinds: &[GroupKind],
    first_pos: &[u32],
) -> Option<RejectReason> {
    if !opts.enabled {
        return Some(RejectReason::Disabled);
    }
    if kinds[g] != GroupKind::Elementwise {
        return Some(RejectReason::Pattern);
    }
    if graph.tensor(t).role == TensorRole::Output {
        return Some(RejectReason::GraphOutput);
    }
    if graph.consumers(t).len() != 1 {
        return Some(RejectReason::MultiConsumer);
    }
    if members[g].len() + 1 > opts.caps.max_ops {
        return Some(RejectReason::CapsExceeded);
    }
    for &other in &graph.node(n).inputs[1..] {
        if let Some(p) = graph.producer(other) {
            if order.position[p] >= first_pos[g] && !members[g].contains(&p) {
                return Some(RejectReason::WouldCycle);
            }
        }
    }
    None
}

/// Order the provisional groups topologically and compute their external inputs and outputs.
pub(crate) fn finish(
    graph: &ComputeGraph,
    order: &TopoOrder,
    members: Vec<Vec<NodeId>>,
    kinds: Vec<GroupKind>,
    gid: SecondaryMap<NodeId, usize>,
    decisions: Vec<FusionDecision>,
) -> FusionPlan {
    let k = members.len();
    // Group DAG edges through tensors, looking through views to their real producer.
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); k];
    let mut indeg = vec![0u32; k];
    for (g, nodes) in members.iter().enumerate() {
        for &n in nodes {
            for &t in &graph.node(n).inputs {
                if let Some(p) = kernel_producer(graph, &gid, t) {
                    if p != g && !succ[p].contains(&g) {
                        succ[p].push(g);
                        indeg[g] += 1;
                    }
                }
            }
        }
    }
    let first: Vec<u32> = members.iter().map(|m| m.iter().map(|&n| order.position[n]).min().unwrap_or(0)).collect();
    let mut ready: BinaryHeap<Reverse<(u32, usize)>> =
        (0..k).filter(|&g| indeg[g] == 0).map(|g| Reverse((first[g], g))).collect();
    let mut new_index = vec![usize::MAX; k];
    let mut sequence = Vec::with_capacity(k);
    while let Some(Reverse((_, g))) = ready.pop() {
        new_index[g] = sequence.len();
        sequence.push(g);
        for &s in &succ[g] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(Reverse((first[s], s)));
            }
        }
    }
    let mut group_of: SecondaryMap<NodeId, GroupId> = SecondaryMap::with_capacity(graph.num_nodes());
    for (n, &g) in gid.iter() {
        group_of.insert(n, GroupId::from_index(new_index[g]));
    }
    let mut groups = Vec::with_capacity(k);
    let mut members = members;
    for &g in &sequence {
        let mut nodes = std::mem::take(&mut members[g]);
        nodes.sort_by_key(|&n| order.position[n]);
        let me = GroupId::from_index(new_index[g]);
        let mut inputs: Vec<TensorId> = Vec::new();
        let mut outputs: Vec<TensorId> = Vec::new();
        for &n in &nodes {
            let node = graph.node(n);
            for &t in &node.inputs {
                let inside = graph.producer(t).is_some_and(|p| group_of.get(p) == Some(&me));
                if !inside && !inputs.contains(&t) {
                    inputs.push(t);
                }
            }
            for &t in &node.outputs {
                let escapes = graph.tensor(t).role == TensorRole::Output
                    || graph.consumers(t).iter().any(|&c| group_of.get(c) != Some(&me));
                if escapes {
                    outputs.push(t);
                }
            }
        }
        groups.push(FusedGroup { nodes, kind: kinds[g], inputs, outputs });
    }
    FusionPlan { groups, group_of, decisions }
}

/// The provisional group of the kernel that produces `t`'s bytes, looking through views outside groups.
fn kernel_producer(graph: &ComputeGraph, gid: &SecondaryMap<NodeId, usize>, mut t: TensorId) -> Option<usize> {
    loop {
        let p = graph.producer(t)?;
        if let Some(&g) = gid.get(p) {
            return Some(g);
        }
        // A view outside any group: its bytes are its input's.
        t = *graph.node(p).inputs.first()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo;
    use graph_ir::{DType, Op};

    fn names(g: &ComputeGraph, p: &FusionPlan) -> Vec<Vec<String>> {
        p.groups.iter().map(|gr| gr.nodes.iter().map(|&n| g.node(n).name.clone()).collect()).collect()
    }

    #[test]
    fn elementwise_chain_fuses_and_stops_at_branches() {
        let mut g = ComputeGraph::new("f");
        let x = g.add_input("x", DType::F32, [8]).unwrap();
        let w = g.add_weight("w", DType::F32, [8, 8]).unwrap();
        let m = g.add_node("mm", Op::MatMul, &[x, w]).unwrap()[0];
        let a = g.add_node("a", Op::Relu, &[m]).unwrap()[0];
        let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
        let c = g.add_node("c", Op::Abs, &[b]).unwrap()[0];
        let d = g.add_node("d", Op::Exp, &[b]).unwrap()[0];
        let e = g.add_node("e", Op::Add, &[c, d]).unwrap()[0];
        g.mark_output(e).unwrap();
        let order = topo::analyse(&g).unwrap();
        let p = analyse(&g, &order, &FusionOptions::default());
        assert_eq!(names(&g, &p), vec![vec!["mm"], vec!["a", "b"], vec!["c"], vec!["d"], vec!["e"]]);
        assert!(p.is_materialized(&g, b));
        assert!(!p.is_materialized(&g, a));
        let off = analyse(&g, &order, &FusionOptions { enabled: false, ..Default::default() });
        assert_eq!(off.groups.len(), 6);
        assert!(off.decisions.iter().all(|d| d.rejected == Some(RejectReason::Disabled)));
    }
}
