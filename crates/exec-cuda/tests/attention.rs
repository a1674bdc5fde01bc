//! Fused attention kernels (`GroupKind::Attention`, `codegen::attention`): BERT/GPT-style blocks (head split by
//! Reshape + Transpose, scale by Mul or Div, a padding or causal mask or none, head merge by Transpose +
//! Reshape), with 70 keys (not a multiple of the 64-key tile), in f32, f16 and bf16.
//!
//! - host emulator: the plan with attention kernels (generated CUDA C compiled as C++ with the shim) against
//!   exec-sim's reference plan (the unfused chain), within `ATTENTION_TOLERANCE` (f32) or
//!   `half_attention_tolerance` (half chains, whose reference is the unfused half plan), relative to the output's
//!   largest magnitude; skips, printing why, without a host C++ compiler;
//! - NVRTC: the same sources compile (skips, printing why, where NVRTC is not installed);
//! - GPU: the plans run on device 0 and agree with exec-sim's reference plan (skips without a driver).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::host::{compiler, HostEmu, HostProgram};
use exec_cuda::codegen;
use exec_sim::attention::{half_attention_tolerance, ATTENTION_TOLERANCE};
use graph_plan::ir::{ComputeGraph, TensorId};
use graph_plan::precision::{Precision, PrecisionPolicy};
use graph_plan::{BindingRole, DType, ExecutionPlan, Executor, GroupKind, Op, PlanOptions, PreparedPlan, TensorMap};

const F: DType = DType::F32;

fn node(g: &mut ComputeGraph, name: &str, op: Op, ins: &[TensorId]) -> TensorId {
    g.add_node(name, op, ins).unwrap()[0]
}

/// How the scores are scaled and masked.
#[derive(Clone, Copy, Debug)]
enum Scale {
    None,
    /// Div by sqrt(d) (scalar on the right).
    Div,
    /// Mul by 1/sqrt(d) with the scalar on the left.
    MulLeft,
}

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// An input [1, 1, 1, S] (BERT padding).
    Padding,
    /// A constant [S, S], -1e9 above the diagonal (GPT causal), on the left of the Add.
    Causal,
    /// Computed from an input `keep` [1, 1, 1, S] of 0/1: `keep * -1e4` (an elementwise producer of the mask).
    Computed,
    /// GPT-2's eager export: `Where(causal [S, S] bool, scores, f32::MIN)`, then the padding mask added.
    CausalWhere,
}

