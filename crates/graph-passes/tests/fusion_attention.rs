#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Fused attention and permuted epilogues: the groups on hand-built graphs (BERT-style with head split and merge,
//! no scale or mask, a GPT causal mask), the refusals with their reason codes, and exec-sim's online-softmax
//! kernel against the reference plan's unfused chain (within `exec_sim::attention::ATTENTION_TOLERANCE`),
//! including a proptest over random attention shapes with layout ops inserted.

mod fusion_util;

use exec_sim::attention::{half_attention_tolerance, ATTENTION_TOLERANCE};
use exec_sim::{check as sim_check, check_plans, check_precision, CheckOptions, Schedule};
use fusion_util::*;
use graph_ir::{ComputeGraph, DType, Op, TensorId};
use graph_passes::fusion::{FusionCaps, FusionOptions, FusionPhase, FusionPlan, GroupKind, RejectReason};
use graph_passes::precision::{transform, Precision, PrecisionPolicy};
use graph_plan::{verify, ExecutionPlan, PlanOptions, TensorMap};
use proptest::prelude::*;

/// How the scores are scaled and masked.
#[derive(Clone, Copy, Debug)]
struct Variant {
    scale: Option<bool>, // Some(true): Div by sqrt(d); Some(false): Mul by 1/sqrt(d)
    mask: Mask,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mask {
    None,
    /// A padding mask [1, 1, 1, S] (BERT).
    Padding,
    /// A causal mask [S, S] with a large negative value above the diagonal (GPT).
    Causal,
    /// GPT-2's eager export: `Where(causal [S, S] bool, scores, f32::MIN)`, then a padding mask added.
    CausalWhere,
}

/// x [1, s, h*d] -> Q, K, V projections with bias, head split (Reshape + Transpose), attention, head merge
/// (Transpose + Reshape), output projection. Returns the graph and the score tensor.
fn block(heads: usize, s: usize, d: usize, v: Variant) -> (ComputeGraph, TensorId) {
    let e = heads * d;
    let mut g = ComputeGraph::new(format!("attn_{heads}_{s}_{d}_{v:?}"));
    let x = g.add_input("x", F, [1, s, e]).unwrap();
    let proj = |g: &mut ComputeGraph, n: &str, perm: Vec<usize>| {
        let w = g.add_weight(&format!("w{n}"), F, [e, e]).unwrap();
        let b = g.add_weight(&format!("b{n}"), F, [e]).unwrap();
        let m = n1(g, &format!("mm_{n}"), Op::MatMul, &[x, w]);
        let a = n1(g, &format!("bias_{n}"), Op::Add, &[m, b]);
        let r = n1(
            g,
            &format!("view_{n}"),
            Op::Reshape { shape: vec![1, s as i64, heads as i64, d as i64], allowzero: false },
            &[a],
        );
        n1(g, &format!("split_{n}"), Op::Transpose { perm: Some(perm) }, &[r])
    };
    let q = proj(&mut g, "q", vec![0, 2, 1, 3]);
    let kt = proj(&mut g, "k", vec![0, 2, 3, 1]);
    let vv = proj(&mut g, "v", vec![0, 2, 1, 3]);
    let scores = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let mut t = scores;
    match v.scale {
        Some(true) => {
            let c = g.add_constant_f32("sqrt_d", [], &[(d as f32).sqrt()]).unwrap();
            t = n1(&mut g, "scale", Op::Div, &[t, c]);
        }
        Some(false) => {
            let c = g.add_constant_f32("inv_sqrt_d", [], &[1.0 / (d as f32).sqrt()]).unwrap();
            t = n1(&mut g, "scale", Op::Mul, &[c, t]);
        }
        None => {}
    }
    match v.mask {
        Mask::None => {}
        Mask::Padding => {
            let m = g.add_input("mask", F, [1, 1, 1, s]).unwrap();
            t = n1(&mut g, "mask_add", Op::Add, &[t, m]);
        }
        Mask::Causal => {
            let vals: Vec<f32> = (0..s * s).map(|i| if i % s > i / s { -1e9 } else { 0.0 }).collect();
            let m = g.add_constant_f32("causal", [s, s], &vals).unwrap();
            t = n1(&mut g, "mask_add", Op::Add, &[m, t]);
        }
        Mask::CausalWhere => {
            let keep: Vec<u8> = (0..s * s).map(|i| u8::from(i % s <= i / s)).collect();
            let c = g.add_constant("causal_keep", DType::Bool, [s, s], keep).unwrap();
            let fill = g.add_constant_f32("mask_value", [], &[f32::MIN]).unwrap();
            t = n1(&mut g, "mask_where", Op::Where, &[c, t, fill]);
            let m = g.add_input("mask", F, [1, 1, 1, s]).unwrap();
            t = n1(&mut g, "mask_add", Op::Add, &[t, m]);
        }
    }
    let p = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[t]);
    let o = n1(&mut g, "pv", Op::MatMul, &[p, vv]);
    let tr = n1(&mut g, "merge_t", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[o]);
    let r = n1(&mut g, "merge", Op::Reshape { shape: vec![1, s as i64, e as i64], allowzero: false }, &[tr]);
    let wo = g.add_weight("wo", F, [e, e]).unwrap();
    let y = n1(&mut g, "out_proj", Op::MatMul, &[r, wo]);
    g.mark_output(y).unwrap();
    (g, scores)
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// exec-sim: the fused plan (4 streams, random schedule, race check) against the reference plan.
fn agrees(g: &ComputeGraph, seed: u64) -> f64 {
    let opts = PlanOptions::with_streams(4);
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, ..CheckOptions::default() };
    let r =
        sim_check(g, &opts, &TensorMap::new(), &TensorMap::new(), &co).unwrap_or_else(|e| panic!("{}: {e}", g.name()));
    assert!(r.passed, "{}: {r:#?}", g.name());
    let worst = r.outputs.iter().map(|o| o.max_rel_err).fold(0f64, f64::max);
    assert!(worst <= ATTENTION_TOLERANCE, "{}: relative error {worst:e}", g.name());
    worst
}

