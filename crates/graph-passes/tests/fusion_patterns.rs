#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One test per fusion class, with the exact expected groups (node names per group, in execution order).

mod fusion_util;

use fusion_util::*;
use graph_ir::op::{ConvAttrs, GeluApprox, PoolAttrs};
use graph_ir::{ComputeGraph, DType, Op};
use graph_passes::fusion::{FusionCaps, FusionOptions, FusionPhase, GroupKind, RejectReason};

fn conv3x3() -> Op {
    Op::Conv(ConvAttrs { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![], group: 1 })
}

#[test]
fn vertical_chain_with_bias_residual_where_and_broadcast_operands() {
    let mut g = ComputeGraph::new("v");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let y = g.add_input("y", F, [4, 8]).unwrap();
    let bias = g.add_weight("bias", F, [8]).unwrap();
    let zero = g.add_constant_f32("zero", [1], &[0.0]).unwrap();
    let a = n1(&mut g, "bias_add", Op::Add, &[x, bias]);
    let r = n1(&mut g, "relu", Op::Relu, &[a]);
    let s = n1(&mut g, "residual", Op::Add, &[r, y]);
    let c = n1(&mut g, "positive", Op::Greater, &[s, zero]);
    let ng = n1(&mut g, "neg", Op::Neg, &[s]);
    let w = n1(&mut g, "where", Op::Where, &[c, s, ng]);
    g.mark_output(w).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["bias_add", "relu", "residual", "positive", "neg", "where"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Elementwise]);
    assert_eq!(outputs(&g, &p, 0), vec!["where"]);
    let ins: Vec<&str> = p.groups[0].inputs.iter().map(|&t| g.tensor(t).name.as_ref()).collect();
    assert_eq!(ins, vec!["x", "bias", "y", "zero"]);
}

#[test]
fn broadcast_producer_is_inlined_into_the_larger_loop() {
    // neg(bias) is [8]; the add is [4, 8]: the small producer is recomputed per element, no launch of its own.
    let mut g = ComputeGraph::new("b");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let bias = g.add_weight("bias", F, [8]).unwrap();
    let nb = n1(&mut g, "neg_bias", Op::Neg, &[bias]);
    let a = n1(&mut g, "add", Op::Add, &[x, nb]);
    g.mark_output(a).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["neg_bias", "add"]]);
}

#[test]
fn batchnorm_scale_shift_fuses_as_elementwise() {
    let mut g = ComputeGraph::new("bn");
    let x = g.add_input("x", F, [1, 4, 3, 3]).unwrap();
    let ps: Vec<_> = ["s", "b", "m", "v"].iter().map(|n| g.add_weight(n, F, [4]).unwrap()).collect();
    let bn = n1(&mut g, "bn", Op::BatchNormalization { epsilon: 1e-5 }, &[x, ps[0], ps[1], ps[2], ps[3]]);
    let r = n1(&mut g, "relu", Op::Relu, &[bn]);
    g.mark_output(r).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["bn", "relu"]]);
    assert_eq!(p.groups[0].inputs.len(), 5);
}

#[test]
fn conv_bn_relu_residual_relu_is_one_launch_per_conv() {
    let mut g = ComputeGraph::new("res");
    let x = g.add_input("x", F, [1, 8, 6, 6]).unwrap();
    let bn_params = |g: &mut ComputeGraph, p: &str| -> Vec<_> {
        ["s", "b", "m", "v"].iter().map(|n| g.add_weight(&format!("{p}.{n}"), F, [8]).unwrap()).collect()
    };
    let w1 = g.add_weight("w1", F, [8, 8, 3, 3]).unwrap();
    let c1 = n1(&mut g, "conv1", conv3x3(), &[x, w1]);
    let p1 = bn_params(&mut g, "bn1");
    let b1 = n1(&mut g, "bn1", Op::BatchNormalization { epsilon: 1e-5 }, &[c1, p1[0], p1[1], p1[2], p1[3]]);
    let h = n1(&mut g, "relu1", Op::Relu, &[b1]);
    let w2 = g.add_weight("w2", F, [8, 8, 3, 3]).unwrap();
    let c2 = n1(&mut g, "conv2", conv3x3(), &[h, w2]);
    let p2 = bn_params(&mut g, "bn2");
    let b2 = n1(&mut g, "bn2", Op::BatchNormalization { epsilon: 1e-5 }, &[c2, p2[0], p2[1], p2[2], p2[3]]);
    let s = n1(&mut g, "add", Op::Add, &[b2, x]);
    let o = n1(&mut g, "relu2", Op::Relu, &[s]);
    g.mark_output(o).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["conv1", "bn1", "relu1"], vec!["conv2", "bn2", "add", "relu2"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Anchor]);
    assert!(p.rejections().all(|d| d.producer == "relu1"));
}