/// x [1, s, h*d] -> Q, K, V projections, head split (Reshape + Transpose), attention, head merge (Transpose +
/// Reshape): the merged context is the graph output, so the head-merge transpose is the attention kernel's
/// output layout.
fn block(heads: usize, s: usize, d: usize, scale: Scale, mask: Mask) -> ComputeGraph {
    let e = heads * d;
    let mut g = ComputeGraph::new(format!("attn_{heads}_{s}_{d}_{scale:?}_{mask:?}"));
    let x = g.add_input("x", F, [1, s, e]).unwrap();
    let proj = |g: &mut ComputeGraph, n: &str, perm: Vec<usize>| {
        let w = g.add_weight(&format!("w{n}"), F, [e, e]).unwrap();
        let m = node(g, &format!("mm_{n}"), Op::MatMul, &[x, w]);
        let r = node(
            g,
            &format!("view_{n}"),
            Op::Reshape { shape: vec![1, s as i64, heads as i64, d as i64], allowzero: false },
            &[m],
        );
        node(g, &format!("split_{n}"), Op::Transpose { perm: Some(perm) }, &[r])
    };
    let q = proj(&mut g, "q", vec![0, 2, 1, 3]);
    let kt = proj(&mut g, "k", vec![0, 2, 3, 1]);
    let vv = proj(&mut g, "v", vec![0, 2, 1, 3]);
    let mut t = node(&mut g, "qk", Op::MatMul, &[q, kt]);
    match scale {
        Scale::Div => {
            let c = g.add_constant_f32("sqrt_d", [], &[(d as f32).sqrt()]).unwrap();
            t = node(&mut g, "scale", Op::Div, &[t, c]);
        }
        Scale::MulLeft => {
            let c = g.add_constant_f32("inv_sqrt_d", [], &[1.0 / (d as f32).sqrt()]).unwrap();
            t = node(&mut g, "scale", Op::Mul, &[c, t]);
        }
        Scale::None => {}
    }
    match mask {
        Mask::None => {}
        Mask::Padding => {
            let m = g.add_input("mask", F, [1, 1, 1, s]).unwrap();
            t = node(&mut g, "mask_add", Op::Add, &[t, m]);
        }
        Mask::Causal => {
            let vals: Vec<f32> = (0..s * s).map(|i| if i % s > i / s { -1e9 } else { 0.0 }).collect();
            let m = g.add_constant_f32("causal", [s, s], &vals).unwrap();
            t = node(&mut g, "mask_add", Op::Add, &[m, t]);
        }
        Mask::Computed => {
            let keep = g.add_input("keep", F, [1, 1, 1, s]).unwrap();
            let c = g.add_constant_f32("big_negative", [], &[-1e4]).unwrap();
            let m = node(&mut g, "mask_bias", Op::Mul, &[keep, c]);
            t = node(&mut g, "mask_add", Op::Add, &[t, m]);
        }
        Mask::CausalWhere => {
            let keep: Vec<u8> = (0..s * s).map(|i| u8::from(i % s <= i / s)).collect();
            let c = g.add_constant("causal_keep", DType::Bool, [s, s], keep).unwrap();
            let fill = g.add_constant_f32("mask_value", [], &[f32::MIN]).unwrap();
            t = node(&mut g, "mask_where", Op::Where, &[c, t, fill]);
            let m = g.add_input("mask", F, [1, 1, 1, s]).unwrap();
            t = node(&mut g, "mask_add", Op::Add, &[t, m]);
        }
    }
    let p = node(&mut g, "softmax", Op::Softmax { axis: -1 }, &[t]);
    let o = node(&mut g, "pv", Op::MatMul, &[p, vv]);
    let tr = node(&mut g, "merge_t", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[o]);
    let r = node(&mut g, "merge", Op::Reshape { shape: vec![1, s as i64, e as i64], allowzero: false }, &[tr]);
    g.mark_output(r).unwrap();
    g
}

/// The graphs every test runs: 70 keys (one full tile and a partial one), a single key, every scale and mask form; with
/// `true`, planned with `layout_epilogue` on (as this backend's caps have it), so that the head-merge Transpose
/// joins the attention kernel and its output is written through the permutation; with `false`, with it off.
fn graphs() -> Vec<(ComputeGraph, bool)> {
    vec![
        (block(2, 70, 8, Scale::Div, Mask::Padding), false),
        (block(2, 70, 8, Scale::MulLeft, Mask::Causal), false),
        (block(1, 70, 4, Scale::None, Mask::None), false),
        (block(3, 5, 4, Scale::Div, Mask::None), false),
        // A 1x1 score matrix scaled from the left: both Mul operands are scalars.
        (block(1, 1, 1, Scale::MulLeft, Mask::None), false),
        (block(2, 70, 8, Scale::Div, Mask::Computed), true),
        // Head widths of whole warps: the warp-cooperative scores (one warp per query row, BERT's 64 with the
        // head merge in the kernel's layout).
        (block(2, 70, 32, Scale::Div, Mask::Padding), false),
        (block(2, 70, 64, Scale::MulLeft, Mask::Causal), true),
        // The causal mask as a Where (GPT-2 eager), per thread and per warp.
        (block(2, 70, 8, Scale::Div, Mask::CausalWhere), false),
        (block(2, 70, 32, Scale::Div, Mask::CausalWhere), true),
    ]
}

/// Plan options with this backend's caps (attention on; `layout_epilogue` as `layout` says), `precision` when
/// given.
fn options(precision: Option<Precision>, reference: bool, layout: bool) -> PlanOptions {
    let mut o = if reference { PlanOptions::reference() } else { PlanOptions::with_streams(2) };
    o.fusion.caps = codegen::fusion_caps();
    o.fusion.caps.layout_epilogue = layout;
    if let Some(p) = precision {
        o.precision = PrecisionPolicy::new(p);
    }
    o
}

