#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Horizontal GEMMs (`FusionCaps::horizontal_gemm`): sibling products that read one activation with weights of
//! one shape share a kernel (an attention layer's Q, K and V projections, a gated MLP's gate and up
//! projections). The groups on hand-built graphs, the refusals with their reason codes and texts, and exec-sim's
//! fused plans against the reference plan, with a proptest over random sibling blocks.

mod fusion_util;

use exec_sim::{check as sim_check, CheckOptions, Schedule};
use fusion_util::*;
use graph_ir::{ComputeGraph, DType, Op, TensorId};
use graph_passes::fusion::{FusionCaps, FusionOptions, FusionPhase, FusionPlan, GroupKind, RejectReason};
use graph_plan::{verify, ExecutionPlan, PlanOptions, TensorMap};
use proptest::prelude::*;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The horizontal decision on products `a` and `b`: `(rejected, detail)`.
fn sibling(p: &FusionPlan, a: &str, b: &str) -> (Option<RejectReason>, String) {
    let d = p
        .decisions
        .iter()
        .find(|d| d.phase == FusionPhase::Horizontal && d.producer == a && d.consumer == b)
        .unwrap_or_else(|| panic!("no horizontal decision on {a} and {b}: {:#?}", p.decisions));
    (d.rejected, d.detail.clone())
}

/// exec-sim at `streams` with a random schedule and the race check, against the reference plan: every output
/// bitwise equal (each product and epilogue is computed as the reference computes it). Returns the launches.
fn agrees(g: &ComputeGraph, streams: usize, seed: u64) -> usize {
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, ..CheckOptions::default() };
    let opts = PlanOptions::with_streams(streams);
    verify(&ExecutionPlan::build_with(g, &opts).unwrap()).unwrap();
    let r = sim_check(g, &opts, &TensorMap::new(), &TensorMap::new(), &co).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{}: {r:#?}", g.name());
    r.optimised_launches
}

/// `x [2, 6, 8]` and three projections `x W + b` whose results are graph outputs (so each stays a kernel of its
/// own until the horizontal phase), `widths` giving each weight's columns.
fn projections(widths: [usize; 3]) -> ComputeGraph {
    let mut g = ComputeGraph::new(format!("qkv_{widths:?}"));
    let x = g.add_input("x", F, [2, 6, 8]).unwrap();
    for (n, w) in ["q", "k", "v"].into_iter().zip(widths) {
        let wt = g.add_weight(&format!("w{n}"), F, [8, w]).unwrap();
        let b = g.add_weight(&format!("b{n}"), F, [w]).unwrap();
        let m = n1(&mut g, &format!("mm_{n}"), Op::MatMul, &[x, wt]);
        let y = n1(&mut g, &format!("bias_{n}"), Op::Add, &[m, b]);
        g.mark_output(y).unwrap();
    }
    g
}

#[test]
fn qkv_projections_share_one_gemm() {
    let g = projections([8, 8, 8]);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![s(&["mm_q", "bias_q", "mm_k", "bias_k", "mm_v", "bias_v"])]);
    assert_eq!(kinds(&p), vec![GroupKind::Anchor]);
    assert_eq!(outputs(&g, &p, 0), vec!["bias_q", "bias_k", "bias_v"]);
    assert_eq!(p.stats.merges_horizontal, 2, "{:?}", p.stats);
    assert_eq!(sibling(&p, "mm_q", "mm_k"), (None, String::new()));
    assert_eq!(sibling(&p, "mm_q", "mm_v"), (None, String::new()));
    // The activation is read once: the kernel reads x, three weights and three biases.
    assert_eq!(p.groups[0].inputs.len(), 7);
    assert_eq!(agrees(&g, 1, 1), 1);
    agrees(&g, 3, 2);
    // The cap off: three kernels, and the reason names the cap.
    let caps = FusionCaps { horizontal_gemm: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..FusionOptions::default() });
    check(&g, &p, &caps);
    assert_eq!(p.groups.len(), 3);
    assert_eq!(sibling(&p, "mm_q", "mm_k"), (Some(RejectReason::CapsExceeded), "caps.horizontal_gemm is off".into()));
}