#[test]
fn matmul_gemm_and_pool_epilogues() {
    let mut g = ComputeGraph::new("mm");
    let x = g.add_input("x", F, [4, 16]).unwrap();
    let w = g.add_weight("w", F, [16, 16]).unwrap();
    let b = g.add_weight("b", F, [16]).unwrap();
    let m = n1(&mut g, "mm", Op::MatMul, &[x, w]);
    let a = n1(&mut g, "bias", Op::Add, &[m, b]);
    let ge = n1(&mut g, "gelu", Op::Gelu { approximate: GeluApprox::None }, &[a]);
    let gemm = Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true };
    let w2 = g.add_weight("w2", F, [16, 16]).unwrap();
    let gm = n1(&mut g, "gemm", gemm, &[ge, w2, b]);
    let t = n1(&mut g, "tanh", Op::Tanh, &[gm]);
    g.mark_output(t).unwrap();
    let img = g.add_input("img", F, [1, 2, 4, 4]).unwrap();
    let pool = PoolAttrs { kernel_shape: vec![2, 2], strides: vec![2, 2], ..Default::default() };
    let mp = n1(&mut g, "pool", Op::MaxPool(pool), &[img]);
    let pr = n1(&mut g, "pool_relu", Op::Relu, &[mp]);
    g.mark_output(pr).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["mm", "bias", "gelu"], vec!["gemm", "tanh"], vec!["pool", "pool_relu"]]);
    // With MatMul epilogues off (a backend calling a plain GEMM), the epilogue becomes its own loop kernel.
    let caps = FusionCaps { matmul_epilogue: false, pool_epilogue: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(
        names(&g, &p),
        vec![vec!["mm"], vec!["bias", "gelu"], vec!["gemm", "tanh"], vec!["pool"], vec!["pool_relu"]]
    );
}

