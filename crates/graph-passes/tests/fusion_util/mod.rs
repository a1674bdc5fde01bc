//! Shared helpers of the fusion test suites (memory_plans builds its graphs with them too): running the pass,
//! naming groups, and an independent checker of a fusion plan's invariants (written from the graph and the plan
//! alone, sharing no code with the pass).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use graph_ir::op::CustomOp;
use graph_ir::rng::SplitMix64;
use graph_ir::{ComputeGraph, DType, NodeId, Op, OpCategory, TensorId, TensorRole, TensorSpec};
use graph_passes::fusion::{self, FusionCaps, FusionOptions, FusionPlan, GroupKind, RejectReason};
use graph_passes::target::Target;
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
    fusion::analyse_for(g, &order, opts, &Target { streams, ..Default::default() })
}

/// Node names of every group, in execution order.
pub fn names(g: &ComputeGraph, p: &FusionPlan) -> Vec<Vec<String>> {
    p.groups.iter().map(|gr| gr.nodes.iter().map(|&n| g.node(n).name.to_string()).collect()).collect()
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
    p.groups[i].outputs.iter().map(|&t| g.tensor(t).name.to_string()).collect()
}

/// Add a one-output node.
pub fn n1(g: &mut ComputeGraph, name: &str, op: Op, ins: &[TensorId]) -> TensorId {
    g.add_node(name, op, ins).unwrap()[0]
}