#[test]
fn grouped_query_projections_merge_the_narrow_pair() {
    // Q is twice as wide as K and V (grouped-query attention): K and V share a kernel, Q keeps its own.
    let g = projections([8, 4, 4]);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![s(&["mm_q", "bias_q"]), s(&["mm_k", "bias_k", "mm_v", "bias_v"])]);
    let (reason, why) = sibling(&p, "mm_q", "mm_k");
    assert_eq!(reason, Some(RejectReason::Pattern));
    assert_eq!(
        why,
        "'mm_q' and 'mm_k' read one activation but are no sibling projections: weights of different shapes or dtypes"
    );
    assert_eq!(sibling(&p, "mm_k", "mm_v"), (None, String::new()));
    assert_eq!(agrees(&g, 1, 3), 2);
}

#[test]
fn gated_mlp_gate_and_up_are_one_kernel_with_their_product() {
    // down(silu(x W1) * (x W3)): the up projection joins the gate's kernel in phase 1 (its one reader is the
    // gate's epilogue), so the gate, up, SiLU and product are one launch; the down projection is the second.
    let mut g = ComputeGraph::new("gated_mlp");
    let x = g.add_input("x", F, [6, 8]).unwrap();
    let w1 = g.add_weight("w1", F, [8, 16]).unwrap();
    let w3 = g.add_weight("w3", F, [8, 16]).unwrap();
    let w2 = g.add_weight("w2", F, [16, 8]).unwrap();
    let gate = n1(&mut g, "gate", Op::MatMul, &[x, w1]);
    let sig = n1(&mut g, "sig", Op::Sigmoid, &[gate]);
    let silu = n1(&mut g, "silu", Op::Mul, &[gate, sig]);
    let up = n1(&mut g, "up", Op::MatMul, &[x, w3]);
    let h = n1(&mut g, "h", Op::Mul, &[silu, up]);
    let y = n1(&mut g, "down", Op::MatMul, &[h, w2]);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![s(&["gate", "sig", "silu", "up", "h"]), s(&["down"])]);
    assert_eq!(outputs(&g, &p, 0), vec!["h"]);
    assert_eq!(agrees(&g, 1, 4), 2);
    agrees(&g, 2, 5);
}

#[test]
fn products_that_are_no_siblings_say_why() {
    // (graph, reason, text) for the products 'a' and 'b'
    let mut cases: Vec<(ComputeGraph, RejectReason, &str)> = Vec::new();
    // A right operand computed from a weight: nothing to concatenate at prepare.
    let mut g = ComputeGraph::new("computed_weight");
    let x = g.add_input("x", F, [6, 8]).unwrap();
    let wa = g.add_weight("wa", F, [8, 8]).unwrap();
    let wb = g.add_weight("wb", F, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, wa]);
    let wr = n1(&mut g, "wr", Op::Relu, &[wb]);
    let b = n1(&mut g, "b", Op::MatMul, &[x, wr]);
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    cases.push((g, RejectReason::Pattern, "a right operand is not a weight"));
    // Gemms with different attributes.
    let mut g = ComputeGraph::new("gemm_attrs");
    let x = g.add_input("x", F, [6, 8]).unwrap();
    let wa = g.add_weight("wa", F, [8, 8]).unwrap();
    let wb = g.add_weight("wb", F, [8, 8]).unwrap();
    let gemm = |t: bool| Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: t };
    let a = n1(&mut g, "a", gemm(false), &[x, wa]);
    let b = n1(&mut g, "b", gemm(true), &[x, wb]);
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    cases.push((g, RejectReason::Pattern, "different ops, attributes or operand counts"));
    // One activation seen through a view of another shape.
    let mut g = ComputeGraph::new("views");
    let x = g.add_input("x", F, [2, 6, 8]).unwrap();
    let wa = g.add_weight("wa", F, [8, 8]).unwrap();
    let wb = g.add_weight("wb", F, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, wa]);
    let flat = n1(&mut g, "flat", Op::Reshape { shape: vec![12, 8], allowzero: false }, &[x]);
    let b = n1(&mut g, "b", Op::MatMul, &[flat, wb]);
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    cases.push((g, RejectReason::Pattern, "the shared operand is read in different shapes"));
    // Half products, one cast to f32 in its epilogue: the products agree in shape and dtype, so they merge.
    let mut g = ComputeGraph::new("dtypes");
    let x = g.add_input("x", DType::F16, [6, 8]).unwrap();
    let wa = g.add_weight("wa", DType::F16, [8, 8]).unwrap();
    let wb = g.add_weight("wb", DType::F16, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, wa]);
    let b = n1(&mut g, "b", Op::MatMul, &[x, wb]);
    let c = n1(&mut g, "c", Op::Cast { to: F }, &[b]);
    g.mark_output(a).unwrap();
    g.mark_output(c).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![s(&["a", "b", "c"])]);
    agrees(&g, 1, 6);
    // A product whose epilogue feeds the other's through a reduction: merging would close a cycle.
    let mut g = ComputeGraph::new("cycle");
    let x = g.add_input("x", F, [6, 8]).unwrap();
    let wa = g.add_weight("wa", F, [8, 8]).unwrap();
    let wb = g.add_weight("wb", F, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, wa]);
    let r = n1(&mut g, "r", Op::ReduceSum { axes: Some(vec![-1]), keepdims: true }, &[a]);
    let b = n1(&mut g, "b", Op::MatMul, &[x, wb]);
    let c = n1(&mut g, "c", Op::Add, &[b, r]);
    g.mark_output(c).unwrap();
    cases.push((g, RejectReason::WouldCycle, "a path from 'a' through 'r' reaches 'b'"));
    for (g, reason, text) in cases {
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        let (got, why) = sibling(&p, "a", "b");
        assert_eq!(got, Some(reason), "{}: {why}", g.name());
        assert!(why.contains(text), "{}: {why}", g.name());
        assert!(p.groups.iter().all(|gr| gr.nodes.iter().filter(|&&n| g.node(n).op.name() == "MatMul").count() <= 1));
        agrees(&g, 2, 7);
    }
}