/// An inception stage: a strided max pool read by a 1x1 conv and by the next module's branch pool. The two pools
/// share a kernel (the kernel writes both results); a window larger than `POOL_CHAIN_MAX_WINDOW` does not chain,
/// nor does a Conv with a pool; with `pool_chain` off each pool is its own kernel again; and a third pool after a
/// chain finds the chain taken (one per kernel).
#[test]
fn pool_chains_share_a_kernel() {
    let down = PoolAttrs { kernel_shape: vec![3, 3], strides: vec![2, 2], pads: vec![1; 4], ..Default::default() };
    let same = PoolAttrs { kernel_shape: vec![3, 3], strides: vec![1, 1], pads: vec![1; 4], ..Default::default() };
    let stage = |third: bool| {
        let mut g = ComputeGraph::new("inception");
        let x = g.add_input("x", F, [1, 8, 16, 16]).unwrap();
        let w = g.add_weight("w", F, [4, 8, 1, 1]).unwrap();
        let p1 = n1(&mut g, "stage_pool", Op::MaxPool(down.clone()), &[x]);
        let c = n1(&mut g, "branch_conv", Op::Conv(ConvAttrs { group: 1, ..Default::default() }), &[p1, w]);
        let r = n1(&mut g, "branch_relu", Op::Relu, &[c]);
        let mut p2 = n1(&mut g, "branch_pool", Op::MaxPool(same.clone()), &[p1]);
        if third {
            p2 = n1(&mut g, "third_pool", Op::AveragePool(same.clone()), &[p2]);
        }
        let wide = PoolAttrs { kernel_shape: vec![5, 5], strides: vec![1, 1], pads: vec![2; 4], ..Default::default() };
        let p4 = n1(&mut g, "wide_pool", Op::MaxPool(wide), &[r]);
        for t in [p2, p4] {
            g.mark_output(t).unwrap();
        }
        g
    };
    let g = stage(false);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(
        names(&g, &p),
        vec![vec!["stage_pool", "branch_pool"], vec!["branch_conv", "branch_relu"], vec!["wide_pool"]]
    );
    assert_eq!(kinds(&p)[0], GroupKind::Anchor);
    assert_eq!(outputs(&g, &p, 0).len(), 2, "the chain writes both results: {:?}", outputs(&g, &p, 0));
    assert_eq!(verdict(&p, "branch_relu", "wide_pool"), Some(RejectReason::Pattern), "a Conv does not chain");
    let caps = FusionCaps { pool_chain: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(p.groups.len(), 4);
    assert_eq!(verdict(&p, "stage_pool", "branch_pool"), Some(RejectReason::Pattern));
    // Three pools in a row: one chain, the other pool alone.
    let g = stage(true);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let pooled: Vec<usize> =
        names(&g, &p).iter().map(|gr| gr.iter().filter(|n| n.ends_with("_pool")).count()).collect();
    assert_eq!(pooled.iter().filter(|&&c| c == 2).count(), 1, "one chain: {:?}", names(&g, &p));
    assert_eq!(pooled.iter().sum::<usize>(), 4);
}

/// ReduceMax, Sub, Exp, ReduceSum, Div over the last axis, as exporters decompose Softmax.
fn softmax_decomposed(g: &mut ComputeGraph, p: &str, x: graph_ir::TensorId) -> graph_ir::TensorId {
    let mx = n1(g, &format!("{p}max"), Op::ReduceMax { axes: Some(vec![-1]), keepdims: true }, &[x]);
    let d = n1(g, &format!("{p}sub"), Op::Sub, &[x, mx]);
    let e = n1(g, &format!("{p}exp"), Op::Exp, &[d]);
    let s = n1(g, &format!("{p}sum"), Op::ReduceSum { axes: Some(vec![-1]), keepdims: true }, &[e]);
    n1(g, &format!("{p}div"), Op::Div, &[e, s])
}

#[test]
fn decomposed_softmax_with_a_scaled_input_is_one_kernel() {
    let mut g = ComputeGraph::new("sm");
    let x = g.add_input("x", F, [1, 2, 8, 16]).unwrap();
    let scale = g.add_constant_f32("scale", [], &[0.125]).unwrap();
    let xs = n1(&mut g, "scaled", Op::Mul, &[x, scale]);
    let y = softmax_decomposed(&mut g, "", xs);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["scaled", "max", "sub", "exp", "sum", "div"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Reduction]);
    assert_eq!(outputs(&g, &p, 0), vec!["div"]);
    // Without reduction fusion every reduction runs alone; the elementwise ops between fuse among themselves.
    let caps = FusionCaps { reduction_fusion: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["scaled"], vec!["max"], vec!["sub", "exp"], vec!["sum"], vec!["div"]]);
}

/// ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add over the last axis.
fn layernorm_decomposed(g: &mut ComputeGraph, p: &str, x: graph_ir::TensorId, h: usize) -> graph_ir::TensorId {
    let gamma = g.add_weight(&format!("{p}gamma"), F, [h]).unwrap();
    let beta = g.add_weight(&format!("{p}beta"), F, [h]).unwrap();
    let two = g.add_constant_f32(&format!("{p}two"), [], &[2.0]).unwrap();
    let eps = g.add_constant_f32(&format!("{p}eps"), [], &[1e-5]).unwrap();
    let mean = n1(g, &format!("{p}mean"), Op::ReduceMean { axes: Some(vec![-1]), keepdims: true }, &[x]);
    let d = n1(g, &format!("{p}sub"), Op::Sub, &[x, mean]);
    let sq = n1(g, &format!("{p}pow"), Op::Pow, &[d, two]);
    let var = n1(g, &format!("{p}var"), Op::ReduceMean { axes: Some(vec![-1]), keepdims: true }, &[sq]);
    let ve = n1(g, &format!("{p}add_eps"), Op::Add, &[var, eps]);
    let sd = n1(g, &format!("{p}sqrt"), Op::Sqrt, &[ve]);
    let nrm = n1(g, &format!("{p}div"), Op::Div, &[d, sd]);
    let sc = n1(g, &format!("{p}mul"), Op::Mul, &[nrm, gamma]);
    n1(g, &format!("{p}add"), Op::Add, &[sc, beta])
}