#[test]
fn bert_block_is_three_kernels_and_the_scores_leave_the_pool() {
    let (g, scores) = block(2, 8, 4, Variant { scale: Some(true), mask: Mask::Padding });
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    // The Q, K and V projections read one activation: one horizontal GEMM, each part with its head split.
    assert_eq!(
        names(&g, &p),
        vec![
            s(&[
                "mm_q", "bias_q", "view_q", "split_q", "mm_k", "bias_k", "view_k", "split_k", "mm_v", "bias_v",
                "view_v", "split_v"
            ]),
            s(&["qk", "scale", "mask_add", "softmax", "pv", "merge_t"]),
            s(&["out_proj"]),
        ]
    );
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Attention, GroupKind::Anchor]);
    assert_eq!((p.stats.merges_horizontal, p.stats.merges_attention), (2, 1));
    assert_eq!(outputs(&g, &p, 0), vec!["split_q", "split_k", "split_v"]);
    assert!(!p.is_materialized(&g, scores));
    // Without horizontal GEMMs: a kernel per projection.
    let caps = FusionCaps { horizontal_gemm: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..FusionOptions::default() });
    check(&g, &p, &caps);
    assert_eq!(
        names(&g, &p),
        vec![
            s(&["mm_q", "bias_q", "view_q", "split_q"]),
            s(&["mm_k", "bias_k", "view_k", "split_k"]),
            s(&["mm_v", "bias_v", "view_v", "split_v"]),
            s(&["qk", "scale", "mask_add", "softmax", "pv", "merge_t"]),
            // The head-merge view aliases the attention kernel's output; the projection reads through it.
            s(&["out_proj"]),
        ]
    );
    assert_eq!(
        kinds(&p),
        vec![GroupKind::Anchor, GroupKind::Anchor, GroupKind::Anchor, GroupKind::Attention, GroupKind::Anchor]
    );
    assert!(!p.is_materialized(&g, scores));
    assert_eq!(p.stats.merges_attention, 1);
    // The attention kernel writes only the merged heads.
    assert_eq!(outputs(&g, &p, 3), vec!["merge_t"]);
    agrees(&g, 3);
}