/// `siblings` products `x W_i` of one activation `x [m, k]`, each with an epilogue: 0 none, 1 a bias, 2 a bias
/// and Relu, 3 a product with the previous sibling's result; every result that nothing else reads is an output.
fn siblings(m: usize, k: usize, n: usize, epilogues: &[u8], gemm: bool, dtype: DType) -> (ComputeGraph, Vec<TensorId>) {
    let mut g = ComputeGraph::new(format!("siblings_{m}_{k}_{n}_{epilogues:?}_{gemm}_{dtype}"));
    let x = g.add_input("x", dtype, [m, k]).unwrap();
    let mut outs: Vec<TensorId> = Vec::new();
    let mut products = Vec::new();
    for (i, &e) in epilogues.iter().enumerate() {
        let w = g.add_weight(&format!("w{i}"), dtype, [k, n]).unwrap();
        let op = if gemm { Op::Gemm { alpha: 0.5, beta: 1.0, trans_a: false, trans_b: false } } else { Op::MatMul };
        let mut y = n1(&mut g, &format!("p{i}"), op, &[x, w]);
        products.push(y);
        if e == 1 || e == 2 {
            let b = g.add_weight(&format!("b{i}"), dtype, [n]).unwrap();
            y = n1(&mut g, &format!("bias{i}"), Op::Add, &[y, b]);
        }
        if e == 2 {
            y = n1(&mut g, &format!("relu{i}"), Op::Relu, &[y]);
        }
        match outs.pop() {
            Some(prev) if e == 3 => y = n1(&mut g, &format!("mul{i}"), Op::Mul, &[prev, y]),
            Some(prev) => outs.push(prev),
            None => {}
        }
        outs.push(y);
    }
    for &o in &outs {
        g.mark_output(o).unwrap();
    }
    (g, products)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random sibling blocks (2-5 products, MatMul or Gemm, f32 or half, random epilogues that may combine two
    /// siblings): at one stream every product shares one kernel; the groups pass the fusion checker, the plans
    /// verify at 1-3 streams, and exec-sim's results equal the reference plan's bit for bit.
    #[test]
    fn random_sibling_blocks_share_a_kernel_and_agree(
        m in 1usize..9, k in 1usize..9, n in 1usize..9,
        epilogues in proptest::collection::vec(0u8..4, 2..6),
        gemm in any::<bool>(), half in any::<bool>(), streams in 1usize..4, seed in 0u64..1000,
    ) {
        let dtype = if half { DType::F16 } else { F };
        let (g, products) = siblings(m, k, n, &epilogues, gemm, dtype);
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        let pn = g.producer(products[0]).unwrap();
        let first = p.group_of[pn];
        for &t in &products {
            prop_assert_eq!(p.group_of[g.producer(t).unwrap()], first, "{:?}", names(&g, &p));
        }
        prop_assert_eq!(p.groups.len(), 1);
        agrees(&g, streams, seed);
    }
}