#[test]
fn decomposed_layernorm_is_one_kernel_with_its_residual_input() {
    let mut g = ComputeGraph::new("ln");
    let x = g.add_input("x", F, [1, 16, 32]).unwrap();
    let w = g.add_weight("w", F, [32, 32]).unwrap();
    let b = g.add_weight("b", F, [32]).unwrap();
    let mm = n1(&mut g, "mm", Op::MatMul, &[x, w]);
    let lin = n1(&mut g, "bias", Op::Add, &[mm, b]);
    let res = n1(&mut g, "residual", Op::Add, &[lin, x]);
    let y = layernorm_decomposed(&mut g, "ln.", res, 32);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let ln: Vec<&str> = vec![
        "bias",
        "residual",
        "ln.mean",
        "ln.sub",
        "ln.pow",
        "ln.var",
        "ln.add_eps",
        "ln.sqrt",
        "ln.div",
        "ln.mul",
        "ln.add",
    ];
    assert_eq!(names(&g, &p), vec![vec!["mm"], ln]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Reduction]);
    // The anchor cannot take a reduction: that pair is a Pattern rejection with the rule named.
    assert_eq!(verdict(&p, "mm", "bias"), Some(graph_passes::fusion::RejectReason::Pattern));
}

#[test]
fn reduction_epilogue_on_reduced_values_and_global_pool() {
    // GlobalAveragePool then a reduced-shape epilogue, and a ReduceSum without keepdims feeding a squeeze-free
    // reduced op.
    let mut g = ComputeGraph::new("gap");
    let x = g.add_input("x", F, [1, 4, 5, 5]).unwrap();
    let r = n1(&mut g, "relu", Op::Relu, &[x]);
    let gp = n1(&mut g, "gap", Op::GlobalAveragePool, &[r]);
    let s = n1(&mut g, "sig", Op::Sigmoid, &[gp]);
    g.mark_output(s).unwrap();
    let y = g.add_input("y", F, [6, 10]).unwrap();
    let rs = n1(&mut g, "rsum", Op::ReduceSum { axes: Some(vec![1]), keepdims: false }, &[y]);
    let rn = n1(&mut g, "rneg", Op::Neg, &[rs]);
    g.mark_output(rn).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["relu", "gap", "sig"], vec!["rsum", "rneg"]]);
}

#[test]
fn reduced_value_never_broadcasts_back_without_kept_dims() {
    // rs is [6] (keepdims off); Add([6, 6], [6]) broadcasts it along the wrong axis for a row kernel.
    let mut g = ComputeGraph::new("rows");
    let y = g.add_input("y", F, [6, 6]).unwrap();
    let rs = n1(&mut g, "rsum", Op::ReduceSum { axes: Some(vec![1]), keepdims: false }, &[y]);
    let a = n1(&mut g, "add", Op::Add, &[y, rs]);
    g.mark_output(a).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["rsum"], vec!["add"]]);
    assert_eq!(verdict(&p, "rsum", "add"), Some(graph_passes::fusion::RejectReason::Pattern));
}