#[test]
fn attention_without_scale_or_mask_and_with_a_causal_mask() {
    for v in [
        Variant { scale: None, mask: Mask::None },
        Variant { scale: Some(false), mask: Mask::Causal },
        Variant { scale: Some(true), mask: Mask::None },
        Variant { scale: None, mask: Mask::Padding },
        Variant { scale: Some(true), mask: Mask::CausalWhere },
    ] {
        let (g, scores) = block(2, 70, 4, v);
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        assert_eq!(kinds(&p).iter().filter(|&&k| k == GroupKind::Attention).count(), 1, "{v:?}");
        assert!(!p.is_materialized(&g, scores), "{v:?}");
        assert_eq!(p.groups.len(), 3, "{v:?}");
        agrees(&g, 7);
    }
}

/// The decision on the edge out of the score MatMul.
fn refusal(g: &ComputeGraph, caps: FusionCaps) -> (RejectReason, FusionPhase, String) {
    refusal_from(g, caps, "qk")
}

/// The decision on the edge out of `producer` (the score MatMul, or the cast phase 1 made its epilogue).
fn refusal_from(g: &ComputeGraph, caps: FusionCaps, producer: &str) -> (RejectReason, FusionPhase, String) {
    let p = fuse(g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(g, &p, &caps);
    assert!(kinds(&p).iter().all(|&k| k != GroupKind::Attention));
    let d = p.decisions.iter().find(|d| d.producer == producer).unwrap_or_else(|| panic!("{:#?}", p.decisions));
    (d.rejected.unwrap(), d.phase, d.detail.clone())
}

/// A minimal chain `qk -> [scale] -> softmax(axis) -> pv` over inputs, with hooks to break it.
fn chain(axis: i64, extra: impl Fn(&mut ComputeGraph, TensorId, TensorId)) -> ComputeGraph {
    let mut g = ComputeGraph::new("chain");
    let q = g.add_input("q", F, [2, 8, 4]).unwrap();
    let kt = g.add_input("kt", F, [2, 4, 8]).unwrap();
    let v = g.add_input("v", F, [2, 8, 4]).unwrap();
    let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let p = n1(&mut g, "softmax", Op::Softmax { axis }, &[sc]);
    let o = n1(&mut g, "pv", Op::MatMul, &[p, v]);
    g.mark_output(o).unwrap();
    extra(&mut g, sc, p);
    g
}

#[test]
fn shapes_and_uses_that_forbid_attention_say_why() {
    let (r, ph, d) = refusal(&chain(1, |_, _, _| {}), FusionCaps::all());
    assert_eq!((r, ph), (RejectReason::Pattern, FusionPhase::Attention));
    assert!(d.contains("not over the last axis"), "{d}");
    // The scores are a graph output: they would be materialised anyway.
    let g = chain(-1, |g, sc, _| g.mark_output(sc).unwrap());
    let (r, _, d) = refusal(&g, FusionCaps::all());
    assert_eq!(r, RejectReason::Pattern);
    assert!(d.contains("'qk'") && d.contains("read outside the chain"), "{d}");
    // The probabilities feed a second consumer.
    let g = chain(-1, |g, _, p| {
        let r = n1(g, "probs_relu", Op::Relu, &[p]);
        g.mark_output(r).unwrap();
    });
    let (_, _, d) = refusal(&g, FusionCaps::all());
    assert!(d.contains("'softmax'") && d.contains("read outside the chain"), "{d}");
    // The backend cannot build it.
    let (r, ph, d) = refusal(&chain(-1, |_, _, _| {}), FusionCaps { attention: false, ..FusionCaps::all() });
    assert_eq!((r, ph), (RejectReason::CapsExceeded, FusionPhase::Attention));
    assert!(d.contains("caps.attention is off"), "{d}");
}

#[test]
fn a_mask_that_broadcasts_the_scores_up_is_refused() {
    let mut g = ComputeGraph::new("bigmask");
    let q = g.add_input("q", F, [1, 8, 4]).unwrap();
    let kt = g.add_input("kt", F, [1, 4, 8]).unwrap();
    let v = g.add_input("v", F, [1, 8, 4]).unwrap();
    let m = g.add_input("mask", F, [3, 8, 8]).unwrap();
    let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let a = n1(&mut g, "mask_add", Op::Add, &[sc, m]);
    let p = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[a]);
    let o = n1(&mut g, "pv", Op::MatMul, &[p, v]);
    g.mark_output(o).unwrap();
    let (r, _, d) = refusal(&g, FusionCaps::all());
    assert_eq!(r, RejectReason::Pattern);
    assert!(d.contains("broadcasts the scores"), "{d}");
    // Without fusion of the chain the plan still computes the reference's values exactly.
    let opts = PlanOptions::with_streams(2);
    let r = sim_check(&g, &opts, &TensorMap::new(), &TensorMap::new(), &CheckOptions::default()).unwrap();
    assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{r:?}");
}