/// The kernel writer of `t`'s bytes: the group of its producer, looking through views outside groups; for an
/// eliminated Concat's output, the last of its inputs' writers.
fn writer(g: &ComputeGraph, p: &FusionPlan, mut t: TensorId) -> Option<usize> {
    loop {
        let n = g.producer(t)?;
        if let Some(gi) = p.group_of.get(n) {
            return Some(gi.index());
        }
        if p.is_eliminated(g, n) {
            return g.node(n).inputs.iter().filter_map(|&i| writer(g, p, i)).max();
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
        if p.is_eliminated(g, id) {
            // An eliminated Concat: in no group, its inputs tile its output at increasing offsets.
            assert!(caps.concat_elimination, "'{}' eliminated against the caps", node.name);
            let mut at = 0u64;
            for &t in &node.inputs {
                let s = p.concat_slots.get(t).unwrap_or_else(|| panic!("input of '{}' has no slot", node.name));
                assert_eq!((s.concat, s.output, s.offset), (id, node.outputs[0], at), "slot of '{}'", node.name);
                at += g.tensor(t).size_bytes() as u64;
            }
            assert_eq!(at, g.tensor(node.outputs[0]).size_bytes() as u64);
        } else if !node.op.is_view() {
            assert!(seen.contains_key(&id), "non-view node '{}' not covered", node.name);
        }
    }
    for (t, s) in &p.concat_slots {
        assert!(p.is_eliminated(g, s.concat), "slot '{}' of a kept Concat", g.tensor(t).name);
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
    let by_name: HashMap<&str, NodeId> = g.nodes().map(|(id, n)| (n.name.as_ref(), id)).collect();
    let mut listed: HashSet<(NodeId, NodeId)> = HashSet::new();
    for d in &p.decisions {
        if d.phase == fusion::FusionPhase::Horizontal {
            continue;
        }
        if d.phase == fusion::FusionPhase::Concat {
            // A kept Concat's reason for not being eliminated: on the Concat itself, not an edge.
            let c = by_name[d.consumer.as_str()];
            assert!(matches!(g.node(c).op, Op::Concat { .. }) && !p.is_eliminated(g, c), "{d:?}");
            continue;
        }
        let (a, b) = (by_name[d.producer.as_str()], by_name[d.consumer.as_str()]);
        assert_ne!(p.group_of.get(a), p.group_of.get(b), "decision on a fused edge: {d:?}");
        assert!(d.rejected.is_some(), "{d:?}");
        assert!(listed.insert((a, b)), "two decisions on one edge: {d:?}");
    }
    for (c, node) in g.nodes() {
        if node.op.is_view() || p.is_eliminated(g, c) {
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
            if let Some(q) = prod.filter(|&q| !p.is_eliminated(g, q)) {
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
    if gr.kind == GroupKind::Attention {
        // Two MatMuls, one Softmax, the rest elementwise or Transposes.
        assert!(caps.attention, "group {gi}: attention against the caps");
        let count = |f: &dyn Fn(&Op) -> bool| ops.iter().filter(|&&n| f(&g.node(n).op)).count();
        assert_eq!(count(&|o| matches!(o, Op::MatMul)), 2, "group {gi}: attention MatMuls");
        assert_eq!(count(&|o| matches!(o, Op::Softmax { .. })), 1, "group {gi}: attention Softmax");
        let others = count(&|o| {
            !matches!(o, Op::MatMul | Op::Softmax { .. } | Op::Transpose { .. })
                && o.category() != OpCategory::Elementwise
        });
        assert_eq!(others, 0, "group {gi}: attention with other ops");
        return;
    }
    assert!(gr.inputs.len() <= caps.max_inputs, "group {gi} has {} inputs", gr.inputs.len());
    let writers: HashSet<NodeId> = gr.outputs.iter().map(|&t| g.producer(t).unwrap()).collect();
    if writers.len() > 1 {
        assert!(caps.multi_output, "group {gi} writes from {} nodes", writers.len());
    }
    let members: HashSet<NodeId> = gr.nodes.iter().copied().collect();
    // A pool chain (`caps.pool_chain`): two pools, the second reading the first's result directly, with a small
    // window; the first pool is the only op that may compute an operand of an anchor.
    let pools: Vec<NodeId> = ops.iter().copied().filter(|&n| g.node(n).op.category() == OpCategory::Anchor).collect();
    // Sibling products (`caps.horizontal_gemm`): MatMuls or Gemms of one op reading one activation in one shape,
    // each with a weight (a source) of one shape and dtype, writing results of one shape and dtype.
    let products = pools.len() >= 2 && pools.iter().all(|&n| matches!(g.node(n).op, Op::MatMul | Op::Gemm { .. }));
    if products {
        assert!(caps.horizontal_gemm, "group {gi}: sibling products against the caps");
        let root = |mut t: TensorId| {
            while let Some(q) = g.producer(t).filter(|&q| g.node(q).op.is_view()) {
                t = g.node(q).inputs[0];
            }
            t
        };
        let first = g.node(pools[0]);
        for &n in &pools[1..] {
            let node = g.node(n);
            assert_eq!(node.op, first.op, "group {gi}: sibling products of different ops");
            assert_eq!(node.inputs.len(), first.inputs.len(), "group {gi}: sibling operand counts");
            assert_eq!(root(node.inputs[0]), root(first.inputs[0]), "group {gi}: siblings over different inputs");
            for (i, what) in [(0, "left operands"), (1, "weights")] {
                let (x, y) = (g.tensor(node.inputs[i]), g.tensor(first.inputs[i]));
                assert_eq!((&x.shape, x.dtype), (&y.shape, y.dtype), "group {gi}: sibling {what} differ");
            }
            let (x, y) = (g.tensor(node.outputs[0]), g.tensor(first.outputs[0]));
            assert_eq!((&x.shape, x.dtype), (&y.shape, y.dtype), "group {gi}: sibling results differ");
        }
        for &n in &pools {
            let w = g.tensor(g.node(n).inputs[1]);
            let weight = matches!(w.role, graph_ir::TensorRole::Weight | graph_ir::TensorRole::Constant);
            assert!(weight && g.producer(g.node(n).inputs[1]).is_none(), "group {gi}: a sibling's weight is computed");
        }
    }
    let chain_link = match pools[..] {
        [first, second] if !products => {
            assert!(caps.pool_chain, "group {gi}: a pool chain against the caps");
            let window = |n: NodeId| match &g.node(n).op {
                Op::MaxPool(a) | Op::AveragePool(a) => a.kernel_shape.iter().product::<usize>(),
                other => panic!("group {gi}: two anchors, '{}' ({}) is no pool", name(n), other.name()),
            };
            window(first);
            let (first, second) =
                if g.producer(g.node(second).inputs[0]) == Some(first) { (first, second) } else { (second, first) };
            assert_eq!(g.producer(g.node(second).inputs[0]), Some(first), "group {gi}: pools that do not chain");
            assert!(window(second) <= fusion::POOL_CHAIN_MAX_WINDOW, "group {gi}: chained window too large");
            Some((first, second))
        }
        _ => None,
    };
    // Operand layouts (`caps.operand_layout`): Transposes that the kernel computes for a product's operand.
    let layouts: HashSet<NodeId> = pools
        .iter()
        .flat_map(|&n| g.node(n).inputs.iter().filter_map(|&t| g.producer(t)))
        .filter(|q| members.contains(q) && matches!(g.node(*q).op, Op::Transpose { .. }))
        .collect();
    for &q in &layouts {
        let node = g.node(q);
        let t = node.outputs[0];
        let r = g.tensor(t).shape.rank();
        let swaps = match &node.op {
            Op::Transpose { perm: None } => r == 2,
            Op::Transpose { perm: Some(p) } => {
                r >= 2 && (0..r - 2).all(|i| p[i] == i) && p[r - 2] == r - 1 && p[r - 1] == r - 2
            }
            _ => false,
        };
        assert!(caps.operand_layout && swaps, "group {gi}: operand layout '{}' against the caps or rules", name(q));
        let readers = g.consumers(t);
        assert!(
            readers.len() == 1 && matches!(g.node(readers[0]).op, Op::MatMul | Op::Gemm { .. }),
            "group {gi}: operand layout '{}' read by {readers:?}",
            name(q)
        );
        assert!(!g.outputs().contains(&t), "group {gi}: operand layout '{}' is a graph output", name(q));
        let mut u = node.inputs[0];
        while let Some(p) = g.producer(u).filter(|&p| g.node(p).op.is_view() && !members.contains(&p)) {
            u = g.node(p).inputs[0];
        }
        assert!(g.producer(u).is_none_or(|p| !members.contains(&p)), "group {gi}: '{}' computes its input", name(q));
    }
    assert!(layouts.is_empty() || (pools.len() == 1), "group {gi}: operand layouts of several products");
    let mut anchors = 0;
    let mut reductions = 0;
    let mut moves = 0;
    let mut permutes = 0;
    let mut selections = 0;
    let mut split_members = 0;
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
                            Some(q) if layouts.contains(&q) => break,
                            Some(q) => {
                                let link = chain_link == Some((q, n));
                                assert!(
                                    link || !members.contains(&q),
                                    "prologue '{}' into anchor '{}'",
                                    name(q),
                                    name(n)
                                );
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            OpCategory::Reduction => reductions += 1,
            OpCategory::DataMovement if layouts.contains(&n) => {}
            OpCategory::DataMovement => {
                moves += 1;
                if matches!(node.op, Op::Transpose { .. }) {
                    permutes += 1;
                }
                // A Gather at a constant scalar index, or a Split (only in an anchor's epilogue).
                let split = matches!(node.op, Op::Split { .. });
                if split
                    || matches!(node.op, Op::Gather { .. })
                        && node.inputs.get(1).is_some_and(|&t| {
                            let i = g.tensor(t);
                            i.role == graph_ir::TensorRole::Constant && i.shape.rank() == 0
                        })
                {
                    selections += 1;
                }
                if split {
                    split_members += 1;
                } else {
                    assert!(node.outputs.len() == 1, "multi-output op '{}' fused", name(n));
                }
            }
            _ => {}
        }
    }
    assert!(anchors <= 1 || (anchors == 2 && chain_link.is_some()) || products, "group {gi} has {anchors} anchors");
    assert!(split_members == 0 || anchors >= 1 || ops.len() == 1, "group {gi}: a Split outside an epilogue");
    if anchors >= 1 {
        assert_eq!(gr.kind, GroupKind::Anchor);
        assert_eq!(reductions, 0, "group {gi}: anchor with reductions");
        // A permuted output layout and selections: only Transposes and constant-index Gathers, and only when
        // the caps allow them; nothing but Transposes computes on a selected value.
        assert_eq!(moves, permutes + selections, "group {gi}: anchor with data movement other than layout");
        assert!(moves == 0 || (caps.layout_epilogue && caps.injective_fusion), "group {gi}: layout epilogue");
        assert!(selections == 0 || caps.select_epilogue, "group {gi}: selection against the caps");
        if selections > 0 {
            let mut selected: HashSet<TensorId> = HashSet::new();
            let source = |mut t: TensorId| {
                while let Some(q) = g.producer(t).filter(|&q| g.node(q).op.is_view()) {
                    t = g.node(q).inputs[0];
                }
                t
            };
            for &n in &ops {
                let node = g.node(n);
                let picked = node.inputs.iter().filter(|&&t| selected.contains(&source(t))).count();
                let inside = node
                    .inputs
                    .iter()
                    .filter(|&&t| g.producer(source(t)).is_some_and(|p| members.contains(&p)))
                    .count();
                let is_sel = matches!(node.op, Op::Split { .. })
                    || matches!(node.op, Op::Gather { .. })
                        && node.inputs.get(1).is_some_and(|&t| {
                            g.tensor(t).role == graph_ir::TensorRole::Constant && g.tensor(t).shape.rank() == 0
                        });
                let same_size = node
                    .inputs
                    .iter()
                    .filter(|&&t| selected.contains(&source(t)))
                    .all(|&t| node.outputs.iter().all(|&o| g.tensor(o).shape.numel() == g.tensor(t).shape.numel()));
                let routes = is_sel
                    || (picked > 0 && matches!(node.op, Op::Transpose { .. }))
                    || (picked == 1 && same_size && node.op.category() == OpCategory::Elementwise && inside == 1);
                if routes {
                    selected.extend(node.outputs.iter().copied());
                } else {
                    assert_eq!(picked, 0, "group {gi}: '{}' combines a selection with another value", name(n));
                }
            }
        }
    }
    if reductions > 0 {
        assert!(caps.reduction_fusion);
        assert_eq!(gr.kind, GroupKind::Reduction);
        // Data movement in a row kernel: only loads (Gather, Slice, Expand, Transpose, Concat) of tensors no
        // member computes but other loads.
        for &n in &ops {
            let node = g.node(n);
            if node.op.category() != OpCategory::DataMovement {
                continue;
            }
            assert!(caps.injective_fusion, "group {gi}: a load in a row kernel against the caps");
            let load = |op: &Op| {
                matches!(
                    op,
                    Op::Gather { .. } | Op::Slice { .. } | Op::Expand { .. } | Op::Transpose { .. } | Op::Concat { .. }
                )
            };
            assert!(load(&node.op), "group {gi}: '{}' is no load", name(n));
            // A load or a Cast whose operands (through views) are outside the kernel or pure themselves.
            fn pure_in(g: &ComputeGraph, members: &HashSet<NodeId>, p: NodeId, load: &dyn Fn(&Op) -> bool) -> bool {
                let node = g.node(p);
                (load(&node.op) || matches!(node.op, Op::Cast { .. }))
                    && node.inputs.iter().all(|&t| {
                        let mut t = t;
                        while let Some(q) = g.producer(t).filter(|&q| g.node(q).op.is_view()) {
                            t = g.node(q).inputs[0];
                        }
                        g.producer(t).is_none_or(|q| !members.contains(&q) || pure_in(g, members, q, load))
                    })
            }
            let pure = |p: NodeId| pure_in(g, &members, p, &load);
            // A row selection: a constant-index Gather whose result nothing in the kernel reads.
            let selection = matches!(node.op, Op::Gather { .. })
                && node.inputs.get(1).is_some_and(|&t| {
                    g.tensor(t).role == graph_ir::TensorRole::Constant && g.tensor(t).shape.rank() == 0
                })
                && node.outputs.iter().all(|&o| {
                    // Its readers through views.
                    let mut stack = vec![o];
                    let mut ok = true;
                    while let Some(t) = stack.pop() {
                        for &c in g.consumers(t) {
                            if g.node(c).op.is_view() {
                                stack.extend(g.node(c).outputs.iter().copied());
                            } else {
                                ok &= !members.contains(&c);
                            }
                        }
                    }
                    ok
                });
            let mut data = node.inputs[0];
            while let Some(q) = g.producer(data).filter(|&q| g.node(q).op.is_view()) {
                data = g.node(q).inputs[0];
            }
            if selection && g.producer(data).is_some_and(|p| members.contains(&p)) {
                assert!(caps.select_rows, "group {gi}: row selection '{}' against the caps", name(n));
                continue;
            }
            for &t in &node.inputs {
                let mut t = t;
                while let Some(q) = g.producer(t).filter(|&q| g.node(q).op.is_view()) {
                    t = g.node(q).inputs[0];
                }
                assert!(
                    g.producer(t).is_none_or(|p| !members.contains(&p) || pure(p)),
                    "group {gi}: load '{}' reads a value the kernel computes",
                    name(n)
                );
            }
        }
    }
    if moves > 0 && anchors == 0 && reductions == 0 {
        assert!(caps.injective_fusion);
        assert_eq!(gr.kind, GroupKind::DataMovement);
    }
}

/// Kinds of the values of a "rows" graph: all derive from `[4, 8]` rows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum K {
    /// `[4, 8]`.
    Full,
    /// `[4, 1]`: reduced over the last axis, kept.
    Keep,
    /// `[4]`: reduced over the last axis, dropped.
    Drop,
    /// `[1, 8]`: reduced over axis 0, kept (broadcasts like a bias).
    Col,
    /// `[32]`: a flattened full value.
    Wide,
    /// `[8, 4]`: transposed.
    T,
}

pub fn shape(k: K) -> Vec<usize> {
    match k {
        K::Full => vec![4, 8],
        K::Keep => vec![4, 1],
        K::Drop => vec![4],
        K::Col => vec![1, 8],
        K::Wide => vec![32],
        K::T => vec![8, 4],
    }
}

/// A random graph over `[4, 8]` rows mixing every fusion class: elementwise with broadcasting, reductions over
/// either axis with and without kept dims, Softmax, LayerNormalization, views, transposes, MatMul, Gemm,
/// Concat/Slice, Split, Where, Cast, and (with `custom`) custom kernels and copies.
pub fn rows_graph(seed: u64, n: usize, custom: bool) -> ComputeGraph {
    let mut r = SplitMix64::new(seed);
    let mut g = ComputeGraph::new(format!("rows_{seed}_{n}"));
    let mut pool: Vec<(TensorId, K)> = Vec::new();
    pool.push((g.add_input("x", F, shape(K::Full)).unwrap(), K::Full));
    pool.push((g.add_input("y", F, shape(K::Full)).unwrap(), K::Full));
    let bias = g.add_weight("bias", F, shape(K::Col)).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let w2 = g.add_weight("w2", F, [8, 8]).unwrap();
    // The left operand of the last product: a later product often reads it too (sibling products).
    let mut lhs: Option<TensorId> = None;
    let gamma = g.add_weight("gamma", F, [8]).unwrap();
    let beta = g.add_weight("beta", F, [8]).unwrap();
    // An embedding table and row ids (loads: a row kernel computes them inline).
    let table = g.add_weight("table", F, [16, 8]).unwrap();
    let ids: Vec<u8> = [3i64, 0, 15, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let ids = g.add_constant("ids", graph_ir::DType::I64, [4], ids).unwrap();
    // A constant scalar index: a selection of one row (a class token).
    let row2 = g.add_constant("row2", graph_ir::DType::I64, [], 2i64.to_le_bytes().to_vec()).unwrap();
    let mut i = 0usize;
    let pick = |r: &mut SplitMix64, pool: &[(TensorId, K)], want: Option<K>| -> Option<(TensorId, K)> {
        let cands: Vec<(TensorId, K)> = pool.iter().copied().filter(|&(_, k)| want.is_none_or(|w| w == k)).collect();
        if cands.is_empty() {
            return None;
        }
        // Mostly recent values (chains), sometimes any (branches and long edges).
        let j = if r.below(4) == 0 {
            r.below(cands.len() as u64) as usize
        } else {
            cands.len() - 1 - r.below(cands.len().min(6) as u64) as usize
        };
        Some(cands[j])
    };
    while i < n {
        let name = format!("n{i}");
        i += 1;
        let choice = r.below(21);
        let (a, ka) = pick(&mut r, &pool, None).unwrap();
        let out: Option<(TensorId, K)> = match choice {
            0..=4 => {
                let op = [Op::Exp, Op::Neg, Op::Tanh, Op::Relu, Op::Sigmoid, Op::Abs][r.below(6) as usize].clone();
                Some((n1(&mut g, &name, op, &[a]), ka))
            }
            5..=8 => {
                let op = [Op::Add, Op::Mul, Op::Sub, Op::Max][r.below(4) as usize].clone();
                let (b, kb) = match ka {
                    K::Full => match r.below(4) {
                        0 => pick(&mut r, &pool, Some(K::Keep)).unwrap_or((bias, K::Col)),
                        1 => pick(&mut r, &pool, Some(K::Col)).unwrap_or((bias, K::Col)),
                        2 => (bias, K::Col),
                        _ => pick(&mut r, &pool, Some(K::Full)).unwrap(),
                    },
                    k => pick(&mut r, &pool, Some(k)).unwrap(),
                };
                let k = if ka == K::Full || kb == K::Full { K::Full } else { ka };
                Some((n1(&mut g, &name, op, &[a, b]), k))
            }
            9 if ka == K::Full => {
                let keep = r.below(2) == 0;
                let op = match r.below(3) {
                    0 => Op::ReduceSum { axes: Some(vec![-1]), keepdims: keep },
                    1 => Op::ReduceMax { axes: Some(vec![1]), keepdims: keep },
                    _ => Op::ReduceMean { axes: Some(vec![-1]), keepdims: keep },
                };
                Some((n1(&mut g, &name, op, &[a]), if keep { K::Keep } else { K::Drop }))
            }
            10 if ka == K::Full => {
                Some((n1(&mut g, &name, Op::ReduceSum { axes: Some(vec![0]), keepdims: true }, &[a]), K::Col))
            }
            11 if ka == K::Full => {
                let t = if r.below(2) == 0 {
                    n1(&mut g, &name, Op::Softmax { axis: -1 }, &[a])
                } else {
                    n1(&mut g, &name, Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[a, gamma, beta])
                };
                Some((t, K::Full))
            }
            12 => match ka {
                K::Full => Some((n1(&mut g, &name, Op::Reshape { shape: vec![32], allowzero: false }, &[a]), K::Wide)),
                K::Wide => {
                    Some((n1(&mut g, &name, Op::Reshape { shape: vec![4, 8], allowzero: false }, &[a]), K::Full))
                }
                K::Drop => Some((n1(&mut g, &name, Op::Unsqueeze { axes: vec![-1] }, &[a]), K::Keep)),
                K::Keep => Some((n1(&mut g, &name, Op::Squeeze { axes: Some(vec![-1]) }, &[a]), K::Drop)),
                _ => None,
            },
            13 => match ka {
                K::Full => Some((n1(&mut g, &name, Op::Transpose { perm: None }, &[a]), K::T)),
                K::T => Some((n1(&mut g, &name, Op::Transpose { perm: None }, &[a]), K::Full)),
                _ => None,
            },
            14 if ka == K::Full => {
                let a = match lhs {
                    Some(l) if r.below(2) == 0 => l,
                    _ => a,
                };
                lhs = Some(a);
                let w = [w, w2][r.below(2) as usize];
                // Sometimes a transposed weight: an operand layout (`caps.operand_layout`) when only the product
                // reads it.
                let w = if r.below(3) == 0 {
                    n1(&mut g, &format!("{name}.wt"), Op::Transpose { perm: None }, &[w])
                } else {
                    w
                };
                let t = if r.below(2) == 0 {
                    n1(&mut g, &name, Op::MatMul, &[a, w])
                } else {
                    let gemm = Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true };
                    n1(&mut g, &name, gemm, &[a, w, bias])
                };
                Some((t, K::Full))
            }
            15 if ka == K::Full => {
                let (b, _) = pick(&mut r, &pool, Some(K::Full)).unwrap();
                let c = n1(&mut g, &format!("{name}.cat"), Op::Concat { axis: 0 }, &[a, b]);
                let slice = Op::Slice { starts: vec![2], ends: vec![6], axes: Some(vec![0]), steps: None };
                Some((n1(&mut g, &name, slice, &[c]), K::Full))
            }
            16 if ka == K::Full => {
                let outs =
                    g.add_node(&format!("{name}.split"), Op::Split { axis: 1, splits: vec![4, 4] }, &[a]).unwrap();
                Some((n1(&mut g, &name, Op::Concat { axis: 1 }, &[outs[1], outs[0]]), K::Full))
            }
            17 if ka == K::Full => {
                let (b, _) = pick(&mut r, &pool, Some(K::Full)).unwrap();
                let c = n1(&mut g, &format!("{name}.gt"), Op::Greater, &[a, b]);
                Some((n1(&mut g, &name, Op::Where, &[c, a, b]), K::Full))
            }
            18 => {
                let c = n1(&mut g, &format!("{name}.f16"), Op::Cast { to: graph_ir::DType::F16 }, &[a]);
                Some((n1(&mut g, &name, Op::Cast { to: F }, &[c]), ka))
            }
            19 if ka == K::Full && custom => {
                if r.below(2) == 0 {
                    let op = CustomOp {
                        source: String::new(),
                        entry: "k".into(),
                        grid: [1, 1, 1],
                        block: [32, 1, 1],
                        outputs: vec![TensorSpec { dtype: F, shape: shape(K::Full).into() }],
                        ..Default::default()
                    };
                    Some((n1(&mut g, &name, Op::Custom(op), &[a]), K::Full))
                } else {
                    let to = graph_ir::op::MemSpace::Device;
                    Some((n1(&mut g, &name, Op::Memcpy { to }, &[a]), K::Full))
                }
            }
            20 if ka == K::Full && r.below(4) == 0 => {
                // Row 2 of a row value, as a `[1, 8]` value (a row selection when a row kernel computes `a`).
                let sel = n1(&mut g, &format!("{name}.sel"), Op::Gather { axis: 0 }, &[a, row2]);
                Some((n1(&mut g, &name, Op::Unsqueeze { axes: vec![0] }, &[sel]), K::Col))
            }
            20 => {
                // A gathered embedding row, a sliced window of the table, or one table row (`[1, 8]`, which
                // broadcasts over the rows, as a position embedding over the batch); often added to a row value.
                let (t, k) = match r.below(3) {
                    0 => (n1(&mut g, &name, Op::Gather { axis: 0 }, &[table, ids]), K::Full),
                    1 => {
                        let slice = Op::Slice { starts: vec![5], ends: vec![9], axes: Some(vec![0]), steps: None };
                        (n1(&mut g, &name, slice, &[table]), K::Full)
                    }
                    _ => {
                        let slice = Op::Slice { starts: vec![7], ends: vec![8], axes: Some(vec![0]), steps: None };
                        (n1(&mut g, &name, slice, &[table]), K::Col)
                    }
                };
                if ka == K::Full && r.below(2) == 0 {
                    Some((n1(&mut g, &format!("{name}.add"), Op::Add, &[t, a]), K::Full))
                } else {
                    Some((t, k))
                }
            }
            _ => None,
        };
        if let Some(o) = out {
            pool.push(o);
            if r.below(10) == 0 && g.tensor(o.0).role != TensorRole::Output {
                g.mark_output(o.0).unwrap();
            }
        }
    }
    let last = pool.last().unwrap().0;
    for (t, _) in pool.iter().skip(2) {
        if g.consumers(*t).is_empty() && g.tensor(*t).role != TensorRole::Output {
            g.mark_output(*t).unwrap();
        }
    }
    if g.outputs().is_empty() {
        // Only sources so far: add one node so the graph is valid.
        let t = n1(&mut g, "tail", Op::Relu, &[last]);
        g.mark_output(t).unwrap();
    }
    g
}

/// Any capability set: each fusion class on or off, op and input caps from small to generous.
pub fn caps_strategy() -> impl proptest::strategy::Strategy<Value = FusionCaps> {
    use proptest::prelude::*;
    (any::<[bool; 15]>(), 1usize..10, 1usize..8).prop_map(|(b, max_ops, max_inputs)| FusionCaps {
        matmul_epilogue: b[0],
        gemm_epilogue: b[1],
        conv_epilogue: b[2],
        pool_epilogue: b[3],
        reduction_fusion: b[4],
        multi_output: b[5],
        injective_fusion: b[6],
        layout_epilogue: b[7],
        attention: b[8],
        select_epilogue: b[9],
        concat_elimination: b[10],
        pool_chain: b[11],
        horizontal_gemm: b[12],
        operand_layout: b[13],
        select_rows: b[14],
        max_inputs,
        max_ops,
    })
}

/// `x [n,c,h,w]` -> two 1x1 conv+relu branches of `ca` and `cb` channels -> Concat(axis 1) -> Neg -> output.
pub fn concat_of_convs(n: usize, ca: usize, cb: usize, hw: usize) -> ComputeGraph {
    let mut g = ComputeGraph::new("cat2");
    let x = g.add_input("x", F, [n, 4, hw, hw]).unwrap();
    let mut outs = Vec::new();
    for (name, c) in [("a", ca), ("b", cb)] {
        let w = g.add_weight(&format!("{name}.w"), F, [c, 4, 1, 1]).unwrap();
        let conv = n1(&mut g, &format!("{name}.conv"), Op::Conv(Default::default()), &[x, w]);
        outs.push(n1(&mut g, &format!("{name}.relu"), Op::Relu, &[conv]));
    }
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &outs);
    let y = n1(&mut g, "neg", Op::Neg, &[cat]);
    g.mark_output(y).unwrap();
    g
}