#[test]
fn multi_output_kernel_writes_the_residual_stream() {
    // s = x + y feeds a LayerNormalization and, much later, a residual add: the row kernel computes s, writes it
    // for the residual, and normalises it in the same launch.
    let mut g = ComputeGraph::new("mo");
    let x = g.add_input("x", F, [1, 8, 16]).unwrap();
    let y = g.add_input("y", F, [1, 8, 16]).unwrap();
    let gamma = g.add_weight("gamma", F, [16]).unwrap();
    let beta = g.add_weight("beta", F, [16]).unwrap();
    let w = g.add_weight("w", F, [16, 16]).unwrap();
    let b = g.add_weight("b", F, [16]).unwrap();
    let s = n1(&mut g, "sum", Op::Add, &[x, y]);
    let ln = n1(&mut g, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[s, gamma, beta]);
    let m = n1(&mut g, "mm", Op::MatMul, &[ln, w]);
    let o = n1(&mut g, "bias", Op::Add, &[m, b]);
    let r = n1(&mut g, "residual", Op::Add, &[s, o]);
    g.mark_output(r).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["sum", "ln"], vec!["mm", "bias", "residual"]]);
    assert_eq!(outputs(&g, &p, 0), vec!["sum", "ln"]);
    assert_eq!(p.stats.merges_multi_output, 1);
    // Without multi-output kernels the sum runs alone.
    let caps = FusionCaps { multi_output: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["sum"], vec!["ln"], vec!["mm", "bias", "residual"]]);
    assert_eq!(verdict(&p, "sum", "ln"), Some(graph_passes::fusion::RejectReason::MultiConsumer));
}

#[test]
fn multi_output_chain_keeps_an_escaping_intermediate() {
    let mut g = ComputeGraph::new("chain");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let b = n1(&mut g, "b", Op::Neg, &[a]);
    let c = n1(&mut g, "c", Op::Abs, &[b]);
    let m = n1(&mut g, "mm", Op::MatMul, &[b, w]);
    g.mark_output(c).unwrap();
    g.mark_output(m).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["a", "b", "c"], vec!["mm"]]);
    assert_eq!(outputs(&g, &p, 0), vec!["b", "c"]);
    assert!(!p.is_materialized(&g, a));
}

#[test]
fn horizontal_siblings_share_one_launch_when_asked() {
    let mut g = ComputeGraph::new("h");
    let x = g.add_input("x", F, [1, 64]).unwrap();
    for (name, op) in [("exp", Op::Exp), ("neg", Op::Neg), ("sig", Op::Sigmoid)] {
        let t = n1(&mut g, name, op, &[x]);
        g.mark_output(t).unwrap();
    }
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["exp"], vec!["neg"], vec!["sig"]]);
    let opts = FusionOptions { horizontal: true, ..Default::default() };
    let p = fuse(&g, &opts);
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["exp", "neg", "sig"]]);
    assert_eq!(outputs(&g, &p, 0), vec!["exp", "neg", "sig"]);
    let h: Vec<_> = p.decisions.iter().filter(|d| d.phase == FusionPhase::Horizontal).collect();
    assert_eq!(h.len(), 2);
    assert!(h.iter().all(|d| d.rejected.is_none() && d.tensor == "x" && d.score > 0));
}

#[test]
fn views_inside_a_group_are_absorbed_and_outside_alias() {
    let mut g = ComputeGraph::new("views");
    let x = g.add_input("x", F, [2, 8]).unwrap();
    let a = n1(&mut g, "relu", Op::Relu, &[x]);
    let v = n1(&mut g, "flat", Op::Reshape { shape: vec![16], allowzero: false }, &[a]);
    let b = n1(&mut g, "neg", Op::Neg, &[v]);
    let u = n1(&mut g, "unsq", Op::Unsqueeze { axes: vec![0] }, &[b]);
    let w = g.add_weight("w", F, [16, 4]).unwrap();
    let m = n1(&mut g, "mm", Op::MatMul, &[u, w]);
    g.mark_output(m).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    // The Reshape between two fused ops is inside; the Unsqueeze feeding the anchor's operand aliases.
    assert_eq!(names(&g, &p), vec![vec!["relu", "flat", "neg"], vec!["mm"]]);
    assert!(p.group_of.get(g.node_id("unsq").unwrap()).is_none());
    assert!(!p.is_materialized(&g, v));
    assert!(p.is_materialized(&g, b));
    assert_eq!(p.stats.views_absorbed, 1);
}