/// The tolerance of the fused kernel against the unfused chain (exec-sim's attention module).
fn tolerance(precision: Option<Precision>) -> f64 {
    match precision {
        None => ATTENTION_TOLERANCE,
        Some(p) => half_attention_tolerance(p.dtype()).unwrap(),
    }
}

/// Seeded inputs and weights for `plan` (the mask input is a padding mask: 0 or -1e4, the last keys padded).
fn seeded(plan: &ExecutionPlan, role: BindingRole) -> TensorMap {
    let mut m = TensorMap::new();
    graph_plan::exec::fill_missing(plan, &mut m, role, 11, &[]);
    if let Some(t) = m.get_mut("mask") {
        let n = t.shape.numel().unwrap();
        let vals: Vec<f32> = (0..n).map(|j| if j + 7 >= n { -1e4 } else { 0.0 }).collect();
        *t = graph_plan::HostTensor::from_f32(t.shape.clone(), &vals);
    }
    if let Some(t) = m.get_mut("keep") {
        let n = t.shape.numel().unwrap();
        let vals: Vec<f32> = (0..n).map(|j| if j + 5 >= n { 1.0 } else { 0.0 }).collect();
        *t = graph_plan::HostTensor::from_f32(t.shape.clone(), &vals);
    }
    m
}

/// The largest |got - want| relative to the largest |want|, over every output (as f64).
fn worst_rel(got: &TensorMap, want: &TensorMap) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f64;
    for (name, w) in want {
        let g = got.get(name).unwrap_or_else(|| panic!("output '{name}' missing"));
        let (gv, wv) = (g.to_f64(), w.to_f64());
        assert_eq!(gv.len(), wv.len(), "'{name}' sizes");
        assert!(wv.iter().all(|v| v.is_finite()), "reference '{name}' is not finite");
        let mag = wv.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
        let err = gv.iter().zip(&wv).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(err / mag);
    }
    worst
}

/// One graph at one precision: the plan with attention kernels and exec-sim's reference plan, both verified.
struct Case {
    name: String,
    precision: Option<Precision>,
    plan: ExecutionPlan,
    reference: ExecutionPlan,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for precision in [None, Some(Precision::Fp16), Some(Precision::Bf16)] {
        for (g, layout) in graphs() {
            let plan = ExecutionPlan::build_with(&g, &options(precision, false, layout)).unwrap();
            graph_plan::verify(&plan).unwrap_or_else(|e| panic!("{}: {e:?}", g.name()));
            let reference = ExecutionPlan::build_with(&g, &options(precision, true, false)).unwrap();
            graph_plan::verify(&reference).unwrap_or_else(|e| panic!("{} ref: {e:?}", g.name()));
            let attn: Vec<_> = plan.kernels().iter().filter(|k| k.kind == GroupKind::Attention).collect();
            assert_eq!(attn.len(), 1, "{} {precision:?}: one attention kernel\n{plan}", g.name());
            assert!(reference.kernels().iter().all(|k| k.kind != GroupKind::Attention));
            let ops: Vec<&str> = attn[0].body.iter().map(|i| i.op.name()).collect();
            eprintln!("{} {precision:?}: attention kernel body {ops:?}", g.name());
            if layout {
                // The head merge rides along: the kernel writes the merged layout.
                assert!(ops.contains(&"Transpose"), "{}: {ops:?}", g.name());
            }
            out.push(Case { name: g.name().to_owned(), precision, plan, reference });
        }
    }
    out
}

/// exec-sim's reference plan on the same inputs and weights.
fn sim_reference(c: &Case, weights: &TensorMap, inputs: &TensorMap) -> TensorMap {
    exec_sim::run_plan(&exec_sim::SimExecutor::new(), &c.reference, weights, inputs)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name))
}