#[test]
fn a_select_in_the_chain_fuses_and_one_that_broadcasts_the_scores_up_is_refused() {
    // `Where(cond, fill, scores)` (scores third: kept where the condition is false) fuses; a condition of a larger
    // batch than the scores would broadcast them up, so that chain stays unfused and says why.
    for (cond_batch, fuses) in [(1, true), (3, false)] {
        let mut g = ComputeGraph::new(format!("select_{cond_batch}"));
        let q = g.add_input("q", F, [1, 8, 4]).unwrap();
        let kt = g.add_input("kt", F, [1, 4, 8]).unwrap();
        let v = g.add_input("v", F, [1, 8, 4]).unwrap();
        let masked: Vec<u8> = (0..cond_batch * 64).map(|i| u8::from((i % 8) > (i / 8) % 8)).collect();
        let c = g.add_constant("masked", DType::Bool, [cond_batch, 8, 8], masked).unwrap();
        let fill = g.add_constant_f32("fill", [], &[-1e9]).unwrap();
        let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
        let w = n1(&mut g, "mask_where", Op::Where, &[c, fill, sc]);
        let p = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[w]);
        let o = n1(&mut g, "pv", Op::MatMul, &[p, v]);
        g.mark_output(o).unwrap();
        if fuses {
            let p = fuse(&g, &FusionOptions::default());
            check(&g, &p, &FusionCaps::all());
            assert_eq!(names(&g, &p), vec![s(&["qk", "mask_where", "softmax", "pv"])]);
            assert_eq!(kinds(&p), vec![GroupKind::Attention]);
            agrees(&g, 21);
        } else {
            let (r, _, d) = refusal(&g, FusionCaps::all());
            assert_eq!(r, RejectReason::Pattern);
            assert!(d.contains("'mask_where'") && d.contains("broadcasts the scores"), "{d}");
            let opts = PlanOptions::with_streams(2);
            let r = sim_check(&g, &opts, &TensorMap::new(), &TensorMap::new(), &CheckOptions::default()).unwrap();
            assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{r:?}");
        }
    }
}

#[test]
fn decomposed_head_ops_on_a_shared_transpose() {
    // One transposed K feeds two attention chains: each chain fuses, the transpose stays one launch that both
    // read (it is not a prologue of either).
    let mut g = ComputeGraph::new("shared_t");
    let q = g.add_input("q", F, [2, 8, 4]).unwrap();
    let k = g.add_input("k", F, [2, 8, 4]).unwrap();
    let v = g.add_input("v", F, [2, 8, 4]).unwrap();
    let kt = n1(&mut g, "kt", Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[k]);
    for h in ["a", "b"] {
        let sc = n1(&mut g, &format!("qk_{h}"), Op::MatMul, &[q, kt]);
        let p = n1(&mut g, &format!("softmax_{h}"), Op::Softmax { axis: -1 }, &[sc]);
        let o = n1(&mut g, &format!("pv_{h}"), Op::MatMul, &[p, v]);
        g.mark_output(o).unwrap();
    }
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(kinds(&p), vec![GroupKind::DataMovement, GroupKind::Attention, GroupKind::Attention]);
    // Not a prologue of either product (phase 2's verdict on the shared operand).
    assert_eq!(verdict(&p, "kt", "qk_a"), Some(RejectReason::Pattern));
    agrees(&g, 11);
}

