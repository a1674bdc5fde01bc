//! Shared helpers of the fusion test suites: running the pass, naming groups, and an independent checker of a
//! fusion plan's invariants (written from the graph and the plan alone, sharing no code with the pass).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use graph_ir::{ComputeGraph, DType, NodeId, Op, OpCategory, TensorId, TensorRole};
use graph_passes::fusion::{self, FusionCaps, FusionOptions, FusionPlan, FusionTarget, GroupKind, RejectReason};
use graph_passes::topo;
use std::collections::{HashMap, HashSet};

pub const F: DType = DType::F32;

/// Run the pass with `opts` on one stream.
pub fn fuse(g: &ComputeGraph, opts: &FusionOptions) -> FusionPlan {
    let order = topo::analyse(g).unwrap();
    fusion::analyse(g, &order, opts)
}

/// Run the pass with `opts` for `streams` streams on the default device.
pub fn fuse_streams(g: &ComputeGraph, opts: &FusionOptions, streams: usize) -> FusionPlan {
    let order = topo::analyse(g).unwrap();
    fusion::analyse_for(g, &order, opts, &FusionTarget { streams, ..Default::default() })
}

/// Node names of every group, in execution order.
pub fn names(g: &ComputeGraph, p: &FusionPlan) -> Vec<Vec<String>> {
    p.groups.iter().map(|gr| gr.nodes.iter().map(|&n| g.node(n).name.clone()).collect()).collect()
}

/// Kinds of every group, in execution order.
pub fn kinds(p: &FusionPlan) -> Vec<GroupKind> {
    p.groups.iter().map(|g| g.kind).collect()
}

/// The verdict on the edge `producer -> consumer`: `None` when fused (no decision: `check` asserts that every
/// edge between two kernels has one).
pub fn verdict(p: &FusionPlan, producer: &str, consumer: &str) -> Option<RejectReason> {
    p.decisions
        .iter()
        .find(|d| d.producer == producer && d.consumer == consumer && d.phase != fusion::FusionPhase::Horizontal)
        .and_then(|d| d.rejected)
}

/// Tensor names written by group `i`.
pub fn outputs(g: &ComputeGraph, p: &FusionPlan, i: usize) -> Vec<String> {
    p.groups[i].outputs.iter().map(|&t| g.tensor(t).name.clone()).collect()
}

/// Add a one-output node.
pub fn n1(g: &mut ComputeGraph, name: &str, op: Op, ins: &[TensorId]) -> TensorId {
    g.add_node(name, op, ins).unwrap()[0]
}

/// The kernel writer of `t`'s bytes: the group of its producer, looking through views outside groups.
fn writer(g: &ComputeGraph, p: &FusionPlan, mut t: TensorId) -> Option<usize> {
    loop {
        let n = g.producer(t)?;
        if let Some(gi) = p.group_of.get(n) {
            return Some(gi.index());
        }
        assert!(g.node(n).op.is_view(), "non-view node '{}' is in no group", g.node(n).name);
        t = g.node(n).inputs[0];
    }
}