#[test]
fn attention_kernels_match_the_reference_plan_on_the_host_emulator() {
    let test = "attention_kernels_match_the_reference_plan_on_the_host_emulator";
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler (c++, g++ or clang++) to emulate kernels");
        return;
    };
    let cases = cases();
    let sources: Vec<_> = cases.iter().flat_map(|c| codegen::generate_all(&c.plan).unwrap()).collect();
    let emu = HostEmu { program: Arc::new(HostProgram::build(cxx, test, &sources)) };
    for c in &cases {
        let (weights, inputs) = (seeded(&c.plan, BindingRole::Weight), seeded(&c.plan, BindingRole::Input));
        let got = emu.prepare(&c.plan, &weights).unwrap().run(&inputs).unwrap();
        let want = sim_reference(c, &weights, &inputs);
        let worst = worst_rel(&got, &want);
        let tol = tolerance(c.precision);
        eprintln!("{test}: {} {:?}: worst relative error {worst:.3e} (tolerance {tol:e})", c.name, c.precision);
        assert!(worst <= tol, "{} {:?}: relative error {worst:e} > {tol:e}", c.name, c.precision);
    }
    // The same sources are CUDA C that NVRTC accepts.
    if common::nvrtc_or_skip(test) {
        let cache = exec_cuda::CompileCache::from_env();
        let n = common::compile_distinct(test, &sources, &cache, &exec_cuda::CompileOptions::default());
        eprintln!("{test}: {n} distinct kernels compiled with NVRTC");
    }
}

/// Heads whose width is a whole number of warps get the warp-cooperative scores (beside the per-thread walk, for
/// warps the guard cuts); narrower heads only the per-thread walk.
#[test]
fn whole_warp_heads_share_their_scores() {
    for (d, coop) in [(8, false), (32, true), (64, true), (48, false)] {
        let g = block(2, 70, d, Scale::Div, Mask::Padding);
        let plan = ExecutionPlan::build_with(&g, &options(None, false, false)).unwrap();
        let k = plan.kernels().iter().find(|k| k.kind == GroupKind::Attention).unwrap();
        let src = codegen::generate(k).unwrap().source;
        assert_eq!(src.contains("__shfl_sync("), coop, "head width {d}\n{src}");
        assert!(src.contains("float s"), "head width {d}: the per-thread walk is always there");
    }
}

/// Attention kernels the generator cannot express are refused with `Unsupported`, never generated: a kernel
/// whose Softmax input is not a MatMul's scores.
#[test]
fn a_body_without_the_chain_is_refused() {
    let g = block(2, 6, 4, Scale::Div, Mask::Padding);
    let plan = ExecutionPlan::build_with(&g, &options(None, false, false)).unwrap();
    let mut k = plan.kernels().iter().find(|k| k.kind == GroupKind::Attention).unwrap().clone();
    let qk = k.body.iter().position(|i| matches!(i.op, Op::MatMul)).unwrap();
    k.body[qk].op = Op::Add;
    let err = codegen::generate(&k).unwrap_err();
    assert!(
        matches!(&err, exec_cuda::CudaError::Unsupported { what, .. } if what.contains("do not come from a MatMul")),
        "{err:?}"
    );
}

/// GPU: the plans with attention kernels run on device 0 and agree with exec-sim's reference plan.
#[test]
fn attention_kernels_match_the_reference_plan_on_the_gpu() {
    let test = "attention_kernels_match_the_reference_plan_on_the_gpu";
    let Some(_device) = common::device_or_skip(test) else {
        return;
    };
    let exec = exec_cuda::CudaExecutor::new(0);
    for c in &cases() {
        let (weights, inputs) = (seeded(&c.plan, BindingRole::Weight), seeded(&c.plan, BindingRole::Input));
        let mut prepared = match exec.prepare(&c.plan, &weights) {
            Ok(p) => p,
            Err(graph_plan::ExecError::Backend { message, .. })
                if message.contains("cuBLAS unavailable") || message.contains("NVRTC unavailable") =>
            {
                eprintln!("SKIP {test}: {message}");
                return;
            }
            Err(e) => panic!("{}: {e}", c.name),
        };
        let got = prepared.run(&inputs).unwrap();
        let want = sim_reference(c, &weights, &inputs);
        let worst = worst_rel(&got, &want);
        // The GPU's expf and the cuBLAS projections differ from the host's in the last bits: twice the tolerance.
        let tol = 2.0 * tolerance(c.precision);
        eprintln!("{test}: {} {:?}: worst relative error {worst:.3e} (tolerance {tol:e})", c.name, c.precision);
        assert!(worst <= tol, "{} {:?}: relative error {worst:e} > {tol:e}", c.name, c.precision);
    }
}