/// Plan options for `streams` streams in half precision `p` (the default keep-in-f32 list).
fn half_opts(p: Precision, streams: usize) -> PlanOptions {
    let mut o = PlanOptions::with_streams(streams);
    o.precision = PrecisionPolicy::new(p);
    o
}

fn built(g: &ComputeGraph, o: &PlanOptions) -> ExecutionPlan {
    let plan = ExecutionPlan::build_with(g, o).unwrap_or_else(|e| panic!("{}: {e}", g.name()));
    verify(&plan).unwrap_or_else(|v| panic!("{}: {v:?}", g.name()));
    plan
}

/// The precision check's tolerance (docs/precision.md): the half plan against the f32 reference plan.
fn precision_tolerance(p: Precision) -> f64 {
    if p == Precision::Fp16 {
        1e-2
    } else {
        5e-2
    }
}

/// exec-sim, a half plan of `g` (4 streams, random schedule, race check): within the precision check's
/// tolerance of the f32 reference plan, and within `half_attention_tolerance` of the unfused half reference plan
/// (the same rewritten graph, no fusion). Returns both worst relative errors.
fn agrees_half(g: &ComputeGraph, p: Precision, seed: u64) -> (f64, f64) {
    let o = half_opts(p, 4);
    let c = check_precision(g, &o, &TensorMap::new(), &TensorMap::new(), 2, seed, precision_tolerance(p)).unwrap();
    assert!(c.passed, "{} {p}: {c:#?}", g.name());
    let vs_f32 = c.outputs.iter().map(|o| o.max_rel_err).fold(0f64, f64::max);
    let mut ro = PlanOptions::reference();
    ro.precision = o.precision.clone();
    let tolerance = half_attention_tolerance(p.dtype()).unwrap();
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, tolerance, ..CheckOptions::default() };
    let r = check_plans(&built(g, &ro), &built(g, &o), &TensorMap::new(), &TensorMap::new(), &co).unwrap();
    assert!(r.passed, "{} {p}: {r:#?}", g.name());
    let vs_half = r.outputs.iter().map(|o| o.max_rel_err).fold(0f64, f64::max);
    (vs_f32, vs_half)
}

/// The groups of the half-precision rewrite of `g` (fused with `FusionOptions::default()`, checked), with the
/// rewritten graph.
fn fuse_half(g: &ComputeGraph, p: Precision) -> (ComputeGraph, FusionPlan) {
    let (rg, _) = transform(g, &PrecisionPolicy::new(p)).unwrap();
    let fp = fuse(&rg, &FusionOptions::default());
    check(&rg, &fp, &FusionCaps::all());
    (rg, fp)
}

#[test]
fn half_bert_block_is_one_attention_kernel_of_mixed_precision_nodes() {
    let (g, scores) = block(2, 70, 4, Variant { scale: Some(true), mask: Mask::Padding });
    let f32_launches = built(&g, &PlanOptions::default()).kernel_count_fused;
    for p in [Precision::Fp16, Precision::Bf16] {
        let (rg, fp) = fuse_half(&g, p);
        let attn: Vec<usize> = (0..fp.groups.len()).filter(|&i| fp.groups[i].kind == GroupKind::Attention).collect();
        assert_eq!(attn.len(), 1, "{p}: {:?}", names(&rg, &fp));
        // The transform writes the softmax input as mixed-precision nodes, not casts: the scale reads the half
        // scores and stores f32, the Softmax reads f32 and stores the half probabilities.
        assert_eq!(names(&rg, &fp)[attn[0]], s(&["qk", "scale", "mask_add", "softmax", "pv", "merge_t"]), "{p}");
        let store = |n: &str| rg.node(rg.node_id(n).unwrap()).store;
        assert_eq!([store("scale"), store("mask_add"), store("softmax")], [Some(F), None, Some(p.dtype())], "{p}");
        assert_eq!(fp.groups.len(), 3, "{p}: {:?}", names(&rg, &fp));
        let scores = rg.tensor_id(&g.tensor(scores).name).unwrap();
        assert!(!fp.is_materialized(&rg, scores), "{p}");
        assert_eq!(fp.stats.merges_attention, 1);
        // The whole plan: as many launches as in f32, and no cast anywhere in the attention kernel.
        let plan = built(&g, &half_opts(p, 1));
        assert_eq!(plan.kernel_count_fused, f32_launches, "{p}");
        let k = plan.kernels().iter().find(|k| k.kind == GroupKind::Attention).unwrap();
        assert!(
            !k.body.iter().any(|i| matches!(i.op, Op::Cast { .. })),
            "{p}: {:?}",
            k.node_names().collect::<Vec<_>>()
        );
        let (vs_f32, vs_half) = agrees_half(&g, p, 3);
        assert!(vs_f32 > 0.0 && vs_half > 0.0, "{p}: half results are not bit-identical to either reference");
    }
}