/// Check every invariant of a fusion plan; panics with the first violation.
pub fn check(g: &ComputeGraph, p: &FusionPlan, caps: &FusionCaps) {
    // Coverage: every non-view node in exactly one group, `group_of` agrees with the lists.
    let mut seen: HashMap<NodeId, usize> = HashMap::new();
    for (gi, gr) in p.groups.iter().enumerate() {
        assert!(!gr.nodes.is_empty(), "group {gi} is empty");
        for &n in &gr.nodes {
            assert!(seen.insert(n, gi).is_none(), "node '{}' in two groups", g.node(n).name);
            assert_eq!(p.group_of.get(n).map(|x| x.index()), Some(gi), "group_of of '{}'", g.node(n).name);
        }
        assert!(gr.nodes.iter().any(|&n| !g.node(n).op.is_view()), "group {gi} holds only views");
    }
    for (id, node) in g.nodes() {
        if !node.op.is_view() {
            assert!(seen.contains_key(&id), "non-view node '{}' not covered", node.name);
        }
    }
    assert_eq!(p.group_of.len(), seen.len());
    // Order: every input of a group is written by an earlier group (or is a source); never by the group itself
    // through an outside view.
    for (gi, gr) in p.groups.iter().enumerate() {
        let members: HashSet<NodeId> = gr.nodes.iter().copied().collect();
        for &n in &gr.nodes {
            for &t in &g.node(n).inputs {
                let inside = g.producer(t).is_some_and(|q| members.contains(&q));
                if inside {
                    continue;
                }
                if let Some(w) = writer(g, p, t) {
                    assert!(w < gi, "group {gi} reads '{}' written by group {w}", g.tensor(t).name);
                }
            }
        }
        // The lists of inputs and outputs match the graph.
        for &t in &gr.inputs {
            assert!(
                !g.producer(t).is_some_and(|q| members.contains(&q)),
                "input '{}' produced inside",
                g.tensor(t).name
            );
        }
        for &t in &gr.outputs {
            let prod = g.producer(t).unwrap();
            assert!(members.contains(&prod));
            let escapes = g.tensor(t).role == TensorRole::Output || g.consumers(t).iter().any(|c| !members.contains(c));
            assert!(escapes, "output '{}' does not escape", g.tensor(t).name);
            assert!(p.is_materialized(g, t));
        }
        for &n in &gr.nodes {
            for &t in &g.node(n).outputs {
                let escapes =
                    g.tensor(t).role == TensorRole::Output || g.consumers(t).iter().any(|c| !members.contains(c));
                assert_eq!(escapes, gr.outputs.contains(&t), "escape of '{}'", g.tensor(t).name);
            }
        }
        check_caps(g, gi, gr, caps);
    }
    // Decisions: exactly the edges between two kernels, each rejected with a reason.
    let by_name: HashMap<&str, NodeId> = g.nodes().map(|(id, n)| (n.name.as_str(), id)).collect();
    let mut listed: HashSet<(NodeId, NodeId)> = HashSet::new();
    for d in &p.decisions {
        if d.phase == fusion::FusionPhase::Horizontal {
            continue;
        }
        let (a, b) = (by_name[d.producer.as_str()], by_name[d.consumer.as_str()]);
        assert_ne!(p.group_of.get(a), p.group_of.get(b), "decision on a fused edge: {d:?}");
        assert!(d.rejected.is_some(), "{d:?}");
        assert!(listed.insert((a, b)), "two decisions on one edge: {d:?}");
    }
    for (c, node) in g.nodes() {
        if node.op.is_view() {
            continue;
        }
        for &t in &node.inputs {
            let mut t = t;
            let prod = loop {
                match g.producer(t) {
                    Some(q) if g.node(q).op.is_view() => t = g.node(q).inputs[0],
                    other => break other,
                }
            };
            if let Some(q) = prod {
                if p.group_of.get(q) != p.group_of.get(c) {
                    assert!(listed.contains(&(q, c)), "edge {} -> {} has no decision", g.node(q).name, node.name);
                }
            }
        }
    }
}

fn check_caps(g: &ComputeGraph, gi: usize, gr: &fusion::FusedGroup, caps: &FusionCaps) {
    let ops: Vec<NodeId> = gr.nodes.iter().copied().filter(|&n| !g.node(n).op.is_view()).collect();
    if ops.len() == 1 {
        return;
    }
    let name = |n: NodeId| g.node(n).name.clone();
    assert!(ops.len() <= caps.max_ops, "group {gi} has {} ops", ops.len());
    assert!(gr.inputs.len() <= caps.max_inputs, "group {gi} has {} inputs", gr.inputs.len());
    let writers: HashSet<NodeId> = gr.outputs.iter().map(|&t| g.producer(t).unwrap()).collect();
    if writers.len() > 1 {
        assert!(caps.multi_output, "group {gi} writes from {} nodes", writers.len());
    }
    let members: HashSet<NodeId> = gr.nodes.iter().copied().collect();
    let mut anchors = 0;
    let mut reductions = 0;
    let mut moves = 0;
    for &n in &ops {
        let node = g.node(n);
        match node.op.category() {
            OpCategory::Custom | OpCategory::Copy => panic!("'{}' fused in group {gi}", name(n)),
            OpCategory::Anchor => {
                anchors += 1;
                let cap = match node.op {
                    Op::MatMul => caps.matmul_epilogue,
                    Op::Gemm { .. } => caps.gemm_epilogue,
                    Op::Conv(_) => caps.conv_epilogue,
                    _ => caps.pool_epilogue,
                };
                assert!(cap, "anchor '{}' has an epilogue against the caps", name(n));
                for &t in &node.inputs {
                    let mut t = t;
                    // Through views: the operand's real producer must be outside.
                    loop {
                        match g.producer(t) {
                            Some(q) if g.node(q).op.is_view() && !members.contains(&q) => t = g.node(q).inputs[0],
                            Some(q) => {
                                assert!(!members.contains(&q), "prologue '{}' into anchor '{}'", name(q), name(n));
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            OpCategory::Reduction => reductions += 1,
            OpCategory::DataMovement => {
                moves += 1;
                assert!(node.outputs.len() == 1, "multi-output op '{}' fused", name(n));
            }
            _ => {}
        }
    }
    assert!(anchors <= 1, "group {gi} has {anchors} anchors");
    if anchors == 1 {
        assert_eq!(gr.kind, GroupKind::Anchor);
        assert_eq!(reductions + moves, 0, "group {gi}: anchor with reductions or moves");
    }
    if reductions > 0 {
        assert!(caps.reduction_fusion);
        assert_eq!(gr.kind, GroupKind::Reduction);
        assert_eq!(moves, 0);
    }
    if moves > 0 {
        assert!(caps.injective_fusion);
        assert_eq!(gr.kind, GroupKind::DataMovement);
    }
}