#[test]
fn bias_reshape_transpose_folds_into_the_projection() {
    // The head split after an attention projection: the permutation is the anchor's output layout.
    let mut g = ComputeGraph::new("qkv");
    let x = g.add_input("x", F, [1, 8, 32]).unwrap();
    let w = g.add_weight("w", F, [32, 32]).unwrap();
    let b = g.add_weight("b", F, [32]).unwrap();
    let m = n1(&mut g, "mm", Op::MatMul, &[x, w]);
    let a = n1(&mut g, "bias", Op::Add, &[m, b]);
    let v = n1(&mut g, "heads", Op::Reshape { shape: vec![1, 8, 4, 8], allowzero: false }, &[a]);
    let t = n1(&mut g, "tr", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[v]);
    g.mark_output(t).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["mm", "bias", "heads", "tr"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor]);
    assert_eq!(outputs(&g, &p, 0), vec!["tr"]);
    // The backend cannot write a permuted output: the bias and the move stay one injective loop, and the
    // rejection names the cap.
    let caps = FusionCaps { layout_epilogue: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["mm"], vec!["bias", "heads", "tr"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::DataMovement]);
    assert_eq!(verdict(&p, "mm", "bias"), Some(RejectReason::CapsExceeded));
    let d = p.decisions.iter().find(|d| d.producer == "mm").unwrap();
    assert!(d.detail.contains("caps.layout_epilogue is off"), "{}", d.detail);
    let caps = FusionCaps { injective_fusion: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["mm", "bias"], vec!["tr"]]);
}

#[test]
fn head_merge_transpose_after_pv_folds_into_the_matmul() {
    // P.V [1,4,8,8] -> Transpose(0,2,1,3) -> Reshape [1,8,32] -> output projection: the transpose is the
    // layout P.V writes, the output projection reads it through the view.
    let mut g = ComputeGraph::new("merge");
    let p_ = g.add_input("p", F, [1, 4, 8, 8]).unwrap();
    let v = g.add_input("v", F, [1, 4, 8, 8]).unwrap();
    let wo = g.add_weight("wo", F, [32, 32]).unwrap();
    let pv = n1(&mut g, "pv", Op::MatMul, &[p_, v]);
    let t = n1(&mut g, "tr", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[pv]);
    let r = n1(&mut g, "merge", Op::Reshape { shape: vec![1, 8, 32], allowzero: false }, &[t]);
    let o = n1(&mut g, "out_proj", Op::MatMul, &[r, wo]);
    g.mark_output(o).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["pv", "tr"], vec!["out_proj"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Anchor]);
    // No prologue: the transpose does not move into the consumer GEMM.
    assert_eq!(verdict(&p, "tr", "out_proj"), Some(RejectReason::Pattern));
}

#[test]
fn slice_or_a_shared_transpose_does_not_fold_into_an_epilogue() {
    let mut g = ComputeGraph::new("noperm");
    let x = g.add_input("x", F, [8, 16]).unwrap();
    let w = g.add_weight("w", F, [16, 16]).unwrap();
    let m = n1(&mut g, "mm", Op::MatMul, &[x, w]);
    let s = n1(&mut g, "slice", Op::Slice { starts: vec![0], ends: vec![8], axes: Some(vec![1]), steps: None }, &[m]);
    g.mark_output(s).unwrap();
    let m2 = n1(&mut g, "mm2", Op::MatMul, &[x, w]);
    let t = n1(&mut g, "tr", Op::Transpose { perm: Some(vec![1, 0]) }, &[m2]);
    // The transposed value feeds two kernels (an elementwise op and a GEMM): it is written once, in the
    // permuted layout, by the anchor.
    let r = n1(&mut g, "relu", Op::Relu, &[t]);
    let w2 = g.add_weight("w2", F, [8, 4]).unwrap();
    let o = n1(&mut g, "mm3", Op::MatMul, &[t, w2]);
    g.mark_output(r).unwrap();
    g.mark_output(o).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(verdict(&p, "mm", "slice"), Some(RejectReason::Pattern));
    let d = p.decisions.iter().find(|d| d.producer == "mm").unwrap();
    assert!(d.detail.contains("other than a Transpose"), "{}", d.detail);
    let gm2 = names(&g, &p).into_iter().find(|n| n.contains(&"mm2".to_string())).unwrap();
    assert!(gm2.contains(&"tr".to_string()), "{gm2:?}");
    assert_eq!(verdict(&p, "tr", "mm3"), Some(RejectReason::Pattern));
}