/// `qk(f16) -> [Cast] -> softmax -> [Cast] -> pv` over f16 Q and K^T and V of `v_dtype`.
fn half_chain(cast_scores: Option<DType>, cast_probs: Option<DType>, v_dtype: DType) -> ComputeGraph {
    let mut g = ComputeGraph::new("half_chain");
    let q = g.add_input("q", DType::F16, [2, 8, 4]).unwrap();
    let kt = g.add_input("kt", DType::F16, [2, 4, 8]).unwrap();
    let v = g.add_input("v", v_dtype, [2, 8, 4]).unwrap();
    let mut t = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    if let Some(to) = cast_scores {
        t = n1(&mut g, "cast_scores", Op::Cast { to }, &[t]);
    }
    t = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[t]);
    if let Some(to) = cast_probs {
        t = n1(&mut g, "cast_probs", Op::Cast { to }, &[t]);
    }
    let o = n1(&mut g, "pv", Op::MatMul, &[t, v]);
    g.mark_output(o).unwrap();
    g
}

#[test]
fn a_half_chain_fuses_only_with_its_links_in_the_right_types() {
    // The half chain as the transform writes it: one kernel, and the unfused half chain (the graph's own
    // reference plan) within the stated tolerance.
    let g = half_chain(Some(DType::F32), Some(DType::F16), DType::F16);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![s(&["qk", "cast_scores", "softmax", "cast_probs", "pv"])]);
    assert_eq!(kinds(&p), vec![GroupKind::Attention]);
    let tolerance = half_attention_tolerance(DType::F16).unwrap();
    let co = CheckOptions { schedule: Schedule::Random { seed: 5 }, seed: 5, tolerance, ..CheckOptions::default() };
    let r = sim_check(&g, &PlanOptions::with_streams(2), &TensorMap::new(), &TensorMap::new(), &co).unwrap();
    assert!(r.passed && r.optimised_launches == 1 && r.reference_launches == 5, "{r:#?}");
    // The scores cast to another type than f32.
    let g = half_chain(Some(DType::BF16), Some(DType::F16), DType::F16);
    let (r, ph, d) = refusal(&g, FusionCaps::all());
    assert_eq!((r, ph), (RejectReason::Pattern, FusionPhase::Attention));
    assert_eq!(d, "attention: cast 'cast_scores' converts f16 to bf16, the chain needs f32 there");
    // The probabilities cast to another half type than the scores'.
    let g = half_chain(Some(DType::F32), Some(DType::BF16), DType::BF16);
    let (r, _, d) = refusal(&g, FusionCaps::all());
    assert_eq!(r, RejectReason::Pattern);
    assert_eq!(d, "attention: cast 'cast_probs' converts f32 to bf16, the chain needs f16 there");
    // A half chain without the casts (`--keep-f32 none`): the Softmax reads the half scores the first MatMul
    // stored, computes in f32 and stores half probabilities, which the fused kernel does without the rounding
    // of the scores (never less accurate; within the stated tolerance of the unfused chain).
    let g = half_chain(None, None, DType::F16);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(kinds(&p), vec![GroupKind::Attention]);
    let r = sim_check(&g, &PlanOptions::with_streams(2), &TensorMap::new(), &TensorMap::new(), &co).unwrap();
    assert!(r.passed && r.optimised_launches == 1 && r.reference_launches == 3, "{r:#?}");
    // A link that stores half: the scores would be rounded inside the chain, which the kernel does not do.
    let mut g = ComputeGraph::new("half_link");
    let q = g.add_input("q", DType::F16, [2, 8, 4]).unwrap();
    let kt = g.add_input("kt", DType::F16, [2, 4, 8]).unwrap();
    let v = g.add_input("v", DType::F16, [2, 8, 4]).unwrap();
    let c = g.add_constant("half", DType::F16, [], vec![0x00, 0x38]).unwrap(); // 0.5 in f16
    let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let sc = n1(&mut g, "scale", Op::Mul, &[sc, c]);
    let pr = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[sc]);
    let o = n1(&mut g, "pv", Op::MatMul, &[pr, v]);
    g.mark_output(o).unwrap();
    let (_, _, d) = refusal(&g, FusionCaps::all());
    assert!(d.starts_with("attention: 'scale' is f16, the chain needs f32"), "{d}");
    // Only the first cast: the probabilities reach the second MatMul in f32.
    let g = half_chain(Some(DType::F32), None, DType::F32);
    let (_, _, d) = refusal(&g, FusionCaps::all());
    assert!(d.starts_with("attention: 'softmax' is f32, the chain needs f16"), "{d}");
    // An f32 chain that narrows its scores.
    let mut g = ComputeGraph::new("narrowed");
    let q = g.add_input("q", F, [2, 8, 4]).unwrap();
    let kt = g.add_input("kt", F, [2, 4, 8]).unwrap();
    let v = g.add_input("v", DType::F16, [2, 8, 4]).unwrap();
    let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let c = n1(&mut g, "cast_scores", Op::Cast { to: DType::F16 }, &[sc]);
    let pr = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[c]);
    let o = n1(&mut g, "pv", Op::MatMul, &[pr, v]);
    g.mark_output(o).unwrap();
    let (_, _, d) = refusal(&g, FusionCaps::all());
    assert_eq!(d, "attention: cast 'cast_scores' converts f32 to f16, the chain needs f32 there");
    // Every refused chain still plans, verifies and computes the reference's values exactly.
    for g in
        [half_chain(Some(DType::BF16), Some(DType::F16), DType::F16), half_chain(Some(DType::F32), None, DType::F32)]
    {
        let r = sim_check(
            &g,
            &PlanOptions::with_streams(2),
            &TensorMap::new(),
            &TensorMap::new(),
            &CheckOptions::default(),
        )
        .unwrap();
        assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{r:?}");
    }
}

#[test]
fn large_half_scores_stay_within_the_stated_tolerance_of_the_unfused_half_chain() {
    // Scores up to 4 x 1.4^2 = 7.8 in magnitude (`half_attention_tolerance`'s premise): the unfused chain rounds
    // each to half, the fused kernel does not. f16 and bf16 inputs through the same chain.
    for h in [DType::F16, DType::BF16] {
        let mut g = ComputeGraph::new("large_scores");
        let q = g.add_input("q", h, [2, 8, 4]).unwrap();
        let kt = g.add_input("kt", h, [2, 4, 8]).unwrap();
        let v = g.add_input("v", h, [2, 8, 4]).unwrap();
        let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
        let c = n1(&mut g, "cast_scores", Op::Cast { to: F }, &[sc]);
        let pr = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[c]);
        let c = n1(&mut g, "cast_probs", Op::Cast { to: h }, &[pr]);
        let o = n1(&mut g, "pv", Op::MatMul, &[c, v]);
        g.mark_output(o).unwrap();
        let tensor = |shape: [usize; 3], f: &dyn Fn(usize) -> f32| {
            let vals: Vec<f32> = (0..64).map(f).collect();
            let t = graph_plan::HostTensor::from_f32(shape.to_vec(), &vals);
            graph_plan::HostTensor { dtype: h, data: graph_plan::exec::f32_to_half_bytes(&t.data, h), ..t }
        };
        let mut inputs = TensorMap::new();
        inputs.insert("q".into(), tensor([2, 8, 4], &|i| 1.4 * (i as f32 * 0.7).sin()));
        inputs.insert("kt".into(), tensor([2, 4, 8], &|i| 1.4 * (i as f32 * 1.3).cos()));
        inputs.insert("v".into(), tensor([2, 8, 4], &|i| (i as f32 * 0.37).sin()));
        let tolerance = half_attention_tolerance(h).unwrap();
        let co = CheckOptions { tolerance, ..CheckOptions::default() };
        let r = sim_check(&g, &PlanOptions::default(), &inputs, &TensorMap::new(), &co).unwrap();
        assert_eq!(r.optimised_launches, 1, "{h}");
        // Measured: f16 7.0e-4, bf16 2.8e-3 (tolerances 1e-2 and 8e-2).
        assert!(r.passed && r.outputs[0].max_rel_err > 0.0, "{h}: {r:#?}");
    }
}