#[test]
fn gelu_diamond_after_matmul_is_one_kernel() {
    // x * 0.5 * (1 + erf(x / sqrt 2)) as the dynamo exporter emits it: the bias output has two readers in the
    // same epilogue.
    let mut g = ComputeGraph::new("gelu");
    let x = g.add_input("x", F, [1, 4, 16]).unwrap();
    let w = g.add_weight("w", F, [16, 64]).unwrap();
    let b = g.add_weight("b", F, [64]).unwrap();
    let sqrt2 = g.add_constant_f32("c_sqrt2", [], &[std::f32::consts::SQRT_2]).unwrap();
    let one = g.add_constant_f32("c_one", [], &[1.0]).unwrap();
    let half = g.add_constant_f32("c_half", [], &[0.5]).unwrap();
    let m = n1(&mut g, "mm", Op::MatMul, &[x, w]);
    let l = n1(&mut g, "bias", Op::Add, &[m, b]);
    let d = n1(&mut g, "div", Op::Div, &[l, sqrt2]);
    let e = n1(&mut g, "erf", Op::Erf, &[d]);
    let a = n1(&mut g, "add1", Op::Add, &[e, one]);
    let h = n1(&mut g, "half", Op::Mul, &[half, a]);
    let y = n1(&mut g, "gelu", Op::Mul, &[l, h]);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["mm", "bias", "div", "erf", "add1", "half", "gelu"]]);
    assert_eq!(p.groups[0].outputs.len(), 1);
}

#[test]
fn explain_lists_groups_and_rejections_and_serialises() {
    let mut g = ComputeGraph::new("ex");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let a = n1(&mut g, "relu", Op::Relu, &[x]);
    let m = n1(&mut g, "mm", Op::MatMul, &[a, w]);
    let t = n1(&mut g, "tanh", Op::Tanh, &[m]);
    g.mark_output(t).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    let text = p.explain(&g);
    assert!(text.contains("fusion of 'ex': 3 ops -> 2 kernels"), "{text}");
    assert!(text.contains("g0 elementwise: relu(Relu)"), "{text}");
    assert!(text.contains("g1 anchor: mm(MatMul) tanh(Tanh)"), "{text}");
    assert!(
        text.contains("relu -> mm [Pattern] (vertical, via relu): 'relu' would compute an operand of anchor 'mm'"),
        "{text}"
    );
    let r = p.report(&g);
    assert_eq!(r.kernels_unfused, 3);
    assert_eq!(r.kernels_fused, 2);
    assert_eq!(r.rejected_by_reason.get("Pattern"), Some(&1));
    let json = serde_json::to_string(&r).unwrap();
    let back: graph_passes::fusion::FusionReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
    let plan_json = serde_json::to_string(&p).unwrap();
    let back: graph_passes::fusion::FusionPlan = serde_json::from_str(&plan_json).unwrap();
    assert_eq!(back.decisions, p.decisions);
    assert_eq!(back.groups, p.groups);
}

#[test]
fn dtype_changing_ops_fuse() {
    let mut g = ComputeGraph::new("cast");
    let x = g.add_input("x", F, [8]).unwrap();
    let c = n1(&mut g, "cast", Op::Cast { to: DType::F16 }, &[x]);
    let r = n1(&mut g, "relu", Op::Relu, &[c]);
    let back = n1(&mut g, "back", Op::Cast { to: DType::F32 }, &[r]);
    g.mark_output(back).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["cast", "relu", "back"]]);
}