#[test]
fn the_transformer_family_in_half_has_the_launches_of_f32() {
    let g = graph_ir::synth::transformer(2, 32, 4, 8, 1).unwrap();
    let f32_plan = built(&g, &PlanOptions::default());
    for p in [Precision::Fp16, Precision::Bf16] {
        let plan = built(&g, &half_opts(p, 2));
        assert_eq!(plan.kernel_count_fused, f32_plan.kernel_count_fused, "{p}");
        assert_eq!(plan.kernels().iter().filter(|k| k.kind == GroupKind::Attention).count(), 2, "{p}");
        agrees_half(&g, p, 9);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random head counts, lengths (across the 64-column tile), head sizes, scales, masks and precisions (f32,
    /// fp16, bf16 under the default policy): the chain is one attention kernel, the projections take their head
    /// split, and exec-sim's online softmax agrees with the reference plan (half: `agrees_half`).
    #[test]
    fn random_attention_blocks_fuse_and_agree(heads in 1usize..4, s in 1usize..150, d in 1usize..9, scale in 0u8..3, mask in 0u8..4, seed in 0u64..1000, precision in 0u8..3) {
        let v = Variant {
            scale: [None, Some(true), Some(false)][scale as usize],
            mask: [Mask::None, Mask::Padding, Mask::Causal, Mask::CausalWhere][mask as usize],
        };
        let (g, scores) = block(heads, s, d, v);
        let precision = [Precision::Fp32, Precision::Fp16, Precision::Bf16][precision as usize];
        if precision == Precision::Fp32 {
            let p = fuse(&g, &FusionOptions::default());
            check(&g, &p, &FusionCaps::all());
            prop_assert_eq!(p.groups.len(), 3);
            prop_assert!(!p.is_materialized(&g, scores));
            agrees(&g, seed);
        } else {
            // A half chain: the transform's casts join the chain, the launches stay those of f32.
            let (rg, p) = fuse_half(&g, precision);
            prop_assert_eq!(p.groups.len(), 3, "{:?}", names(&rg, &p));
            prop_assert_eq!(p.stats.merges_attention, 1);
            let scores = rg.tensor_id(&g.tensor(scores).name).unwrap();
            prop_assert!(!p.is_materialized(&rg, scores));
            agrees_half(&g, precision, seed);
        }
    }
}

#[test]
fn a_one_by_one_score_matrix_scaled_from_the_left_is_still_one_chain() {
    // s = d = 1: the scores are a scalar too, so `Mul(inv_sqrt_d, scores)` has two scalar operands; the scores
    // are the one that leads down to the MatMul (CI found this: the walk took the constant and missed the chain).
    for scale in [Some(false), Some(true)] {
        let (g, scores) = block(1, 1, 1, Variant { scale, mask: Mask::None });
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        assert_eq!(p.groups.len(), 3, "{scale:?}: {:?}", names(&g, &p));
        assert_eq!(p.stats.merges_attention, 1);
        assert!(!p.is_materialized(&g, scores));
        agrees(&g, 3);
        for precision in [Precision::Fp16, Precision::Bf16] {
            let (rg, p) = fuse_half(&g, precision);
            assert_eq!(p.stats.merges_attention, 1, "{precision}: {:?}", names(&rg, &p));
            agrees_half(&g, precision, 3);
        }
    }
}
